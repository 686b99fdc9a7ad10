"""A language model as the judge (docs/algorithms.md §12): scores read from the probabilities the judge puts on its
verdict tokens, never parsed from sampled text, and the figures that say how far a judge (or any pairwise reward)
can be trusted — the swap of the two answers' order, calibration.

Inputs are the judge's next-token log-probabilities of the verdict tokens at the verdict position (full-vocabulary
log-softmax at temperature 1: the judge is read, not sampled). Tensors in, tensors out; float64 where a test
compares digits.
"""

from __future__ import annotations

import torch


def expected_score(verdict_logprobs: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Pointwise judge: verdict_logprobs (N, K), the log-probabilities of the K score tokens; values (K,), the score
    each stands for. Returns (E[s], m), each (N,): m = Σ_k exp ℓ_k, the mass on the score tokens, and
    E[s] = Σ_k s_k exp(ℓ_k) / m, the expected score normalised over the score tokens (so it lies on the scale
    whatever mass the judge puts elsewhere; m says how much that was)."""
    if verdict_logprobs.shape[-1] != values.shape[-1]:
        raise ValueError(f"expected_score: {verdict_logprobs.shape[-1]} score tokens but {values.shape[-1]} values")
    mass = verdict_logprobs.exp().sum(-1)
    weights = torch.softmax(verdict_logprobs, dim=-1)  # exp ℓ_k / m, computed stably
    return (weights * values.to(weights.dtype)).sum(-1), mass


def first_slot_probability(verdict_logprobs: torch.Tensor) -> torch.Tensor:
    """Pairwise judge, one order: verdict_logprobs (N, 2), the log-probabilities of the verdicts "the answer shown
    first wins" and "the answer shown second wins". Returns P(first wins) = σ(ℓ_first − ℓ_second), (N,): the two
    verdicts' probabilities normalised over the pair."""
    if verdict_logprobs.shape[-1] != 2:
        raise ValueError(f"first_slot_probability: 2 verdict tokens expected, got {verdict_logprobs.shape[-1]}")
    return torch.sigmoid(verdict_logprobs[..., 0] - verdict_logprobs[..., 1])


def swap_averaged_preference(p_ab: torch.Tensor, p_ba: torch.Tensor) -> torch.Tensor:
    """P(A ≻ B) = ½ [P_AB + (1 − P_BA)]: P_AB is P(first wins) with A shown first, P_BA with B shown first. Asking in
    both orders and averaging cancels a judge's preference for a slot: swapping A and B gives exactly 1 − P."""
    return 0.5 * (p_ab + (1.0 - p_ba))


def first_slot_bias(p_ab: torch.Tensor, p_ba: torch.Tensor) -> torch.Tensor:
    """b = ½ (P_AB + P_BA) − ½ ∈ [−½, ½]: how much the judge favours whichever answer is shown first (0: no
    preference for a slot; the same for A and B swapped)."""
    return 0.5 * (p_ab + p_ba) - 0.5


def order_inconsistent(p_ab: torch.Tensor, p_ba: torch.Tensor) -> torch.Tensor:
    """True where the two orders disagree on the winner: (P_AB − ½)(½ − P_BA) < 0, i.e. both orders favour the same
    slot, strictly (a verdict of exactly ½ in either order is never inconsistent). Its mean over pairs is the
    order-inconsistency (flip) rate."""
    return (p_ab - 0.5) * (0.5 - p_ba) < 0


def round_robin(preferences: torch.Tensor) -> torch.Tensor:
    """A group's rewards from its pairwise preferences: preferences (..., G, G) with P[i, j] = P(i ≻ j) swap-averaged
    (so P[j, i] = 1 − P[i, j]; the diagonal is ignored). Returns r_i = (1/(G − 1)) Σ_{j≠i} P(i ≻ j), (..., G); the
    rewards of a group sum to G/2."""
    g = preferences.shape[-1]
    if g < 2 or preferences.shape[-2] != g:
        raise ValueError(f"round_robin: a (G, G) matrix with G ≥ 2 expected, got {tuple(preferences.shape[-2:])}")
    off_diagonal = 1.0 - torch.eye(g, dtype=preferences.dtype, device=preferences.device)
    return (preferences * off_diagonal).sum(-1) / (g - 1)


def best_of_listings(forward_logprobs: torch.Tensor, reversed_logprobs: torch.Tensor) -> torch.Tensor:
    """A group judge asked "which is best?" over a listing of the G answers, twice: in their own order and reversed.
    forward_logprobs (..., G): the log-probabilities of the labels "1".."G" with answer i listed at i;
    reversed_logprobs (..., G): the same with answer i listed at G − 1 − i. Each listing's labels are normalised over
    the G labels (q = softmax ℓ); answer i's reward is r_i = ½ [q_fwd(i) + q_rev(G − 1 − i)], so a preference for a
    place in the listing (the first, the last) is averaged out as the swap does for a pair; a group's rewards sum
    to 1."""
    if forward_logprobs.shape != reversed_logprobs.shape or forward_logprobs.shape[-1] < 2:
        raise ValueError(
            f"best_of_listings: two (..., G) tensors with G ≥ 2 expected, got {tuple(forward_logprobs.shape)} and "
            f"{tuple(reversed_logprobs.shape)}"
        )
    return 0.5 * (torch.softmax(forward_logprobs, -1) + torch.softmax(reversed_logprobs, -1).flip(-1))


def impute_unparsed(scores: torch.Tensor, parsed: torch.Tensor, group_size: int = 1) -> torch.Tensor:
    """scores (N,) with parsed (N,) bool false where the judge gave no verdict (text that did not match its pattern,
    or too little probability on the verdict tokens). An unparsed score becomes the mean of the parsed scores of its
    group (N = groups × group_size, contiguous: its advantage in the group is then 0), or of the whole batch where
    its group has none, never 0 (which would be a verdict). Raises ValueError when nothing is parsed."""
    if not bool(parsed.any()):
        raise ValueError("impute_unparsed: no score was parsed")
    if scores.numel() % group_size:
        raise ValueError(f"impute_unparsed: {scores.numel()} scores are not groups of {group_size}")
    weights = parsed.to(scores.dtype)
    batch_mean = (scores * weights).sum() / weights.sum()
    grouped, grouped_weights = (scores * weights).view(-1, group_size), weights.view(-1, group_size)
    counts = grouped_weights.sum(-1, keepdim=True)
    group_mean = torch.where(counts > 0, grouped.sum(-1, keepdim=True) / counts.clamp(min=1), batch_mean)
    return torch.where(parsed, scores, group_mean.expand(-1, group_size).reshape(-1))


def brier_score(p_preferred: torch.Tensor) -> torch.Tensor:
    """mean (1 − P)² over held-out pairs, P the probability given to the labelled-preferred answer: a proper scoring
    rule (lowest only when P is the true probability), no bins. 0 is perfect, 0.25 is P = ½ everywhere."""
    return ((1.0 - p_preferred) ** 2).mean()


def expected_calibration_error(p_preferred: torch.Tensor, bins: int = 10) -> torch.Tensor:
    """Σ_b (n_b / n) |acc_b − conf_b| over `bins` equal bins of the confidence c = max(P, 1 − P) on [½, 1] (the last
    bin closed): acc_b the share of the bin's pairs where P > ½ (the judge picked the preferred answer), conf_b the
    bin's mean confidence. Biased upward when bins hold few pairs; shown beside the Brier score, not instead."""
    confidence = torch.maximum(p_preferred, 1.0 - p_preferred)
    correct = (p_preferred > 0.5).to(p_preferred.dtype)
    index = ((confidence - 0.5) * 2 * bins).floor().clamp(0, bins - 1).long()
    total = p_preferred.new_zeros(())
    for b in range(bins):
        members = index == b
        if members.any():
            total = total + members.sum() * (correct[members].mean() - confidence[members].mean()).abs()
    return total / p_preferred.numel()
