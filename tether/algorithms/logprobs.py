"""Per-token log-probabilities from logits, without a full log-softmax copy.

One function serves SFT, reference, old and current log-probs alike, so the
same sampling transform (logits / temperature) is applied everywhere.
"""

from __future__ import annotations

import torch


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """float32 for a lower precision (bf16, fp16) or float32; float64 stays float64 (a float64 model, as the tests'
    N-processes-equal-one checks run, keeps its precision through log-probs, values and scores)."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def at_least_float32(x: torch.Tensor) -> torch.Tensor:
    """``x`` in compute_dtype(x): what a bf16 model's head outputs are read in."""
    return x.to(compute_dtype(x))


# Positions per chunk: a chunk's float copy and log-softmax hold at most this many logits (64 MiB in float32), so the
# memory beyond the logits does not grow with the sequence or the vocabulary (4,096 positions of a 151,936-token
# vocabulary would be 2.3 GiB a copy; at 2**24 logits a chunk is 110 positions of it).
CHUNK_LOGITS = 2**24


def _positions_per_chunk(vocab: int, chunk_positions: int | None) -> int:
    return chunk_positions or max(1, CHUNK_LOGITS // max(vocab, 1))


def token_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0, chunk_positions: int | None = None
) -> torch.Tensor:
    """log π(a_t | s_t) for the given targets.

    logp_t = z_t[a_t] / τ − logsumexp_v(z_t[v] / τ)

    Args:
        logits: (B, T, V) next-token logits; position t predicts targets[:, t].
        targets: (B, T) token ids (any value where the result will be masked).
        temperature: τ, the sampling temperature used at rollout time (1 for SFT).
        chunk_positions: positions (of the B·T) processed at once; default: as many as hold CHUNK_LOGITS logits.
            The naive equivalent is ``torch.log_softmax(logits / τ, -1).gather(-1, targets[..., None])``, which
            materialises a (B, T, V) float32 tensor; chunking bounds that to (chunk_positions, V), whatever the
            sequence length and the vocabulary. A test checks both agree.

    Returns:
        (B, T) float32 log-probabilities (float64 for float64 logits).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    flat, picked_ids = logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)  # (B·T, V), (B·T,)
    out = torch.empty(picked_ids.shape, dtype=compute_dtype(logits), device=logits.device)
    step = _positions_per_chunk(flat.shape[-1], chunk_positions)
    for start in range(0, flat.shape[0], step):
        rows = flat[start : start + step].to(out.dtype)
        if temperature != 1.0:
            rows = rows / temperature
        picked = rows.gather(-1, picked_ids[start : start + step].unsqueeze(-1)).squeeze(-1)
        out[start : start + step] = picked - torch.logsumexp(rows, dim=-1)
    return out.view(targets.shape)


def token_entropy(logits: torch.Tensor, temperature: float = 1.0, chunk_positions: int | None = None) -> torch.Tensor:
    """Per-token entropy of the sampling distribution π(· | s_t) = softmax(z_t / τ).

    H_t = −Σ_v π(v | s_t) · log π(v | s_t)

    Args:
        logits: (B, T, V) next-token logits.
        temperature: τ, the same sampling transform token_logprobs applies (docs/algorithms.md §3).
        chunk_positions: positions processed at once, as in token_logprobs: never a full (B, T, V) float32 copy.

    A logit of −inf (a token never sampled: a vision-language model's image placeholder online) adds 0 · log 0 = 0.

    Returns:
        (B, T) float32 entropies in nats (float64 for float64 logits; any value where the result will be masked).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    flat = logits.reshape(-1, logits.shape[-1])
    entropy = torch.empty(flat.shape[0], dtype=compute_dtype(logits), device=logits.device)
    step = _positions_per_chunk(flat.shape[-1], chunk_positions)
    for start in range(0, flat.shape[0], step):
        rows = flat[start : start + step].to(entropy.dtype) / temperature
        logp = torch.log_softmax(rows, -1)
        # a token whose logit is -inf (one that is never sampled) adds 0·log 0 = 0, and a gradient of 0, not nan
        entropy[start : start + step] = -(logp.exp() * logp.masked_fill(torch.isneginf(logp), 0.0)).sum(-1)
    return entropy.view(logits.shape[:-1])


class _HeadLogprobs(torch.autograd.Function):
    """linear_token_logprobs' forward and its backward, each a chunk of positions at a time. One chunk's logits are
    kept for the backward instead of recomputed (they are at most CHUNK_LOGITS: the bound holds, and the product is
    saved); several chunks' are recomputed."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, step):
        out = torch.empty(targets.shape, dtype=compute_dtype(hidden), device=hidden.device)
        lse = torch.empty_like(out)
        z = None  # no position (an empty selection): nothing computed, zero gradients
        for start in range(0, hidden.shape[0], step):
            z = at_least_float32(torch.nn.functional.linear(hidden[start : start + step], weight, bias))
            lse[start : start + step] = torch.logsumexp(z, dim=-1)
            picked = z.gather(-1, targets[start : start + step, None])[:, 0]
            out[start : start + step] = picked - lse[start : start + step]
        ctx.save_for_backward(hidden, weight, bias, targets, lse)
        ctx.step = step
        ctx.kept = z if hidden.shape[0] <= step and any(ctx.needs_input_grad[:3]) else None
        device = hidden.device.type  # the backward recomputes under the forward's autocast, so its z is the forward's
        ctx.autocast = (device, torch.is_autocast_enabled(device), torch.get_autocast_dtype(device))
        return out

    @staticmethod
    def backward(ctx, grad):
        hidden, weight, bias, targets, lse = ctx.saved_tensors
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = grad_bias = None
        device, enabled, dtype = ctx.autocast
        for start in range(0, hidden.shape[0], ctx.step):
            h = hidden[start : start + ctx.step]
            z = ctx.kept
            if z is None:
                with torch.autocast(device, dtype=dtype, enabled=enabled):
                    z = at_least_float32(torch.nn.functional.linear(h, weight, bias))  # recomputed, not kept
            g = grad[start : start + ctx.step, None].to(z.dtype)
            dz = -g * torch.exp(z - lse[start : start + ctx.step, None])  # ∂/∂z of g·logp: g·(onehot − softmax)
            dz.scatter_add_(-1, targets[start : start + ctx.step, None], g)
            if grad_hidden is not None:
                grad_hidden[start : start + ctx.step] = (dz.to(weight.dtype) @ weight).to(hidden.dtype)
            if ctx.needs_input_grad[1]:  # the first chunk's product is the buffer: no (V, H) zeros to add to
                h_ = h.to(dz.dtype)
                grad_weight = dz.T @ h_ if grad_weight is None else grad_weight.addmm_(dz.T, h_)
            if ctx.needs_input_grad[2]:
                grad_bias = dz.sum(0) if grad_bias is None else grad_bias.add_(dz.sum(0))
        ctx.kept = None
        if ctx.needs_input_grad[1] and grad_weight is None:  # no position: zeros, so the weight's gradient hooks run
            grad_weight = torch.zeros_like(weight)
        if ctx.needs_input_grad[2] and grad_bias is None:
            grad_bias = torch.zeros_like(bias)
        cast = lambda g, like: None if g is None else g.to(like.dtype)
        return grad_hidden, cast(grad_weight, weight), cast(grad_bias, bias), None, None


def linear_token_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    chunk_positions: int | None = None,
) -> torch.Tensor:
    """log π(a_t | s_t) straight from the last hidden states, the LM head applied a chunk of positions at a time, so
    the (N, V) logits never exist whole, in the forward or the backward (docs/algorithms.md §10).

    z_t = W h_t + b,   logp_t = z_t[a_t] − logsumexp_v z_t[v],   ∂logp_t/∂z_t = e_{a_t} − softmax(z_t)

    The backward recomputes each chunk's logits from the kept hidden states and the per-position logsumexp, so the
    memory beyond the inputs is one chunk's (chunk_positions, V) logits; the price is one more head product (none
    when all positions fit one chunk: its logits are kept instead).

    Args:
        hidden: (N, H) last (normed) hidden states at the positions that predict ``targets``.
        weight: (V, H) the LM head's weight; bias: (V,) or None.
        targets: (N,) token ids.
        chunk_positions: positions per chunk; default as token_logprobs (CHUNK_LOGITS logits a chunk).

    Returns:
        (N,) float32 log-probabilities (float64 for float64 inputs); equal to
        ``token_logprobs(linear(hidden, weight, bias)[None], targets[None])[0]`` up to rounding (a test checks it,
        and the gradients).
    """
    if hidden.dim() != 2 or targets.shape != hidden.shape[:1]:
        raise ValueError(
            f"hidden must be (N, H) and targets (N,), got {tuple(hidden.shape)} and {tuple(targets.shape)}"
        )
    step = _positions_per_chunk(weight.shape[0], chunk_positions)
    return _HeadLogprobs.apply(hidden, weight, bias, targets, step)
