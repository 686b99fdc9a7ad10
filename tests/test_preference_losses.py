"""Hand-computed cases for the DPO family, its table of losses, ORPO's stable log-odds and β-DPO's margins."""

import dataclasses
import math

import pytest
import torch

from tether.algorithms.preference import (
    PAIR_LOSSES,
    PREFERENCE_LOSSES,
    REFERENCE_FREE,
    PreferenceParams,
    beta_dpo_beta,
    beta_dpo_margins,
    dpo_sigmoid_loss,
    hinge_loss,
    implicit_rewards,
    ipo_loss,
    ipo_norm_loss,
    listwise_dpo_loss,
    log1mexp,
    orpo_odds_ratio_loss,
    preference_loss,
    robust_dpo_loss,
    simpo_loss,
    weighted_loss_sum,
)

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


def test_log1mexp_matches_the_naive_formula_at_moderate_x_in_float64():
    for x in (-20.0, -5.0, -1.0, -math.log(2) - 1e-9, -math.log(2) + 1e-9, -0.5, -0.1, -1e-3):
        got = log1mexp(torch.tensor([x], dtype=torch.float64)).item()
        assert got == pytest.approx(math.log(1 - math.exp(x)), rel=1e-9)
    assert log1mexp(torch.tensor([0.0])).item() == -math.inf  # log(1 − 1)


def test_log1mexp_gradient_is_finite_on_both_branches():
    x = torch.tensor([-3.0, -0.5, -1e-6], dtype=torch.float64, requires_grad=True)
    log1mexp(x).sum().backward()
    # d/dx log(1 − eˣ) = −eˣ/(1 − eˣ) = −1/expm1(−x)
    want = [-1 / math.expm1(3.0), -1 / math.expm1(0.5), -1 / math.expm1(1e-6)]
    assert x.grad.tolist() == pytest.approx(want, rel=1e-9)


def test_orpo_log_odds_keep_growing_as_p_approaches_one():
    # x = −1e−10: log odds = x − log(1 − eˣ) ≈ −log(1e−10) = 23.02585 (the old exp(x).clamp(max=1−1e−7) stopped
    # near 16); in float32 and float64 alike
    for dtype in (torch.float32, torch.float64):
        x = torch.tensor([-1e-10], dtype=dtype)
        assert (x - log1mexp(x)).item() == pytest.approx(-math.log(1e-10), rel=1e-6)
        # against p_l = 0.5 (log odds 0): L_OR = −log σ(23.02585) = log1p(e^−23.02585)
        got = orpo_odds_ratio_loss(x, torch.tensor([math.log(0.5)], dtype=dtype)).item()
        assert got == pytest.approx(math.log1p(math.exp(math.log(1e-10))), rel=1e-5)


def test_orpo_equals_the_naive_formula_at_moderate_values_in_float64():
    xw = torch.tensor([-2.0, -0.9, -0.3, -0.05], dtype=torch.float64)
    xl = torch.tensor([-0.2, -3.0, -0.7, -0.01], dtype=torch.float64)
    got = orpo_odds_ratio_loss(xw, xl)
    odds = lambda x: math.log(math.exp(x) / (1 - math.exp(x)))
    want = [sp(odds(w) - odds(l)) for w, l in zip(xw.tolist(), xl.tolist())]
    assert got.tolist() == pytest.approx(want, rel=1e-10)


def test_orpo_at_probability_one_stays_finite_with_a_finite_gradient():
    x = torch.tensor([0.0, -1.0], requires_grad=True)  # chosen mean logp exactly 0 (p = 1 in float32)
    loss = orpo_odds_ratio_loss(x[:1], x[1:])
    loss.backward()
    assert torch.isfinite(loss).all() and torch.isfinite(x.grad).all()


def test_beta_dpo_margins_both_forms_by_hand():
    logps, refs = torch.tensor([[-10.0, -11.0]]), torch.tensor([[-12.0, -10.0]])
    # u_w = −10 + 12 = 2, u_l = −11 + 10 = −1: gap 3; scaled by β_0 = 0.1: 0.3
    assert beta_dpo_margins(logps, refs, 0.1).tolist() == pytest.approx([0.3])
    assert beta_dpo_margins(logps, refs, 0.1, scaled=False).tolist() == pytest.approx([3.0])
    # a ranked list of three: y_l is the LAST column. u = (−1 + 2, −5 − 0, −2 − 0) = (1, −5, −2): gap 1 − (−2) = 3
    lists, list_refs = torch.tensor([[-1.0, -5.0, -2.0]]), torch.tensor([[-2.0, 0.0, 0.0]])
    assert beta_dpo_margins(lists, list_refs, 0.5).tolist() == pytest.approx([1.5])
    assert beta_dpo_margins(lists, list_refs, 0.5, scaled=False).tolist() == pytest.approx([3.0])


