"""The critic-free advantage estimators and DAPO's overlong shaping: hand-computed cases and properties."""

import math

import pytest
import torch

from tether.algorithms.advantages import (
    ADVANTAGE_ESTIMATORS,
    SEQUENCE_ADVANTAGES,
    group_advantages,
    group_advantages_no_std,
    groups_without_signal,
    masked_whiten,
    process_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
    token_advantages,
    zero_variance_groups,
)
from tether.algorithms.shaping import overlong_penalty


def test_group_advantages_by_hand():
    scores = torch.tensor([[1.0, 0.0, 0.0, 1.0], [2.0, 2.0, 2.0, 2.0]])
    # group 1: mean 0.5, population std 0.5 → ±0.5 / (0.5 + 1e-4)
    a = group_advantages(scores)
    assert a[0].tolist() == pytest.approx([0.5 / 0.5001, -0.5 / 0.5001, -0.5 / 0.5001, 0.5 / 0.5001])
    assert a[1].tolist() == [0.0, 0.0, 0.0, 0.0] and not torch.isnan(a).any()  # equal scores: 0, not NaN
    # ε = 0.5: ±0.5 / (0.5 + 0.5) = ±0.5
    assert group_advantages(scores, eps=0.5)[0].tolist() == [0.5, -0.5, -0.5, 0.5]
    assert group_advantages_no_std(scores)[0].tolist() == [0.5, -0.5, -0.5, 0.5]  # Dr. GRPO: R − mean
    assert group_advantages_no_std(scores, eps=123.0).tolist() == group_advantages_no_std(scores).tolist()  # ε unused
    assert zero_variance_groups(scores).tolist() == [False, True]


def test_rloo_by_hand():
    scores = torch.tensor([[3.0, 0.0, 0.0]])
    # 3 − (0+0)/2 = 3; 0 − (3+0)/2 = −1.5
    assert rloo_advantages(scores).tolist() == [[3.0, -1.5, -1.5]]
    assert rloo_advantages(scores, eps=9.0).tolist() == [[3.0, -1.5, -1.5]]  # ε unused
    assert rloo_advantages(torch.full((2, 3), 7.0)).abs().sum() == 0
    with pytest.raises(ValueError):
        rloo_advantages(torch.ones(1, 1))


def test_sequence_estimators_share_one_signature_and_centre_each_group():
    assert list(SEQUENCE_ADVANTAGES) == ["group", "group_no_std", "rloo"]
    assert ADVANTAGE_ESTIMATORS == ("group", "group_no_std", "rloo", "reinforce_pp")
    torch.manual_seed(0)
    scores = torch.randn(5, 4)
    for name, fn in SEQUENCE_ADVANTAGES.items():
        a = fn(scores, 1e-4)
        assert a.shape == (5, 4)
        torch.testing.assert_close(a.sum(-1), torch.zeros(5), atol=1e-5, rtol=0)  # each group sums to 0
    # RLOO = G/(G−1) · (R − mean)
    torch.testing.assert_close(rloo_advantages(scores), 4 / 3 * group_advantages_no_std(scores))


