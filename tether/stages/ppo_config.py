"""Settings of `tether ppo`, each documented once (this text is the --help)."""
from __future__ import annotations

from dataclasses import dataclass

from tether.config import ConfigError, choice, option
from tether.sections import RewardFunctionOptions


@dataclass(frozen=True)
class RolesSection(RewardFunctionOptions):
    """The four roles: policy (trained), critic (trained), reward (frozen), reference (frozen), and reward functions."""

    policy: str = option("", "Policy to train: a local causal-LM folder, usually the SFT model.", flag="--policy")
    reference: str = option("", "Reference model folder; default: a frozen copy of --policy as loaded.")
    reward_model: str = option("", "Reward model folder written by `tether rm`.", flag="--reward-model")
    reward_weights: str = option("", "Weights of reward-model heads, HEAD=W,...; default: the first head alone.")
    normalize_reward: bool = option(True, "Standardise reward-model scores with the statistics saved by `tether rm`.")
    critic: str = option("", "Critic initialisation for the separate layout: a reward-model folder (default: --reward-model, "
                             "as InstructGPT) or a causal-LM folder such as the policy (a new zero head).")
    critic_layout: str = option("separate", "separate: the critic is its own model (--critic); shared: a value head on the "
                                            "policy's backbone, trained by value_loss_coef x value loss (one model in memory).",
                                choices=("separate", "shared"))
    lora_r: int = option(0, "Train the policy through LoRA adapters of this rank; 0 trains every weight. With LoRA and no "
                            "--reference, the reference is the policy with its adapter disabled (no second copy).")
    lora_alpha: float = option(16.0, "LoRA scaling alpha.")
    lora_dropout: float = option(0.0, "Dropout on the LoRA input.")
    lora_target_modules: list = option(["all-linear"], "Module names that get adapters, or all-linear.")
    dtype: str = option("float32", "Weights dtype of every role.", choices=("float32", "bfloat16", "float16"))
    device: str = option("auto", "auto (GPU if present), cpu or cuda.", choices=("auto", "cpu", "cuda"))


@dataclass(frozen=True)
class RolloutSection:
    """Prompts and sampling."""

    prompts: str = option("", "Prompt file (.jsonl...): a 'prompt' column, a string or a list of chat messages.", flag="--prompts")
    eval_prompts: str = option("", "Held-out prompts for periodic evaluation; empty: no evaluation.")
    prompts_per_step: int = option(32, "Prompts sampled per PPO step (one response each).")
    max_new_tokens: int = option(64, "Response budget; responses without EOS within it are truncated.")
    temperature: float = option(1.0, "Sampling temperature; log-probs are computed from logits / temperature.")
    top_p: float = option(1.0, "Nucleus sampling threshold (1 = off).")
    top_k: int = option(0, "Top-k sampling (0 = off).")
    penalize_truncated: bool = option(False, "Give truncated responses truncation_penalty instead of their score.")
    truncation_penalty: float = option(-1.0, "Score of a truncated response when penalize_truncated is on.")
    reward_clip: float = option(0.0, "Clip scores to [-c, c]; 0 = off.")

    def __post_init__(self):
        if self.temperature <= 0 or self.prompts_per_step < 1 or self.max_new_tokens < 1:
            raise ConfigError("temperature must be > 0, prompts_per_step and max_new_tokens >= 1")


@dataclass(frozen=True)
class PPOSection:
    """PPO updates, KL control and advantages (ALGORITHMS §3-4)."""

    steps: int = option(100, "PPO steps (rollout, then updates).")
    ppo_epochs: int = option(2, "Passes over each rollout batch.")
    minibatch: int = option(16, "Responses per optimizer step within a pass.")
    policy_lr: float = option(1e-5, "Policy learning rate (AdamW, constant).")
    critic_lr: float = option(1e-4, "Critic learning rate (AdamW, constant).")
    max_grad_norm: float = option(1.0, "Clip each model's gradient norm; 0 = off.")
    kl_coef: float = option(0.05, "β: KL penalty coefficient in the per-token reward (initial value if adaptive).")
    kl_estimator: str = option("k1", "Per-token KL estimator in the reward: k1, k2 or k3.", choices=("k1", "k2", "k3"))
    adaptive_kl: bool = option(False, "Adapt β towards target_kl (Ziegler et al. 2019).")
    target_kl: float = option(6.0, "Target sequence KL (nats) for the adaptive controller.")
    kl_horizon: int = option(10000, "Controller horizon in responses.")
    gamma: float = option(1.0, "Discount γ.")
    lam: float = option(0.95, "GAE λ.")
    whiten_advantages: bool = option(True, "Whiten advantages over the batch's valid tokens.")
    clip_low: float = option(0.2, "ε_low: ratio clip below 1.")
    clip_high: float = option(0.2, "ε_high: ratio clip above 1.")
    dual_clip: float = option(0.0, "Dual-clip constant c > 1 for negative advantages; 0 = off.")
    value_clip: float = option(0.2, "ε_v: value clipping around the rollout-time values.")
    value_loss_coef: float = option(1.0, "c_v: weight of the value loss. With a separate critic (own AdamW) it barely matters; "
                                         "with the shared layout it sets how hard the value loss pulls the shared backbone.")
    entropy_coef: float = option(0.0, "Entropy bonus coefficient. Off by default: it is not part of RLHF-PPO as published.")
    target_approx_kl: float = option(0.0, "Stop a step's remaining passes when approx KL to the sampling policy exceeds this; 0 = off.")

    def __post_init__(self):
        choice(self.kl_estimator, ("k1", "k2", "k3"), "kl_estimator")
        if self.kl_coef < 0 or self.steps < 1 or self.ppo_epochs < 1 or self.minibatch < 1:
            raise ConfigError("kl_coef must be >= 0; steps, ppo_epochs and minibatch >= 1")
        if self.dual_clip and self.dual_clip <= 1:
            raise ConfigError(f"dual_clip={self.dual_clip}: must be > 1 (or 0 for off)")


@dataclass(frozen=True)
class PPORunSection:
    """Run folder, evaluation, checkpoints, logging."""

    output: str = option("", "Run folder.")
    eval_every: int = option(10, "Evaluate every N steps (and before the first update, and at the end).")
    save_every: int = option(20, "Checkpoint every N steps (and at the end).")
    sample_every: int = option(5, "Write the step's responses to samples.jsonl every N steps.")
    keep_checkpoints: int = option(1, "Newest checkpoints to keep; 0 keeps all.")
    best_metric: str = option("", "Keep best/ (HF format) at the evaluation with the best value of this metric, "
                                  "e.g. eval/score_mean or, on the lab, eval/gold_reward; empty: no best/.")
    best_mode: str = option("max", "Whether best_metric is better high (max) or low (min).", choices=("max", "min"))
    log_every: int = option(5, "Console line every N steps.")
    stop_on_alarm: bool = option(False, "Stop (after a checkpoint) when a reward-hacking monitor raises an alarm "
                                        "(docs/monitors.md); alarms are always written to alarms.jsonl.")
    seed: int = option(0, "Seed for prompt order and sampling.")
    resume: bool = option(False, "Continue from the newest checkpoint in --output.")
    overwrite: bool = option(False, "Start afresh in an --output that already holds a run.")
    report_to: list = option(["tensorboard"], "Extra loggers: tensorboard, wandb, mlflow, none.")


@dataclass(frozen=True)
class PPOConfig:
    roles: RolesSection = RolesSection()
    rollout: RolloutSection = RolloutSection()
    ppo: PPOSection = PPOSection()
    run: PPORunSection = PPORunSection()
