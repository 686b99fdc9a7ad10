"""Importance ratios, the one clipped surrogate and clip fraction, against hand-computed cases and gradients."""

import math

import pytest
import torch

from tether.algorithms.policy import (
    RATIOS,
    clip_fraction,
    clip_fractions,
    clipped_surrogate,
    sequence_ratio,
    sequence_token_ratio,
    token_ratio,
)


def test_token_ratio_by_hand_and_mask_unused():
    logp, old = torch.tensor([[0.0, math.log(2.0)]]), torch.tensor([[math.log(2.0), 0.0]])
    # exp(0 − ln 2) = 0.5, exp(ln 2 − 0) = 2
    assert token_ratio(logp, old, torch.ones(1, 2))[0].tolist() == pytest.approx([0.5, 2.0])
    assert torch.equal(token_ratio(logp, old, torch.zeros(1, 2)), token_ratio(logp, old, torch.ones(1, 2)))
    assert list(RATIOS) == ["token", "sequence", "sequence_token"]


def test_gspo_sequence_ratio_and_token_variant():
    logp = torch.tensor([[-1.0, -2.0, 0.0], [-1.0, 0.0, 0.0]], requires_grad=True)
    old = torch.tensor([[-1.5, -1.5, 5.0], [-2.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    s = sequence_ratio(logp, old, mask)
    # row 0: mean(0.5, −0.5) = 0 → 1 (padding's −5 ignored); row 1: exp(1)
    assert s[:, 0].tolist() == pytest.approx([1.0, math.e])
    assert s[0].tolist() == pytest.approx([1.0, 1.0, 1.0])  # broadcast over the row
    st = sequence_token_ratio(logp, old, mask)
    assert torch.allclose(st, s)  # same values
    (st[0] * torch.tensor([1.0, 0.0, 0.0])).sum().backward()  # d s_{0,0} / d logp: only token 0, times s_0
    assert logp.grad[0].tolist() == pytest.approx([1.0, 0.0, 0.0])
    logp.grad = None
    (s[0, 0]).backward()  # sequence ratio: every counted token gets s/|y|
    assert logp.grad[0].tolist() == pytest.approx([0.5, 0.5, 0.0])


def test_ratios_are_one_at_the_sampling_policy():
    torch.manual_seed(0)
    logp = torch.randn(3, 4)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [0, 0, 0, 0]])
    for fn in RATIOS.values():  # step 0: π_θ = π_old, every ratio is 1 (an empty row too: exp(0/1))
        assert torch.equal(fn(logp, logp.clone(), mask), torch.ones(3, 4))


def test_clipped_surrogate_by_hand_with_separate_bounds():
    ratio = torch.tensor([[1.5, 0.5, 1.1, 0.7]])
    adv = torch.tensor([[1.0, -1.0, 1.0, 1.0]])
    mask = torch.tensor([[1, 1, 1, 1]])
    loss, low, high = clipped_surrogate(ratio, adv, mask, clip_low=0.2, clip_high=0.28)
    # 1.5·1 clipped to 1.28 → −1.28; 0.5·(−1) → max(0.5, 0.8) = 0.8; 1.1 → −1.1; 0.7 with A>0 → −0.7 (unclipped min)
    assert loss[0].tolist() == pytest.approx([-1.28, 0.8, -1.1, -0.7])
    assert high[0].tolist() == [True, False, False, False]
    assert low[0].tolist() == [False, True, False, False]
    # one advantage per sequence, (B, 1), broadcasts over the tokens: the same numbers for A = +1
    loss1, _, _ = clipped_surrogate(torch.tensor([[1.5, 1.1, 0.7]]), torch.tensor([[1.0]]), torch.ones(1, 3), 0.2, 0.28)
    assert loss1[0].tolist() == pytest.approx([-1.28, -1.1, -0.7])


def test_clipped_surrogate_hand_computed_and_clipped_tokens_get_no_gradient():
    ratios = torch.tensor([[1.5, 1.5, 0.5, 0.5, 1.25]])
    adv = torch.tensor([[1.0, -1.0, -1.0, 1.0, 1.0]])
    logp = ratios.log().clone().requires_grad_(True)
    mask = torch.ones_like(adv)
    loss, low, high = clipped_surrogate(token_ratio(logp, torch.zeros_like(logp), mask), adv, mask, 0.2, 0.28)
    # ρ=1.5,A=+1: max(−1.5, −1.28) = −1.28 clipped; ρ=1.5,A=−1: max(1.5, 1.28) = 1.5;
    # ρ=0.5,A=−1: max(0.5, 0.8) = 0.8 clipped; ρ=0.5,A=+1: max(−0.5, −0.8) = −0.5; ρ=1.25 < 1.28: −1.25
    torch.testing.assert_close(loss.detach(), torch.tensor([[-1.28, 1.5, 0.8, -0.5, -1.25]]))
    assert (low | high).tolist() == [[True, False, True, False, False]]
    assert high.tolist() == [[True, False, False, False, False]]
    assert low.tolist() == [[False, False, True, False, False]]
    loss.sum().backward()
    # d/dlogp of −ρA is −ρA; clipped tokens get exactly zero gradient
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, 1.5, 0.0, -0.5, -1.25]]))


