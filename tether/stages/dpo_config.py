"""Settings of `tether dpo`: the shared sections with DPO's defaults, the loss, and online rounds."""

from __future__ import annotations

import math
from dataclasses import dataclass

from tether.algorithms.choices import LABEL_SMOOTHING_LOSSES, UNPAIRED_LOSSES
from tether.algorithms.choices import PREFERENCE_LOSSES as PAIR_LOSSES
from tether.config import ConfigError, Section, StageConfig, option
from tether.online_sections import JudgeSection, RewardSection, SamplingSection
from tether.sections import AlarmOptions, DataSection, OptimSection, PolicySection, TrainSection

DEFAULT_BETA = {"simpo": 2.0}  # every other loss: 0.1


@dataclass(frozen=True)
class DPOSection(Section):
    """The loss, its coefficients, and the reference log-probs."""

    loss: str = option(
        "sigmoid",
        "sigmoid (DPO), cdpo, robust, ipo (on summed log-ratios, the paper's form), ipo_norm (on "
        "length-normalised ones: TRL's and LLaMA-Factory's ipo), hinge, simpo, orpo, beta_dpo, listwise "
        "(Plackett–Luce over ranked lists), weighted (a sum of losses: --loss-weights), kto (unpaired "
        "true/false labels). Formulas: docs/algorithms.md §6.",
        choices=PAIR_LOSSES + UNPAIRED_LOSSES,
    )
    loss_weights: dict = option(
        {},
        "loss weighted: the losses summed and their weights, NAME=WEIGHT,... of sigmoid, cdpo, robust, ipo, "
        "ipo_norm, hinge, each at the same β (e.g. sigmoid=0.8,ipo_norm=0.2; TRL's loss_type list with "
        "loss_weights). TRL's sft term is --sft-coef.",
    )
    beta: float = option(0.0, "β; 0 = the loss's usual value (0.1; SimPO 2.0). For beta_dpo the base β_0.")
    label_smoothing: float = option(
        0.0, "ε: the assumed rate of flipped labels, read by cdpo and robust only (robust needs 0 < ε < 0.5)."
    )
    simpo_gamma: float = option(0.5, "SimPO's target margin γ.")
    orpo_lambda: float = option(0.1, "ORPO's weight λ on the odds-ratio term.")
    beta_dpo_alpha: float = option(0.6, "β-DPO: β_b = β_0 (1 + α (M_b − M_0)), M_b the step batch's mean margin.")
    beta_dpo_momentum: float = option(0.9, "β-DPO: M_0 and σ are running averages with this momentum.")
    beta_dpo_margin: str = option(
        "scaled",
        "β-DPO's margin M: scaled = β_0 (u_w − u_l) (tether's form so far), unscaled "
        "= u_w − u_l (the authors' released code); docs/algorithms.md §6.",
        choices=("scaled", "unscaled"),
    )
    beta_dpo_weighting: bool = option(
        False, "β-DPO's data weighting: pairs weighted by exp(−(M_i − M_0)²/2σ²), normalised to mean 1 over the step."
    )
    kto_desirable_weight: float = option(
        1.0, "KTO's λ_D, the weight of desirable completions (docs/algorithms.md §6.5)."
    )
    kto_undesirable_weight: float = option(
        1.0, "KTO's λ_U, the weight of undesirable completions; the paper advises λ_D n_D / (λ_U n_U) in [1, 4/3]."
    )
    sft_coef: float = option(
        0.0,
        "Adds this times the chosen response's mean token NLL (RPO), against likelihood "
        "displacement (both chosen and rejected log-probs falling).",
    )
    reference_batch_size: int = option(32, "Preference examples per forward in the one-off reference pass.")
    reference_cache: str = option(
        "",
        "Folder for cached reference log-probs (keyed by data, reference and tokenizer); "
        "default <output>/reference_cache. Point several runs at one folder to share it.",
    )

    def check(self):
        self._check_weights()
        if self.beta < 0:
            raise ConfigError(f"beta={self.beta}: must be > 0 (or 0 for the loss's usual value)")
        if self.loss == "robust" and not 0 < self.label_smoothing < 0.5:
            raise ConfigError(
                f"loss robust needs 0 < label_smoothing < 0.5 (the assumed flip rate), got {self.label_smoothing}"
            )
        if not 0 <= self.label_smoothing < 0.5:
            raise ConfigError(f"label_smoothing={self.label_smoothing}: must be in [0, 0.5)")
        self._check_label_smoothing_is_read()
        if self.sft_coef < 0 or self.reference_batch_size < 1:
            raise ConfigError(
                f"sft_coef={self.sft_coef} must be >= 0 and reference_batch_size={self.reference_batch_size} >= 1"
            )
        if self.kto_desirable_weight <= 0 or self.kto_undesirable_weight <= 0:
            raise ConfigError("kto_desirable_weight and kto_undesirable_weight must be > 0")
        if self.loss == "kto" and self.sft_coef:
            raise ConfigError("loss kto takes no sft_coef (its labels are per completion, so no answer is 'chosen')")
        if not 0 <= self.beta_dpo_momentum < 1:
            raise ConfigError(f"beta_dpo_momentum={self.beta_dpo_momentum}: must be in [0, 1)")

    def _check_label_smoothing_is_read(self) -> None:
        """ε > 0 with a loss whose formula has no ε is refused (LABEL_SMOOTHING_LOSSES): it would change nothing."""
        parts = [name for name, weight in self.loss_weights.items() if weight] if self.loss == "weighted" else []
        if not self.label_smoothing or any(name in LABEL_SMOOTHING_LOSSES for name in (self.loss, *parts)):
            return
        raise ConfigError(
            f"label_smoothing={self.label_smoothing:g}: loss {self.loss} does not read ε; the losses that do are "
            f"{' and '.join(LABEL_SMOOTHING_LOSSES)} (or weighted with one of them among --loss-weights): use --loss "
            "cdpo for conservative DPO (DPO with label smoothing; TRL's sigmoid ignores label_smoothing too), or leave "
            "--label-smoothing out"
        )

    def _check_weights(self) -> None:
        from tether.algorithms.choices import COMPOSABLE_LOSSES

        if (self.loss == "weighted") != bool(self.loss_weights):
            raise ConfigError(
                "loss weighted and loss_weights go together: --loss weighted --loss-weights NAME=WEIGHT,..."
                if self.loss == "weighted"
                else f"loss_weights={self.loss_weights} weigh the parts of --loss weighted, not of {self.loss}"
            )
        for name, weight in self.loss_weights.items():
            if name not in COMPOSABLE_LOSSES:
                raise ConfigError(
                    f"loss_weights: {name!r} cannot be summed with the others; the losses that can are "
                    f"{', '.join(COMPOSABLE_LOSSES)} (pairwise, through the reference, at one β)"
                )
            if (
                isinstance(weight, bool)
                or not isinstance(weight, (int, float))
                or not math.isfinite(weight)
                or weight < 0
            ):
                raise ConfigError(f"loss_weights: {name}={weight!r}: a weight is a finite number >= 0")
        if self.loss_weights and not any(self.loss_weights.values()):
            raise ConfigError(f"loss_weights={self.loss_weights}: every weight is 0")

    @property
    def effective_beta(self) -> float:
        return self.beta or DEFAULT_BETA.get(self.loss, 0.1)


