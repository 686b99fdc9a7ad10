"""Hand-computed cases for the pure functions in tether.algorithms and the LR schedule."""

import math

import pytest
import torch

from tether.algorithms.logprobs import at_least_float32, linear_token_logprobs, token_entropy, token_logprobs
from tether.algorithms.reductions import AGGREGATIONS, aggregate, masked_sum
from tether.algorithms.sft import sft_nll_sum
from tether.train.schedule import warmup_cosine


def test_token_logprobs_hand_computed():
    # logits [0, ln 3] -> softmax [1/4, 3/4]; target 1 -> log(3/4)
    logits = torch.tensor([[[0.0, math.log(3.0)]]])
    assert token_logprobs(logits, torch.tensor([[1]])).item() == pytest.approx(math.log(0.75))
    # temperature 2 halves the logits: [0, ln3/2] -> softmax [1/(1+√3), √3/(1+√3)]
    got = token_logprobs(logits, torch.tensor([[0]]), temperature=2.0).item()
    assert got == pytest.approx(math.log(1 / (1 + math.sqrt(3))))


def test_token_logprobs_matches_naive_log_softmax_in_chunks():
    torch.manual_seed(0)
    logits = torch.randn(5, 7, 11)
    targets = torch.randint(0, 11, (5, 7))
    for temperature in (1.0, 0.7):
        naive = torch.log_softmax(logits / temperature, -1).gather(-1, targets[..., None]).squeeze(-1)
        torch.testing.assert_close(token_logprobs(logits, targets, temperature, chunk_positions=3), naive)


def test_token_entropy_hand_computed_and_at_the_sampling_temperature():
    # softmax [1/4, 3/4]: H = -(1/4 ln 1/4 + 3/4 ln 3/4) = 0.5623351...
    logits = torch.tensor([[[0.0, math.log(3.0)]]], dtype=torch.float64)
    assert token_entropy(logits).item() == pytest.approx(-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)), rel=1e-6)
    # τ = 2: probabilities [1/(1+√3), √3/(1+√3)]
    p = 1 / (1 + math.sqrt(3))
    assert token_entropy(logits, 2.0).item() == pytest.approx(-(p * math.log(p) + (1 - p) * math.log(1 - p)), rel=1e-6)
    torch.manual_seed(0)
    logits = torch.randn(5, 3, 11)  # chunked rows equal the whole
    naive = -(torch.softmax(logits / 0.7, -1) * torch.log_softmax(logits / 0.7, -1)).sum(-1)
    torch.testing.assert_close(token_entropy(logits, 0.7, chunk_positions=3), naive)
    with pytest.raises(ValueError, match="temperature"):
        token_entropy(logits, 0.0)
    # a token never sampled (logit -inf) adds nothing: softmax [1/2, 1/2, 0] has H = ln 2, and its gradient is finite
    # (the naive p·log p is 0·-inf = nan there): dH/dz = -p (log p + H) = [0, 0, 0] for the two equal logits
    logits = torch.tensor([[[0.0, 0.0, float("-inf")]]], dtype=torch.float64, requires_grad=True)
    entropy = token_entropy(logits)
    assert entropy.item() == pytest.approx(math.log(2), rel=1e-12)
    entropy.sum().backward()
    assert torch.equal(logits.grad, torch.zeros_like(logits))


def test_log_probs_keep_float64_and_lift_lower_precisions_to_float32():
    # log(3/4) = ln 3 − ln 4 to float64 precision (a few roundings of terms ≤ 1.4: within 10 ulps of 1), not rounded
    # to float32 (6e-8) on the way
    logits = torch.tensor([[[0.0, math.log(3.0)]]], dtype=torch.float64)
    got = token_logprobs(logits, torch.tensor([[1]]))
    assert got.dtype == torch.float64 and abs(got.item() - math.log(0.75)) <= 10 * 2.0**-53
    assert token_entropy(logits).dtype == torch.float64
    for low in (torch.bfloat16, torch.float16, torch.float32):
        assert token_logprobs(logits.to(low), torch.tensor([[1]])).dtype == torch.float32
        assert at_least_float32(logits.to(low)).dtype == torch.float32


