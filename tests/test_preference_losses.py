"""Hand-computed cases for the DPO family (groundwork for the DPO stage)."""
import math

import pytest
import torch

from tether.algorithms.preference import (beta_dpo_beta, dpo_sigmoid_loss, hinge_loss, implicit_rewards, ipo_loss,
                                          listwise_dpo_loss, orpo_odds_ratio_loss, robust_dpo_loss, simpo_loss)

# chosen: policy −10, ref −12 (u_w = 2); rejected: policy −11, ref −10 (u_l = −1); u_w − u_l = 3
W, L, RW, RL = (torch.tensor([v]) for v in (-10.0, -11.0, -12.0, -10.0))
sp = lambda x: math.log1p(math.exp(-x))  # −log σ(x)


def test_dpo_and_cdpo():
    assert dpo_sigmoid_loss(W, L, RW, RL, beta=0.1).item() == pytest.approx(sp(0.3))
    cdpo = dpo_sigmoid_loss(W, L, RW, RL, beta=0.1, label_smoothing=0.2).item()
    assert cdpo == pytest.approx(0.8 * sp(0.3) + 0.2 * sp(-0.3))


def test_robust_dpo():
    got = robust_dpo_loss(W, L, RW, RL, beta=0.1, label_smoothing=0.2).item()
    assert got == pytest.approx((0.8 * sp(0.3) - 0.2 * sp(-0.3)) / 0.6)
    with pytest.raises(ValueError):
        robust_dpo_loss(W, L, RW, RL, label_smoothing=0.5)


def test_ipo_and_hinge():
    assert ipo_loss(W, L, RW, RL, beta=0.1).item() == pytest.approx((3 - 5) ** 2)  # 1/(2β) = 5
    assert hinge_loss(W, L, RW, RL, beta=0.1).item() == pytest.approx(0.7)  # max(0, 1 − 0.3)
    assert hinge_loss(W, L, RW, RL, beta=1.0).item() == 0.0


def test_simpo():
    # lengths 5 and 10: β/|y| log π = 2·(−10)/5 = −4 and 2·(−11)/10 = −2.2; −4 + 2.2 − 0.5 = −2.3
    got = simpo_loss(W, L, torch.tensor([5.0]), torch.tensor([10.0]), beta=2.0, gamma=0.5).item()
    assert got == pytest.approx(sp(-2.3))


def test_orpo_odds_ratio():
    pw, pl = 0.5, 0.25  # mean token probabilities
    got = orpo_odds_ratio_loss(torch.tensor([math.log(pw)]), torch.tensor([math.log(pl)])).item()
    assert got == pytest.approx(sp(math.log(1.0) - math.log(1 / 3)))  # odds 1 and 1/3


def test_beta_dpo_and_listwise():
    assert beta_dpo_beta(torch.tensor([1.0, 3.0]), beta0=0.1, alpha=0.5, reference_margin=1.0) == pytest.approx(0.15)
    assert beta_dpo_beta(torch.tensor([-100.0]), 0.1, 0.5, 0.0) == pytest.approx(1e-3)
    logps, refs = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-2.0, -1.0]])  # u = (1, −1)
    assert listwise_dpo_loss(logps, refs, beta=0.5).item() == pytest.approx(sp(1.0))  # K=2 is DPO: β(u_w−u_l)=1


def test_swapping_chosen_and_rejected_flips_the_margin():
    torch.manual_seed(0)
    w, l, rw, rl = (torch.randn(6) for _ in range(4))
    cw, cl = implicit_rewards(w, l, rw, rl, 0.1)
    sw, sl = implicit_rewards(l, w, rl, rw, 0.1)
    torch.testing.assert_close(sw - sl, -(cw - cl))
    # and a pair the policy already prefers costs less than the swapped one
    assert (dpo_sigmoid_loss(W, L, RW, RL) < dpo_sigmoid_loss(L, W, RL, RW)).all()