def test_the_table_has_one_signature_and_the_dispatcher_goes_through_it():
    assert PAIR_LOSSES == (
        "sigmoid",
        "cdpo",
        "robust",
        "ipo",
        "ipo_norm",
        "hinge",
        "simpo",
        "orpo",
        "beta_dpo",
        "listwise",
        "weighted",
    )
    assert tuple(PREFERENCE_LOSSES) == PAIR_LOSSES and REFERENCE_FREE == ("simpo", "orpo")
    weights = {"sigmoid": 1.0, "hinge": 2.0}
    params = PreferenceParams(
        beta=0.1, label_smoothing=0.2, simpo_gamma=0.5, orpo_lambda=0.5, weights=(*weights.items(),)
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        params.beta = 1.0
    assert PreferenceParams(0.3) == PreferenceParams(0.3, 0.0, 0.5, 0.1)  # the defaults
    logps, refs, tokens = torch.tensor([[-10.0, -11.0]]), torch.tensor([[-12.0, -10.0]]), torch.tensor([[5.0, 10.0]])
    # u_w − u_l = 3, β = 0.1 → h = 0.3
    w, l, rw, rl = logps[:, 0], logps[:, 1], refs[:, 0], refs[:, 1]
    want = {
        "sigmoid": sp(0.3),
        "cdpo": 0.8 * sp(0.3) + 0.2 * sp(-0.3),
        "robust": (0.8 * sp(0.3) - 0.2 * sp(-0.3)) / 0.6,
        "ipo": (3 - 5) ** 2,
        "ipo_norm": (2 / 5 + 1 / 10 - 5) ** 2,  # u/|y|: 0.4 and −0.1
        "hinge": 0.7,
        "weighted": sp(0.3) + 2 * 0.7,
        "beta_dpo": sp(0.3),
        "listwise": sp(0.3),
        "simpo": sp(0.1 * -10 / 5 - 0.1 * -11 / 10 - 0.5),  # β/|y|: −0.2 + 0.11 − 0.5 = −0.59
        "orpo": 2.0 + 0.5 * orpo_odds_ratio_loss(w / 5, l / 10).item(),
    }  # −mean_w + λ L_OR, mean_w = −2
    for name, fn in PREFERENCE_LOSSES.items():
        ref = None if name in REFERENCE_FREE else refs
        got = fn(logps, ref, tokens, params, None)
        assert got.shape == (1,) and got.item() == pytest.approx(want[name], rel=1e-6), name
        assert torch.equal(got, preference_loss(name, logps, ref, tokens, 0.1, 0.2, 0.5, 0.5, weights=weights))
    assert torch.equal(PREFERENCE_LOSSES["ipo"](logps, refs, tokens, params, None), ipo_loss(w, l, rw, rl, 0.1))
    with pytest.raises(ValueError, match="choose from"):
        preference_loss("kto", logps, refs, tokens, beta=0.1)
    with pytest.raises(ValueError, match="needs reference"):
        PREFERENCE_LOSSES["listwise"](logps, None, tokens, params, None)
    with pytest.raises(ValueError, match="listwise"):
        PREFERENCE_LOSSES["simpo"](torch.zeros(1, 3), None, torch.ones(1, 3), params, None)


def test_kto_by_hand():
    """z_0 = max(0, mean mismatched log-ratio) = max(0, (1 + 2)/2) = 1.5; r = (1, −1).
    desirable: 1 − σ(0.1 (1 − 1.5)) = 1 − σ(−0.05) = 0.5124974; undesirable, λ_U = 2: 2 − 2 σ(0.1 (1.5 + 1)) =
    2 − 2 σ(0.25) = 0.8756470."""
    from tether.algorithms.preference import kto_loss, kto_reference_point

    z0 = kto_reference_point(torch.tensor([-20.0, -18.0]), torch.tensor([-21.0, -20.0]))
    assert z0.item() == pytest.approx(1.5)
    loss = kto_loss(
        torch.tensor([-10.0, -12.0]),
        torch.tensor([-11.0, -11.0]),
        torch.tensor([True, False]),
        z0,
        beta=0.1,
        desirable_weight=1.0,
        undesirable_weight=2.0,
    )
    assert loss.tolist() == pytest.approx([0.5124974, 0.8756470], abs=1e-6)
    # a policy closer to the reference on other prompts than the reference itself: z_0 is floored at 0
    assert kto_reference_point(torch.tensor([-22.0]), torch.tensor([-21.0])).item() == 0.0
    # the reference point carries no gradient; the example's own log-prob does
    logps = torch.tensor([-10.0], requires_grad=True)
    mismatched = torch.tensor([-20.0], requires_grad=True)
    kto_loss(
        logps, torch.tensor([-11.0]), torch.tensor([True]), kto_reference_point(mismatched, torch.tensor([-21.0]))
    ).sum().backward()
    assert mismatched.grad is None and logps.grad.item() == pytest.approx(-0.1 * 0.25, abs=1e-6)  # −β σ'(0) at r = z_0


def test_length_normalised_ipo_by_hand():
    """Issue 52 item 20: TRL's and LLaMA-Factory's ipo divide each log-ratio by its length. In float64: u_w = 2 over
    4 tokens -> 0.5, u_l = -1 over 2 tokens -> -0.5; 0.5 + 0.5 - 1/(2*0.5) = 0; at beta 0.1: (1 - 5)^2 = 16.
    The paper's form on the same pair is (3 - 5)^2 = 4 (test_ipo_and_hinge): another target at the same beta."""
    w, l, rw, rl = (torch.tensor([v], dtype=torch.float64) for v in (-10.0, -11.0, -12.0, -10.0))
    n_w, n_l = torch.tensor([4.0], dtype=torch.float64), torch.tensor([2.0], dtype=torch.float64)
    assert ipo_norm_loss(w, l, rw, rl, n_w, n_l, beta=0.5).item() == 0.0
    assert ipo_norm_loss(w, l, rw, rl, n_w, n_l, beta=0.1).item() == 16.0
    logps, ref = torch.cat([w, l]).view(1, 2), torch.cat([rw, rl]).view(1, 2)
    tokens = torch.cat([n_w, n_l]).view(1, 2)
    assert preference_loss("ipo_norm", logps, ref, tokens, beta=0.1).item() == 16.0
    assert preference_loss("ipo", logps, ref, tokens, beta=0.1).item() == 4.0


def test_a_weighted_sum_of_losses_by_hand():
    """Issue 52 item 21: TRL's loss_type list with loss_weights. In float64, the pair above at beta 0.1:
    hinge max(0, 1 - 0.3) = 0.7, ipo (3 - 5)^2 = 4; 0.5 x 0.7 + 2 x 4 = 8.35."""
    logps, ref = (torch.tensor([[a, b]], dtype=torch.float64) for a, b in ((-10.0, -11.0), (-12.0, -10.0)))
    tokens = torch.tensor([[4.0, 2.0]], dtype=torch.float64)
    got = preference_loss("weighted", logps, ref, tokens, beta=0.1, weights={"hinge": 0.5, "ipo": 2.0})
    assert abs(got.item() - 8.35) <= 8.35 * 4 * torch.finfo(torch.float64).eps  # a few roundings of float64
    assert weighted_loss_sum({"a": torch.tensor([1.0, 2.0])}, {"a": 3.0}).tolist() == [3.0, 6.0]
    with pytest.raises(ValueError, match="name different losses"):
        weighted_loss_sum({"a": torch.tensor([1.0])}, {"b": 1.0})
    with pytest.raises(ValueError, match="needs weights"):
        preference_loss("weighted", logps, ref, tokens, beta=0.1)


def test_the_losses_said_to_read_label_smoothing_are_those_it_changes():
    """choices.LABEL_SMOOTHING_LOSSES (what the config lets take ε) against the formulas: ε moves exactly these."""
    from tether.algorithms.choices import LABEL_SMOOTHING_LOSSES

    logps, refs, tokens = torch.tensor([[-10.0, -11.0]]), torch.tensor([[-12.0, -10.0]]), torch.tensor([[5.0, 10.0]])
    moved = {
        name
        for name in PREFERENCE_LOSSES
        if name != "weighted"  # a sum of the others: it reads ε through its parts
        and preference_loss(name, logps, refs, tokens, 0.1, 0.0) != preference_loss(name, logps, refs, tokens, 0.1, 0.2)
    }
    assert moved == set(LABEL_SMOOTHING_LOSSES) == {"cdpo", "robust"}
