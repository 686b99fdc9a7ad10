"""Settings of `tether dpo`, each documented once (this text is the --help)."""
from __future__ import annotations

from dataclasses import dataclass

from tether.algorithms.preference import PAIR_LOSSES
from tether.config import ConfigError, option
from tether.sections import ModelSection, OptimSection, PreferenceDataSection, RewardFunctionOptions, TrainSection

DEFAULT_BETA = {"simpo": 2.0}  # every other loss: 0.1


@dataclass(frozen=True)
class DPOSection:
    """The loss, its coefficients, and the reference."""

    loss: str = option("sigmoid", "sigmoid (DPO), cdpo, robust, ipo, hinge, simpo, orpo, beta_dpo, listwise "
                                  "(Plackett–Luce over ranked lists). Formulas: docs/dpo.md.",
                       choices=PAIR_LOSSES)
    beta: float = option(0.0, "β; 0 = the loss's usual value (0.1; SimPO 2.0). For beta_dpo the base β_0.")
    label_smoothing: float = option(0.0, "ε: the assumed rate of flipped labels (cdpo, robust; robust needs 0 < ε < 0.5).")
    simpo_gamma: float = option(0.5, "SimPO's target margin γ.")
    orpo_lambda: float = option(0.1, "ORPO's weight λ on the odds-ratio term.")
    beta_dpo_alpha: float = option(0.6, "β-DPO: β_b = β_0 (1 + α (M_b − M_0)), M_b the step batch's mean margin.")
    beta_dpo_momentum: float = option(0.9, "β-DPO: M_0 and σ are running averages with this momentum.")
    beta_dpo_weighting: bool = option(False, "β-DPO's data weighting: pairs weighted by exp(−(M_i − M_0)²/2σ²), "
                                             "normalised to mean 1 over the step.")
    sft_coef: float = option(0.0, "Adds this times the chosen response's mean token NLL (RPO), against likelihood "
                                  "displacement (both chosen and rejected log-probs falling).")
    reference: str = option("", "Reference model folder; default the --model folder (with LoRA: the adapter-disabled "
                                "model). Not used by simpo and orpo.")
    reference_batch_size: int = option(32, "Preference examples per forward in the one-off reference pass.")
    reference_cache: str = option("", "Folder for cached reference log-probs (keyed by data, reference and tokenizer); "
                                      "default <output>/reference_cache. Point several runs at one folder to share it.")

    def __post_init__(self):
        if self.beta < 0:
            raise ConfigError(f"beta={self.beta}: must be > 0 (or 0 for the loss's usual value)")
        if self.loss == "robust" and not 0 < self.label_smoothing < 0.5:
            raise ConfigError("loss robust needs 0 < label_smoothing < 0.5 (the assumed flip rate)")
        if not 0 <= self.label_smoothing < 0.5:
            raise ConfigError(f"label_smoothing={self.label_smoothing}: must be in [0, 0.5)")
        if self.sft_coef < 0 or self.reference_batch_size < 1:
            raise ConfigError("sft_coef must be >= 0 and reference_batch_size >= 1")
        if not 0 <= self.beta_dpo_momentum < 1:
            raise ConfigError("beta_dpo_momentum must be in [0, 1)")

    @property
    def effective_beta(self) -> float:
        return self.beta or DEFAULT_BETA.get(self.loss, 0.1)


@dataclass(frozen=True)
class OnlineSection(RewardFunctionOptions):
    """Online (iterative) DPO: sample two answers per prompt from the current policy, label them, train, repeat."""

    online: bool = option(False, "Train on pairs sampled from the current policy each round instead of --data (which "
                                 "may then be left out; --eval-data still gives held-out pairs).",
                          flag="--online")
    prompts: str = option("", "Prompt file for online rounds: a 'prompt' column and any columns the labeller needs.",
                          flag="--online-prompts")
    rounds: int = option(4, "Online rounds: sample and label, then train steps_per_round steps on that round's pairs.")
    prompts_per_round: int = option(64, "Prompts sampled per round (two answers each).")
    steps_per_round: int = option(4, "Optimizer steps on each round's pairs.")
    temperature: float = option(1.0, "Sampling temperature of the online answers.")
    max_new_tokens: int = option(128, "Answer budget; pairs with an answer that hits it are dropped and counted ...")
    keep_truncated: bool = option(False, "... unless this is set: then a cut-off answer is trained as if it had ended there.")
    judge: str = option("", "module:function(prompts, first, second, **columns) -> P(first is better) per pair "
                            "(1, 0, or 0.5 for a tie); instead of scores.", flag="--judge")
    reward_model: str = option("", "A `tether rm` folder; the higher-scored answer is chosen.", flag="--reward-model")
    stop_on_alarm: bool = option(False, "Stop after the round in which a reward-hacking monitor raises an alarm "
                                        "(docs/monitors.md); the round's answers go to samples.jsonl with their label "
                                        "(1 chosen, 0 rejected, 0.5 tie) or score as `score`.")

    def __post_init__(self):
        if self.rounds < 1 or self.prompts_per_round < 1 or self.steps_per_round < 1 or self.max_new_tokens < 1:
            raise ConfigError("rounds, prompts_per_round, steps_per_round and max_new_tokens must be >= 1")
        if self.temperature <= 0:
            raise ConfigError("the online temperature must be > 0")


@dataclass(frozen=True)
class DPOConfig:
    model: ModelSection = ModelSection()
    data: PreferenceDataSection = PreferenceDataSection()
    dpo: DPOSection = DPOSection()
    online: OnlineSection = OnlineSection()
    optim: OptimSection = OptimSection()
    train: TrainSection = TrainSection()
