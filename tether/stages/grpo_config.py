"""Settings of `tether grpo`: the shared sections with the group family's defaults, and its own pieces.

A recipe (tether/stages/grpo_recipes.py) presets the pieces; any flag or YAML value overrides it, but a recipe named
by a flag or keyword is applied over a --config file's (or a config object's) values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from tether.algorithms.choices import ADVANTAGE_ESTIMATORS, AGGREGATIONS, RATIOS
from tether.config import ConfigError, StageConfig, option
from tether.online_sections import (
    AgentSection,
    JudgeSection,
    PolicyUpdateSection,
    RewardSection,
    SamplingSection,
    check_best_and_alarms,
)
from tether.sections import OnlineRunSection, OptimSection, PolicySection
from tether.stages.grpo_recipes import RECIPES


@dataclass(frozen=True)
class GroupSection(PolicyUpdateSection):
    """The pieces a recipe composes (docs/algorithms.md §5); a recipe sets them, any flag overrides."""

    recipe: str = option(
        "grpo",
        "Named composition: grpo, dr_grpo, dapo, gspo, rloo, reinforce_pp (`tether recipes`).",
        flag="--recipe",
        choices=tuple(RECIPES),
    )
    advantage: str = option(
        "group", "group (std-scaled), group_no_std, rloo, reinforce_pp.", choices=ADVANTAGE_ESTIMATORS
    )
    std_eps: float = option(1e-4, "ε added to the group std (equal scores give 0, never 0/0).")
    ratio: str = option(
        "token",
        "Importance ratio: token (PPO/GRPO), sequence (GSPO), sequence_token (GSPO-token).",
        choices=tuple(RATIOS),
    )
    aggregation: str = option("seq-mean-token-mean", "How token terms become the loss.", choices=AGGREGATIONS)
    norm_length: int = option(0, "L of seq-mean-token-sum-norm; 0 = max_new_tokens.")
    kl_in_reward: float = option(
        0.0, "β of the per-token KL penalty folded into the rewards (reinforce_pp's estimator only); 0 = none."
    )
    dynamic_sampling: bool = option(
        False,
        "Drop groups whose scores are all equal and sample more prompts to fill the step. With --max-staleness the "
        "later rounds draw from a top-up stream of the prompts, so each step's first round is drawn ahead.",
    )
    max_sampling_rounds: int = option(
        3,
        "Dynamic sampling: most generation rounds per step; a step short of groups "
        "after them trains on what it has (logged).",
    )
    mask_truncated: bool = option(False, "Give truncated responses no loss (DAPO's overlong filtering).")
    micro_batch_size: int = option(
        32,
        "Responses per forward/backward within an optimizer update (the offline stages' micro_batch_size: one name per concept).",
    )

    def check(self):
        super().check()
        if self.kl_in_reward < 0 or self.micro_batch_size < 1 or self.max_sampling_rounds < 1 or self.norm_length < 0:
            raise ConfigError(
                f"kl_in_reward={self.kl_in_reward} must be >= 0, micro_batch_size={self.micro_batch_size} and "
                f"max_sampling_rounds={self.max_sampling_rounds} >= 1, norm_length={self.norm_length} >= 0"
            )
        if self.kl_in_reward > 0 and self.advantage != "reinforce_pp":
            raise ConfigError(
                f"kl_in_reward={self.kl_in_reward} folds the KL into token rewards, which only the "
                f"reinforce_pp advantage reads; advantage={self.advantage!r} would ignore it "
                "(use kl_coef for a KL term in the loss)"
            )


@dataclass(frozen=True)
class GRPOConfig(StageConfig):
    # a group's responses after one copy of its prompt pays with long prompts (0.44x a step with 160-word contexts)
    # and not with the lab's 20-token ones (1.06x: the wider rows' attention costs what the positions save), so
    # it is asked for (--share-prompt), not the default (docs/performance.md)
    model: PolicySection = PolicySection(share_prompt=False)
    rewards: RewardSection = RewardSection()
    judge: JudgeSection = JudgeSection()
    rollout: SamplingSection = SamplingSection(prompts_per_step=16, group_size=8, max_new_tokens=128)
    algo: GroupSection = GroupSection(kl_coef=0.04, kl_estimator="k3")
    optim: OptimSection = OptimSection(lr=1e-6, weight_decay=0.01, lr_schedule="constant", warmup_ratio=0.0)
    agent: AgentSection = AgentSection()
    train: OnlineRunSection = OnlineRunSection(
        max_steps=100, eval_every=10, save_every=20, keep_checkpoints=1, log_every=5
    )

    RENAMED = {
        "rollout.tis_cap": "rollout.is_ratio_max",  # with --off-policy-correction token_truncate
        "model.policy": "model.path",
        "algo.lr": "optim.lr",
        "algo.warmup_steps": "optim.warmup_steps",
        "algo.max_grad_norm": "optim.max_grad_norm",
        "algo.inner_iterations": "algo.update_epochs",
        "algo.overlong_cache": "rewards.overlong_cache",
        "run.steps": "train.max_steps",
        "run.*": "train.*",
        "algo.micro_batch": "algo.micro_batch_size",
    }

    PRESET_KEY: ClassVar[str] = "algo.recipe"

    @classmethod
    def preset(cls, values: dict[str, Any]) -> dict[str, Any]:
        name = values.get("algo.recipe", "grpo")
        if name not in RECIPES:
            raise ConfigError(f"algo.recipe={name!r} is not one of {', '.join(RECIPES)}")
        return dict(RECIPES[name].settings)

    def check(self):
        from tether.rewards.judge_template import check_judge_config

        check_judge_config(self.judge, "grpo", self.rollout.group_size, self.agent.env)
        self.model.refuse_chunked_head("tether grpo")
        if self.rollout.group_size < 2:
            raise ConfigError(
                f"rollout.group_size={self.rollout.group_size}: a group baseline needs at least two responses"
            )
        self.rewards.overlong_tokens(self.rollout.max_new_tokens)
        self.agent.check_rewards(self.rewards)
        check_best_and_alarms(self)

    @property
    def norm_length(self) -> int:
        """L of seq-mean-token-sum-norm: algo.norm_length, or the response budget."""
        return self.algo.norm_length or self.rollout.max_new_tokens

    def needs_reference(self) -> bool:
        return self.algo.kl_coef > 0 or self.algo.kl_in_reward > 0
