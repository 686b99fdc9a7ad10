"""The group family's named recipes: each is a composition of pieces (advantage estimator, importance ratio,
clip, aggregation, KL placement and estimator, rollout filter, reward shaping), set as config values.

Brand names live here and in the docs only; the trainer reads the pieces. A recipe sits between the stage's
defaults and the user's values: any flag or YAML value overrides it (tether/config.py).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Recipe:
    summary: str
    equations: str
    settings: dict  # dotted config key: value
    sources: str


RECIPES: dict[str, Recipe] = {
    "grpo": Recipe(
        "Group-relative advantages with std scaling, token-ratio clipping, per-sequence mean, k3 KL in the loss.",
        "Â_i = (R_i − mean R) / (std R + ε);  J = mean_i (1/|y_i|) Σ_t [min(ρ_t Â_i, clip(ρ_t, 1±ε) Â_i) − β k3_t]",
        {
            "algo.advantage": "group",
            "algo.ratio": "token",
            "algo.clip_low": 0.2,
            "algo.clip_high": 0.2,
            "algo.aggregation": "seq-mean-token-mean",
            "algo.kl_coef": 0.04,
            "algo.kl_estimator": "k3",
            "algo.kl_in_reward": 0.0,
            "algo.dynamic_sampling": False,
            "rewards.overlong_cache": 0,
        },
        "Shao et al. 2024, DeepSeekMath (arXiv 2402.03300): ε = 0.2, β = 0.04.",
    ),
    "dr_grpo": Recipe(
        "GRPO without the two length/difficulty biases: no std division, token sums over a constant length.",
        "Â_i = R_i − mean R;  J = mean_i (1/L) Σ_t min(ρ_t Â_i, clip(ρ_t, 1±ε) Â_i),  L = max_new_tokens",
        {
            "algo.advantage": "group_no_std",
            "algo.ratio": "token",
            "algo.clip_low": 0.2,
            "algo.clip_high": 0.2,
            "algo.aggregation": "seq-mean-token-sum-norm",
            "algo.kl_coef": 0.0,
            "algo.kl_in_reward": 0.0,
            "algo.dynamic_sampling": False,
            "rewards.overlong_cache": 0,
        },
        "Liu et al. 2025, Understanding R1-Zero-Like Training (arXiv 2503.20783): β = 0.",
    ),
    "dapo": Recipe(
        "Clip-higher, dynamic sampling, token-level loss, soft overlong punishment, no KL.",
        "Â_i group-normalised; J = Σ_{i,t} min(ρ_t Â_i, clip(ρ_t, 1−0.2, 1+0.28) Â_i) / Σ_i |y_i|;  "
        "groups with equal R dropped and re-sampled; R += R_len(|y|)",
        {
            "algo.advantage": "group",
            "algo.ratio": "token",
            "algo.clip_low": 0.2,
            "algo.clip_high": 0.28,
            "algo.aggregation": "token-mean",
            "algo.kl_coef": 0.0,
            "algo.kl_in_reward": 0.0,
            "algo.dynamic_sampling": True,
            "rewards.overlong_cache": -1,
        },
        "Yu et al. 2025, DAPO (arXiv 2503.14476): ε_low 0.2, ε_high 0.28; L_cache = a quarter of the budget here "
        "(the paper: 4096 of 20480).",
    ),
    "gspo": Recipe(
        "Sequence-level importance ratio (length-normalised) with a very small clip range.",
        "s_i = exp((1/|y_i|) Σ_t (logp_t − old_logp_t));  J = mean_i min(s_i Â_i, clip(s_i, 1−ε_l, 1+ε_h) Â_i)",
        {
            "algo.advantage": "group",
            "algo.ratio": "sequence",
            "algo.clip_low": 3e-4,
            "algo.clip_high": 4e-4,
            "algo.aggregation": "seq-mean-token-mean",
            "algo.kl_coef": 0.0,
            "algo.kl_in_reward": 0.0,
            "algo.dynamic_sampling": False,
            "rewards.overlong_cache": 0,
        },
        "Zheng et al. 2025, Group Sequence Policy Optimization (arXiv 2507.18071): ε_l 3e-4, ε_h 4e-4. "
        "The ratio differs from 1 only with μ > 1 or several minibatches per rollout.",
    ),
    "rloo": Recipe(
        "REINFORCE with the leave-one-out baseline; the clip is kept as a trust region.",
        "A_i = R_i − (1/(G−1)) Σ_{j≠i} R_j;  J = mean_i (1/|y_i|) Σ_t min(ρ_t A_i, clip(ρ_t, 1±ε) A_i)",
        {
            "algo.advantage": "rloo",
            "algo.ratio": "token",
            "algo.clip_low": 0.2,
            "algo.clip_high": 0.2,
            "algo.aggregation": "seq-mean-token-mean",
            "algo.kl_coef": 0.0,
            "algo.kl_in_reward": 0.0,
            "algo.dynamic_sampling": False,
            "rewards.overlong_cache": 0,
        },
        "Ahmadian et al. 2024, Back to Basics (arXiv 2402.14740).",
    ),
    "reinforce_pp": Recipe(
        "REINFORCE++: per-token KL penalty in the reward, returns-to-go, advantages normalised over the batch.",
        "r_t = −β k1_t (+ R on the last token);  G_t = Σ_{s≥t} γ^{s−t} r_s;  A_t = (G_t − mean G) / std G;  token-mean loss",
        {
            "algo.advantage": "reinforce_pp",
            "algo.ratio": "token",
            "algo.clip_low": 0.2,
            "algo.clip_high": 0.2,
            "algo.aggregation": "token-mean",
            "algo.kl_coef": 0.0,
            "algo.kl_in_reward": 0.01,
            "algo.kl_estimator": "k1",
            "algo.gamma": 1.0,
            "algo.dynamic_sampling": False,
            "rewards.overlong_cache": 0,
        },
        "Hu 2025, REINFORCE++ (arXiv 2501.03262): β = 0.01, γ = 1.",
    ),
}
