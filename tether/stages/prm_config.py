"""Settings of `tether prm` (kept apart from the stage so that `--help` needs neither torch nor transformers)."""

from __future__ import annotations

from dataclasses import dataclass

from tether.config import ConfigError, StageConfig, option
from tether.sections import DataSection, ModelSection, OptimSection, TrainSection


@dataclass(frozen=True)
class PRMDataSection(DataSection):
    """Step-labelled solutions: prompt, completions (a list of steps) or completion (cut at step_separator), labels
    (one per step: true/false or a number in [0, 1]) (docs/reward-models.md, "Process reward models")."""

    step_separator: str = option(
        "\n",
        "What ends each step in the text the model scores (and cuts a 'completion' string into steps); the step's "
        "score is read at its last token.",
    )

    def check(self):
        super().check()
        if not self.step_separator:
            raise ConfigError("step_separator must not be empty: each step is scored at the end of its separator")


@dataclass(frozen=True)
class PRMConfig(StageConfig):
    model: ModelSection = ModelSection()
    data: PRMDataSection = PRMDataSection(eval_fraction=0.1)
    optim: OptimSection = OptimSection(lr=1e-5)
    train: TrainSection = TrainSection()

    def check(self):
        self.model.refuse_chunked_head("tether prm")
