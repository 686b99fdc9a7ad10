"""Per-token KL estimators (docs/algorithms.md §3; Schulman 2020, "Approximating KL divergence").

Samples come from π_θ; ``log_r = ref_logprobs − logprobs``. Each returns (B, T) values; mask and reduce outside.
"""

from __future__ import annotations

import torch


def kl_k1(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k1 = −log r = logp − ref_logp. Unbiased for KL(π_θ‖π_ref); negative on some tokens."""
    return logprobs - ref_logprobs


def kl_k2(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k2 = ½ (log r)². Biased, low variance, never negative."""
    return 0.5 * (ref_logprobs - logprobs) ** 2


def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k3 = exp(log r) − 1 − log r. Unbiased for KL(π_θ‖π_ref) and never negative (the GRPO loss term)."""
    log_r = ref_logprobs - logprobs
    return torch.expm1(log_r) - log_r


KL_ESTIMATORS = {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3}


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str = "k1") -> torch.Tensor:
    """k_estimator(logp, ref_logp), estimator one of k1, k2, k3 (KL_ESTIMATORS); (B, T) -> (B, T), unmasked."""
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"unknown KL estimator {estimator!r}; choose k1, k2 or k3")
    return KL_ESTIMATORS[estimator](logprobs, ref_logprobs)
