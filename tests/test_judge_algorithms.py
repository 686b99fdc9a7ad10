"""The judge's arithmetic (tether/algorithms/judge.py, docs/algorithms.md §12) on hand-computed cases, in float64."""

import math

import pytest
import torch

from tether.algorithms.judge import (
    best_of_listings,
    brier_score,
    expected_calibration_error,
    expected_score,
    first_slot_bias,
    first_slot_probability,
    impute_unparsed,
    order_inconsistent,
    round_robin,
    swap_averaged_preference,
)

F64 = torch.float64


def _logp(*probs):
    return torch.tensor([[math.log(p) for p in row] for row in probs], dtype=F64)


def test_the_pointwise_score_is_the_expectation_over_the_score_tokens_alone():
    """Scores 1..5. p = (0.1, 0.2, 0.3, 0.2, 0.1): mass 0.9, Σ s p = 0.1 + 0.4 + 0.9 + 0.8 + 0.5 = 2.7, E = 3.0.
    p = (0.05, 0.05, 0.1, 0.2, 0.4): mass 0.8, Σ s p = 0.05 + 0.1 + 0.3 + 0.8 + 2.0 = 3.25, E = 4.0625."""
    values = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0], dtype=F64)
    score, mass = expected_score(_logp((0.1, 0.2, 0.3, 0.2, 0.1), (0.05, 0.05, 0.1, 0.2, 0.4)), values)
    torch.testing.assert_close(score, torch.tensor([3.0, 4.0625], dtype=F64), rtol=0, atol=1e-14)
    torch.testing.assert_close(mass, torch.tensor([0.9, 0.8], dtype=F64), rtol=0, atol=1e-15)
    with pytest.raises(ValueError, match="5 score tokens but 4 values"):
        expected_score(_logp((0.1, 0.2, 0.3, 0.2, 0.1)), values[:4])


def test_the_pairwise_preference_is_averaged_over_both_orders_and_the_flip_is_counted():
    """Pair 1: A first, p(first) 0.6, p(second) 0.2 → P_AB = 0.6 / 0.8 = 0.75; B first, 0.3 and 0.5 → P_BA = 0.375.
    P(A ≻ B) = ½ (0.75 + 0.625) = 0.6875; bias ½ (0.75 + 0.375) − ½ = 0.0625; consistent (both orders pick A).
    Pair 2: 0.6 / 0.2 in both orders → P_AB = P_BA = 0.75: P = 0.5, bias 0.25, inconsistent (the first slot wins
    twice). Flip rate 1/2, mean bias 0.15625."""
    p_ab = first_slot_probability(_logp((0.6, 0.2), (0.6, 0.2)))
    p_ba = first_slot_probability(_logp((0.3, 0.5), (0.6, 0.2)))
    torch.testing.assert_close(p_ab, torch.tensor([0.75, 0.75], dtype=F64), rtol=0, atol=1e-15)
    torch.testing.assert_close(p_ba, torch.tensor([0.375, 0.75], dtype=F64), rtol=0, atol=1e-15)
    torch.testing.assert_close(swap_averaged_preference(p_ab, p_ba), torch.tensor([0.6875, 0.5], dtype=F64))
    torch.testing.assert_close(first_slot_bias(p_ab, p_ba), torch.tensor([0.0625, 0.25], dtype=F64))
    flips = order_inconsistent(p_ab, p_ba)
    assert flips.tolist() == [False, True] and flips.double().mean().item() == 0.5
    assert first_slot_bias(p_ab, p_ba).mean().item() == pytest.approx(0.15625, abs=1e-15)
    # A and B swapped: exactly 1 − P, the same bias
    torch.testing.assert_close(swap_averaged_preference(p_ba, p_ab), 1 - swap_averaged_preference(p_ab, p_ba))
    torch.testing.assert_close(first_slot_bias(p_ba, p_ab), first_slot_bias(p_ab, p_ba))
    # a verdict of exactly ½ is never a flip; read as text (P ∈ {0, 1}), "A" in both orders is one
    half = torch.tensor([0.5, 0.5, 1.0], dtype=F64)
    assert order_inconsistent(half, torch.tensor([0.9, 0.5, 1.0], dtype=F64)).tolist() == [False, False, True]
    with pytest.raises(ValueError, match="2 verdict tokens"):
        first_slot_probability(_logp((0.2, 0.3, 0.5)))


