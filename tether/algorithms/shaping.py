"""Reward shaping: what turns a reward model's score into the reward a policy optimiser sees.

KL penalty folded into token rewards (docs/algorithms.md §4), DAPO's overlong ramp (§5), the fixed penalty for
truncated responses and score clipping (§4). Scores are (B,), one per completion; token tensors are (B, T).
"""

from __future__ import annotations

import torch

from tether.algorithms.masks import last_action_mask


def kl_penalty_rewards(
    scores: torch.Tensor, kl: torch.Tensor, response_mask: torch.Tensor, kl_coef: float
) -> torch.Tensor:
    """r_t = − β · kl_t · m_t + [t = ℓ] · R(x, y),   ℓ = max{t : m_t = 1} (masks.last_action_index).

    Per-token rewards with the KL penalty in the reward (Ziegler et al. 2019, arXiv 1909.08593; Ouyang et al.
    2022, arXiv 2203.02155; docs/algorithms.md §4.1). scores (B,) sequence rewards; kl (B, T) per-token KL
    estimates; response_mask (B, T), 1 on the policy's tokens up to and including EOS — with holes in an agent
    episode, where the environment's tokens sit (§4.2a): the score goes on the last action, never on an
    environment token. Returns (B, T), 0 where the mask is 0; a row with no action gets no score.
    """
    penalty = -kl_coef * kl * response_mask.to(kl.dtype)
    outcome = scores.to(kl.dtype)[:, None].expand_as(penalty)
    return penalty + torch.where(last_action_mask(response_mask), outcome, torch.zeros_like(penalty))


def overlong_penalty(lengths: torch.Tensor, max_length: int, cache: int) -> torch.Tensor:
    """R_len = 0                                  if |y| ≤ L_max − L_cache
          ((L_max − L_cache) − |y|) / L_cache  if L_max − L_cache < |y| ≤ L_max
          −1                                   if |y| > L_max

    DAPO's soft overlong punishment (Yu et al. 2025, arXiv 2503.14476, §3.4; docs/algorithms.md §5), added to
    the score. lengths (B,) response lengths in tokens; returns (B,) float32. Needs 0 < L_cache ≤ L_max.
    """
    if cache <= 0 or cache > max_length:
        raise ValueError(f"overlong cache must be in (0, max_length], got {cache} for max_length {max_length}")
    lengths = lengths.to(torch.float32)
    free = max_length - cache
    ramp = (free - lengths) / cache
    return torch.where(
        lengths <= free, torch.zeros_like(lengths), torch.where(lengths <= max_length, ramp, -torch.ones_like(lengths))
    )


def truncation_penalty(scores: torch.Tensor, truncated: torch.Tensor, penalty: float) -> torch.Tensor:
    """R'_i = p if response i ended without EOS (truncated), else R_i; (B,) -> (B,).

    A fixed penalty instead of the reward model's score for responses cut at the length limit (Huang et al.
    2024, arXiv 2403.17031, "The N+ implementation details of RLHF with PPO";
    docs/algorithms.md §4). truncated: (B,) bool.
    """
    return torch.where(truncated, torch.full_like(scores, penalty), scores)


def clip_scores(scores: torch.Tensor, clip: float) -> torch.Tensor:
    """R'_i = clip(R_i, −c, c) for c > 0; c ≤ 0 leaves the scores as they are; (B,) -> (B,).

    Bounds outlier reward-model scores before they reach the advantages (docs/algorithms.md §4).
    """
    return scores.clamp(-clip, clip) if clip > 0 else scores
