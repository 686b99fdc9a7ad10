"""Critic-free policy optimisation with group baselines (shared ALGORITHMS §5), as pure functions.

Shapes: ``scores`` (N, G) for N prompts with G sampled responses each; token tensors (B, T) with B = N·G rows
ordered prompt-major (row i·G + j is response j of prompt i); ``mask`` (B, T) is 1 on response tokens that
count (up to and including EOS) and 0 on padding.
"""
from __future__ import annotations

import torch

from tether.algorithms.ppo import masked_whiten


def group_advantages(scores: torch.Tensor, scale_by_std: bool = True, eps: float = 1e-4) -> torch.Tensor:
    """GRPO (Shao et al. 2024): Â_i = (R_i − mean(R)) / (std(R) + ε) within each group; (N, G).

    scale_by_std False is Dr. GRPO (Liu et al. 2025): Â_i = R_i − mean(R). std is the population std of the
    group. A group of equal scores gets Â = 0 exactly (never 0/0): its centred scores are 0 and ε > 0 keeps
    the division finite.
    """
    centred = scores - scores.mean(-1, keepdim=True)
    if not scale_by_std:
        return centred
    return centred / (scores.std(-1, unbiased=False, keepdim=True) + eps)


def rloo_advantages(scores: torch.Tensor) -> torch.Tensor:
    """RLOO (Ahmadian et al. 2024): A_i = R_i − (1/(G−1)) Σ_{j≠i} R_j; (N, G). Needs G ≥ 2.

    Equivalently G/(G−1) · (R_i − mean(R)).
    """
    g = scores.shape[-1]
    if g < 2:
        raise ValueError("RLOO needs at least 2 responses per prompt")
    others = (scores.sum(-1, keepdim=True) - scores) / (g - 1)
    return scores - others


def reinforce_pp_advantages(scores: torch.Tensor, kl: torch.Tensor, mask: torch.Tensor, kl_coef: float,
                            gamma: float = 1.0) -> torch.Tensor:
    """REINFORCE++ (Hu 2025): token rewards with the KL penalty folded in, returns-to-go, batch-normalised.

    r_t = −β · kl_t, plus the sequence score R on the last counted token
    G_t = Σ_{s ≥ t} γ^{s−t} r_s
    A_t = (G_t − mean(G)) / std(G), mean and std over every counted token of the whole batch.

    scores (B,), kl (B, T) (any estimator, 0 on padding), mask (B, T). Returns (B, T), 0 on padding.
    """
    m = mask.to(kl.dtype)
    rewards = -kl_coef * kl * m
    last = (m.cumsum(-1) == m.sum(-1, keepdim=True)) & (m > 0)  # the last counted token of each row
    rewards = rewards + last.to(kl.dtype) * scores[:, None]
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(scores, dtype=rewards.dtype)
    for t in range(rewards.shape[1] - 1, -1, -1):
        running = rewards[:, t] + gamma * running * m[:, t]  # padding after the response contributes nothing
        returns[:, t] = running
    return masked_whiten(returns * m, mask)


def process_advantages(step_rewards: list[list[list[float]]], step_ends: list[list[list[int]]], length: int,
                       eps: float = 1e-4) -> torch.Tensor:
    """Process supervision (Shao et al. 2024, §4.1.3): step rewards normalised across the group, and a token's
    advantage is the sum of the normalised rewards of the steps that end at or after it.

    step_rewards[i][j] = the step scores of response j of prompt i; step_ends[i][j][k] = the index of the
    token that ends step k of that response (k-th score). Normalisation r̃ = (r − mean) / (std + ε) runs over
    all step scores of all responses of one prompt. Returns (N·G, length): Â_t = Σ_{k: end_k ≥ t} r̃_k.
    Tokens after the last step's end get 0.
    """
    rows = []
    for group_rewards, group_ends in zip(step_rewards, step_ends):
        flat = torch.tensor([r for resp in group_rewards for r in resp], dtype=torch.float32)
        mean = flat.mean() if flat.numel() else torch.tensor(0.0)
        std = flat.std(unbiased=False) if flat.numel() else torch.tensor(0.0)
        for rewards, ends in zip(group_rewards, group_ends):
            if len(rewards) != len(ends):
                raise ValueError(f"{len(rewards)} step scores but {len(ends)} step ends")
            per_token = torch.zeros(length)
            for r, end in zip(rewards, ends):
                per_token[: min(end, length - 1) + 1] += (r - mean) / (std + eps)
            rows.append(per_token)
    return torch.stack(rows)


def token_ratio(logprobs: torch.Tensor, old_logprobs: torch.Tensor) -> torch.Tensor:
    """ρ_{i,t} = exp(logp_{i,t} − old_logp_{i,t}); (B, T)."""
    return torch.exp(logprobs - old_logprobs)


