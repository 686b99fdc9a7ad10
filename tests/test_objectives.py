"""Each online stage's full objective against a hand-computed case, and micro-batch invariance of the group loss."""

import math

import pytest
import torch

from tether.algorithms.objectives import group_objective, ppo_objective, ppo_policy_loss, ppo_value_loss
from tether.algorithms.reductions import AGGREGATIONS

LN = math.log


def _ppo_case():
    # one row, T = 3, token 2 is padding (garbage everywhere in it)
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    old = torch.zeros(1, 3)
    logp = torch.tensor([[LN(1.5), LN(0.5), 9.0]], requires_grad=True)  # ρ = 1.5, 0.5 (e⁹ on padding)
    adv = torch.tensor([[1.0, 1.0, 5.0]])
    entropy = torch.tensor([[0.4, 0.2, 99.0]])
    values = torch.tensor([[1.0, 0.6, 7.0]], requires_grad=True)
    old_values = torch.tensor([[0.5, 0.5, 0.0]])
    returns = torch.tensor([[2.0, 2.0, 0.0]])
    return logp, old, adv, entropy, values, old_values, returns, mask


def test_ppo_objective_by_hand():
    logp, old, adv, entropy, values, old_values, returns, mask = _ppo_case()
    loss, parts = ppo_objective(
        logp,
        old,
        adv,
        entropy,
        values,
        old_values,
        returns,
        mask,
        clip_low=0.2,
        clip_high=0.2,
        value_clip=0.2,
        value_loss_coef=0.5,
        entropy_coef=0.1,
    )
    # ℓ_clip: ρ=1.5, A=1 → max(−1.5, −1.2) = −1.2 (clipped high); ρ=0.5, A=1 → max(−0.5, −0.8) = −0.5
    # token-mean(ℓ_clip) = −1.7/2 = −0.85; token-mean(H) = (0.4 + 0.2)/2 = 0.3; policy = −0.85 − 0.1·0.3 = −0.88
    assert parts["policy_loss"].item() == pytest.approx(-0.88)
    # L_V: V=1.0 clips to 0.7, ½ max(1, 1.69) = 0.845; V=0.6 inside the range, ½ (1.4)² = 0.98; mean 0.9125
    assert parts["value_loss"].item() == pytest.approx(0.9125)
    assert loss.item() == pytest.approx(-0.88 + 0.5 * 0.9125)  # = −0.42375
    assert parts["clipped_high"].tolist() == [[True, False, False]]
    assert parts["clipped_low"].tolist() == [[False, False, False]]
    assert parts["value_clipped"].tolist() == [[True, False, False]]
    loss.backward()
    # d/dlogp: clipped token 0 → 0; token 1: −ρA / 2 tokens = −0.5/2 = −0.25; padding 0
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, -0.25, 0.0]]))
    # d/dV: token 0's clipped value is flat in V → 0; token 1: (V − G)/2 tokens · c_v = −1.4/2·0.5 = −0.35
    torch.testing.assert_close(values.grad, torch.tensor([[0.0, -0.35, 0.0]]))


def test_ppo_objective_is_its_policy_and_value_terms():
    """The PPO stage backpropagates the two terms one model at a time when the critic is separate: their weighted
    sum must be the objective, and each term must reach only its own inputs."""
    logp, old, adv, entropy, values, old_values, returns, mask = _ppo_case()
    kwargs = dict(clip_low=0.2, clip_high=0.28, dual_clip=3.0, entropy_coef=0.01)
    loss, parts = ppo_objective(
        logp, old, adv, entropy, values, old_values, returns, mask, value_clip=0.2, value_loss_coef=0.5, **kwargs
    )
    lp = logp.detach().clone().requires_grad_(True)
    vv = values.detach().clone().requires_grad_(True)
    pl, pparts = ppo_policy_loss(lp, old, adv, entropy, mask, **kwargs)
    vl, vparts = ppo_value_loss(vv, old_values, returns, mask, value_clip=0.2)
    assert torch.equal(pl + 0.5 * vl, loss)
    assert torch.equal(pl, parts["policy_loss"]) and torch.equal(vl, parts["value_loss"])
    for name, value in {**pparts, **vparts}.items():
        assert torch.equal(value, parts[name]), name
    pl.backward()
    assert lp.grad is not None and vv.grad is None


