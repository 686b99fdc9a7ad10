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


def token_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0, chunk_rows: int = 8
) -> torch.Tensor:
    """log π(a_t | s_t) for the given targets.

    logp_t = z_t[a_t] / τ − logsumexp_v(z_t[v] / τ)

    Args:
        logits: (B, T, V) next-token logits; position t predicts targets[:, t].
        targets: (B, T) token ids (any value where the result will be masked).
        temperature: τ, the sampling temperature used at rollout time (1 for SFT).
        chunk_rows: rows of the batch processed at once. The naive equivalent is
            ``torch.log_softmax(logits / τ, -1).gather(-1, targets[..., None])``,
            which materialises a (B, T, V) float32 tensor; chunking bounds that
            to (chunk_rows, T, V). A test checks both agree.

    Returns:
        (B, T) float32 log-probabilities (float64 for float64 logits).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    out = torch.empty(targets.shape, dtype=compute_dtype(logits), device=logits.device)
    for start in range(0, logits.shape[0], chunk_rows):
        rows = logits[start : start + chunk_rows].to(out.dtype)
        if temperature != 1.0:
            rows = rows / temperature
        picked = rows.gather(-1, targets[start : start + chunk_rows].unsqueeze(-1)).squeeze(-1)
        out[start : start + chunk_rows] = picked - torch.logsumexp(rows, dim=-1)
    return out


def token_entropy(logits: torch.Tensor, temperature: float = 1.0, chunk_rows: int = 8) -> torch.Tensor:
    """Per-token entropy of the sampling distribution π(· | s_t) = softmax(z_t / τ).

    H_t = −Σ_v π(v | s_t) · log π(v | s_t)

    Args:
        logits: (B, T, V) next-token logits.
        temperature: τ, the same sampling transform token_logprobs applies (docs/algorithms.md §3).
        chunk_rows: rows processed at once, as in token_logprobs: never a full (B, T, V) float32 copy.

    Returns:
        (B, T) float32 entropies in nats (float64 for float64 logits; any value where the result will be masked).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    entropy = torch.empty(logits.shape[:2], dtype=compute_dtype(logits), device=logits.device)
    for start in range(0, logits.shape[0], chunk_rows):
        rows = logits[start : start + chunk_rows].to(entropy.dtype) / temperature
        logp = torch.log_softmax(rows, -1)
        entropy[start : start + chunk_rows] = -(logp.exp() * logp).sum(-1)
    return entropy
