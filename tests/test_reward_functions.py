"""Python reward functions: loading, the signature check and dry run, errors handled as documented."""
import sys
import textwrap

import pytest

from tether.config import ConfigError
from tether.rewards import RewardSet, parse_reward_specs
from tether.rewards.functions import RewardFunctionError

ROWS = [{"prompt": "What is 2+2?", "answer": "4"}, {"prompt": "What is 3+3?", "answer": "6"}]


@pytest.fixture
def reward_file(tmp_path):
    path = tmp_path / "my_rewards.py"
    path.write_text(textwrap.dedent('''
        def exact(completions, answer):
            return [1.0 if c.strip() == a else 0.0 for c, a in zip(completions, answer)]

        def length(completion_ids, **kwargs):
            assert "answer" in kwargs and "prompts" in kwargs
            return [float(len(ids)) for ids in completion_ids]

        def needs_missing(completions, solution):
            return [0.0] * len(completions)

        def raises(completions):
            if any(completions):
                raise ValueError("boom")
            return [0.0] * len(completions)

        def wrong_count(completions):
            return [1.0]

        def not_a_number(completions):
            return ["yes"] * len(completions)

        def nan(completions):
            return [float("nan")] * len(completions)

        def steps(completions):
            return [[0.5, 1.0] for _ in completions]
    '''))
    return path


def rewards(path, *names, **kw):
    return RewardSet(parse_reward_specs([f"{path}:{n}" for n in names]), columns=["prompt", "answer"], **kw)


def test_functions_get_the_columns_they_declare_and_weights_sum(reward_file):
    rs = RewardSet(parse_reward_specs([f"{reward_file}:exact=2", f"{reward_file}:length=0.5"]), columns=["prompt", "answer"])
    rs.check(ROWS)
    parts = rs.score(ROWS, ["4", "7"], [[5, 6, 7], [8]], [False, True])
    assert parts == {"exact": [1.0, 0.0], "length": [3.0, 1.0]}
    assert rs.total(parts).tolist() == [2 * 1 + 0.5 * 3, 2 * 0 + 0.5 * 1]


def test_missing_column_is_reported_before_training(reward_file):
    with pytest.raises(ConfigError, match=r"needs_missing needs \['solution'\].*columns \['answer', 'prompt'\]"):
        rewards(reward_file, "needs_missing").check(ROWS)


def test_wrong_count_and_non_numbers_fail_the_dry_run(reward_file):
    with pytest.raises(ConfigError, match="wrong_count returned 1 values for 2 completions"):
        rewards(reward_file, "wrong_count").check(ROWS)
    with pytest.raises(ConfigError, match="not_a_number: value 0 is 'yes'"):
        rewards(reward_file, "not_a_number").check(ROWS)
    with pytest.raises(ConfigError, match="not finite"):
        rewards(reward_file, "nan").check(ROWS)


def test_a_raising_function_stops_the_run_or_is_scored_and_counted(reward_file):
    strict = rewards(reward_file, "raises")
    strict.check(ROWS)  # empty completions: fine
    with pytest.raises(RewardFunctionError, match=r"raises raised ValueError: boom .*first prompt: 'What is 2\+2\?'"):
        strict.score(ROWS, ["x", "y"], [[1], [2]], [False, False])
    lenient = rewards(reward_file, "raises", on_error="score", error_score=-1.0)
    assert lenient.score(ROWS, ["x", "y"], [[1], [2]], [False, False]) == {"raises": [-1.0, -1.0]}
    assert lenient.components[0].errors == 1


def test_step_scores_are_kept_but_not_summed_for_ppo(reward_file):
    rs = rewards(reward_file, "steps")
    parts = rs.score(ROWS, ["a", "b"], [[1], [2]], [False, False])
    assert parts["steps"] == [[0.5, 1.0], [0.5, 1.0]]
    with pytest.raises(ConfigError, match="process reward"):
        rs.total(parts)


def test_bad_specs_say_what_is_wrong(reward_file, tmp_path):
    with pytest.raises(ConfigError, match="expected module:function"):
        parse_reward_specs(["no_colon"])
    with pytest.raises(ConfigError, match="no file"):
        parse_reward_specs([f"{tmp_path}/absent.py:f"])
    with pytest.raises(ConfigError, match="has no function 'nope'"):
        parse_reward_specs([f"{reward_file}:nope"])
    with pytest.raises(ConfigError, match="cannot import"):
        parse_reward_specs(["surely_not_a_module_xyz:f"])
    with pytest.raises(ConfigError, match="weight after '='"):
        parse_reward_specs([f"{reward_file}:exact=heavy"])


def test_importable_module_spec(reward_file, monkeypatch):
    monkeypatch.syspath_prepend(str(reward_file.parent))
    [component] = parse_reward_specs(["my_rewards:exact=3"])
    assert component.name == "exact" and component.weight == 3.0
    sys.modules.pop("my_rewards", None)
