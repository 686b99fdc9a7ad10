"""Reward-model losses (docs/algorithms.md §2) and process reward models' step losses and measures (§2.4).
Per-pair, per-list or per-step values; callers reduce."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tether.algorithms.masks import last_action_index


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


def step_bce_loss(step_logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Per-step binary cross-entropy of a process reward model.

    L_k = −[y_k log σ(s_k) + (1 − y_k) log(1 − σ(s_k))] = softplus(s_k) − y_k s_k

    s_k is the head's logit at step k's last token, y_k ∈ [0, 1] its label (1: the step is right; a fraction: a
    Math-Shepherd soft label). Padded steps (mask 0) give 0. Source: Lightman et al. 2023 (arXiv 2305.20050, §2.2
    and appendix on the PRM); Wang et al. 2024 (Math-Shepherd, arXiv 2312.08935, §3.3).
    Shapes: step_logits, labels, mask (B, S) -> (B, S).
    """
    losses = F.softplus(step_logits) - labels.to(step_logits.dtype) * step_logits
    return losses if mask is None else losses * mask.to(losses.dtype)


def binary_auroc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """AUROC = P(s₊ > s₋) + ½ P(s₊ = s₋) over all (positive, negative) pairs = U / (n₊ n₋),
    U = R₊ − n₊(n₊ + 1)/2, R₊ the sum of the positives' ranks among all N scores (1 = lowest; tied scores share
    their mean rank). Mann–Whitney U (Hanley & McNeil 1982; docs/algorithms.md §2.4): one sort, O(N log N) time and
    O(N) memory, where comparing every pair holds n₊ n₋ of them. In float64 the ranks are halves of integers, and
    U is exact, equal to the pair count, for N < 2^26. NaN without both classes; scores must be finite.
    Shapes: (N,), (N,) -> float."""
    scores, labels = scores.flatten().double(), labels.flatten().bool()
    n_pos, n_neg = int(labels.sum()), int((~labels).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    _, tie_group, group_sizes = torch.unique(scores, sorted=True, return_inverse=True, return_counts=True)
    below = torch.cumsum(group_sizes, 0) - group_sizes  # scores strictly lower than each group
    mean_rank = below.double() + (group_sizes.double() + 1) / 2  # ranks below + 1 .. below + size, averaged
    rank_sum = mean_rank[tie_group][labels].sum()
    return float((rank_sum - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def first_wrong_step(correct: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """f_i = min({k : m_{i,k} = 1, c_{i,k} = 0} ∪ {Σ_k m_{i,k}}): the index of each solution's first wrong step, or the
    number of real steps when every step is right (0 for a batch with no step column, S = 0).
    Shapes: (B, S) bool, (B, S) -> (B,) long."""
    wrong = (~correct.bool()) & mask.bool()
    steps = mask.long().sum(-1)
    index = torch.where(wrong, torch.arange(correct.shape[1], device=correct.device), correct.shape[1])
    return torch.cat([index, steps[:, None]], -1).min(-1).values


def aggregate_step_scores(step_scores: torch.Tensor, mask: torch.Tensor, how: str) -> torch.Tensor:
    """One score per solution from its step scores: ``min`` (Math-Shepherd, Wang et al. 2024 §3.4: a solution is
    as good as its worst step), ``sum``, ``mean`` or ``last`` (the last real step's score). A solution with no
    step scores 0. Shapes: (B, S), (B, S) -> (B,)."""
    real = mask.bool()
    has = real.any(-1)
    if step_scores.shape[-1] == 0:  # no solution has a step
        return torch.zeros(step_scores.shape[:-1], dtype=step_scores.dtype, device=step_scores.device)
    if how == "min":
        out = torch.where(real, step_scores, torch.full_like(step_scores, float("inf"))).min(-1).values
    elif how == "sum":
        out = (step_scores * real).sum(-1)
    elif how == "mean":
        out = (step_scores * real).sum(-1) / real.sum(-1).clamp(min=1)
    elif how == "last":
        out = step_scores.gather(-1, last_action_index(real).clamp(min=0)[:, None]).squeeze(-1)  # none: 0 below
    else:
        raise ValueError(f"aggregation {how!r}: min, sum, mean or last")
    return torch.where(has, out, torch.zeros_like(out))
