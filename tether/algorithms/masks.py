"""Index rules over masks (docs/algorithms.md §4.2a): which position of a row is its last action.

A mask is (B, T), 1 on the positions that count. It may have holes: in an agent episode the environment's tokens
sit between the policy's turns, so the last action is not at index Σ_t m_t − 1.
"""

from __future__ import annotations

import torch


def last_action_index(mask: torch.Tensor) -> torch.Tensor:
    """ℓ_i = max{t : m_{i,t} ≠ 0}, or −1 for a row with no set entry; (B, T) -> (B,) long.

    The one rule for "the last action / last response token / last real entry" (docs/algorithms.md §4.2a): the
    outcome's position in KL-shaped rewards and REINFORCE++, a reward model's read position, the last step of a
    process reward. Σ_t m_t − 1 equals it only for a mask without holes. Computed as max_t (t + 1) · m_t − 1 over
    the row with a 0 column in front, so an all-zero row (or T = 0) gives −1 rather than an index of its own.
    """
    positions = torch.arange(1, mask.shape[-1] + 1, device=mask.device)
    marked = mask.bool().long() * positions  # (B, T): t + 1 where set, 0 elsewhere
    return torch.cat([marked.new_zeros(marked.shape[:-1] + (1,)), marked], -1).amax(-1) - 1


def last_action_mask(mask: torch.Tensor) -> torch.Tensor:
    """e_{i,t} = [t = ℓ_i], ℓ = last_action_index(mask); (B, T) -> (B, T) bool, all False for a row with no action."""
    return torch.arange(mask.shape[-1], device=mask.device)[None, :] == last_action_index(mask)[:, None]
