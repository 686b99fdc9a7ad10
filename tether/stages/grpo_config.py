"""Settings of `tether grpo`, each documented once (this text is the --help), and the named recipes."""
from __future__ import annotations

from dataclasses import dataclass

from tether.config import ConfigError, build_config, choice, option
from tether.sections import RewardFunctionOptions

ADVANTAGES = ("group", "group_no_std", "rloo", "reinforce_pp")
RATIOS = ("token", "sequence", "sequence_token")
AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")
RECIPE_NAMES = ("grpo", "dr_grpo", "dapo", "gspo", "rloo", "reinforce_pp")  # defined in RECIPES below


@dataclass(frozen=True)
class GRPOModelSection:
    """The policy (trained) and, when the KL coefficient is above 0, the frozen reference."""

    policy: str = option("", "Policy to train: a local causal-LM folder, usually the SFT model.", flag="--policy")
    reference: str = option("", "Reference model folder; default: a frozen copy of --policy. Not loaded when no KL is used.")
    lora_r: int = option(0, "Train through LoRA adapters of this rank; 0 trains every weight. With LoRA and no --reference, "
                            "the reference is the policy with its adapter disabled.")
    lora_alpha: float = option(16.0, "LoRA scaling alpha.")
    lora_dropout: float = option(0.0, "Dropout on the LoRA input.")
    lora_target_modules: list = option(["all-linear"], "Module names that get adapters, or all-linear.")
    dtype: str = option("float32", "Weights dtype.", choices=("float32", "bfloat16", "float16"))
    device: str = option("auto", "auto (GPU if present), cpu or cuda.", choices=("auto", "cpu", "cuda"))
    trainable_params: str = option("", "Regular expression: train only the parameters whose names match it (the rest "
                                       "frozen); empty trains all. Not with LoRA.")


@dataclass(frozen=True)
class GRPORewardSection(RewardFunctionOptions):
    """What scores a completion (docs/rewards.md)."""

    reward_model: str = option("", "A `tether rm` folder whose (normalised) score is added to the reward.", flag="--reward-model")
    step_pattern: str = option(r"\.(?=\s|$)", "Process rewards: a regular expression whose matches end the steps of a "
                                               "completion; step k's score goes to the token where its k-th match ends.")


@dataclass(frozen=True)
class GRPORolloutSection:
    """Prompts and sampling: prompts_per_step groups of group_size responses."""

    prompts: str = option("", "Prompt file (.jsonl...): a 'prompt' column and any columns the rewards need.", flag="--prompts")
    eval_prompts: str = option("", "Held-out prompts for periodic evaluation; empty: no evaluation.")
    prompts_per_step: int = option(16, "Groups per step (prompts), after dynamic sampling's filtering.")
    group_size: int = option(8, "G: responses sampled per prompt.")
    max_new_tokens: int = option(128, "Response budget; responses without EOS within it are truncated.")
    temperature: float = option(1.0, "Sampling temperature; log-probs are computed from logits / temperature.")
    top_p: float = option(1.0, "Nucleus sampling threshold (1 = off).")
    top_k: int = option(0, "Top-k sampling (0 = off).")

    def __post_init__(self):
        if self.group_size < 2:
            raise ConfigError("group_size must be >= 2: a group baseline needs at least two responses")
        if self.temperature <= 0 or self.prompts_per_step < 1 or self.max_new_tokens < 1:
            raise ConfigError("temperature must be > 0, prompts_per_step and max_new_tokens >= 1")