def test_clipped_tokens_get_no_gradient():
    logp = torch.tensor([[0.0, 0.0]], requires_grad=True)
    old = torch.tensor([[-1.0, 0.0]])  # token 0 has ratio e ≈ 2.72 > 1.28 with A > 0: clipped
    mask = torch.ones(1, 2)
    loss, _, high = clipped_surrogate(token_ratio(logp, old, mask), torch.tensor([[1.0, 1.0]]), mask, 0.2, 0.28)
    loss.sum().backward()
    assert high.tolist() == [[True, False]]
    assert logp.grad[0, 0] == 0 and logp.grad[0, 1] == -1.0


def test_dual_clip_bounds_negative_advantage_loss():
    logp = torch.tensor([[math.log(5.0), math.log(5.0)]], requires_grad=True)
    adv = torch.tensor([[-1.0, 1.0]])
    loss, low, high = clipped_surrogate(
        token_ratio(logp, torch.zeros(1, 2), torch.ones(1, 2)), adv, torch.ones(1, 2), dual_clip=3.0
    )
    # A = −1, ρ = 5: min(max(5, 1.2), 3) = 3, counted as clipped low; A = +1, ρ = 5: max(−5, −1.2) = −1.2, high
    assert loss[0].tolist() == pytest.approx([3.0, -1.2])
    assert low.tolist() == [[True, False]] and high.tolist() == [[False, True]]
    loss.sum().backward()
    assert logp.grad.tolist() == [[0.0, 0.0]]
    # without the dual clip the first token's loss is 5, with gradient −ρA = 5
    off, low_off, _ = clipped_surrogate(torch.tensor([[5.0]]), torch.tensor([[-1.0]]), torch.ones(1, 1))
    assert off.item() == pytest.approx(5.0) and not low_off.item()
    for bad in (0.5, 1.0, -2.0):
        with pytest.raises(ValueError, match="dual_clip"):
            clipped_surrogate(torch.ones(1, 1), torch.ones(1, 1), torch.ones(1, 1), dual_clip=bad)


def test_surrogate_ignores_padding():
    loss, low, high = clipped_surrogate(
        torch.tensor([[1.3, 9.0, 0.1]]), torch.tensor([[1.0, 1.0, -1.0]]), torch.tensor([[1, 0, 0]]), dual_clip=3.0
    )
    # token 0: max(−1.3, −1.2) = −1.2 (clipped high); tokens 1 and 2 are padding: 0 and never clipped
    assert loss[0].tolist() == pytest.approx([-1.2, 0.0, 0.0])
    assert high.tolist() == [[True, False, False]] and low.tolist() == [[False, False, False]]


def test_clip_fraction_by_hand():
    low = torch.tensor([[False, True, False], [False, False, False]])
    high = torch.tensor([[True, False, True], [False, False, False]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    # counted tokens 4; clipped among them (0,0) and (0,1) — (0,2) is padding — so 2/4
    assert clip_fraction(low, high, mask).item() == pytest.approx(0.5)
    assert clip_fraction(low, high, mask.float()).item() == pytest.approx(0.5)
    assert clip_fraction(low, high, torch.zeros(2, 3)).item() == 0.0  # nothing counted: 0/max(0, 1), not NaN
    assert clip_fraction(low, high, mask).shape == ()
    # by side: (0,1) is the low side's one of 4 counted, (0,0) the high side's ((0,2), padding, not counted)
    assert clip_fractions(low, high, mask) == {
        "policy/clip_frac": 0.5,
        "policy/clip_frac_low": 0.25,
        "policy/clip_frac_high": 0.25,
    }