def test_ppo_objective_dual_clip_and_defaults():
    logp, old, adv, entropy, values, old_values, returns, mask = _ppo_case()
    adv = torch.tensor([[-1.0, 1.0, 0.0]])
    logp = torch.tensor([[LN(5.0), LN(0.5), 0.0]])
    loss, parts = ppo_objective(logp, old, adv, entropy, values, old_values, returns, mask, dual_clip=3.0)
    # A=−1, ρ=5: min(max(5, 1.2), 3) = 3 (dual bound → clipped low); A=1, ρ=0.5: −0.5. policy (3 − 0.5)/2 = 1.25
    # defaults: no entropy bonus, c_v = 1: loss = 1.25 + 0.9125
    assert parts["policy_loss"].item() == pytest.approx(1.25)
    assert loss.item() == pytest.approx(1.25 + 0.9125)
    assert parts["clipped_low"].tolist() == [[True, False, False]]


def test_ppo_objective_split_over_processes_adds_up():
    """Two processes, each with one token of the minibatch and n_tokens = 2: their losses and gradients add up to the
    one-process minibatch's (by hand: token 0 gives ℓ −1.2 − 0.1·0.4 and ½·1.69; token 1 −0.5 − 0.1·0.2 and 0.98)."""
    logp, old, adv, entropy, values, old_values, returns, mask = _ppo_case()
    kwargs = dict(clip_low=0.2, clip_high=0.2, value_clip=0.2, value_loss_coef=0.5, entropy_coef=0.1)
    whole, _ = ppo_objective(logp, old, adv, entropy, values, old_values, returns, mask, **kwargs)
    halves = [torch.tensor([[1.0, 0.0, 0.0]]), torch.tensor([[0.0, 1.0, 0.0]])]
    parts = [
        ppo_objective(logp, old, adv, entropy, values, old_values, returns, m, n_tokens=2.0, **kwargs)[0]
        for m in halves
    ]
    assert parts[0].item() == pytest.approx((-1.2 - 0.04) / 2 + 0.5 * 0.845 / 2)
    assert parts[1].item() == pytest.approx((-0.5 - 0.02) / 2 + 0.5 * 0.98 / 2)
    assert (parts[0] + parts[1]).item() == pytest.approx(whole.item())


def _group_case():
    # one prompt, G = 2, T = 2; row 1 has one token (its second position is padding)
    response_mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    old = torch.zeros(2, 2)
    logp = torch.tensor([[LN(1.5), 0.0], [LN(0.5), 9.0]], requires_grad=True)  # token ρ = (1.5, 1 | 0.5, pad)
    adv = torch.tensor([[1.0], [-1.0]])  # one advantage per response
    # log r = ref − logp: ln 2 on token (0, 1), 0 elsewhere → k3 = (2 − 1 − ln 2) = 1 − ln 2 there, 0 elsewhere
    ref = logp.detach() + torch.tensor([[0.0, LN(2.0)], [0.0, 0.0]])
    return logp, old, adv, response_mask, ref


