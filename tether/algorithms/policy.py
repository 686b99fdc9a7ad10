"""Importance ratios and the one clipped surrogate, shared by PPO (docs/algorithms.md §4) and the group family (§5).

Ratios share one signature, ``(logprobs, old_logprobs, mask) -> (B, T)``; ``clipped_surrogate`` takes any of
them. Shapes: B sequences × T response tokens; ``mask`` (B, T) is 1 on tokens that count and 0 on padding.
"""

from __future__ import annotations

import torch


def token_ratio(logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """ρ_{i,t} = exp(logp_{i,t} − old_logp_{i,t}); (B, T).

    PPO's per-token ratio (Schulman et al. 2017, arXiv 1707.06347; docs/algorithms.md §4). ``mask`` is unused
    (padding is masked by the loss): it is there so every ratio shares one signature.
    """
    return torch.exp(logprobs - old_logprobs)


def _mean_log_ratio_ratio(logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """s_i = exp( (1/|y_i|) Σ_t m_t (logp_t − old_logp_t) ), broadcast to (B, T); |y_i| = Σ_t m_t, at least 1."""
    m = mask.to(logprobs.dtype)
    mean_log_ratio = ((logprobs - old_logprobs) * m).sum(-1) / m.sum(-1).clamp(min=1.0)  # (B,)
    return torch.exp(mean_log_ratio)[:, None].expand_as(logprobs)


def sequence_ratio(logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """s_i = exp( (1/|y_i|) Σ_t m_t (logp_{i,t} − old_logp_{i,t}) ), the same value on every token of row i; (B, T).

    GSPO (Zheng et al. 2025, arXiv 2507.18071; docs/algorithms.md §5): the geometric mean of the token
    ratios. ``mask`` should cover every generated token (the response mask), since |y_i| is the response length.
    Every counted token's gradient is s_i/|y_i| times the gradient of its log-prob.
    """
    return _mean_log_ratio_ratio(logprobs, old_logprobs, mask)


def sequence_token_ratio(logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """s_{i,t} = sg[s_i] · π_θ(a_t) / sg[π_θ(a_t)]; (B, T).

    GSPO-token (Zheng et al. 2025, arXiv 2507.18071; docs/algorithms.md §5): the same value as
    ``sequence_ratio``'s s_i, but each token's gradient is its own log-prob's (scaled by s_i) instead of the
    sequence mean's, so token-level advantages can be used. sg is stop-gradient.
    """
    seq = _mean_log_ratio_ratio(logprobs, old_logprobs, mask)
    return seq.detach() * torch.exp(logprobs - logprobs.detach())


RATIOS = {"token": token_ratio, "sequence": sequence_ratio, "sequence_token": sequence_token_ratio}


def clipped_surrogate(
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ℓ_t = max(−ρ_t Â_t, −clip(ρ_t, 1 − ε_low, 1 + ε_high) Â_t), per token;
    with dual clip, ℓ_t = min(ℓ_t, −c Â_t) where Â_t < 0.

    PPO's clipped surrogate (Schulman et al. 2017, arXiv 1707.06347), written as a loss to minimise, with
    separate lower and upper ranges (DAPO's clip-higher, Yu et al. 2025, arXiv 2503.14476) and the optional dual
    clip (Ye et al. 2020, arXiv 1912.09729): for Â < 0 the loss is also bounded by −c·Â, c = dual_clip > 1; 0 turns
    it off. docs/algorithms.md §4 and §5.

    ratio: (B, T) token ratios, or a sequence ratio broadcast over the tokens (any of RATIOS). advantages: (B, T)
    or (B, 1). mask: (B, T). Returns (loss (B, T), clipped_low (B, T) bool, clipped_high (B, T) bool), the
    masks marking tokens whose gradient the clip removed — low: Â < 0 and ρ < 1 − ε_low, plus the tokens where
    the dual bound applied; high: Â > 0 and ρ > 1 + ε_high. Loss and masks are 0 / False on padding.
    """
    if dual_clip != 0.0 and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1 (or 0 for off), got {dual_clip}")
    advantages = advantages.expand_as(ratio)
    loss = torch.maximum(-ratio * advantages, -torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * advantages)
    low = (advantages < 0) & (ratio < 1.0 - clip_low)
    high = (advantages > 0) & (ratio > 1.0 + clip_high)
    if dual_clip > 0:
        bound = -dual_clip * advantages
        dual = (advantages < 0) & (loss > bound)
        loss = torch.where(dual, bound, loss)
        low = low | dual
    valid = mask.bool()
    return torch.where(valid, loss, torch.zeros_like(loss)), low & valid, high & valid


def clip_fraction(clipped_low: torch.Tensor, clipped_high: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """clip_frac = Σ_{b,t} (low | high)_{b,t} m_{b,t} / max(Σ_{b,t} m_{b,t}, 1): the share of counted tokens whose
    gradient the clip removed.

    The one definition of clip fraction in tether (docs/algorithms.md §4): it counts a token only when the clip
    changed its gradient (ρ outside the range on the side its advantage pushes, or the dual bound applied), not
    every token with |ρ − 1| > ε. clipped_low, clipped_high: (B, T) bool from ``clipped_surrogate``; mask (B, T).
    Returns a 0-dim tensor (float, in mask's dtype when mask is floating point).
    """
    m = mask if mask.is_floating_point() else mask.to(torch.get_default_dtype())
    clipped = (clipped_low | clipped_high).to(m.dtype)
    return (clipped * m).sum() / m.sum().clamp(min=1.0)


def clip_fractions(clipped_low: torch.Tensor, clipped_high: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """The three clip shares a policy update logs (docs/algorithms.md §4), each ``clip_fraction``: either side
    (``policy/clip_frac``), the lower side alone (``policy/clip_frac_low``: ρ < 1 − ε_low with A < 0, or the dual
    bound) and the upper side alone (``policy/clip_frac_high``: ρ > 1 + ε_high with A > 0)."""
    none = torch.zeros_like(clipped_low)
    return {
        "policy/clip_frac": float(clip_fraction(clipped_low, clipped_high, mask)),
        "policy/clip_frac_low": float(clip_fraction(clipped_low, none, mask)),
        "policy/clip_frac_high": float(clip_fraction(none, clipped_high, mask)),
    }