def test_linear_token_logprobs_hand_computed_with_its_gradient():
    # W = [[1, 0], [0, 1], [0, 0]], b = [0, 0, ln 2], h = [ln 3, 0]: z = [ln 3, 0, ln 2], softmax = [1/2, 1/6, 1/3];
    # target 0 -> logp = ln(1/2). ∂logp/∂z = e_0 − softmax = [1/2, −1/6, −1/3]; ∂/∂W = that ⊗ h, ∂/∂b = that,
    # ∂/∂h = Wᵀ (that) = [1/2, −1/6]
    weight = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]], dtype=torch.float64, requires_grad=True)
    bias = torch.tensor([0.0, 0.0, math.log(2.0)], dtype=torch.float64, requires_grad=True)
    hidden = torch.tensor([[math.log(3.0), 0.0]], dtype=torch.float64, requires_grad=True)
    logp = linear_token_logprobs(hidden, weight, bias, torch.tensor([0]))
    assert logp.item() == pytest.approx(math.log(0.5), abs=1e-15)
    logp.sum().backward()
    dz = [0.5, -1 / 6, -1 / 3]
    torch.testing.assert_close(bias.grad, torch.tensor(dz, dtype=torch.float64), atol=1e-15, rtol=0)
    expected_w = torch.tensor([[d * math.log(3.0), 0.0] for d in dz], dtype=torch.float64)
    torch.testing.assert_close(weight.grad, expected_w, atol=1e-15, rtol=0)
    torch.testing.assert_close(hidden.grad, torch.tensor([[0.5, -1 / 6]], dtype=torch.float64), atol=1e-15, rtol=0)


@pytest.mark.parametrize("chunk", (3, None))
@pytest.mark.parametrize("with_bias", (False, True))
def test_linear_token_logprobs_equal_the_whole_logits_path_in_chunks(with_bias, chunk):
    """float64: the chunked head with its recomputing backward (chunks of 3, 3, 3, 1) or with one chunk's logits kept
    (the default size holds all 10 positions) gives the log-probs and gradients of the head applied whole then
    token_logprobs, to float64 rounding (bound 1e-12 on values of order 1-10)."""
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(10, 6, dtype=torch.float64, generator=gen)
    weight = torch.randn(13, 6, dtype=torch.float64, generator=gen)
    bias = torch.randn(13, dtype=torch.float64, generator=gen) if with_bias else None
    targets = torch.randint(0, 13, (10,), generator=gen)
    upstream = torch.randn(10, dtype=torch.float64, generator=gen)  # a weighted sum, as a loss makes of them
    results = []
    for chunked in (False, True):
        leaves = [t.clone().requires_grad_() for t in (hidden, weight) + ((bias,) if with_bias else ())]
        b = leaves[2] if with_bias else None
        if chunked:
            logp = linear_token_logprobs(leaves[0], leaves[1], b, targets, chunk_positions=chunk)
        else:
            logits = torch.nn.functional.linear(leaves[0], leaves[1], b)
            logp = token_logprobs(logits[None], targets[None])[0]
        (logp * upstream).sum().backward()
        results.append([logp.detach()] + [t.grad for t in leaves])
    for whole, chunked in zip(*results):
        torch.testing.assert_close(chunked, whole, atol=1e-12, rtol=0)