def test_group_objective_by_hand():
    logp, old, adv, mask, ref = _group_case()
    k = 1 - LN(2.0)  # ≈ 0.30685
    # clip 0.2 / 0.28: (0,0) ρ=1.5, A=1 → −1.28 (high); (0,1) ρ=1 → −1; (1,0) ρ=0.5, A=−1 → max(0.5, 0.8) = 0.8 (low)
    # with β = 0.1: row 0 terms (−1.28, −1 + 0.1k), row 1 (0.8)
    common = dict(clip_low=0.2, clip_high=0.28, ref_logprobs=ref, kl_coef=0.1, kl_estimator="k3")
    loss, parts = group_objective(logp, old, adv, mask, mask, **common)
    # seq-mean-token-mean: ((−2.28 + 0.1k)/2 + 0.8/1) / 2
    assert loss.item() == pytest.approx(((-2.28 + 0.1 * k) / 2 + 0.8) / 2)
    assert parts["clipped_high"].tolist() == [[True, False], [False, False]]
    assert parts["clipped_low"].tolist() == [[False, False], [True, False]]
    assert parts["kl"][0].tolist() == pytest.approx([0.0, k])
    assert parts["ratio"][0].tolist() == pytest.approx([1.5, 1.0])
    # token-mean: (−2.28 + 0.1k + 0.8) / 3 tokens
    tm, _ = group_objective(logp, old, adv, mask, mask, aggregation="token-mean", **common)
    assert tm.item() == pytest.approx((-2.28 + 0.1 * k + 0.8) / 3)
    # seq-mean-token-sum-norm, L = 4: (−2.28 + 0.1k + 0.8) / (4 · 2)
    sn, _ = group_objective(logp, old, adv, mask, mask, aggregation="seq-mean-token-sum-norm", norm_length=4, **common)
    assert sn.item() == pytest.approx((-2.28 + 0.1 * k + 0.8) / 8)
    # β = 0 (DAPO): the KL is computed and returned but not in the loss: ((−2.28)/2 + 0.8) / 2 = −0.17
    no_kl, parts = group_objective(logp, old, adv, mask, mask, clip_low=0.2, clip_high=0.28, ref_logprobs=ref)
    assert no_kl.item() == pytest.approx(-0.17) and parts["kl"][0, 1].item() == pytest.approx(k)
    # no reference: kl is zeros
    _, parts = group_objective(logp, old, adv, mask, mask, kl_coef=0.1)
    assert parts["kl"].abs().sum() == 0
    loss.backward()
    # gradient of seq-mean-token-mean: (0,0) clipped → 0; (0,1) −ρA/(2 tokens · 2 seqs) = −1/4 plus the k3 term
    # β·d k3/d logp /4 with d k3/d logp = 1 − r = 1 − 2 = −1 → −0.1/4; (1,0) clipped → 0; padding 0
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, -0.25 - 0.025], [0.0, 0.0]]))


def test_group_objective_sequence_ratio_and_loss_mask_by_hand():
    logp, old, adv, response_mask, _ = _group_case()
    # GSPO: row 0 s = exp((ln 1.5 + 0)/2) = √1.5 ≈ 1.2247 < 1.28, unclipped: −√1.5 on both tokens;
    # row 1 s = exp(ln 0.5 / 1) = 0.5 (its padding's 9 not counted), A = −1 → 0.8
    loss, parts = group_objective(logp, old, adv, response_mask, response_mask, ratio="sequence", clip_high=0.28)
    assert parts["ratio"][:, 0].tolist() == pytest.approx([math.sqrt(1.5), 0.5])
    assert loss.item() == pytest.approx((-math.sqrt(1.5) + 0.8) / 2)
    # the loss mask drops response 1 (say it was truncated); the ratio still uses the response mask.
    # seq-mean-token-mean over n = 2 rows: (−√1.5 + 0) / 2
    loss_mask = torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    dropped, parts = group_objective(logp, old, adv, loss_mask, response_mask, ratio="sequence_token", clip_high=0.28)
    assert dropped.item() == pytest.approx(-math.sqrt(1.5) / 2)
    assert parts["clipped_low"].sum() == 0  # row 1 is not counted, so nothing of it is marked clipped
    with pytest.raises(ValueError, match="sequence_token"):
        group_objective(logp, old, adv, response_mask, response_mask, ratio="geometric")


@pytest.mark.parametrize("ratio", ["token", "sequence"])
@pytest.mark.parametrize("mode", AGGREGATIONS)
def test_micro_batch_splits_give_the_same_loss_and_gradient(mode, ratio):
    torch.manual_seed(0)
    logp = (0.3 * torch.randn(6, 5)).requires_grad_(True)
    old = logp.detach() + 0.2 * torch.randn(6, 5)
    ref = logp.detach() + 0.2 * torch.randn(6, 5)
    mask = torch.tensor(
        [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 0, 0, 0, 0]]
    ).float()
    adv = torch.randn(6, 1)
    kw = dict(ratio=ratio, ref_logprobs=ref, kl_coef=0.05, aggregation=mode, norm_length=5.0)
    whole_loss, _ = group_objective(logp, old, adv, mask, mask, **kw)
    whole_loss.backward()
    whole = logp.grad.clone()
    logp.grad = None
    n_tokens, n_seq = float(mask.sum()), 6
    total = 0.0
    for rows in (slice(0, 1), slice(1, 4), slice(4, 6)):
        part, _ = group_objective(
            logp[rows],
            old[rows],
            adv[rows],
            mask[rows],
            mask[rows],
            ref_logprobs=ref[rows],
            ratio=ratio,
            kl_coef=0.05,
            aggregation=mode,
            norm_length=5.0,
            n_tokens=n_tokens,
            n_sequences=n_seq,
        )
        part.backward()
        total = total + part.detach()
    torch.testing.assert_close(total, whole_loss.detach())
    torch.testing.assert_close(logp.grad, whole)


