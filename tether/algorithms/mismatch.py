"""The sampler against the trainer: responses drawn by another engine (vLLM, a bf16 copy) or by an older policy
(a rollout that ran while the trainer updated) carry the sampler's log-probs of the sampled tokens, which are not
the trainer's, and the policy-gradient terms are then off-policy.

``sampler_mismatch`` measures the gap on the sampled tokens; ``importance_weights`` corrects for it in the loss,
by one of five rules (token or sequence level; truncated or masked; a length-free geometric-mean rejection);
``importance_statistics`` says what the rule did. docs/algorithms.md §11.
"""

from __future__ import annotations

import math

import torch

from tether.algorithms.choices import OFF_POLICY_CORRECTIONS as CORRECTIONS


def sequence_log_ratio(logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log ρ_i = Σ_t m_it (logp_it − sampler_logp_it): the log of the whole response's probability ratio; (B,).
    0 for a row with an empty mask."""
    return ((logprobs.detach() - sampler_logprobs) * mask.to(logprobs.dtype)).sum(-1)


def geometric_mean_log_ratio(
    logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """log ρ̄_i = log ρ_i / n_i, n_i = Σ_t m_it: the per-token geometric mean of the ratio, which does not grow with the
    response's length as ρ_i does; (B,). 0 for a row with an empty mask."""
    return sequence_log_ratio(logprobs, sampler_logprobs, mask) / mask.sum(-1).clamp(min=1).to(logprobs.dtype)


def _inside(log_ratio: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """low ≤ exp(log_ratio) ≤ high, compared in log space (a sequence ratio can overflow); high = inf: no bound."""
    above = log_ratio >= math.log(low) if low > 0 else torch.ones_like(log_ratio, dtype=torch.bool)
    return above & (log_ratio <= math.log(high))


def importance_weights(
    logprobs: torch.Tensor,
    sampler_logprobs: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    low: float = 0.0,
    high: float = math.inf,
) -> torch.Tensor:
    """w (B, T): each sampled token's weight on its policy-gradient term; 0 off the mask; no gradient through w.

    With r_t = π_train(a_t) / π_sampler(a_t) = exp(logp_t − sampler_logp_t), ρ = Π_t r_t (the response's ratio) and
    ρ̄ = ρ^(1/n) (its per-token geometric mean), on the mask:

        token_truncate     w_t = clip(r_t, low, high)                  (TIS: Yao et al. 2025)
        token_mask         w_t = r_t · 1[low ≤ r_t ≤ high]             (IcePop: Ling Team 2025)
        sequence_truncate  w_t = clip(ρ, low, high)                    (Seq-TIS)
        sequence_mask      w_t = ρ · 1[low ≤ ρ ≤ high]                 (Seq-MIS)
        geo_mask           w_t = 1[low ≤ ρ̄ ≤ high]                     (geometric rejection: kept responses unweighted)

    low = 0 and high = inf leave that side unbounded. ``logprobs`` are the trainer's at sampling time (the proximal
    policy of decoupled PPO, docs/algorithms.md §11), ``sampler_logprobs`` the behaviour policy's.
    """
    if mode not in CORRECTIONS:
        raise ValueError(f"off-policy correction {mode!r}: one of {', '.join(CORRECTIONS)}")
    if not 0 <= low < high:
        raise ValueError(f"importance ratio bounds [{low}, {high}]: need 0 <= low < high")
    m = mask.to(logprobs.dtype)
    if mode.startswith("token"):
        log_r = logprobs.detach() - sampler_logprobs
        if mode == "token_truncate":
            w = torch.exp(log_r).clamp(min=low, max=high)
        else:
            w = torch.where(_inside(log_r, low, high), torch.exp(log_r), torch.zeros_like(log_r))
        return w * m
    if mode == "geo_mask":
        kept = _inside(geometric_mean_log_ratio(logprobs, sampler_logprobs, mask), low, high)
        return kept.to(m.dtype)[:, None] * m
    log_rho = sequence_log_ratio(logprobs, sampler_logprobs, mask)
    if mode == "sequence_truncate":
        floor = math.log(low) if low > 0 else -math.inf
        w = torch.exp(log_rho.clamp(min=floor, max=math.log(high)))
    else:
        inside = _inside(log_rho, low, high)
        w = torch.where(inside, torch.exp(log_rho.clamp(max=math.log(high))), torch.zeros_like(log_rho))
    return w[:, None] * m


def importance_statistics(
    logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, mask: torch.Tensor, weights: torch.Tensor
) -> dict:
    """What a correction did, over the masked tokens (floats): the token ratio r_t's 1st, 50th and 99th percentiles and
    its maximum; ``masked_share``, the share of tokens whose weight is 0; ``changed_share``, the share whose weight is
    not their own ratio r_t (truncated, masked, or given a sequence's weight). Zeros for an empty mask."""
    m = mask.bool()
    if not m.any():
        return {
            "ratio_p1": 0.0,
            "ratio_p50": 0.0,
            "ratio_p99": 0.0,
            "ratio_max": 0.0,
            "masked_share": 0.0,
            "changed_share": 0.0,
        }
    r = torch.exp((logprobs.detach() - sampler_logprobs)[m].double())
    w = weights[m].double()
    q = torch.quantile(r, torch.tensor([0.01, 0.5, 0.99], dtype=torch.float64))
    return {
        "ratio_p1": float(q[0]),
        "ratio_p50": float(q[1]),
        "ratio_p99": float(q[2]),
        "ratio_max": float(r.max()),
        "masked_share": float((w == 0).double().mean()),
        "changed_share": float((~torch.isclose(w, r, rtol=1e-6, atol=0.0)).double().mean()),
    }


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