def test_linear_token_logprobs_recompute_under_the_forwards_autocast():
    """Under bf16 autocast the head's product runs in bf16 in the forward, and the backward recomputes it in bf16 too
    (chunks of 5: recomputed): the log-probs are the whole path's up to a logit's bf16 rounding, the gradients up to
    the rounding of its bf16 backward products (bounds derived below)."""
    gen = torch.Generator().manual_seed(1)
    hidden = torch.randn(12, 16, generator=gen)
    weight = torch.randn(40, 16, generator=gen) / 4
    targets = torch.randint(0, 40, (12,), generator=gen)
    results = []
    for chunked in (False, True):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            if chunked:
                logp = linear_token_logprobs(h, w, None, targets, chunk_positions=5)
            else:
                logp = token_logprobs(torch.nn.functional.linear(h, w)[None], targets[None])[0]
        logp.sum().backward()
        results.append((logp.detach(), h.grad, w.grad))
    (logp0, h0, w0), (logp1, h1, w1) = results
    assert logp1.dtype == torch.float32
    # the same bf16 products on other row counts: a kernel may sum in another order, and a logit then rounds to the
    # neighbouring bf16 value (2^-8 of its size), moving a log-prob by at most twice that
    with torch.autocast("cpu", dtype=torch.bfloat16):
        largest = float(torch.nn.functional.linear(hidden, weight).abs().max())
    torch.testing.assert_close(logp1, logp0, atol=2 * 2.0**-8 * largest, rtol=0)
    # the whole path's backward multiplies dz = onehot − softmax by W (for h) and by h (for W) in bf16: each operand
    # rounded to 8 significant bits (2^-9 relative), so an entry moves by at most 2·2^-9 of the sum of its terms'
    # sizes; 2^-7 of that sum bounds it with room for the float32 accumulation
    z = torch.nn.functional.linear(hidden, weight.to(torch.bfloat16).float())  # the bf16-rounded weight's logits
    dz = (torch.nn.functional.one_hot(targets, 40).float() - torch.softmax(z, -1)).abs()
    assert ((h1 - h0).abs() <= 2.0**-7 * (dz @ weight.abs()) + 1e-7).all()
    assert ((w1 - w0).abs() <= 2.0**-7 * (dz.T @ hidden.abs()) + 1e-7).all()


def test_token_logprobs_rejects_bad_temperature():
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs(torch.zeros(1, 1, 2), torch.zeros(1, 1, dtype=torch.long), temperature=0)


def test_reductions_hand_computed():
    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 100.0, 100.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    assert masked_sum(values, mask).item() == 10.0  # 1+2+3+4
    assert aggregate(values, mask).item() == pytest.approx(2.5)  # default token-mean: 10 / 4
    assert aggregate(values, mask, "token-mean").item() == pytest.approx(2.5)  # 10 / 4
    assert aggregate(values, mask, "token-mean", n_tokens=8).item() == pytest.approx(1.25)  # 10 / 8 (global count)
    assert aggregate(values, mask, "seq-mean-token-mean").item() == pytest.approx(3.0)  # (6/3 + 4/1) / 2 = (2 + 4) / 2
    # (6 + 4) / (L·n) = 10 / (4·2) = 1.25, i.e. (6/4 + 4/4) / 2
    assert aggregate(values, mask, "seq-mean-token-sum-norm", norm_length=4).item() == pytest.approx(1.25)
    # the step's sequence count: (2 + 4) / 4 = 1.5 and 10 / (4·4) = 0.625
    assert aggregate(values, mask, "seq-mean-token-mean", n_sequences=4).item() == pytest.approx(1.5)
    got = aggregate(values, mask, "seq-mean-token-sum-norm", n_sequences=4, norm_length=4)
    assert got.item() == pytest.approx(0.625)


def test_aggregate_rejects_unknown_mode_and_missing_norm_length():
    assert AGGREGATIONS == ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")
    values, mask = torch.ones(1, 2), torch.ones(1, 2)
    with pytest.raises(ValueError, match="token-mean"):
        aggregate(values, mask, "mean")
    for bad in (None, 0, -1.0):
        with pytest.raises(ValueError, match="norm_length"):
            aggregate(values, mask, "seq-mean-token-sum-norm", norm_length=bad)