def test_token_truncated_importance_weights_and_mismatch_by_hand():
    from tether.algorithms.mismatch import importance_weights, sampler_mismatch

    # trainer log-probs ln(0.6), ln(0.2), ln(0.5) (padding); sampler's ln(0.5), ln(0.05), anything
    logp = torch.tensor([[LN(0.6), LN(0.2), LN(0.5)]], dtype=torch.float64)
    sampler = torch.tensor([[LN(0.5), LN(0.05), 3.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 0.0]], dtype=torch.float64)
    # ratios 0.6/0.5 = 1.2 and 0.2/0.05 = 4, capped at 2; padding 0
    w = importance_weights(logp, sampler, mask, "token_truncate", high=2.0)
    torch.testing.assert_close(w, torch.tensor([[1.2, 2.0, 0.0]], dtype=torch.float64))
    assert importance_weights(logp, sampler, mask, "token_truncate", high=10.0)[0, 1].item() == pytest.approx(4.0)
    with pytest.raises(ValueError, match="bounds"):
        importance_weights(logp, sampler, mask, "token_truncate", high=0.0)
    with pytest.raises(ValueError, match="one of token_truncate"):
        importance_weights(logp, sampler, mask, "icepop", high=2.0)
    m = sampler_mismatch(logp, sampler, mask)
    # |log 1.2| = 0.18232, |log 4| = 1.38629; k3 = r − 1 − ln r: 0.2 − 0.18232 = 0.01768, 3 − 1.38629 = 1.61371
    assert m["abs_mean"] == pytest.approx((LN(1.2) + LN(4.0)) / 2)
    assert m["abs_max"] == pytest.approx(LN(4.0))
    assert m["kl"] == pytest.approx((0.2 - LN(1.2) + 3.0 - LN(4.0)) / 2)
    assert sampler_mismatch(logp, sampler, torch.zeros_like(mask)) == {"abs_mean": 0.0, "abs_max": 0.0, "kl": 0.0}


def _ratios(rows, mask):
    """Trainer log-probs ln r against a sampler's 0: the token ratios are r itself."""
    logp = torch.log(torch.tensor(rows, dtype=torch.float64))
    return logp, torch.zeros_like(logp), torch.tensor(mask, dtype=torch.float64)


def test_each_off_policy_correction_by_hand():
    from tether.algorithms.mismatch import geometric_mean_log_ratio, importance_weights, sequence_log_ratio

    # row 0: r = 2, 0.5, 4 (and 9 on padding); row 1: r = 1, 3 (0.1 and 1 on padding)
    logp, sampler, mask = _ratios([[2.0, 0.5, 4.0, 9.0], [1.0, 3.0, 0.1, 1.0]], [[1, 1, 1, 0], [1, 1, 0, 0]])
    # ρ = 2 · 0.5 · 4 = 4 and 1 · 3 = 3; the geometric means 4^(1/3) = 1.5874 and 3^(1/2) = 1.7321
    torch.testing.assert_close(sequence_log_ratio(logp, sampler, mask).exp(), torch.tensor([4.0, 3.0]).double())
    torch.testing.assert_close(
        geometric_mean_log_ratio(logp, sampler, mask).exp(), torch.tensor([4 ** (1 / 3), 3**0.5]).double()
    )

    def w(mode, low, high):
        return importance_weights(logp, sampler, mask, mode, low, high)

    expect = {
        # clip(r, 0.6, 3): 0.5 → 0.6, 4 → 3
        ("token_truncate", 0.6, 3.0): [[2.0, 0.6, 3.0, 0.0], [1.0, 3.0, 0.0, 0.0]],
        # r outside [0.6, 3] → 0 (3 itself is inside)
        ("token_mask", 0.6, 3.0): [[2.0, 0.0, 0.0, 0.0], [1.0, 3.0, 0.0, 0.0]],
        # ρ = 4 → 3.5 on every token of row 0; row 1's ρ = 3 stays
        ("sequence_truncate", 0.0, 3.5): [[3.5, 3.5, 3.5, 0.0], [3.0, 3.0, 0.0, 0.0]],
        # ρ = 4 > 3.5: row 0 out; a lower bound of 3.2 drops row 1 as well
        ("sequence_mask", 0.0, 3.5): [[0.0, 0.0, 0.0, 0.0], [3.0, 3.0, 0.0, 0.0]],
        ("sequence_mask", 3.2, 3.5): [[0.0] * 4, [0.0] * 4],
        # geometric means 1.587 ≤ 1.65 < 1.732: row 0 kept with weight 1, row 1 rejected
        ("geo_mask", 0.0, 1.65): [[1.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]],
        ("geo_mask", 1.6, 2.0): [[0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0]],
    }
    for (mode, low, high), want in expect.items():
        torch.testing.assert_close(w(mode, low, high), torch.tensor(want, dtype=torch.float64), msg=mode)
    # a sequence ratio past float64's range (800 tokens at r = e: ρ = e^800) neither overflows nor gives NaN
    long_logp = torch.full((1, 800), 1.0, dtype=torch.float64)
    long = importance_weights(long_logp, torch.zeros_like(long_logp), torch.ones_like(long_logp), "sequence_mask", 0, 5)
    assert torch.equal(long, torch.zeros_like(long))
    capped = importance_weights(long_logp, torch.zeros_like(long_logp), torch.ones(1, 800), "sequence_truncate", 0, 5)
    torch.testing.assert_close(capped, torch.full((1, 800), 5.0, dtype=torch.float64))


