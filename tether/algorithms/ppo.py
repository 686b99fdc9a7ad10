"""PPO for RLHF as pure functions (shared ALGORITHMS §4): reward shaping, GAE, whitening, losses, KL control.

Shapes: B sequences × T response tokens; ``response_mask`` (B, T) is 1 on generated tokens up to and including
EOS and 0 on padding. The last valid token of row b is at index ``response_mask[b].sum() − 1``.
"""
from __future__ import annotations

import torch


def shape_token_rewards(scores: torch.Tensor, kl: torch.Tensor, response_mask: torch.Tensor,
                        kl_coef: float) -> torch.Tensor:
    """Per-token rewards with the KL penalty in the reward (Ziegler et al. 2019; Ouyang et al. 2022).

    r_t = − β · kl_t for t < T,   r_T = R(x, y) − β · kl_T

    scores (B,) sequence rewards; kl (B, T) per-token KL estimates; returns (B, T), 0 on padding.
    """
    mask = response_mask.to(kl.dtype)
    rewards = -kl_coef * kl * mask
    last = (response_mask.sum(-1) - 1).clamp(min=0).long()  # (B,)
    rows = torch.arange(rewards.shape[0], device=rewards.device)
    has_tokens = response_mask.sum(-1) > 0
    rewards[rows[has_tokens], last[has_tokens]] += scores[has_tokens].to(rewards.dtype)
    return rewards


def gae_advantages(token_rewards: torch.Tensor, values: torch.Tensor, response_mask: torch.Tensor,
                   gamma: float = 1.0, lam: float = 0.95) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016, arXiv 1506.02438).

    δ_t = r_t + γ V(s_{t+1}) − V(s_t)   (V = 0 past the last valid token)
    A_t = δ_t + γ λ A_{t+1},            G_t = A_t + V(s_t)

    token_rewards, values, response_mask: (B, T). Returns (advantages, returns), both (B, T) and 0 on padding.
    Padding may sit anywhere after a row's last valid token; it never feeds values back into valid tokens.
    """
    mask = response_mask.to(values.dtype)
    values = values * mask
    rewards = token_rewards * mask
    advantages = torch.zeros_like(values)
    next_value = torch.zeros_like(values[:, 0])
    next_adv = torch.zeros_like(values[:, 0])
    for t in reversed(range(values.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        adv = delta + gamma * lam * next_adv
        # On padding, carry nothing: the next valid step sees V = 0 and A = 0 beyond the end.
        advantages[:, t] = adv * mask[:, t]
        next_value = values[:, t] * mask[:, t]
        next_adv = advantages[:, t]
    returns = (advantages + values) * mask
    return advantages, returns


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8) -> torch.Tensor:
    """(x − mean) / sqrt(var + eps) over the masked entries of the whole batch (population variance).

    With shift_mean False the mean is added back (scale only). Padding positions come back as 0.
    """
    m = mask.to(values.dtype)
    n = m.sum().clamp(min=1.0)
    mean = (values * m).sum() / n
    var = (((values - mean) * m) ** 2).sum() / n
    whitened = (values - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    return whitened * m


def clipped_policy_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                        mask: torch.Tensor, clip_low: float = 0.2, clip_high: float = 0.2,
                        dual_clip: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped surrogate, per token (Schulman et al. 2017, arXiv 1707.06347).

    ρ_t = exp(logp_t − old_logp_t)
    L_t = − min(ρ_t A_t, clip(ρ_t, 1 − ε_low, 1 + ε_high) A_t)
    Dual clip (Ye et al. 2020, arXiv 1912.09729), for A_t < 0 only: L_t = min(L_t, −c · A_t), c > 1.

    Returns (loss (B, T), clipped (B, T) bool: tokens whose gradient the clip removed). Padding gives 0.
    """
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = -ratio * advantages
    clipped_ratio = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    clipped_obj = -clipped_ratio * advantages
    loss = torch.maximum(unclipped, clipped_obj)
    was_clipped = clipped_obj > unclipped
    if dual_clip is not None:
        if dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
        bound = -dual_clip * advantages
        dual = (advantages < 0) & (loss > bound)
        loss = torch.where(dual, bound, loss)
        was_clipped = was_clipped | dual
    valid = mask.bool()
    return torch.where(valid, loss, torch.zeros_like(loss)), was_clipped & valid


def clipped_value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
                       clip_range: float = 0.2) -> tuple[torch.Tensor, torch.Tensor]:
    """L_V = ½ max((V − G)², (clip(V, V_old − ε_v, V_old + ε_v) − G)²), per token.

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
    """1 − Var(G − V) / Var(G) over masked tokens (1 is perfect, 0 is no better than a constant, can be < 0)."""
    m = mask.bool()
    g, v = returns[m], values[m]
    var_g = g.var(unbiased=False)
    if var_g <= 0:
        return float("nan")
    return float(1.0 - (g - v).var(unbiased=False) / var_g)
