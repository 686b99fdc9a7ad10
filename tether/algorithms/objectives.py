"""The full objective each online stage optimises, one function per stage, composed from the pieces.

``ppo_objective`` is PPO with a critic (docs/algorithms.md §4), the sum of ``ppo_policy_loss`` and
``ppo_value_loss``; ``group_objective`` is the critic-free group
family, GRPO, Dr. GRPO, DAPO, GSPO, RLOO, REINFORCE++ (§5), which differ only in the arguments given. Each
returns (loss, parts): a 0-dim loss to backpropagate and the per-token pieces a trainer logs.
"""

from __future__ import annotations

import torch

from tether.algorithms.kl import kl_estimate
from tether.algorithms.policy import RATIOS, clipped_surrogate, token_ratio
from tether.algorithms.ppo import clipped_value_loss
from tether.algorithms.reductions import aggregate


def ppo_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    entropy: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float = 0.0,
    entropy_coef: float = 0.0,
    n_tokens: float | None = None,
    token_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict]:
    """L_π = token-mean(w · ℓ_clip) − c_H · token-mean(H), the policy's part of ``ppo_objective`` (docs/algorithms.md
    §4); w = ``token_weights`` (B, T), the truncated importance weights of a sampler that is not the trainer
    (mismatch.importance_weights, §11), or 1.

    Returns (L_π, {"clipped_low", "clipped_high": (B, T) bool}). It reaches only the policy's parameters when the
    critic is a separate model, so the PPO stage can backpropagate it (and free the policy's activations) before the
    critic's forward.
    """
    pl, low, high = clipped_surrogate(
        token_ratio(logprobs, old_logprobs, mask), advantages, mask, clip_low, clip_high, dual_clip
    )
    if token_weights is not None:
        pl = pl * token_weights
    loss = aggregate(pl, mask, n_tokens=n_tokens) - entropy_coef * aggregate(entropy, mask, n_tokens=n_tokens)
    return loss, {"clipped_low": low, "clipped_high": high}


def ppo_value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    *,
    value_clip: float = 0.2,
    n_tokens: float | None = None,
) -> tuple[torch.Tensor, dict]:
    """L_V = token-mean(½ max((V − G)², (clip(V, V_old ± ε_v) − G)²)), the critic's part of ``ppo_objective``
    (docs/algorithms.md §4). Returns (L_V, {"value_clipped": (B, T) bool}); it is not yet weighted by c_v."""
    vl, vclipped = clipped_value_loss(values, old_values, returns, mask, value_clip)
    return aggregate(vl, mask, n_tokens=n_tokens), {"value_clipped": vclipped}


def ppo_objective(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    entropy: torch.Tensor,
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float = 0.0,
    value_clip: float = 0.2,
    value_loss_coef: float = 1.0,
    entropy_coef: float = 0.0,
    n_tokens: float | None = None,
    token_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict]:
    """L = token-mean(ℓ_clip) − c_H · token-mean(H) + c_v · token-mean(L_V) = L_π + c_v · L_V.

    ℓ_clip = max(−ρA, −clip(ρ, 1 − ε_low, 1 + ε_high) A), ρ = exp(logp − old_logp), with the optional dual clip;
    L_V = ½ max((V − G)², (clip(V, V_old ± ε_v) − G)²); H the per-token policy entropy. PPO (Schulman et al. 2017,
    arXiv 1707.06347) as used for RLHF (Ziegler et al. 2019; Ouyang et al. 2022; Huang et al. 2024, arXiv
    2403.17031); docs/algorithms.md §4. The two terms are ``ppo_policy_loss`` and ``ppo_value_loss``.

    Every tensor is (B, T); mask is 1 on generated tokens up to and including EOS. token-mean divides by this
    tensor's own token count, or by ``n_tokens``, the whole minibatch's, when the minibatch is split over
    processes (the parts' losses then add up to the minibatch's; docs/algorithms.md §1). Returns (loss, parts) with
    parts = {"policy_loss": token-mean(ℓ_clip) − c_H token-mean(H), "value_loss": token-mean(L_V),
    "clipped_low", "clipped_high": (B, T) bool from the surrogate, "value_clipped": (B, T) bool}.
    ``token_weights``: as in ``ppo_policy_loss`` (ℓ_clip becomes w · ℓ_clip).
    """
    policy_loss, policy_parts = ppo_policy_loss(
        logprobs,
        old_logprobs,
        advantages,
        entropy,
        mask,
        clip_low=clip_low,
        clip_high=clip_high,
        dual_clip=dual_clip,
        entropy_coef=entropy_coef,
        n_tokens=n_tokens,
        token_weights=token_weights,
    )
    value_loss, value_parts = ppo_value_loss(
        values, old_values, returns, mask, value_clip=value_clip, n_tokens=n_tokens
    )
    loss = policy_loss + value_loss_coef * value_loss
    return loss, {"policy_loss": policy_loss, "value_loss": value_loss, **policy_parts, **value_parts}


