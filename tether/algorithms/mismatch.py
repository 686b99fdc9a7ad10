"""The sampler against the trainer: when responses are drawn by another engine (vLLM), its log-probs of the sampled
tokens are not exactly the trainer's, and the policy-gradient terms are then slightly off-policy.

``sampler_mismatch`` measures the gap on the sampled tokens; ``truncated_importance_weights`` corrects for it in
the loss (truncated importance sampling, Yao et al. 2025). docs/algorithms.md §11.
"""

from __future__ import annotations

import torch


def truncated_importance_weights(
    logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, mask: torch.Tensor, cap: float
) -> torch.Tensor:
    """w_t = min(π_train(a_t) / π_sampler(a_t), C) = min(exp(logp_t − sampler_logp_t), C) on the mask, 0 off it; (B, T).

    Truncated importance sampling (Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy RL
    training"; docs/algorithms.md §11): the tokens were drawn from π_sampler, the loss is written for π_train at the
    same weights (the old policy), so each token's policy-gradient term is weighted by their ratio, capped at C to
    bound the variance. ``logprobs`` are the trainer's log-probs at sampling time (no gradient flows through w).
    """
    if cap <= 0:
        raise ValueError(f"the importance-weight cap must be > 0, got {cap}")
    ratio = torch.exp(logprobs.detach() - sampler_logprobs)
    return torch.clamp(ratio, max=cap) * mask.to(ratio.dtype)


def sampler_mismatch(logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, mask: torch.Tensor) -> dict:
    """{"abs_mean", "abs_max": of |logp_t − sampler_logp_t|, "kl": token-mean of k3} over the masked tokens.

    k3 = r − 1 − log r with r = π_train(a_t) / π_sampler(a_t), a_t drawn from π_sampler: an unbiased, non-negative
    estimate of KL(π_sampler ‖ π_train) per token (Schulman 2020; docs/algorithms.md §3 and §11). Floats; zeros
    when the mask is empty.
    """
    m = mask.bool()
    if not m.any():
        return {"abs_mean": 0.0, "abs_max": 0.0, "kl": 0.0}
    log_r = (logprobs.detach() - sampler_logprobs)[m].double()
    return {
        "abs_mean": float(log_r.abs().mean()),
        "abs_max": float(log_r.abs().max()),
        "kl": float((torch.exp(log_r) - 1 - log_r).mean()),
    }