def test_token_advantages_by_hand():
    # two prompts, G = 2, prompt-major: scores (1, 0 | 3, 3); T = 3 with padding
    scores = torch.tensor([1.0, 0.0, 3.0, 3.0])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    # group_no_std: prompt 0 mean 0.5 → (0.5, −0.5); prompt 1 all equal → 0; each row's value on its tokens
    a = token_advantages("group_no_std", scores, mask, group_size=2)
    assert a.tolist() == [[0.5, 0.5, 0.0], [-0.5, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]
    # group: population std 0.5 → ±0.5 / 0.5001
    a = token_advantages("group", scores, mask, group_size=2)
    assert a[0].tolist() == pytest.approx([0.5 / 0.5001, 0.5 / 0.5001, 0.0])
    # rloo, G = 2: 1 − 0 = 1 and 0 − 1 = −1
    a = token_advantages("rloo", scores, mask, group_size=2)
    assert a[:2].tolist() == [[1.0, 1.0, 0.0], [-1.0, 0.0, 0.0]]
    with pytest.raises(ValueError, match="reinforce_pp"):
        token_advantages("ppo", scores, mask, group_size=2)


def test_token_advantages_is_exactly_the_composition_of_its_pieces():
    torch.manual_seed(1)
    scores = torch.randn(12)
    mask = (torch.arange(6)[None] < torch.randint(1, 7, (12, 1))).float()
    kl = torch.rand(12, 6)
    for name, fn in SEQUENCE_ADVANTAGES.items():
        want = fn(scores.view(-1, 3), 1e-2).reshape(-1, 1) * mask
        assert torch.equal(token_advantages(name, scores, mask, 3, eps=1e-2), want)
    got = token_advantages("reinforce_pp", scores, mask, 3, kl=kl, kl_coef=0.1, gamma=0.9)
    assert torch.equal(got, reinforce_pp_advantages(scores, kl, mask, 0.1, 0.9))
    no_kl = token_advantages("reinforce_pp", scores, mask, 3, kl_coef=0.1)  # kl None: no penalty
    assert torch.equal(no_kl, reinforce_pp_advantages(scores, torch.zeros_like(mask), mask, 0.1))


def test_reinforce_pp_by_hand():
    # row 0: 2 tokens, score 1, kl (0.5, 1.0); row 1: 1 token, score 0, kl 0.2; β = 0.1, γ = 1
    scores = torch.tensor([1.0, 0.0])
    kl = torch.tensor([[0.5, 1.0], [0.2, 9.9]])
    mask = torch.tensor([[1, 1], [1, 0]])
    # rewards: row0 (−0.05, −0.1 + 1) → returns (0.85, 0.9); row1 (−0.02) → return −0.02
    g = torch.tensor([0.85, 0.9, -0.02])
    expected = (g - g.mean()) / torch.sqrt(g.var(unbiased=False) + 1e-8)
    a = reinforce_pp_advantages(scores, kl, mask, kl_coef=0.1)
    assert [a[0, 0], a[0, 1], a[1, 0]] == pytest.approx(expected.tolist(), abs=1e-5)
    assert a[1, 1] == 0
    # γ = 0.5: row 0 returns (−0.05 + 0.5·0.9, 0.9) = (0.4, 0.9)
    g2 = torch.tensor([0.4, 0.9, -0.02])
    a2 = reinforce_pp_advantages(scores, kl, mask, kl_coef=0.1, gamma=0.5)
    assert a2[0, 0] == pytest.approx(float((g2[0] - g2.mean()) / torch.sqrt(g2.var(unbiased=False) + 1e-8)), abs=1e-5)


def test_reinforce_pp_carries_an_episodes_outcome_across_the_environments_tokens():
    """Issue 52 item 1, REINFORCE++'s side: in an episode the mask has holes (the environment's tokens); the return
    to go used to restart at each hole, so the first turn's tokens got nothing of the outcome."""
    mask = torch.tensor([[1, 1, 0, 0, 1, 0], [1, 0, 0, 0, 0, 0]])  # row 0: turn 1 at 0-1, turn 2 at 4
    kl = torch.tensor([[0.0, 0.0, 5.0, 5.0, 0.0, 5.0], [0.0] * 6])  # the environment's KL never enters
    a = reinforce_pp_advantages(torch.tensor([3.0, 0.0]), kl, mask, kl_coef=0.1, gamma=0.5)
    # row 0: R = 3 on token 4 (the last action, not Σm − 1 = 2); γ per action: G_4 = 3, G_1 = 0.5·3 = 1.5,
    # G_0 = 0.5·1.5 = 0.75; row 1: G_0 = 0. Then whitened over the four actions
    returns = torch.tensor([[0.75, 1.5, 0, 0, 3.0, 0], [0.0] * 6])
    assert torch.equal(a, masked_whiten(returns, mask))


def test_process_advantages_by_hand():
    # one prompt, two responses; response 0 has steps ending at tokens 1 and 3 with scores (1, 0);
    # response 1 one step ending at token 0 with score 1. All step scores (1, 0, 1): mean 2/3, std √(2/9)
    mean, std = 2 / 3, math.sqrt(2 / 9)
    n = lambda r: (r - mean) / (std + 1e-4)
    a = process_advantages([[[1.0, 0.0], [1.0]]], [[[1, 3], [0]]], length=5)
    assert a[0].tolist() == pytest.approx([n(1) + n(0), n(1) + n(0), n(0), n(0), 0.0], abs=1e-5)
    assert a[1].tolist() == pytest.approx([n(1), 0, 0, 0, 0], abs=1e-5)
    with pytest.raises(ValueError):
        process_advantages([[[1.0]]], [[[1, 2]]], length=4)


def test_zero_variance_groups_by_hand():
    # spreads 0, 1e-9 (within tol 1e-8) and 1
    scores = torch.tensor([[1.0, 1.0], [0.0, 1e-9], [0.0, 1.0]], dtype=torch.float64)
    assert zero_variance_groups(scores).tolist() == [True, True, False]
    assert zero_variance_groups(scores, tol=0.0).tolist() == [True, False, False]


def test_groups_without_signal_are_those_whose_every_token_advantage_is_0():
    """Group 0 scored 1, 1; group 1 scored 0, 1. A group-relative estimator gives group 0 advantage 0 everywhere;
    REINFORCE++ whitens over the batch (mean 0.75, so group 0's responses get +0.25/std): no group is flat. With a
    process reward, group 0's step scores [1, 0] and [0, 1] give r − mean = ±0.5 (process_advantages): not flat
    either, though each response's steps sum to 1; step scores all equal are flat, and with no outcome the step
    scores decide alone."""
    outcome = torch.tensor([[1.0, 1.0], [0.0, 1.0]])
    for estimator in ("group", "group_no_std", "rloo"):
        assert groups_without_signal(estimator, outcome, None).tolist() == [True, False]
        mask = torch.ones(4, 3)
        assert token_advantages(estimator, outcome.flatten(), mask, 2)[:2].abs().max() == 0.0
    assert groups_without_signal("reinforce_pp", outcome, None).tolist() == [False, False]
    reinforce = token_advantages("reinforce_pp", outcome.flatten(), torch.ones(4, 3), 2)
    assert reinforce[:2].abs().min() > 0
    steps = [[[1.0, 0.0], [0.0, 1.0]], [[0.5], [0.5]]]
    assert groups_without_signal("group", outcome, steps).tolist() == [False, False]
    assert groups_without_signal("group", None, steps).tolist() == [False, True]
    assert process_advantages(steps, [[[0, 1], [0, 1]], [[0], [0]]], length=2)[:2, 1].abs().min() > 0  # ±0.9998
    assert groups_without_signal("group", None, [[[2.0], [2.0, 2.0]], [[1.0], []]]).tolist() == [True, True]
    with pytest.raises(ValueError, match="neither"):
        groups_without_signal("group", None, None)


def test_overlong_penalty_by_hand():
    lengths = torch.tensor([10, 12, 14, 16, 17])
    # L_max 16, cache 4: free up to 12; 14 → (12 − 14)/4 = −0.5; 16 → −1; 17 → −1
    assert overlong_penalty(lengths, 16, 4).tolist() == [0.0, 0.0, -0.5, -1.0, -1.0]
    with pytest.raises(ValueError):
        overlong_penalty(lengths, 16, 0)
    with pytest.raises(ValueError):
        overlong_penalty(lengths, 16, 17)