def test_importance_statistics_by_hand():
    from tether.algorithms.mismatch import importance_statistics, importance_weights

    logp, sampler, mask = _ratios([[2.0, 0.5, 4.0, 9.0], [1.0, 3.0, 0.1, 1.0]], [[1, 1, 1, 0], [1, 1, 0, 0]])
    # the five masked ratios sorted: 0.5, 1, 2, 3, 4; linear quantiles at 0.01 · 4 = 0.04 and 0.99 · 4 = 3.96
    masked = importance_weights(logp, sampler, mask, "token_mask", 0.6, 3.0)
    s = importance_statistics(logp, sampler, mask, masked)
    assert s["ratio_p1"] == pytest.approx(0.5 + 0.04 * 0.5) and s["ratio_p50"] == pytest.approx(2.0)
    assert s["ratio_p99"] == pytest.approx(3.0 + 0.96 * 1.0) and s["ratio_max"] == pytest.approx(4.0)
    assert s["masked_share"] == pytest.approx(2 / 5) and s["changed_share"] == pytest.approx(2 / 5)
    truncated = importance_statistics(
        logp, sampler, mask, importance_weights(logp, sampler, mask, "token_truncate", 0.6, 3)
    )
    assert truncated["masked_share"] == 0.0 and truncated["changed_share"] == pytest.approx(2 / 5)
    # a sequence weight replaces every token's own ratio except where they happen to agree (none here)
    seq = importance_weights(logp, sampler, mask, "sequence_truncate", 0.0, 3.5)
    assert importance_statistics(logp, sampler, mask, seq)["changed_share"] == pytest.approx(4 / 5)  # row 1's 3 = ρ


def test_token_weights_scale_the_surrogate_only():
    # the PPO case with weights 0.5 and 2 on the two real tokens: ℓ_clip = (−1.2, −0.5) becomes (−0.6, −1.0);
    # token-mean −0.8, minus 0.1 · entropy mean 0.3 = −0.83; the gradient of token 1 doubles to −0.5
    logp, old, adv, entropy, _, _, _, mask = _ppo_case()
    w = torch.tensor([[0.5, 2.0, 0.0]])
    loss, _ = ppo_policy_loss(logp, old, adv, entropy, mask, entropy_coef=0.1, token_weights=w)
    assert loss.item() == pytest.approx(-0.83)
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, -0.5, 0.0]]))
    # the group case: weights (1, 3) on row 0 and 0.5 on row 1; terms (−1.28, 3·(−1) + 0.1k) and 0.5 · 0.8
    logp, old, adv, mask, ref = _group_case()
    k = 1 - LN(2.0)
    w = torch.tensor([[1.0, 3.0], [0.5, 0.0]])
    loss, _ = group_objective(
        logp, old, adv, mask, mask, clip_low=0.2, clip_high=0.28, ref_logprobs=ref, kl_coef=0.1, token_weights=w
    )
    assert loss.item() == pytest.approx(((-1.28 - 3.0 + 0.1 * k) / 2 + 0.4) / 2)
