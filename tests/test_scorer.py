"""One scorer for every online stage: EOS and truncation rules, sampled token ids, parts, shaping, process rewards."""

import pytest
import torch

from tether.config import ConfigError
from tether.online_sections import RewardSection
from tether.rewards.functions import RewardComponent, RewardFunctionError, RewardSet
from tether.rewards.score import Scorer
from tether.rollout.batch import Rollout


class Tok:
    eos_token = "</s>"


def rollout():
    """Two responses: the first ended with its stop token (id 2), the second hit the budget of 3 tokens."""
    return Rollout(
        prompt_ids=torch.tensor([[5, 6], [5, 7]]),
        prompt_mask=torch.ones(2, 2, dtype=torch.long),
        response_ids=torch.tensor([[9, 2, 0], [8, 8, 8]]),
        response_mask=torch.tensor([[1, 1, 0], [1, 1, 1]]),
        truncated=torch.tensor([False, True]),
        prompts=["Q1 ", "Q2 "],
        responses=["a", "bbb"],
    )


def test_reward_model_sees_eos_only_after_finished_responses_and_functions_get_the_sampled_ids():
    seen = {}

    def rm(texts):
        seen["texts"] = texts
        return [1.0, 2.0]

    def length(completion_ids, truncated):
        seen["ids"], seen["truncated"] = completion_ids, truncated
        return [float(len(ids)) for ids in completion_ids]

    rewards = RewardSet([RewardComponent("length", length, 0.5)], columns=["prompt"])
    scores = Scorer(RewardSection(reward_model_weight=2.0), 3, Tok(), rewards, rm)(
        rollout(), [{"prompt": "Q1"}, {"prompt": "Q2"}]
    )
    assert seen["texts"] == ["Q1 a</s>", "Q2 bbb"]  # no EOS appended to the truncated answer
    assert seen["ids"] == [[9, 2], [8, 8, 8]] and seen["truncated"] == [
        False,
        True,
    ]  # the sampled ids, stop token included
    assert scores.total.tolist() == [2 * 1.0 + 0.5 * 2, 2 * 2.0 + 0.5 * 3]  # 3.0, 5.5
    assert set(scores.parts) == {"reward_model", "length"} and scores.step_scores is None and scores.has_outcome


def test_shaping_overlong_then_truncation_penalty_then_clip():
    const = RewardSet([RewardComponent("const", lambda completions: [4.0, 4.0])], columns=["prompt"])
    rows = [{"prompt": "Q1"}, {"prompt": "Q2"}]
    # overlong over the last 2 of 3 tokens: length 2 → (1 − 2)/2 = −0.5; length 3 → (1 − 3)/2 = −1
    scores = Scorer(RewardSection(overlong_cache=2), 3, Tok(), const)(rollout(), rows)
    assert scores.total.tolist() == [3.5, 3.0] and scores.parts["overlong"].tolist() == [-0.5, -1.0]
    shaped = Scorer(RewardSection(penalize_truncated=True, truncation_penalty=-1.0, reward_clip=2.0), 3, Tok(), const)
    assert shaped(rollout(), rows).total.tolist() == [2.0, -1.0]  # 4 clipped to 2; the truncated one gets −1


def test_process_rewards_are_kept_apart_and_refused_where_one_score_is_needed():
    steps = RewardSet([RewardComponent("steps", lambda completions: [[1.0, 0.0], [0.5]], 2.0)], columns=["prompt"])
    rows = [{"prompt": "Q1"}, {"prompt": "Q2"}]
    scores = Scorer(RewardSection(), 3, Tok(), steps)(rollout(), rows)
    assert scores.step_scores == [[2.0, 0.0], [1.0]] and not scores.has_outcome
    assert scores.parts["steps"].tolist() == [1.0, 0.5] and scores.flat().tolist() == [2.0, 1.0]
    with pytest.raises(ConfigError, match="Process rewards are for `tether grpo`"):
        Scorer(RewardSection(), 3, Tok(), steps, allow_process=False)(rollout(), rows)
    with pytest.raises(ConfigError, match="a reward is required"):
        Scorer(RewardSection(), 3, Tok(), None)


def test_a_process_rewards_no_opinion_is_no_steps_and_a_mix_of_kinds_is_refused():
    """None from a process reward: no step scores for that completion (counted), not a crash on a 0.0 row. A
    function returning a score for one completion and step scores for another is named."""
    rows = [{"prompt": "Q1"}, {"prompt": "Q2"}]
    steps = RewardSet([RewardComponent("steps", lambda completions: [[1.0, 0.5], None])], columns=["prompt"])
    scores = Scorer(RewardSection(), 3, Tok(), steps)(rollout(), rows)
    assert scores.step_scores == [[1.0, 0.5], []] and steps.components[0].nones == 1
    mixed = RewardSet([RewardComponent("mixed", lambda completions: [[1.0, 0.5], 0.3])], columns=["prompt"])
    with pytest.raises(RewardFunctionError, match="mixed returned a score for some completions and a list of step"):
        Scorer(RewardSection(), 3, Tok(), mixed)(rollout(), rows)


def test_the_truncation_penalty_beside_a_process_reward_alone_is_an_outcome():
    """GRPO adds the outcome's advantages to the steps' only when there is an outcome: with a process reward alone
    the truncation penalty (the second response hit the budget) is that outcome, else it would change nothing."""
    rows = [{"prompt": "Q1"}, {"prompt": "Q2"}]
    steps = RewardSet([RewardComponent("steps", lambda completions: [[1.0, 1.0], [1.0, 1.0]])], columns=["prompt"])
    penalised = Scorer(RewardSection(penalize_truncated=True, truncation_penalty=-1.0), 3, Tok(), steps)
    scores = penalised(rollout(), rows)
    assert scores.has_outcome and scores.total.tolist() == [0.0, -1.0]
    assert not Scorer(RewardSection(), 3, Tok(), steps)(rollout(), rows).has_outcome


def test_a_step_where_every_reward_function_has_no_opinion_stops_with_the_step_named():
    rows = [{"prompt": "Q1"}, {"prompt": "Q2"}]
    picky = RewardSet(
        [RewardComponent("picky", lambda completions: [1.0 if c == "yes" else None for c in completions])],
        columns=["prompt"],
    )
    picky.trainer_state.global_step = 6
    scorer = Scorer(RewardSection(), 3, Tok(), picky)
    with pytest.raises(RewardFunctionError, match=r"picky\) returned None .* for all 2 completions of step 7"):
        scorer(rollout(), rows)

    # with a process reward model beside it the step still has a score: 0.9 a step, min over the steps
    class StepModel:
        step_separator, reads_images = "\n", False

        def __call__(self, texts, ends):
            return [[0.9] * len(e) for e in ends]

    aggregated = RewardSection(process_reward_aggregation="min", step_pattern="$")  # one step: the response
    total = Scorer(aggregated, 3, Tok(), picky, process_model=StepModel())(rollout(), rows).total
    torch.testing.assert_close(total, torch.tensor([0.9, 0.9]), rtol=0, atol=0)
    # and with a reward model
    assert Scorer(RewardSection(), 3, Tok(), picky, lambda texts: [1.0, 2.0])(rollout(), rows).total.tolist() == [
        1.0,
        2.0,
    ]
