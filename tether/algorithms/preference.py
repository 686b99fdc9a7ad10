"""The direct-preference family as pure functions of one signature (shared ALGORITHMS §6).

Every loss takes sequence log-probabilities (sums over response tokens, (B,)) of the chosen and rejected
responses under the policy and the reference, plus its own numbers, and returns per-pair losses (B,).
Reference-free losses ignore the reference arguments. With u_w = logπ(y_w) − logπ_ref(y_w),
u_l = logπ(y_l) − logπ_ref(y_l) and h = β (u_w − u_l):
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def _h(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, beta):
    return beta * ((chosen_logps - ref_chosen_logps) - (rejected_logps - ref_rejected_logps))


def dpo_sigmoid_loss(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, beta: float = 0.1,
                     label_smoothing: float = 0.0) -> torch.Tensor:
    """DPO (Rafailov et al. 2023, arXiv 2305.18290): L = − log σ(h).

    With label_smoothing ε > 0, conservative DPO (cDPO): L = −(1−ε) log σ(h) − ε log σ(−h).
    """
    h = _h(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, beta)
    return -(1 - label_smoothing) * F.logsigmoid(h) - label_smoothing * F.logsigmoid(-h)


def robust_dpo_loss(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, beta: float = 0.1,
                    label_smoothing: float = 0.1) -> torch.Tensor:
    """Robust DPO (Chowdhury et al. 2024, arXiv 2403.00409), ε the assumed label-flip rate (< 0.5):
    L = [ −(1−ε) log σ(h) + ε log σ(−h) ] / (1 − 2ε).
    """
    if not 0 <= label_smoothing < 0.5:
        raise ValueError("robust DPO needs 0 <= label_smoothing < 0.5")
    h = _h(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, beta)
    return (-(1 - label_smoothing) * F.logsigmoid(h) + label_smoothing * F.logsigmoid(-h)) / (1 - 2 * label_smoothing)


def ipo_loss(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, beta: float = 0.1) -> torch.Tensor:
    """IPO (Azar et al. 2023, arXiv 2310.12036): L = (u_w − u_l − 1/(2β))².

    Convention: the log-probs given are what the caller chose; the paper's form uses sequence sums, some
    implementations pass per-token means. tether's DPO stage says which it passes.
    """
    u = (chosen_logps - ref_chosen_logps) - (rejected_logps - ref_rejected_logps)
    return (u - 1.0 / (2.0 * beta)) ** 2


def hinge_loss(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, beta: float = 0.1) -> torch.Tensor:
    """SLiC-style hinge (Zhao et al. 2023, arXiv 2305.10425): L = max(0, 1 − h)."""
    return torch.relu(1 - _h(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, beta))


def simpo_loss(chosen_logps, rejected_logps, chosen_lengths, rejected_lengths, beta: float = 2.0,
               gamma: float = 0.5) -> torch.Tensor:
    """SimPO (Meng et al. 2024, arXiv 2405.14734), reference-free and length-normalised:
    L = − log σ( (β/|y_w|) log π(y_w) − (β/|y_l|) log π(y_l) − γ ).
    """
    return -F.logsigmoid(beta * chosen_logps / chosen_lengths - beta * rejected_logps / rejected_lengths - gamma)


def orpo_odds_ratio_loss(chosen_mean_logps, rejected_mean_logps) -> torch.Tensor:
    """ORPO's preference term (Hong et al. 2024, arXiv 2403.07691), reference-free, on per-token mean log-probs:
    odds(y) = p / (1 − p), p = exp(mean token logp of y);  L_OR = − log σ(log odds(y_w) − log odds(y_l)).
    The full ORPO loss is L_SFT(y_w) + λ L_OR; the SFT term is the caller's.
    """
    # log odds = log p − log(1 − p), with log(1 − p) = log1p(−exp(log p)) computed stably
    log_odds_w = chosen_mean_logps - torch.log1p(-torch.exp(chosen_mean_logps).clamp(max=1 - 1e-7))
    log_odds_l = rejected_mean_logps - torch.log1p(-torch.exp(rejected_mean_logps).clamp(max=1 - 1e-7))
    return -F.logsigmoid(log_odds_w - log_odds_l)


def beta_dpo_beta(batch_margins: torch.Tensor, beta0: float, alpha: float, reference_margin: float) -> float:
    """β-DPO's per-batch β (Wu et al. 2024, arXiv 2407.08639): β_b = β_0 (1 + α (M_b − M_0)),
    M_b the batch mean of the implicit-reward margin, M_0 a running average kept by the caller. Floored at 1e-3.
    """
    return max(1e-3, beta0 * (1.0 + alpha * (float(batch_margins.mean()) - reference_margin)))


def listwise_dpo_loss(ranked_logps: torch.Tensor, ranked_ref_logps: torch.Tensor, beta: float = 0.1,
                      mask: torch.Tensor | None = None) -> torch.Tensor:
    """Plackett–Luce over K ranked responses (DPO paper, appendix A.3), best first, (B, K) -> (B,):
    L = − Σ_{k=1}^{K−1} log [ exp(β u_(k)) / Σ_{j≥k} exp(β u_(j)) ].
    """
    from tether.algorithms.reward import plackett_luce_loss

    return plackett_luce_loss(beta * (ranked_logps - ranked_ref_logps), mask)


def implicit_rewards(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, beta: float):
    """r̂(y) = β (log π(y) − log π_ref(y)) for chosen and rejected: the logged rewards/chosen, rewards/rejected."""
    return beta * (chosen_logps - ref_chosen_logps), beta * (rejected_logps - ref_rejected_logps)


def beta_dpo_pair_weights(margins: torch.Tensor, running_mean: float, running_std: float) -> torch.Tensor:
    """β-DPO's data weighting (Wu et al. 2024): a pair whose margin M_i sits near the running mean M_0 counts
    more — w_i = exp(−(M_i − M_0)² / (2 σ²)), σ the running standard deviation. Unnormalised: the caller divides
    by the step's mean weight so the weights average 1 over the optimizer step's batch."""
    return torch.exp(-((margins - running_mean) ** 2) / (2 * max(running_std, 1e-6) ** 2))


REFERENCE_FREE = ("simpo", "orpo")
PAIR_LOSSES = ("sigmoid", "cdpo", "robust", "ipo", "hinge", "simpo", "orpo", "beta_dpo", "listwise")


def preference_loss(name: str, logps: torch.Tensor, ref_logps: torch.Tensor | None, tokens: torch.Tensor,
                    beta: float, label_smoothing: float = 0.0, gamma: float = 0.5, orpo_lambda: float = 0.1,
                    list_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Every member of the family behind one signature, (B,) per-example losses.

    logps, ref_logps, tokens: (B, K), best first (K = 2: chosen, rejected): Σ log π over each response's tokens,
    the same under the reference (None for the reference-free losses) and the token counts |y|.

    sigmoid: DPO; cdpo: DPO with label smoothing ε; robust: robust DPO; ipo: IPO on sequence sums (the paper's
    form); hinge: SLiC; beta_dpo: the DPO loss at the β the caller computed for this batch (beta_dpo_beta);
    simpo: SimPO with margin γ; orpo: ORPO, −mean log π(y_w) + λ·L_OR; listwise: Plackett–Luce over the K
    ranked responses (for K = 2 it equals sigmoid).
    """
    if name not in REFERENCE_FREE and ref_logps is None:
        raise ValueError(f"{name} needs reference log-probabilities")
    if name == "listwise":
        return listwise_dpo_loss(logps, ref_logps, beta, list_mask)
    if logps.shape[1] != 2:
        raise ValueError(f"{name} is a pairwise loss; ranked lists of {logps.shape[1]} need loss listwise")
    w, l = logps[:, 0], logps[:, 1]
    if name == "simpo":
        return simpo_loss(w, l, tokens[:, 0], tokens[:, 1], beta, gamma)
    if name == "orpo":
        mean_w, mean_l = w / tokens[:, 0], l / tokens[:, 1]
        return -mean_w + orpo_lambda * orpo_odds_ratio_loss(mean_w, mean_l)
    rw, rl = ref_logps[:, 0], ref_logps[:, 1]
    if name in ("sigmoid", "beta_dpo"):
        return dpo_sigmoid_loss(w, l, rw, rl, beta)
    if name == "cdpo":
        return dpo_sigmoid_loss(w, l, rw, rl, beta, label_smoothing)
    if name == "robust":
        return robust_dpo_loss(w, l, rw, rl, beta, label_smoothing)
    if name == "ipo":
        return ipo_loss(w, l, rw, rl, beta)
    if name == "hinge":
        return hinge_loss(w, l, rw, rl, beta)
    raise ValueError(f"unknown preference loss {name!r}; choose from {PAIR_LOSSES}")
