"""Settings of `tether rm` (kept apart from the stage so that `--help` needs neither torch nor transformers)."""

from __future__ import annotations

from dataclasses import dataclass

from tether.config import ConfigError, Section, StageConfig, option
from tether.sections import DataSection, ModelSection, OptimSection, TrainSection


@dataclass(frozen=True)
class RMDataSection(DataSection):
    """Preference data: pairs or ranked lists (docs/reward-models.md), plus margins, probes and normalisation rows."""

    margin_column: str = option(
        "", "Column with a per-pair margin m >= 0 for -log σ(r_w - r_l - m) (Llama 2). Empty: no margin."
    )
    probe_path: str = option(
        "", "Your own probe pairs (prompt, original, modified, probe) to measure score shifts after training."
    )
    norm_path: str = option(
        "", "Reference preferences whose responses give the normalisation mean/std; default: the held-out set."
    )


@dataclass(frozen=True)
class RMSection(Section):
    """Reward-model objective, heads and over-fitting detection."""

    heads: list = option(
        ["reward"],
        "Head names. The first learns from chosen/rejected; each other head H from column H "
        "('chosen', 'rejected' or null per row).",
    )
    ranking_loss: str = option(
        "plackett-luce",
        "Loss for ranked lists: plackett-luce or all-pairs (InstructGPT).",
        choices=("plackett-luce", "all-pairs"),
    )
    center_coef: float = option(
        0.0, "Reward centring η: adds η (r_w + r_l)² per pair (Eisenstein et al. 2023; pairs only). Typical 0.01."
    )
    overfit_drop: float = option(0.02, "Over-fitting alarm: validation accuracy this far below its best ...")
    overfit_patience: int = option(3, "... for this many evaluations in a row.")
    early_stop: bool = option(False, "Stop training when the over-fitting alarm fires.")

    def check(self):
        if not self.heads or len(set(self.heads)) != len(self.heads):
            raise ConfigError(f"heads={self.heads}: give one or more distinct names")
        if self.center_coef < 0 or self.overfit_drop < 0 or self.overfit_patience < 1:
            raise ConfigError("center_coef and overfit_drop must be >= 0, overfit_patience >= 1")


@dataclass(frozen=True)
class RMConfig(StageConfig):
    model: ModelSection = ModelSection()
    data: RMDataSection = RMDataSection(eval_fraction=0.1)
    rm: RMSection = RMSection()
    optim: OptimSection = OptimSection()
    train: TrainSection = TrainSection()

    def check(self):
        self.model.refuse_chunked_head("tether rm")
