"""Reward-model losses (docs/algorithms.md §2). Per-pair or per-list values; callers reduce."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def bradley_terry_loss(
    chosen_scores: torch.Tensor, rejected_scores: torch.Tensor, margin: torch.Tensor | None = None
) -> torch.Tensor:
    """Pairwise Bradley–Terry loss, optionally with a margin.

    L = − log σ(r_w − r_l − m)

    Source: Ouyang et al. 2022 (InstructGPT, arXiv 2203.02155, §3.5); margin m ≥ 0 from Touvron et al. 2023
    (Llama 2, arXiv 2307.09288, §3.2.2).
    Shapes: chosen_scores, rejected_scores, margin (B,) -> (B,).
    """
    diff = chosen_scores - rejected_scores
    if margin is not None:
        diff = diff - margin
    return -F.logsigmoid(diff)


def reward_centering_penalty(chosen_scores: torch.Tensor, rejected_scores: torch.Tensor, eta: float) -> torch.Tensor:
    """Auxiliary term that pins the mean reward near zero: η (r_w + r_l)².

    Source: Eisenstein et al. 2023 (arXiv 2312.09244). Shapes (B,) -> (B,).
    """
    return eta * (chosen_scores + rejected_scores) ** 2


def plackett_luce_loss(ranked_scores: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Plackett–Luce negative log-likelihood of a ranking.

    L = − Σ_{k=1}^{K−1} [ r_(k) − log Σ_{j≥k} exp r_(j) ]

    ``ranked_scores`` (B, K) are the scores in ranking order, best first; ``mask`` (B, K) marks real entries
    (lists shorter than K are padded at the end). Source: Plackett 1975, Luce 1959; used for reward models by
    Zhu et al. 2023 (arXiv 2301.11270). Returns (B,).
    """
    if mask is None:
        mask = torch.ones_like(ranked_scores, dtype=torch.bool)
    mask = mask.bool()
    masked = ranked_scores.masked_fill(~mask, float("-inf"))
    # log Σ_{j≥k} exp r_(j): a reversed cumulative logsumexp.
    tail_lse = torch.logcumsumexp(masked.flip(-1), dim=-1).flip(-1)
    terms = ranked_scores - tail_lse  # (B, K)
    # The last real entry contributes r − r = 0; padding contributes nothing.
    terms = torch.where(mask, terms, torch.zeros_like(terms))
    return -terms.sum(-1)


def all_pairs_loss(ranked_scores: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """InstructGPT's treatment of a ranked list: the mean Bradley–Terry loss over its K(K−1)/2 ordered pairs.

    L = − (1 / C(K,2)) Σ_{i<j} log σ(r_(i) − r_(j))

    Source: Ouyang et al. 2022 (arXiv 2203.02155, §3.5), one list = one batch element. Shapes (B, K) -> (B,).
    """
    if mask is None:
        mask = torch.ones_like(ranked_scores, dtype=torch.bool)
    mask = mask.bool()
    k = ranked_scores.shape[-1]
    upper = torch.triu(torch.ones(k, k, dtype=torch.bool, device=ranked_scores.device), diagonal=1)
    valid = upper & mask.unsqueeze(-1) & mask.unsqueeze(-2)  # (B, K, K): i ranked above j, both real
    diff = ranked_scores.unsqueeze(-1) - ranked_scores.unsqueeze(-2)
    losses = torch.where(valid, -F.logsigmoid(diff), torch.zeros_like(diff)).sum((-1, -2))
    return losses / valid.sum((-1, -2)).clamp(min=1)


def ordered_pair_accuracy(ranked: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per list: fraction of (better, worse) pairs whose scores are in the right order. (B, K) -> (B,)."""
    k = ranked.shape[-1]
    upper = torch.triu(torch.ones(k, k, dtype=torch.bool, device=ranked.device), diagonal=1)
    valid = upper & mask.unsqueeze(-1) & mask.unsqueeze(-2)
    right = (ranked.unsqueeze(-1) > ranked.unsqueeze(-2)) & valid
    return right.sum((-1, -2)).float() / valid.sum((-1, -2)).clamp(min=1)