def test_reductions_ignore_padding_content_even_nan():
    values = torch.tensor([[1.0, float("nan")]])
    mask = torch.tensor([[1, 0]])
    for mode in AGGREGATIONS:  # token-mean 1/1; seq-mean-token-mean (1/1)/1; sum-norm 1/(1·1)
        assert aggregate(values, mask, mode, norm_length=1.0).item() == 1.0


def test_sequences_without_counted_tokens_count_zero_and_an_empty_mask_gives_zero():
    values = torch.tensor([[2.0, 2.0], [5.0, 5.0]])
    mask = torch.tensor([[1, 1], [0, 0]])
    assert aggregate(values, mask, "seq-mean-token-mean").item() == pytest.approx(1.0)  # (4/2 + 0) / 2
    for mode in AGGREGATIONS:  # nothing counted: 0 / max(0, 1), never 0/0
        assert aggregate(values, torch.zeros(2, 2), mode, norm_length=2.0).item() == 0.0


def test_sft_nll_sum_hand_computed_and_gradient_only_on_trained_tokens():
    logprobs = torch.tensor([[-1.0, -2.0, -3.0]], requires_grad=True)
    mask = torch.tensor([[0, 1, 1]])
    loss = sft_nll_sum(logprobs, mask)
    assert loss.item() == 5.0  # 2 + 3; the prompt token is not counted
    loss.backward()
    assert logprobs.grad.tolist() == [[0.0, -1.0, -1.0]]


def test_warmup_cosine_hand_computed():
    # 10 steps, 2 warm-up: 0.5, 1.0, then cosine from 1 to 0.1 over steps 2..9
    values = [warmup_cosine(s, 10, 2, 0.1) for s in range(10)]
    assert values[0] == pytest.approx(0.5) and values[1] == pytest.approx(1.0)
    assert values[2] == pytest.approx(1.0)
    assert values[-1] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(values[1:], values[2:]))
    # 11 steps, 2 warm-up: decay over steps 2..10 (8 intervals); step 6 is half-way: 0.1 + 0.9 * 0.5 = 0.55
    assert warmup_cosine(6, 11, 2, 0.1) == pytest.approx(0.55)


def test_the_names_settings_offer_are_the_pieces_implemented():
    """tether.algorithms.choices keeps the names without torch (for `--help`); each implementation has exactly them."""
    from tether.algorithms import choices, policy, preference, reductions
    from tether.algorithms.advantages import token_advantages

    assert tuple(policy.RATIOS) == choices.RATIOS
    assert tuple(reductions.AGGREGATIONS) == choices.AGGREGATIONS
    assert tuple(preference.PREFERENCE_LOSSES) == choices.PREFERENCE_LOSSES
    mask = torch.ones(2, 3)
    for name in choices.ADVANTAGE_ESTIMATORS:  # every offered estimator runs
        token_advantages(name, torch.tensor([1.0, 0.0]), mask, 2, kl=torch.zeros(2, 3), kl_coef=0.1)
    from tether.algorithms.mismatch import importance_weights

    for name in choices.OFF_POLICY_CORRECTIONS:  # every offered correction runs: equal log-probs, weight 1
        torch.testing.assert_close(importance_weights(torch.zeros(2, 3), torch.zeros(2, 3), mask, name, 0.5, 2.0), mask)


def test_help_needs_neither_torch_nor_transformers():
    import subprocess
    import sys

    code = (
        "import sys, tether.cli; tether.cli.build_parser(); "
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr[-2000:]


def test_linear_token_logprobs_of_no_position_back_propagate_zeros():
    hidden = torch.zeros(0, 4, requires_grad=True)
    weight, bias = torch.ones(6, 4, requires_grad=True), torch.ones(6, requires_grad=True)
    out = linear_token_logprobs(hidden, weight, bias, torch.zeros(0, dtype=torch.long))
    assert out.shape == (0,)
    out.sum().backward()
    assert torch.equal(weight.grad, torch.zeros(6, 4)) and torch.equal(bias.grad, torch.zeros(6))
