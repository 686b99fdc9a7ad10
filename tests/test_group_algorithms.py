"""The group family's pieces against hand-computed cases, and their properties."""
import math

import pytest
import torch

from tether.algorithms.group import (aggregate, clipped_surrogate, group_advantages, gspo_ratio, overlong_penalty,
                                     process_advantages, reinforce_pp_advantages, rloo_advantages, token_ratio,
                                     zero_variance_groups)


def test_group_advantages_by_hand():
    scores = torch.tensor([[1.0, 0.0, 0.0, 1.0], [2.0, 2.0, 2.0, 2.0]])
    # group 1: mean 0.5, population std 0.5 → ±0.5 / (0.5 + 1e-4)
    a = group_advantages(scores)
    assert a[0].tolist() == pytest.approx([0.5 / 0.5001, -0.5 / 0.5001, -0.5 / 0.5001, 0.5 / 0.5001])
    assert a[1].tolist() == [0.0, 0.0, 0.0, 0.0] and not torch.isnan(a).any()  # equal scores: 0, not NaN
    assert group_advantages(scores, scale_by_std=False)[0].tolist() == [0.5, -0.5, -0.5, 0.5]  # Dr. GRPO
    assert zero_variance_groups(scores).tolist() == [False, True]


def test_rloo_by_hand():
    scores = torch.tensor([[3.0, 0.0, 0.0]])
    # 3 − (0+0)/2 = 3; 0 − (3+0)/2 = −1.5
    assert rloo_advantages(scores).tolist() == [[3.0, -1.5, -1.5]]
    assert rloo_advantages(torch.full((2, 3), 7.0)).abs().sum() == 0
    with pytest.raises(ValueError):
        rloo_advantages(torch.ones(1, 1))


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


def test_clipped_surrogate_by_hand_with_separate_bounds():
    ratio = torch.tensor([[1.5, 0.5, 1.1, 0.7]])
    adv = torch.tensor([[1.0, -1.0, 1.0, 1.0]])
    mask = torch.tensor([[1, 1, 1, 1]])
    loss, low, high = clipped_surrogate(ratio, adv, mask, clip_low=0.2, clip_high=0.28)
    # 1.5·1 clipped to 1.28 → −1.28; 0.5·(−1) → max(0.5, 0.8) = 0.8; 1.1 → −1.1; 0.7 with A>0 → −0.7 (unclipped min)
    assert loss[0].tolist() == pytest.approx([-1.28, 0.8, -1.1, -0.7])
    assert high[0].tolist() == [True, False, False, False]
    assert low[0].tolist() == [False, True, False, False]


def test_clipped_tokens_get_no_gradient():
    logp = torch.tensor([[0.0, 0.0]], requires_grad=True)
    old = torch.tensor([[-1.0, 0.0]])  # token 0 has ratio e ≈ 2.72 > 1.28 with A > 0: clipped
    loss, _, high = clipped_surrogate(token_ratio(logp, old), torch.tensor([[1.0, 1.0]]), torch.ones(1, 2), 0.2, 0.28)
    loss.sum().backward()
    assert high.tolist() == [[True, False]]
    assert logp.grad[0, 0] == 0 and logp.grad[0, 1] == -1.0


def test_gspo_sequence_ratio_and_token_variant():
    logp = torch.tensor([[-1.0, -2.0, 0.0], [-1.0, 0.0, 0.0]], requires_grad=True)
    old = torch.tensor([[-1.5, -1.5, 5.0], [-2.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    s = gspo_ratio(logp, old, mask)
    # row 0: mean(0.5, −0.5) = 0 → 1; row 1: exp(1)
    assert s[:, 0].tolist() == pytest.approx([1.0, math.e])
    st = gspo_ratio(logp, old, mask, token_level=True)
    assert torch.allclose(st, s)  # same values
    (st[0] * torch.tensor([1.0, 0.0, 0.0])).sum().backward()  # d s_{0,0} / d logp: only token 0, times s_0
    assert logp.grad[0].tolist() == pytest.approx([1.0, 0.0, 0.0])
    logp.grad = None
    (s[0, 0]).backward()  # sequence ratio: every counted token gets s/|y|
    assert logp.grad[0].tolist() == pytest.approx([0.5, 0.5, 0.0])


def test_aggregations_by_hand():
    v = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    m = torch.tensor([[1, 1, 1], [1, 0, 0]])
    assert aggregate(v, m, "token-mean").item() == pytest.approx(10 / 4)
    assert aggregate(v, m, "seq-mean-token-mean").item() == pytest.approx((2 + 4) / 2)
    assert aggregate(v, m, "seq-mean-token-sum-norm", norm_length=5).item() == pytest.approx((6 + 4) / (5 * 2))
    with pytest.raises(ValueError):
        aggregate(v, m, "mean")


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_micro_batch_splits_give_the_same_gradient(mode):
    torch.manual_seed(0)
    logits = torch.randn(6, 5, requires_grad=True)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 0, 0, 0, 0]])
    weights = torch.randn(6, 5)
    kw = dict(norm_length=5.0)
    aggregate(logits * weights, mask, mode, **kw).backward()
    whole = logits.grad.clone()
    logits.grad = None
    n_tokens, n_seq = float(mask.sum()), 6
    for rows in (slice(0, 1), slice(1, 4), slice(4, 6)):
        aggregate(logits[rows] * weights[rows], mask[rows], mode, n_tokens=n_tokens, n_sequences=n_seq, **kw).backward()
    torch.testing.assert_close(logits.grad, whole)


def test_overlong_penalty_by_hand():
    lengths = torch.tensor([10, 12, 14, 16, 17])
    # L_max 16, cache 4: free up to 12; 14 → (12 − 14)/4 = −0.5; 16 → −1; 17 → −1
    assert overlong_penalty(lengths, 16, 4).tolist() == [0.0, 0.0, -0.5, -1.0, -1.0]
    with pytest.raises(ValueError):
        overlong_penalty(lengths, 16, 0)
