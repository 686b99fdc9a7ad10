"""The lab's noise (tether/lab/stats.py): each interval, standard error and noise rule on hand-computed cases."""

import pytest

from tether.lab.stats import (
    bootstrap_interval,
    difference_noise,
    format_interval,
    intervals_apart,
    logged_interval,
    mean_standard_error,
    rate_difference_noise,
    rate_interval95,
)


def test_bootstrap_interval_resamples_prompts_not_answers():
    # Two prompts with means 0 and 1: a resample's mean is 0, ½ or 1 with chances ¼, ½, ¼, so the 2.5 % and
    # 97.5 % quantiles are 0 and 1.
    assert bootstrap_interval([[0.0, 0.0], [1.0, 1.0]]) == (0.0, 1.0)
    # Resampling answers one by one would see 4 independent draws and a narrower interval; by prompt, four answers
    # that always move together give the same interval as two answers.
    assert bootstrap_interval([[0.0] * 4, [1.0] * 4]) == bootstrap_interval([[0.0], [1.0]])
    # 40 prompts, half 0 and half 1: mean ½, standard error ½/√40 ≈ 0.079, interval about ½ ± 0.155.
    low, high = bootstrap_interval([[0.0]] * 20 + [[1.0]] * 20)
    assert low == pytest.approx(0.5 - 0.155, abs=0.03) and high == pytest.approx(0.5 + 0.155, abs=0.03)


def test_the_standard_error_of_a_mean_by_hand():
    # 1, 0.5, 0: mean 0.5, s² = (0.25 + 0 + 0.25)/2 = 0.25, standard error √(0.25/3) = 0.288675
    assert mean_standard_error([1.0, 0.5, 0.0]) == pytest.approx(0.288675, abs=1e-6)
    assert mean_standard_error([0.7]) == 0.0 and mean_standard_error([]) == 0.0


def test_the_interval_of_a_rate_by_hand():
    # 1.96 √(0.5 × 0.5/100) = 1.96 × 0.05 = 0.098
    assert rate_interval95(0.5, 100) == pytest.approx(0.098, abs=1e-12)
    # 1.96 √(0.2 × 0.8/25) = 1.96 × 0.08 = 0.1568; no prompts counts as one: 1.96 × 0.5 = 0.98
    assert rate_interval95(0.2, 25) == pytest.approx(0.1568, abs=1e-12)
    assert rate_interval95(0.5, 0) == pytest.approx(0.98, abs=1e-12)
    assert rate_interval95(1.0, 10) == 0.0


def test_the_noise_of_a_difference_of_two_rates_by_hand():
    # 1.96 √(0.25/100 + 0.25/100) = 1.96 × 0.0707107 = 0.138593
    assert rate_difference_noise(0.5, 100, 0.5, 100) == pytest.approx(0.138593, abs=1e-6)
    # 1.96 √(0.09/200 + 0.16/50) = 1.96 √(0.00045 + 0.0032) = 1.96 × 0.0604152 = 0.118414
    assert rate_difference_noise(0.1, 200, 0.8, 50) == pytest.approx(0.118414, abs=1e-6)
    assert rate_difference_noise(0.0, 10, 1.0, 10) == 0.0


def test_the_noise_of_a_difference_of_two_means_by_hand():
    # 1.96 √(0.03² + 0.04²) = 1.96 × 0.05 = 0.098
    assert difference_noise(0.03, 0.04) == pytest.approx(0.098, abs=1e-12)
    assert difference_noise(0.0, 0.0) == 0.0


def test_a_logged_interval_is_read_compared_and_written():
    row = {"eval/gold_reward": 1.2, "eval/gold_reward_low": 1.0, "eval/gold_reward_high": 1.5}
    assert logged_interval(row, "gold_reward") == [1.0, 1.5]
    assert logged_interval({"eval/gold_reward": 1.2}, "gold_reward") is None  # a run from before it was logged
    assert intervals_apart([0.1, 0.4], [0.5, 0.9]) is True
    assert intervals_apart([0.1, 0.5], [0.5, 0.9]) is False  # touching is not apart
    assert intervals_apart(None, [0.5, 0.9]) is None
    assert format_interval([0.1234, 0.5678], 3) == " [0.123, 0.568]"
    assert format_interval([0.1234, 0.5678], 2) == " [0.12, 0.57]"
    assert format_interval(None, 3) == ""
