"""How per-token terms become one number (docs/algorithms.md §5, "Loss aggregation").

Losses elsewhere return per-token (B, T) values; ``aggregate`` is the one named, tested step that turns them
into a scalar. ``mask`` is 1 on tokens that count (response tokens up to and including EOS) and 0 on prompt
and padding.
"""

from __future__ import annotations

import torch

AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def masked_sum(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Σ_{b,t} v_{b,t} m_{b,t}. Padding content never leaks in, even if it is NaN-free garbage."""
    return torch.where(mask.bool(), values, torch.zeros_like(values)).sum()


def aggregate(
    values: torch.Tensor,
    mask: torch.Tensor,
    mode: str = "token-mean",
    n_tokens: float | None = None,
    n_sequences: float | None = None,
    norm_length: float | None = None,
) -> torch.Tensor:
    """Token terms → one number, with denominators of the whole optimizer step (docs/algorithms.md §5).

    token-mean:              Σ_{i,t} ℓ m / n_tokens                     (DAPO, Yu et al. 2025, arXiv 2503.14476)
    seq-mean-token-mean:     Σ_i ( Σ_t ℓ m / Σ_t m ) / n_sequences      (GRPO, Shao et al. 2024, arXiv 2402.03300)
    seq-mean-token-sum-norm: Σ_i Σ_t ℓ m / (L · n_sequences)            (Dr. GRPO, Liu et al. 2025, arXiv 2503.20783;
                                                                         L constant)

    values, mask: (B, T); returns a 0-dim tensor. Padding content (even NaN) never leaks in. A sequence with
    no counted token contributes 0 to seq-mean-token-mean.

    n_tokens / n_sequences default to this tensor's own counts; pass the step's totals when the step is
    split into micro-batches (or processes), and the micro-batch losses add up to exactly the full-batch loss
    (docs/algorithms.md §1 on global denominators). ``norm_length`` is L, required by seq-mean-token-sum-norm.
    """
    m = mask.to(values.dtype)
    masked = torch.where(mask.bool(), values, torch.zeros_like(values))
    if mode == "token-mean":
        denominator = m.sum() if n_tokens is None else torch.as_tensor(n_tokens, dtype=values.dtype)
        return masked.sum() / denominator.clamp(min=1.0)
    n = values.shape[0] if n_sequences is None else n_sequences
    if mode == "seq-mean-token-mean":
        return (masked.sum(-1) / m.sum(-1).clamp(min=1.0)).sum() / max(n, 1)
    if mode == "seq-mean-token-sum-norm":
        if not norm_length or norm_length <= 0:
            raise ValueError("seq-mean-token-sum-norm needs norm_length > 0")
        return masked.sum() / (norm_length * max(n, 1))
    raise ValueError(f"unknown aggregation {mode!r}: token-mean, seq-mean-token-mean or seq-mean-token-sum-norm")


def segment_sum(values: torch.Tensor, segment: torch.Tensor, n: int) -> torch.Tensor:
    """s_j = Σ_{positions p with segment_p = j} v_p, for j = 0..n−1 (docs/algorithms.md §5.6.1).

    values, segment: the same shape; segment holds ids in [0, n], and id n (padding) is dropped. Returns (n,) in
    values' dtype; the gradient reaches every summed position.
    """
    flat = values.reshape(-1)
    out = torch.zeros(n + 1, dtype=flat.dtype, device=flat.device)
    return out.index_add(0, segment.reshape(-1).to(flat.device), flat)[:n]