def test_a_round_robin_pays_each_answer_its_mean_preference_over_the_others():
    """G = 3, P(1≻2) = 0.75, P(1≻3) = 0.5, P(2≻3) = 0.25: r₁ = ½ (0.75 + 0.5) = 0.625, r₂ = ½ (0.25 + 0.25) = 0.25,
    r₃ = ½ (0.5 + 0.75) = 0.625; Σ r = 1.5 = G/2."""
    p = torch.tensor([[0.0, 0.75, 0.5], [0.25, 0.0, 0.25], [0.5, 0.75, 0.0]], dtype=F64)
    p = p + 7.0 * torch.eye(3, dtype=F64)  # the diagonal is ignored whatever it holds
    rewards = round_robin(p)
    torch.testing.assert_close(rewards, torch.tensor([0.625, 0.25, 0.625], dtype=F64), rtol=0, atol=1e-15)
    assert rewards.sum().item() == pytest.approx(1.5, abs=1e-15)
    with pytest.raises(ValueError, match="G ≥ 2"):
        round_robin(torch.zeros(1, 1, dtype=F64))


def test_calibration_by_brier_and_by_bins():
    """P(preferred) = (0.9, 0.6, 0.3, 0.8): accuracy 3/4; Brier (0.01 + 0.16 + 0.49 + 0.04) / 4 = 0.175; confidences
    0.9, 0.6, 0.7, 0.8 each alone in a bin of width 0.05, right, right, wrong, right: ECE (0.1 + 0.4 + 0.7 + 0.2) / 4
    = 0.35. A judge at ½ everywhere: Brier 0.25, ECE |0 − ½| = 0.5 (no pick is right at P = ½)."""
    p = torch.tensor([0.9, 0.6, 0.3, 0.8], dtype=F64)
    assert brier_score(p).item() == pytest.approx(0.175, abs=1e-15)
    assert expected_calibration_error(p).item() == pytest.approx(0.35, abs=1e-15)
    flat = torch.full((6,), 0.5, dtype=F64)
    assert brier_score(flat).item() == 0.25 and expected_calibration_error(flat).item() == 0.5
    # one bin: every confidence in [0.5, 1] together — mean confidence 0.75, accuracy 0.75: calibrated on average
    assert expected_calibration_error(p, bins=1).item() == pytest.approx(0.0, abs=1e-15)


def test_a_group_listed_twice_shares_best_as_the_average_of_the_two_listings():
    """G = 3. Forward listing: p(labels) = (0.5, 0.3, 0.1), normalised over the labels q = (5, 3, 1)/9. Reversed
    listing (answer i at place 2 − i): p = (0.2, 0.2, 0.4), q = (1, 1, 2)/4, so answer 0 gets q_rev(2) = ½,
    answer 1 q_rev(1) = ¼, answer 2 q_rev(0) = ¼. r = ½ (5/9 + 1/2, 3/9 + 1/4, 1/9 + 1/4) = (19/36, 21/72, 13/72);
    Σ r = 1."""
    r = best_of_listings(_logp((0.5, 0.3, 0.1)), _logp((0.2, 0.2, 0.4)))
    torch.testing.assert_close(r, torch.tensor([[19 / 36, 21 / 72, 13 / 72]], dtype=F64), rtol=0, atol=1e-15)
    torch.testing.assert_close(r.sum(), torch.tensor(1.0, dtype=F64), rtol=0, atol=1e-15)
    with pytest.raises(ValueError, match="G ≥ 2"):
        best_of_listings(_logp((0.5, 0.3, 0.1)), _logp((0.5, 0.5)))


def test_an_unparsed_score_takes_its_groups_parsed_mean_or_the_batchs():
    """Groups of 3: (4, ?, 2) → the ? gets (4 + 2)/2 = 3; (?, ?, ?) has nothing parsed → the batch's parsed mean
    (4 + 2 + 5)/3 = 11/3; (5, ?, ?) → 5. Parsed scores never change."""
    scores = torch.tensor([4.0, 9.0, 2.0, 7.0, 7.0, 7.0, 5.0, 0.0, 0.0], dtype=F64)
    parsed = torch.tensor([True, False, True, False, False, False, True, False, False])
    out = impute_unparsed(scores, parsed, group_size=3)
    torch.testing.assert_close(
        out, torch.tensor([4.0, 3.0, 2.0, 11 / 3, 11 / 3, 11 / 3, 5.0, 5.0, 5.0], dtype=F64), rtol=0, atol=1e-15
    )
    batch = impute_unparsed(scores[:3], parsed[:3])  # no groups: the batch's mean
    torch.testing.assert_close(batch, torch.tensor([4.0, 3.0, 2.0], dtype=F64), rtol=0, atol=0)
    with pytest.raises(ValueError, match="no score was parsed"):
        impute_unparsed(scores[3:6], parsed[3:6])
