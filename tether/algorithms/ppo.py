"""PPO's critic and KL-control pieces (docs/algorithms.md §4): the clipped value loss, the adaptive KL
coefficient, explained variance.

The rest of PPO lives with its kind: GAE and whitening in ``advantages``, ratios and the clipped surrogate in
``policy``, KL-in-the-reward in ``shaping``, the full loss in ``objectives.ppo_objective``. Shapes: B sequences ×
T response tokens; ``mask`` (B, T) is 1 on generated tokens up to and including EOS and 0 on padding.
"""

from __future__ import annotations

import torch


def clipped_value_loss(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor, clip_range: float = 0.2
) -> tuple[torch.Tensor, torch.Tensor]:
    """L_V = ½ max((V − G)², (clip(V, V_old − ε_v, V_old + ε_v) − G)²), per token.

    PPO's clipped value loss as in the RLHF implementations (Huang et al. 2024, arXiv 2403.17031;
    docs/algorithms.md §4). values, old_values, returns, mask: (B, T).
    Returns (loss (B, T), clipped (B, T) bool: tokens where the clipped term was the larger). Padding gives 0.
    """
    clipped_values = old_values + torch.clamp(values - old_values, -clip_range, clip_range)
    plain = (values - returns) ** 2
    clipped = (clipped_values - returns) ** 2
    loss = 0.5 * torch.maximum(plain, clipped)
    valid = mask.bool()
    return torch.where(valid, loss, torch.zeros_like(loss)), (clipped > plain) & valid


def adaptive_kl_coef(kl_coef: float, current_kl: float, target_kl: float, horizon: int, n_steps: int) -> float:
    """Ziegler et al. 2019 (arXiv 1909.08593) proportional controller.

    e = clip(KL_now / KL_target − 1, −0.2, 0.2),   β ← β (1 + e · n_steps / horizon)
    """
    if target_kl <= 0 or horizon <= 0:
        raise ValueError("target_kl and horizon must be > 0")
    error = min(max(current_kl / target_kl - 1.0, -0.2), 0.2)
    return kl_coef * (1.0 + error * n_steps / horizon)


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """1 − Var(G − V) / Var(G) over masked tokens (1 is perfect, 0 is no better than a constant, can be < 0).

    A critic diagnostic (docs/algorithms.md §4); population variances. Returns NaN when Var(G) = 0.
    """
    m = mask.bool()
    g, v = returns[m], values[m]
    var_g = g.var(unbiased=False)
    if var_g <= 0:
        return float("nan")
    return float(1.0 - (g - v).var(unbiased=False) / var_g)
