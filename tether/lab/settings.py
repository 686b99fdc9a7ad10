"""The lab's settings: LabConfig (every stage's knobs, each commented with why it has its value), QUICK (the plumbing
check `tether lab --quick` runs), the line a plumbing check opens and closes with, and `--set FIELD=VALUE` parsed
and checked against LabConfig's fields."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from tether.config import ConfigError
from tether.lab.world import WorldConfig

# The lab in another precision (`tether lab --set precision=NAME`; docs/performance.md "The whole lab in bf16"):
# each name's overrides of a training stage's options by dotted name. autocast: every forward and backward under
# bf16 autocast, weights and AdamW states in fp32; bf16_sampling: a bf16 copy samples, the fp32 trainer's
# policy-gradient terms truncated-IS corrected at 2 (Yao et al. 2025's cap). Gold scores in fp32 either way.
PRECISIONS = {
    "fp32": {},
    "autocast": {"model.mixed_precision": "bf16"},
    "bf16_sampling": {
        "rollout.sampling_dtype": "bf16",
        "rollout.off_policy_correction": "token_truncate",
        "rollout.is_ratio_max": 2.0,
    },
}
CORRECTION_KEYS = ("rollout.off_policy_correction", "rollout.is_ratio_max")


def precision_settings(precision: str, samples: bool = False, policy_gradient: bool = False) -> dict:
    """A lab stage's overrides for ``precision``: the model's always, the sampler's where the stage samples, the
    off-policy correction where a policy-gradient loss takes it (online DPO refuses it: no term of its loss is
    taken at sampling time)."""
    return {
        key: value
        for key, value in PRECISIONS[precision].items()
        if key.startswith("model.") or (samples and (policy_gradient or key not in CORRECTION_KEYS))
    }


@dataclass(frozen=True)
class LabConfig:
    world: WorldConfig = field(default_factory=WorldConfig)
    # tokenizer and base model (Llama architecture, trained from scratch)
    vocab_size: int = 1024
    hidden: int = 128
    layers: int = 2
    heads: int = 4
    max_positions: int = 256
    # pretraining: every token of the world's mixed-quality corpus, packed into rows. Held-out arithmetic goes
    # through a transition whose step varies with the seed and the vocabulary; 1,000 steps of 16 rows at lr 1e-3
    # stopped before it on seeds 1 and 2 (greedy accuracy 0.685 / 0.08 / 0.06). The same tokens in 4x the updates
    # at 2x the learning rate got every seed and vocabulary tried into it (0.42-0.77); AdamW's weight decay 0.1
    # then takes seeds 0-2 across it at the same cost (0.77 / 0.80 / 0.75; a 768-token vocabulary 0.50), where more
    # updates (8,000 x 2) or a constant learning rate did not (docs/lab.md)
    pretrain_steps: int = 4000
    pretrain_batch: int = 4  # packed rows of pack_length tokens
    pack_length: int = 256
    pretrain_lr: float = 2e-3
    pretrain_lr_schedule: str = "cosine"  # after the warm-up: cosine (down to 0.1 x lr at the end) or constant
    pretrain_weight_decay: float = 0.1  # AdamW's decoupled weight decay, on every parameter
    # supervised fine-tuning on demonstrations (completion-only)
    sft_steps: int = 450
    sft_batch: int = 64
    sft_lr: float = 5e-4
    # reward models on the annotators' pairs: all of them, and those with at least rm_min_agreement of the votes
    rm_epochs: float = 2.0
    rm_batch: int = 32
    rm_lr: float = 3e-4
    rm_min_agreement: float = 0.8
    # PPO on the assist world against the filtered reward model: one run per KL coefficient (0 shows the
    # over-optimisation), and one with the adaptive controller (from ppo_adaptive_init) aiming at
    # ppo_adaptive_target nats of sequence KL
    ppo_reward_model: str = "rm_filtered"
    ppo_kl_coefs: tuple = (0.0, 0.05, 0.2)
    ppo_adaptive_target: float = 2.0  # 0 = no adaptive run
    ppo_adaptive_init: float = 0.05
    ppo_kl_horizon: int = 160  # responses; 32 per step moves β by at most 0.2 x 32/160 = 4 % a step
    ppo_steps: int = 60
    ppo_prompts_per_step: int = 32
    ppo_lr: float = 5e-5
    ppo_eval_every: int = 10
    ppo_eval_samples: int = 4  # sampled answers per held-out request at each evaluation
    # the group family on arith from the SFT model: the same recipe and budget with outcome rewards (correct
    # answer + format) and with process rewards (each worked step checked, then the answer)
    grpo_recipe: str = "grpo"
    grpo_rewards: tuple = ("outcome", "process")
    grpo_steps: int = 40
    grpo_prompts_per_step: int = 32
    grpo_group_size: int = 8
    grpo_lr: float = 5e-5
    grpo_eval_every: int = 10
    grpo_eval_problems: int = 200
    # sampled answers per held-out problem at each evaluation: the GRPO lesson judges the sampled accuracy, and with
    # one answer per problem the sampling noise alone (±0.069 at p ≈ 0.15 over 200 problems) hid a +0.055 gain
    grpo_eval_samples: int = 4
    # the DPO family on assist from the SFT model: offline on the annotators' agreement-filtered pairs (one run per
    # loss), sigmoid on all pairs (label noise), and online (each round two answers per prompt sampled from the
    # policy and labelled by the same annotator panel with the same agreement filter)
    dpo_losses: tuple = ("sigmoid", "ipo", "simpo", "beta_dpo")
    dpo_unfiltered: bool = True
    dpo_online: bool = True
    # offline sigmoid DPO on the SFT model's own answers: the online run's labels (rounds x prompts) drawn in one
    # round before training, then dpo_steps on them. The DPO paper's recipe (pairs sampled from the reference model),
    # beside the annotators' pairs, which were written by the world's demonstrators, not by the SFT model
    dpo_sft_samples: bool = True
    # offline sigmoid DPO on the filtered annotator pairs with the chosen answer's mean token NLL added at this weight
    # (RPO: Pang et al. 2024's weight 1, not tuned here): the `dpo_sigmoid_nll` stage; 0 = no such stage. Plain DPO
    # on these pairs widens its margin by pushing the rejected answers down and barely raises the chosen ones
    # (likelihood displacement, docs/lab.md), so its gold gain is the size of the spread between draws
    dpo_nll_coef: float = 1.0
    dpo_steps: int = 60
    dpo_batch: int = 32
    dpo_lr: float = 5e-5
    dpo_eval_every: int = 20
    # sampled answers per held-out request at each DPO evaluation (the SFT model's reference answers alike). Four, as
    # PPO's, left offline DPO's effect on the gold win rate (about +0.06) inside the evaluation's noise (±0.057); 16
    # narrow the interval to about ±0.03 (measured on two of issue 59's design draws; docs/lab.md "The lessons over
    # draws"), the measurement's power, not the effect's size
    dpo_eval_samples: int = 16
    dpo_online_rounds: int = 6  # dpo_steps / rounds steps on each round's pairs
    dpo_online_prompts: int = 192
    dpo_online_keep_truncated: bool = False  # the quick lab's tiny model often runs past 64 tokens
    # agents (docs/agents.md): tool-use demonstrations on top of the SFT model, then GRPO with an environment.
    # calculator: calc_tool_fraction of arith demonstrations call `calc`; GRPO is rewarded on the final answer only.
    # shop: demonstrators order and report (some check the stock first, lazy ones claim without ordering, careless
    # ones claim after a refusal); one GRPO run rewards the state (the order table), one the claim.
    agent_stages: bool = True
    calc_sft_examples: int = 1500
    calc_tool_fraction: float = 0.5
    calc_sft_steps: int = 150
    shop_sft_examples: int = 1200
    shop_rl_prompts: int = 600
    shop_eval_requests: int = 100
    shop_lazy_fraction: float = 0.25
    shop_check_fraction: float = 0.25
    shop_careless_fraction: float = 0.4
    shop_sft_steps: int = 100
    agent_sft_lr: float = 1e-3
    agent_steps: int = 20
    agent_prompts_per_step: int = 16
    agent_group_size: int = 8
    agent_temperature: float = 0.7  # at T = 1 most of this tiny model's JSON tool calls are malformed (docs/agents.md)
    calc_lr: float = 5e-5
    shop_lr: float = 1e-4
    agent_eval_every: int = 5
    # sampled held-out episodes per request at agent_temperature, beside the greedy one: GRPO raises the expected
    # reward of the policy it samples; greedy decoding of a tiny model flips between behaviours (docs/lab.md)
    agent_eval_samples: int = 2
    calc_eval_problems: int = 100
    # evaluation
    eval_arith: int = 200  # held-out problems (at most world.n_eval_arith)
    assist_samples: int = 4  # sampled answers per held-out request (plus one greedy)
    sample_temperature: float = 1.0
    seed: int = 0
    # a run too small to learn (the quick lab): said in its first and last lines, so no one reads its figures as
    # the lessons. Measured (docs/lab.md): d 64 on 1 M tokens learns no arithmetic with any recipe tried (greedy
    # accuracy 0-0.017), and the held-out transition that makes arithmetic learnable needs the full lab's 4.1 M
    # tokens (about 270 s of pretraining alone on two cores)
    plumbing_check: bool = False
    # every training stage's precision, a name of PRECISIONS: the lessons are judged in fp32; the other two are
    # measured against it (docs/performance.md "The whole lab in bf16")
    precision: str = "fp32"

    def __post_init__(self):
        if self.precision not in PRECISIONS:
            raise ConfigError(f"LabConfig.precision={self.precision!r}: one of {', '.join(PRECISIONS)}")


PLUMBING_NOTE = (
    "a plumbing check: every stage runs end to end, on a model too small to learn (d {hidden}, {tokens:.1f} M "
    "pretraining tokens), so these figures show none of the lab's lessons (SFT above base, GRPO, PPO's KL rope, "
    "reward hacking); `make lab` (about 19 minutes on 2 cores) is the run that shows them"
)


def plumbing_note(cfg: LabConfig) -> str | None:
    """The line a plumbing-check run opens and closes with (None for a run meant to show the lessons)."""
    if not cfg.plumbing_check:
        return None
    tokens = cfg.pretrain_steps * cfg.pretrain_batch * cfg.pack_length / 1e6
    return PLUMBING_NOTE.format(hidden=cfg.hidden, tokens=tokens)


QUICK = LabConfig(
    world=WorldConfig(
        n_pretrain_arith=3000,
        n_pretrain_assist=3000,
        n_sft_arith=800,
        n_sft_arith_direct=1200,
        n_sft_assist=800,
        n_rl_arith=300,
        n_pairs=600,
        n_pairs_eval=100,
        n_rankings=50,
    ),
    vocab_size=768,
    hidden=64,
    layers=2,
    heads=2,
    pretrain_steps=500,
    pretrain_batch=8,
    sft_steps=80,
    sft_batch=32,
    rm_epochs=1.0,
    eval_arith=60,
    assist_samples=2,
    ppo_kl_coefs=(0.0, 0.2),
    ppo_steps=6,
    ppo_prompts_per_step=16,
    ppo_eval_every=3,
    ppo_eval_samples=1,
    grpo_steps=4,
    grpo_prompts_per_step=4,
    grpo_group_size=4,
    grpo_eval_every=2,
    grpo_eval_problems=20,
    grpo_eval_samples=2,
    dpo_losses=("sigmoid", "simpo"),
    dpo_steps=4,
    dpo_batch=8,
    dpo_eval_every=2,
    dpo_eval_samples=1,
    dpo_online_rounds=2,
    dpo_online_prompts=8,
    dpo_online_keep_truncated=True,
    calc_sft_examples=200,
    calc_sft_steps=10,
    shop_sft_examples=200,
    shop_rl_prompts=40,
    shop_eval_requests=16,
    shop_sft_steps=10,
    agent_steps=2,
    agent_prompts_per_step=4,
    agent_group_size=4,
    agent_eval_every=1,
    calc_eval_problems=16,
    plumbing_check=True,
)


def lab_settings(items: list[str]) -> dict:
    """``FIELD=VALUE`` items (`tether lab --set`, examples/lab_seeds.py --set) as LabConfig values, each parsed as
    its field's default is typed (a bool: 1/true/yes or 0/false/no). Fields that are not one number, flag or text
    (the world, tuples) and ``seed`` (its own option) are refused, naming the item."""
    defaults = {f.name: f.default for f in fields(LabConfig)}
    out = {}
    for item in items:
        name, eq, value = item.partition("=")
        default = defaults.get(name)
        if not eq or not isinstance(default, (int, float, str)) or name == "seed":
            raise ConfigError(
                f"--set {item}: expected FIELD=VALUE with FIELD a number, flag or text field of "
                "LabConfig (tether/lab/settings.py), other than seed"
            )
        try:
            if isinstance(default, bool):
                if value.lower() not in ("1", "true", "yes", "0", "false", "no"):
                    raise ValueError(value)
                out[name] = value.lower() in ("1", "true", "yes")
            else:
                out[name] = type(default)(value)
        except ValueError:
            wanted = (
                "true or false"
                if isinstance(default, bool)
                else "an integer"
                if isinstance(default, int)
                else "a number"
                if isinstance(default, float)
                else "text"
            )
            raise ConfigError(f"--set {item}: {name} must be {wanted}, got {value!r}") from None
    return out