@dataclass(frozen=True)
class GRPOAlgoSection:
    """The pieces a recipe composes (ALGORITHMS §5); a recipe sets them, any flag overrides."""

    recipe: str = option("grpo", "Named composition: grpo, dr_grpo, dapo, gspo, rloo, reinforce_pp (`tether recipes`).",
                         flag="--recipe")
    advantage: str = option("group", "group (std-scaled), group_no_std, rloo, reinforce_pp.", choices=ADVANTAGES)
    std_eps: float = option(1e-4, "ε added to the group std (equal scores give 0, never 0/0).")
    ratio: str = option("token", "Importance ratio: token (PPO/GRPO), sequence (GSPO), sequence_token (GSPO-token).",
                        choices=RATIOS)
    clip_low: float = option(0.2, "ε_low: ratio clip below 1.")
    clip_high: float = option(0.2, "ε_high: ratio clip above 1.")
    aggregation: str = option("seq-mean-token-mean", "How token terms become the loss.", choices=AGGREGATIONS)
    norm_length: int = option(0, "L of seq-mean-token-sum-norm; 0 = max_new_tokens.")
    kl_coef: float = option(0.04, "β of the KL term in the loss; 0 loads no reference model.")
    kl_estimator: str = option("k3", "Estimator of the KL term: k1, k2 or k3.", choices=("k1", "k2", "k3"))
    kl_in_reward: float = option(0.0, "β of the per-token KL penalty folded into the rewards (reinforce_pp); 0 = none.")
    gamma: float = option(1.0, "Discount of reinforce_pp's returns-to-go.")
    dynamic_sampling: bool = option(False, "Drop groups whose scores are all equal and sample more prompts to fill the step.")
    max_sampling_rounds: int = option(3, "Dynamic sampling: most generation rounds per step; a step short of groups "
                                         "after them trains on what it has (logged).")
    overlong_cache: int = option(0, "DAPO overlong shaping window L_cache (L_max = max_new_tokens), added to the reward as "
                                    "the 'overlong' component; 0 = off, -1 = a quarter of max_new_tokens.")
    mask_truncated: bool = option(False, "Give truncated responses no loss (DAPO's overlong filtering).")
    inner_iterations: int = option(1, "μ: passes over each rollout batch; old log-probs kept from sampling time.")
    minibatch: int = option(0, "Responses per optimizer step; 0 = the whole rollout batch (one update per pass).")
    micro_batch: int = option(32, "Responses per forward/backward within an optimizer step.")
    lr: float = option(1e-6, "Learning rate (AdamW, constant after warm-up).", flag="--lr")
    warmup_steps: int = option(0, "Linear warm-up of the learning rate over this many optimizer updates.")
    max_grad_norm: float = option(1.0, "Clip the gradient norm; 0 = off.")

    def __post_init__(self):
        choice(self.advantage, ADVANTAGES, "advantage")
        choice(self.ratio, RATIOS, "ratio")
        choice(self.aggregation, AGGREGATIONS, "aggregation")
        choice(self.recipe, RECIPE_NAMES, "recipe")
        if self.kl_coef < 0 or self.kl_in_reward < 0 or self.inner_iterations < 1 or self.micro_batch < 1:
            raise ConfigError("kl_coef and kl_in_reward must be >= 0; inner_iterations and micro_batch >= 1")


@dataclass(frozen=True)
class GRPORunSection:
    """Run folder, evaluation, checkpoints, logging."""

    output: str = option("", "Run folder.")
    steps: int = option(100, "Steps (rollout, then μ passes of updates).")
    eval_every: int = option(10, "Evaluate every N steps (and before the first update, and at the end).")
    save_every: int = option(20, "Checkpoint every N steps (and at the end).")
    sample_every: int = option(5, "Write the step's responses to samples.jsonl every N steps.")
    keep_checkpoints: int = option(1, "Newest checkpoints to keep; 0 keeps all.")
    best_metric: str = option("", "Keep best/ at the evaluation with the best value of this metric (e.g. eval/score_mean).")
    best_mode: str = option("max", "Whether best_metric is better high (max) or low (min).", choices=("max", "min"))
    log_every: int = option(5, "Console line every N steps.")
    stop_on_alarm: bool = option(False, "Stop (after a checkpoint) when a reward-hacking monitor raises an alarm "
                                        "(docs/monitors.md); alarms are always written to alarms.jsonl.")
    seed: int = option(0, "Seed for prompt order and sampling.")
    resume: bool = option(False, "Continue from the newest checkpoint in --output.")
    overwrite: bool = option(False, "Start afresh in an --output that already holds a run.")
    report_to: list = option(["tensorboard"], "Extra loggers: tensorboard, wandb, mlflow, none.")

    def __post_init__(self):
        if self.steps < 1:
            raise ConfigError("steps must be >= 1")


@dataclass(frozen=True)
class GRPOConfig:
    model: GRPOModelSection = GRPOModelSection()
    rewards: GRPORewardSection = GRPORewardSection()
    rollout: GRPORolloutSection = GRPORolloutSection()
    algo: GRPOAlgoSection = GRPOAlgoSection()
    run: GRPORunSection = GRPORunSection()


@dataclass(frozen=True)
class Recipe:
    summary: str
    equations: str
    settings: dict  # algo.<field>: value
    sources: str


