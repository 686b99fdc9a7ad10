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