@dataclass(frozen=True)
class OnlineSection(AlarmOptions):
    """Online (iterative) DPO: each round samples group_size = 2 answers for each of the rollout's prompts_per_step
    prompts from the current policy, labels them, and trains steps_per_round steps on those pairs."""

    online: bool = option(
        False,
        "Train on pairs sampled from the current policy each round instead of --data (which "
        "may then be left out; --eval-data still gives held-out pairs).",
        flag="--online",
    )
    rounds: int = option(4, "Online rounds: sample and label, then train steps_per_round steps on that round's pairs.")
    steps_per_round: int = option(4, "Optimizer steps on each round's pairs.")
    keep_truncated: bool = option(
        False,
        "Keep pairs with an answer that hit max_new_tokens (trained as if it had ended "
        "there); by default they are dropped and counted.",
    )
    judge: str = option(
        "",
        "module:function(prompts, first, second, **columns) -> P(first is better) per pair "
        "(1, 0, or 0.5 for a tie); instead of scores.",
        flag="--judge",
    )

    def check(self):
        if self.alarm_final == "best":
            raise ConfigError("alarm_final=best: online DPO keeps no best/; choose last or before")
        if self.rounds < 1 or self.steps_per_round < 1:
            raise ConfigError(f"rounds={self.rounds} and steps_per_round={self.steps_per_round} must be >= 1")


