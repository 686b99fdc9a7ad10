"""How per-token terms become one number (shared ALGORITHMS §5, "Loss aggregation").

Losses elsewhere return per-token (B, T) values; these reductions are the
named, tested step that turns them into a scalar. ``mask`` is 1 on tokens that
count (response tokens up to and including EOS) and 0 on prompt and padding.
"""
from __future__ import annotations

import torch


def masked_sum(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Σ_{b,t} v_{b,t} m_{b,t}. Padding content never leaks in, even if it is NaN-free garbage."""
    return torch.where(mask.bool(), values, torch.zeros_like(values)).sum()


def token_mean(values: torch.Tensor, mask: torch.Tensor, denominator: float | torch.Tensor | None = None) -> torch.Tensor:
    """token-mean: Σ_{b,t} v m / Σ_{b,t} m.

    ``denominator`` replaces Σ m when the mean must run over more tokens than
    this tensor holds: under gradient accumulation and several processes the
    denominator is the token count of the whole optimizer step (ALGORITHMS §1),
    so that each micro-batch contributes its *sum* divided by the global count.
    """
    if denominator is None:
        denominator = mask.sum()
    return masked_sum(values, mask) / torch.clamp(torch.as_tensor(denominator, dtype=values.dtype), min=1.0)


def seq_mean_token_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """seq-mean-token-mean: mean_b ( Σ_t v m / Σ_t m ). Sequences with no counted token contribute 0."""
    mask = mask.to(values.dtype)
    per_seq = (torch.where(mask.bool(), values, torch.zeros_like(values))).sum(-1) / mask.sum(-1).clamp(min=1.0)
    return per_seq.mean()


def seq_mean_token_sum_norm(values: torch.Tensor, mask: torch.Tensor, norm_length: float) -> torch.Tensor:
    """seq-mean-token-sum-norm: mean_b ( Σ_t v m / L ), L a constant such as the maximum response length (Dr. GRPO)."""
    if norm_length <= 0:
        raise ValueError(f"norm_length must be > 0, got {norm_length}")
    return (torch.where(mask.bool(), values, torch.zeros_like(values))).sum(-1).mean() / norm_length