def group_objective(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    ratio: str = "token",
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float = 0.0,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    kl_estimator: str = "k3",
    aggregation: str = "seq-mean-token-mean",
    n_tokens: float | None = None,
    n_sequences: float | None = None,
    norm_length: float | None = None,
    token_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict]:
    """J = aggregate( w · ℓ_clip(ρ) + β · k(π_θ, π_ref) ),  ℓ_clip = max(−ρÂ, −clip(ρ, 1 − ε_low, 1 + ε_high) Â).

    The group family's loss (docs/algorithms.md §5): GRPO (Shao et al. 2024, arXiv 2402.03300) is ratio "token",
    β > 0 with k3, seq-mean-token-mean; Dr. GRPO (Liu et al. 2025, arXiv 2503.20783) seq-mean-token-sum-norm;
    DAPO (Yu et al. 2025, arXiv 2503.14476) ε_high > ε_low, token-mean, β = 0; GSPO (Zheng et al. 2025, arXiv
    2507.18071) ratio "sequence" or "sequence_token". ρ is one of policy.RATIOS; k is kl.kl_estimate's estimator
    (docs/algorithms.md §3), added only when β = kl_coef > 0 and ref_logprobs is given. dual_clip > 1 bounds the
    loss of negative-advantage tokens at −c·Â (policy.clipped_surrogate); 0 = off, as in every recipe.

    logprobs, old_logprobs, ref_logprobs, advantages: (B, T) (advantages may be (B, 1)). mask: the loss mask,
    which may exclude truncated responses; response_mask: every generated token, used by the sequence ratio for
    |y_i|. ``token_weights`` w (B, T): truncated importance weights of a sampler that is not the trainer
    (mismatch.importance_weights, docs/algorithms.md §11), on the surrogate only; None = 1.
    n_tokens / n_sequences / norm_length go to ``aggregate``: pass the optimizer step's totals when the
    step is split into micro-batches, and the micro-batch losses sum to the full-batch loss. Returns (loss,
    parts) with parts = {"ratio": ρ (B, T), "kl": k (B, T), zeros without a reference, "clipped_low",
    "clipped_high": (B, T) bool}.

    Convention: the papers write min(ρÂ, clip(ρ)Â) − βD as an objective to maximise; this is its negative, a
    loss to minimise.
    """
    if ratio not in RATIOS:
        raise ValueError(f"unknown ratio {ratio!r}; choose from {tuple(RATIOS)}")
    rho = RATIOS[ratio](logprobs, old_logprobs, response_mask)
    terms, low, high = clipped_surrogate(rho, advantages, mask, clip_low, clip_high, dual_clip)
    if token_weights is not None:
        terms = terms * token_weights
    kl = kl_estimate(logprobs, ref_logprobs, kl_estimator) if ref_logprobs is not None else torch.zeros_like(logprobs)
    if kl_coef > 0:
        terms = terms + kl_coef * kl
    loss = aggregate(terms, mask, aggregation, n_tokens, n_sequences, norm_length)
    return loss, {"ratio": rho, "kl": kl, "clipped_low": low, "clipped_high": high}