@dataclass(frozen=True)
class DPOConfig(StageConfig):
    model: PolicySection = PolicySection()
    data: DataSection = DataSection()
    dpo: DPOSection = DPOSection()
    rollout: SamplingSection = SamplingSection(prompts_per_step=64, group_size=2, max_new_tokens=128)
    rewards: RewardSection = RewardSection()
    judge: JudgeSection = JudgeSection()
    online: OnlineSection = OnlineSection()
    optim: OptimSection = OptimSection()
    train: TrainSection = TrainSection()

    RENAMED = {
        "rollout.tis_cap": "rollout.is_ratio_max",  # with --off-policy-correction token_truncate
        "dpo.reference": "model.reference",
        "online.prompts": "rollout.prompts",
        "online.prompts_per_round": "rollout.prompts_per_step",
        "online.temperature": "rollout.temperature",
        "online.max_new_tokens": "rollout.max_new_tokens",
        "online.reward_model": "rewards.reward_model",
        "online.reward": "rewards.reward",
        "online.reward_on_error": "rewards.reward_on_error",
        "online.reward_error_score": "rewards.reward_error_score",
        "online.reward_timeout": "rewards.reward_timeout",
        "online.reward_model_weight": "rewards.reward_model_weight",
    }
    OLD_FLAGS = {"--online-prompts": "online.prompts"}

    def check(self):
        from tether.rewards.judge_template import check_judge_config

        check_judge_config(self.judge, "dpo", self.rollout.group_size, other_reward=self.rewards.has_reward())
        if self.rewards.audit:
            raise ConfigError(
                "--audit: the audit of training responses serves tether ppo and tether grpo; online DPO labels pairs "
                "and is not audited yet"
            )
        if self.online.alarm_stops == "trusted":
            raise ConfigError(
                "online.alarm_stops=trusted: online DPO has no trusted check to confirm an alarm (it is not audited "
                "and takes no environment); use any"
            )
        if self.model.offload_frozen:
            raise ConfigError(
                "model.offload_frozen: tether dpo holds no sharded frozen model to offload (its reference "
                "log-probs are computed before training, or each round, by a whole reference, and cached)"
            )
        if self.train.micro_batch_tokens and self.model.fsdp and self.dpo.loss in ("kto", "beta_dpo"):
            raise ConfigError(
                f"dpo.loss={self.dpo.loss} with train.micro_batch_tokens and model.fsdp: the loss's "
                "step-wide pass runs once per micro-batch, and sharded processes must run as many "
                "forwards each; set train.micro_batch_size instead"
            )
        if not self.online.online:
            sampling_only = {
                "--rollout-backend": self.rollout.backend != "hf",
                "--judge": bool(self.online.judge),
                "--judge-model": bool(self.judge.model),
                "--reward / --reward-model": self.rewards.has_reward(),
                "--max-staleness": self.rollout.max_staleness > 0,
            }
            given = [flag for flag, set_ in sampling_only.items() if set_]
            if given:
                raise ConfigError(
                    f"{', '.join(given)}: online DPO's (--online: pairs sampled and labelled each round); offline "
                    "DPO trains on the pairs in --data and samples nothing, so they would have no effect"
                )
        if self.online.online:
            if self.dpo.loss == "kto":
                raise ConfigError(
                    "dpo.loss=kto with online.online: online rounds make pairs; use a pairwise loss "
                    "(kto reads unpaired labels from --data)"
                )
            if self.dpo.loss == "listwise":
                raise ConfigError(
                    "dpo.loss=listwise with online.online: online rounds make pairs; use a pairwise loss "
                    "(listwise needs ranked lists in --data)"
                )
            if self.rollout.group_size != 2:
                raise ConfigError(
                    f"rollout.group_size={self.rollout.group_size}: online DPO samples two answers per prompt"
                )
            if not (self.online.judge or self.judge.model or self.rewards.has_reward()):
                raise ConfigError(
                    "online.online needs a labeller: --judge module:function, --judge-model DIR, --reward-model or "
                    "--reward"
                )
            if self.online.judge and self.judge.model:
                raise ConfigError(
                    "online.judge (a Python function) and judge.model (a language model) both label pairs; choose one"
                )
            if self.rollout.off_policy_correction:
                raise ConfigError(
                    f"rollout.off_policy_correction={self.rollout.off_policy_correction}: online DPO's loss has no "
                    "sampling ratio to weight (its pairs are labelled, not scored by log-probs under the sampler); "
                    "leave it empty"
                )
            if self.online.judge and self.rewards.has_reward():
                raise ConfigError(
                    "online.judge and a reward (rewards.reward_model / rewards.reward) both label pairs; choose one"
                )

    @property
    def total_steps_online(self) -> int:
        return self.online.rounds * self.online.steps_per_round
