"""Settings of `tether sft` (kept apart from the stage so that `--help` needs neither torch nor transformers)."""

from __future__ import annotations

from dataclasses import dataclass

from tether.config import StageConfig
from tether.sections import ModelSection, OptimSection, SFTDataSection, TrainSection


@dataclass(frozen=True)
class SFTConfig(StageConfig):
    model: ModelSection = ModelSection()
    data: SFTDataSection = SFTDataSection()
    optim: OptimSection = OptimSection()
    train: TrainSection = TrainSection()