def gspo_ratio(logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor,
               token_level: bool = False) -> torch.Tensor:
    """GSPO (Zheng et al. 2025): s_i = exp( (1/|y_i|) Σ_t m_t (logp_t − old_logp_t) ), broadcast to (B, T).

    token_level (GSPO-token): s_{i,t} = sg[s_i] · π_θ(a_t) / sg[π_θ(a_t)] — the same value as s_i, but each
    token's gradient is its own log-prob's (scaled by s_i) instead of the sequence mean's.
    """
    m = mask.to(logprobs.dtype)
    mean_log_ratio = ((logprobs - old_logprobs) * m).sum(-1) / m.sum(-1).clamp(min=1.0)  # (B,)
    seq = torch.exp(mean_log_ratio)[:, None].expand_as(logprobs)
    if not token_level:
        return seq
    return seq.detach() * torch.exp(logprobs - logprobs.detach())


def clipped_surrogate(ratio: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, clip_low: float,
                      clip_high: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ℓ_t = − min(ρ_t Â_t, clip(ρ_t, 1 − ε_low, 1 + ε_high) Â_t), per token; (B, T), 0 on padding.

    ratio: token ratios, or GSPO's sequence ratio broadcast over the tokens. advantages: (B, T) (or (B, 1)).
    Returns (loss, clipped_low, clipped_high): the bool masks of tokens whose gradient the clip removed —
    low: Â < 0 and ρ < 1 − ε_low; high: Â > 0 and ρ > 1 + ε_high.
    """
    advantages = advantages.expand_as(ratio)
    loss = torch.maximum(-ratio * advantages, -torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * advantages)
    valid = mask.bool()
    low = (advantages < 0) & (ratio < 1.0 - clip_low) & valid
    high = (advantages > 0) & (ratio > 1.0 + clip_high) & valid
    return torch.where(valid, loss, torch.zeros_like(loss)), low, high


def aggregate(values: torch.Tensor, mask: torch.Tensor, mode: str, n_tokens: float | None = None,
              n_sequences: float | None = None, norm_length: float | None = None) -> torch.Tensor:
    """Token terms → one number, with denominators of the whole optimizer step (ALGORITHMS §5).

    token-mean:              Σ_{i,t} ℓ m / n_tokens                     (DAPO)
    seq-mean-token-mean:     Σ_i ( Σ_t ℓ m / Σ_t m ) / n_sequences      (GRPO)
    seq-mean-token-sum-norm: Σ_i Σ_t ℓ m / (L · n_sequences)            (Dr. GRPO, L constant)

    n_tokens / n_sequences default to this tensor's own counts; pass the step's totals when the step is
    split into micro-batches, and the micro-batch losses add up to exactly the full-batch loss.
    """
    m = mask.to(values.dtype)
    masked = torch.where(mask.bool(), values, torch.zeros_like(values))
    if mode == "token-mean":
        denominator = m.sum() if n_tokens is None else torch.as_tensor(n_tokens, dtype=values.dtype)
        return masked.sum() / denominator.clamp(min=1.0)
    n = values.shape[0] if n_sequences is None else n_sequences
    if mode == "seq-mean-token-mean":
        return (masked.sum(-1) / m.sum(-1).clamp(min=1.0)).sum() / max(n, 1)
    if mode == "seq-mean-token-sum-norm":
        if not norm_length or norm_length <= 0:
            raise ValueError("seq-mean-token-sum-norm needs norm_length > 0")
        return masked.sum() / (norm_length * max(n, 1))
    raise ValueError(f"unknown aggregation {mode!r}: token-mean, seq-mean-token-mean or seq-mean-token-sum-norm")


def overlong_penalty(lengths: torch.Tensor, max_length: int, cache: int) -> torch.Tensor:
    """DAPO's soft overlong punishment (Yu et al. 2025), per response; (B,).

    0 if |y| ≤ L_max − L_cache; ((L_max − L_cache) − |y|) / L_cache if L_max − L_cache < |y| ≤ L_max; −1 beyond.
    """
    if cache <= 0 or cache > max_length:
        raise ValueError(f"overlong cache must be in (0, max_length], got {cache} for max_length {max_length}")
    lengths = lengths.to(torch.float32)
    free = max_length - cache
    ramp = (free - lengths) / cache
    return torch.where(lengths <= free, torch.zeros_like(lengths), torch.where(lengths <= max_length, ramp, -torch.ones_like(lengths)))


def zero_variance_groups(scores: torch.Tensor, tol: float = 1e-8) -> torch.Tensor:
    """(N,) bool: groups whose scores are all equal — their group-relative advantage is 0 (no signal)."""
    return (scores.max(-1).values - scores.min(-1).values) <= tol