RECIPES: dict[str, Recipe] = {
    "grpo": Recipe(
        "Group-relative advantages with std scaling, token-ratio clipping, per-sequence mean, k3 KL in the loss.",
        "Â_i = (R_i − mean R) / (std R + ε);  J = mean_i (1/|y_i|) Σ_t [min(ρ_t Â_i, clip(ρ_t, 1±ε) Â_i) − β k3_t]",
        {"advantage": "group", "ratio": "token", "clip_low": 0.2, "clip_high": 0.2, "aggregation": "seq-mean-token-mean",
         "kl_coef": 0.04, "kl_estimator": "k3", "kl_in_reward": 0.0, "dynamic_sampling": False, "overlong_cache": 0},
        "Shao et al. 2024, DeepSeekMath (arXiv 2402.03300): ε = 0.2, β = 0.04."),
    "dr_grpo": Recipe(
        "GRPO without the two length/difficulty biases: no std division, token sums over a constant length.",
        "Â_i = R_i − mean R;  J = mean_i (1/L) Σ_t min(ρ_t Â_i, clip(ρ_t, 1±ε) Â_i),  L = max_new_tokens",
        {"advantage": "group_no_std", "ratio": "token", "clip_low": 0.2, "clip_high": 0.2,
         "aggregation": "seq-mean-token-sum-norm", "kl_coef": 0.0, "kl_in_reward": 0.0, "dynamic_sampling": False,
         "overlong_cache": 0},
        "Liu et al. 2025, Understanding R1-Zero-Like Training (arXiv 2503.20783): β = 0."),
    "dapo": Recipe(
        "Clip-higher, dynamic sampling, token-level loss, soft overlong punishment, no KL.",
        "Â_i group-normalised; J = Σ_{i,t} min(ρ_t Â_i, clip(ρ_t, 1−0.2, 1+0.28) Â_i) / Σ_i |y_i|;  "
        "groups with equal R dropped and re-sampled; R += R_len(|y|)",
        {"advantage": "group", "ratio": "token", "clip_low": 0.2, "clip_high": 0.28, "aggregation": "token-mean",
         "kl_coef": 0.0, "kl_in_reward": 0.0, "dynamic_sampling": True, "overlong_cache": -1},
        "Yu et al. 2025, DAPO (arXiv 2503.14476): ε_low 0.2, ε_high 0.28; L_cache = a quarter of the budget here "
        "(the paper: 4096 of 20480)."),
    "gspo": Recipe(
        "Sequence-level importance ratio (length-normalised) with a very small clip range.",
        "s_i = exp((1/|y_i|) Σ_t (logp_t − old_logp_t));  J = mean_i min(s_i Â_i, clip(s_i, 1−ε_l, 1+ε_h) Â_i)",
        {"advantage": "group", "ratio": "sequence", "clip_low": 3e-4, "clip_high": 4e-4, "aggregation": "seq-mean-token-mean",
         "kl_coef": 0.0, "kl_in_reward": 0.0, "dynamic_sampling": False, "overlong_cache": 0},
        "Zheng et al. 2025, Group Sequence Policy Optimization (arXiv 2507.18071): ε_l 3e-4, ε_h 4e-4. "
        "The ratio differs from 1 only with μ > 1 or several minibatches per rollout."),
    "rloo": Recipe(
        "REINFORCE with the leave-one-out baseline; the clip is kept as a trust region.",
        "A_i = R_i − (1/(G−1)) Σ_{j≠i} R_j;  J = mean_i (1/|y_i|) Σ_t min(ρ_t A_i, clip(ρ_t, 1±ε) A_i)",
        {"advantage": "rloo", "ratio": "token", "clip_low": 0.2, "clip_high": 0.2, "aggregation": "seq-mean-token-mean",
         "kl_coef": 0.0, "kl_in_reward": 0.0, "dynamic_sampling": False, "overlong_cache": 0},
        "Ahmadian et al. 2024, Back to Basics (arXiv 2402.14740)."),
    "reinforce_pp": Recipe(
        "REINFORCE++: per-token KL penalty in the reward, returns-to-go, advantages normalised over the batch.",
        "r_t = −β k1_t (+ R on the last token);  G_t = Σ_{s≥t} γ^{s−t} r_s;  A_t = (G_t − mean G) / std G;  token-mean loss",
        {"advantage": "reinforce_pp", "ratio": "token", "clip_low": 0.2, "clip_high": 0.2, "aggregation": "token-mean",
         "kl_coef": 0.0, "kl_in_reward": 0.01, "kl_estimator": "k1", "gamma": 1.0, "dynamic_sampling": False,
         "overlong_cache": 0},
        "Hu 2025, REINFORCE++ (arXiv 2501.03262): β = 0.01, γ = 1."),
}


def build_grpo_config(file_values: dict | None = None, overrides: dict | None = None, source: str = "config"):
    """defaults ← the recipe's settings ← the YAML file ← flags: whatever the user names beats the recipe."""
    build_config(GRPOConfig, file_values, {}, source)  # unknown sections or fields in the file fail here, by name
    file_values = {k: dict(v) for k, v in (file_values or {}).items()}
    overrides = dict(overrides or {})
    name = overrides.get("algo.recipe") or file_values.get("algo", {}).get("recipe") or "grpo"
    if name not in RECIPES:
        raise ConfigError(f"--recipe {name!r}: choose from {sorted(RECIPES)}")
    merged = {f"algo.{k}": v for k, v in RECIPES[name].settings.items()}
    for section, entries in file_values.items():
        for key, value in entries.items():
            merged[f"{section}.{key}"] = value
    merged.update(overrides)
    merged["algo.recipe"] = name
    return build_config(GRPOConfig, overrides=merged, source=source)
