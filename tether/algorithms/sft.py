"""Supervised fine-tuning loss (docs/algorithms.md §1)."""

from __future__ import annotations

import torch

from tether.algorithms.reductions import masked_sum


def sft_nll_sum(logprobs: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Summed negative log-likelihood of the trained tokens.

    L_sum = − Σ_{b,t} m_{b,t} logp_{b,t}

    The SFT loss is L = L_sum / N with N = Σ m over the whole optimizer step
    (every micro-batch and every process). This function returns the sum so
    the caller can divide by that global N; dividing each micro-batch by its
    own token count would over-weight short sequences (docs/algorithms.md §1).

    Args:
        logprobs: (B, T) log-probabilities of the target tokens.
        loss_mask: (B, T) 1 on trained target tokens (completion and its EOS,
            or every token when prompts are trained on), 0 on prompt and padding.
    Returns:
        scalar tensor.
    """
    return -masked_sum(logprobs, loss_mask)
