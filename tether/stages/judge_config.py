"""Settings of `tether judge` (kept apart from the stage so that `--help` needs neither torch nor transformers)."""

from __future__ import annotations

from dataclasses import dataclass

from tether.config import StageConfig
from tether.online_sections import JudgePromptSection
from tether.sections import DataSection, ModelSection, OptimSection, TrainSection


@dataclass(frozen=True)
class JudgeConfig(StageConfig):
    model: ModelSection = ModelSection()
    data: DataSection = DataSection(eval_fraction=0.1)
    judge: JudgePromptSection = JudgePromptSection(template="pairwise")
    optim: OptimSection = OptimSection()
    train: TrainSection = TrainSection()

    def check(self):
        from tether.rewards.judge_template import JudgeTemplate

        template = JudgeTemplate.load(self.judge.template or "pairwise", self.model.path)
        if template.mode != "pairwise" or template.read != "probs":
            from tether.config import ConfigError

            raise ConfigError(
                f"judge.template={self.judge.template!r} is a {template.mode} template read from {template.read}: "
                "`tether judge` trains a pairwise verdict read from its probabilities (mode: pairwise, read: probs)"
            )
