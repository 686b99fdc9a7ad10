"""Advantage estimators (docs/algorithms.md §4 and §5): GAE for PPO's critic, and the critic-free ones.

Sequence-level estimators share one signature, ``(scores (N, G), eps) -> (N, G)``, for N prompts with G
sampled responses each; ``token_advantages`` is the one entry point a trainer calls and returns (B, T). Token
tensors are (B, T) with B = N·G rows ordered prompt-major (row i·G + j is response j of prompt i); a mask is 1
on response tokens that count (up to and including EOS) and 0 on padding.
"""

from __future__ import annotations

import torch

from tether.algorithms.masks import last_action_mask


def gae_advantages(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 0.95,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016, arXiv 1506.02438; docs/algorithms.md §4).

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


def compact_actions(x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The entries of x where mask is 1, moved left in order: (packed (B, T'), packed mask (B, T')), T' the most
    actions in a row. A multi-turn transcript has the environment's tokens between the policy's turns; GAE runs
    over the policy's tokens alone, as consecutive decisions (docs/algorithms.md §4, "Multi-turn episodes")."""
    keep = mask.bool()
    counts = keep.sum(-1)
    width = int(counts.max()) if counts.numel() else 0
    packed = x.new_zeros((x.shape[0], width))
    packed_mask = torch.arange(width, device=x.device)[None, :] < counts[:, None]
    packed[packed_mask] = x[keep]
    return packed, packed_mask.to(mask.dtype)


def expand_actions(packed: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Inverse of compact_actions: packed entries back at the positions where mask is 1, 0 elsewhere."""
    keep = mask.bool()
    out = packed.new_zeros(mask.shape)
    counts = keep.sum(-1)
    packed_mask = torch.arange(packed.shape[1], device=packed.device)[None, :] < counts[:, None]
    out[keep] = packed[packed_mask]
    return out


def action_gae(
    token_rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0, lam: float = 0.95
) -> tuple[torch.Tensor, torch.Tensor]:
    """(A, G) = expand(GAE(compact(r), compact(V))): GAE over a row's actions alone, as consecutive decisions, with
    whatever sits between them (an episode's environment tokens) skipped (docs/algorithms.md §4.2a). (B, T) each;
    returns (advantages, returns), (B, T), 0 where the mask is 0. On a mask without holes it is gae_advantages."""
    rewards, actions = compact_actions(token_rewards, mask)
    packed_values, _ = compact_actions(values, mask)
    advantages, returns = gae_advantages(rewards, packed_values, actions, gamma, lam)
    return expand_actions(advantages, mask), expand_actions(returns, mask)


def turn_rewards(step_scores: list[list[float]], step_ends: list[list[int]], length: int) -> torch.Tensor:
    """r_t = Σ_k [end_k = t] · s_k: each turn's reward on the token that ends it; (B, length)."""
    out = torch.zeros((len(step_scores), length))
    for i, (scores, ends) in enumerate(zip(step_scores, step_ends)):
        for s, end in zip(scores, ends):
            out[i, min(end, length - 1)] += s
    return out


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8) -> torch.Tensor:
    """x̃ = (x − μ) / √(σ² + ε), μ and σ² the mean and population variance over the masked entries of the batch.

    values, mask: (B, T); returns (B, T). With shift_mean False the mean is added back (scale only): x̃ + μ.
    Padding positions come back as 0. Used for PPO's advantage whitening (docs/algorithms.md §4) and
    REINFORCE++'s batch normalisation (§5).
    """
    m = mask.to(values.dtype)
    n = m.sum().clamp(min=1.0)
    mean = (values * m).sum() / n
    var = (((values - mean) * m) ** 2).sum() / n
    whitened = (values - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    return whitened * m


def group_advantages(scores: torch.Tensor, eps: float = 1e-4) -> torch.Tensor:
    """Â_i = (R_i − mean(R)) / (std(R) + ε) within each group; (N, G) -> (N, G).

    GRPO (Shao et al. 2024, arXiv 2402.03300, §4.1.2; docs/algorithms.md §5). std is the population std
    (biased, divides by G) of the group. A group of equal scores gets Â = 0 exactly (never 0/0): its centred
    scores are 0 and ε > 0 keeps the division finite.

    Differs from the paper: the paper divides by std(R) alone; the ε here keeps equal-score groups finite.
    """
    centred = scores - scores.mean(-1, keepdim=True)
    return centred / (scores.std(-1, unbiased=False, keepdim=True) + eps)


def group_advantages_no_std(scores: torch.Tensor, eps: float = 1e-4) -> torch.Tensor:
    """Â_i = R_i − mean(R) within each group; (N, G) -> (N, G).

    Dr. GRPO (Liu et al. 2025, arXiv 2503.20783; docs/algorithms.md §5): GRPO's advantage without the
    division by the group std. ``eps`` is unused: it is there so every sequence-level estimator shares one
    signature.
    """
    return scores - scores.mean(-1, keepdim=True)


def rloo_advantages(scores: torch.Tensor, eps: float = 1e-4) -> torch.Tensor:
    """A_i = R_i − (1/(G−1)) Σ_{j≠i} R_j; (N, G) -> (N, G). Needs G ≥ 2.

    RLOO (Ahmadian et al. 2024, arXiv 2402.14740; docs/algorithms.md §5). Equivalently G/(G−1) · (R_i − mean(R)).
    ``eps`` is unused: it is there so every sequence-level estimator shares one signature.
    """
    g = scores.shape[-1]
    if g < 2:
        raise ValueError("RLOO needs at least 2 responses per prompt")
    others = (scores.sum(-1, keepdim=True) - scores) / (g - 1)
    return scores - others


SEQUENCE_ADVANTAGES = {"group": group_advantages, "group_no_std": group_advantages_no_std, "rloo": rloo_advantages}


def reinforce_pp_advantages(
    scores: torch.Tensor, kl: torch.Tensor, mask: torch.Tensor, kl_coef: float, gamma: float = 1.0
) -> torch.Tensor:
    """REINFORCE++: token rewards with the KL penalty folded in, returns-to-go, batch-normalised.

    r_t = −β · kl_t, plus the sequence score R on the last counted token (masks.last_action_index)
    G_t = Σ_{s ≥ t, m_s = 1} γ^{n(t, s)} r_s,   n(t, s) = the counted tokens in [t, s)
    A_t = (G_t − mean(G)) / √(var(G) + 1e-8), mean and population variance over every counted token of the batch

    Hu 2025, arXiv 2501.03262; docs/algorithms.md §5.2. scores (B,), kl (B, T) (any estimator, 0 on padding),
    mask (B, T), with holes in an agent episode (the environment's tokens): the return runs across them as over
    consecutive actions, as GAE does after compact_actions (§4.2a). Returns (B, T), 0 where the mask is 0.
    Normalise over the whole global batch: call it on all of it.
    """
    m = mask.to(kl.dtype)
    rewards = -kl_coef * kl * m
    rewards = torch.where(last_action_mask(mask), scores.to(kl.dtype)[:, None].expand_as(rewards), 0.0) + rewards
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(scores, dtype=rewards.dtype)
    for t in range(rewards.shape[1] - 1, -1, -1):
        # a position that is not an action (padding, an environment token) passes the return on unchanged
        running = torch.where(m[:, t] > 0, rewards[:, t] + gamma * running, running)
        returns[:, t] = running
    return masked_whiten(returns * m, mask)


def process_advantages(
    step_rewards: list[list[list[float]]], step_ends: list[list[list[int]]], length: int, eps: float = 1e-4
) -> torch.Tensor:
    """Â_t = Σ_{k: end_k ≥ t} r̃_k,  r̃ = (r − mean) / (std + ε) over all step scores of one prompt's group.

    Process supervision (Shao et al. 2024, arXiv 2402.03300, §4.1.3; docs/algorithms.md §5): step rewards are
    normalised across the group, and a token's advantage is the sum of the normalised rewards of the steps that
    end at or after it. step_rewards[i][j] = the step scores of response j of prompt i; step_ends[i][j][k] = the
    index of the token that ends step k of that response (k-th score). std is the population std. Returns
    (N·G, length) float32, prompt-major. Tokens after the last step's end get 0.
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


def zero_variance_groups(scores: torch.Tensor, tol: float = 1e-8) -> torch.Tensor:
    """max_j R_j − min_j R_j ≤ tol: (N, G) -> (N,) bool, the groups whose scores are all equal.

    Their group-relative advantage is 0 (no learning signal); DAPO's dynamic sampling (Yu et al. 2025,
    arXiv 2503.14476; docs/algorithms.md §5) drops them.
    """
    return (scores.max(-1).values - scores.min(-1).values) <= tol


GROUP_BASELINES = ("group", "group_no_std", "rloo")  # estimators whose baseline is the response's own group


def groups_without_signal(
    estimator: str, outcome: torch.Tensor | None, step_scores: list[list[list[float]]] | None, tol: float = 1e-8
) -> torch.Tensor:
    """The groups whose every token advantage is 0: (N,) bool, for N groups.

    A group teaches nothing when both parts of its advantage vanish: the outcome part — ``outcome`` (N, G), None
    when the run has no outcome score — is group-relative (GROUP_BASELINES) with all G scores equal
    (zero_variance_groups), and the process part — ``step_scores[i][j]``, the step scores of response j of prompt
    i, None without a process reward — has all the group's step scores equal (r − mean = 0 for each,
    process_advantages). REINFORCE++'s baseline is the batch's, so its equal-scored groups still carry signal
    (docs/algorithms.md §5.4).
    """
    if outcome is None and step_scores is None:
        raise ValueError("groups_without_signal: neither an outcome score nor step scores")
    n = len(outcome) if outcome is not None else len(step_scores)
    if outcome is None:
        flat = torch.ones(n, dtype=torch.bool)
    elif estimator in GROUP_BASELINES:
        flat = zero_variance_groups(outcome, tol)
    else:
        flat = torch.zeros(n, dtype=torch.bool)
    if step_scores is not None:
        pooled = [[r for response in group for r in response] for group in step_scores]
        flat &= torch.tensor([not rs or max(rs) - min(rs) <= tol for rs in pooled], dtype=torch.bool)
    return flat


from tether.algorithms.choices import ADVANTAGE_ESTIMATORS  # noqa: E402 - the names the settings offer


def token_advantages(
    estimator: str,
    scores: torch.Tensor,
    mask: torch.Tensor,
    group_size: int,
    kl: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    gamma: float = 1.0,
    eps: float = 1e-4,
) -> torch.Tensor:
    """A_{i,t} = Â_i · m_{i,t} for a sequence-level estimator; REINFORCE++'s token advantages otherwise.

    The one entry point a trainer calls (docs/algorithms.md §5). estimator: one of ADVANTAGE_ESTIMATORS.
    scores (B,) prompt-major (row i·G + j = response j of prompt i, G = group_size); mask (B, T) float, 1 on
    response tokens. group / group_no_std / rloo give every token of response i its sequence advantage;
    reinforce_pp folds ``kl_coef · kl`` (B, T) into the token rewards (kl None means no penalty) and uses γ.
    ``eps`` reaches the sequence-level estimators only. Returns (B, T), 0 on padding.
    """
    if estimator == "reinforce_pp":
        return reinforce_pp_advantages(scores, kl if kl is not None else torch.zeros_like(mask), mask, kl_coef, gamma)
    if estimator not in SEQUENCE_ADVANTAGES:
        raise ValueError(f"unknown advantage estimator {estimator!r}; choose from {ADVANTAGE_ESTIMATORS}")
    return SEQUENCE_ADVANTAGES[estimator](scores.view(-1, group_size), eps).reshape(-1, 1) * mask
