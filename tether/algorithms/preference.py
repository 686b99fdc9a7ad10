"""The direct-preference family (docs/algorithms.md §6): pure loss functions, and one table of them, one signature.

The pairwise functions take sequence log-probabilities (sums over response tokens, (B,)) of the chosen and
rejected responses under the policy and the reference, plus their own numbers, and return per-pair losses (B,).
Reference-free losses ignore the reference. With u_w = logπ(y_w) − logπ_ref(y_w), u_l = logπ(y_l) − logπ_ref(y_l)
and h = β (u_w − u_l). ``PREFERENCE_LOSSES`` maps each name to one signature over (B, K) tensors, best first;
``preference_loss`` dispatches through it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F


def _h(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, beta):
    return beta * ((chosen_logps - ref_chosen_logps) - (rejected_logps - ref_rejected_logps))


def dpo_sigmoid_loss(
    chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, beta: float = 0.1, label_smoothing: float = 0.0
) -> torch.Tensor:
    """L = −(1−ε) log σ(h) − ε log σ(−h), h = β (u_w − u_l); ε = 0 is DPO's L = − log σ(h).

    DPO (Rafailov et al. 2023, arXiv 2305.18290); with label_smoothing ε > 0, conservative DPO (cDPO, Mitchell
    2023, "A note on DPO with noisy preferences"). docs/algorithms.md §6. Sequence log-probs (B,) -> (B,).
    """
    h = _h(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, beta)
    return -(1 - label_smoothing) * F.logsigmoid(h) - label_smoothing * F.logsigmoid(-h)


def robust_dpo_loss(
    chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, beta: float = 0.1, label_smoothing: float = 0.1
) -> torch.Tensor:
    """L = [ −(1−ε) log σ(h) + ε log σ(−h) ] / (1 − 2ε), ε the assumed label-flip rate (0 ≤ ε < 0.5).

    Robust DPO (Chowdhury et al. 2024, arXiv 2403.00409); docs/algorithms.md §6. Sequence log-probs (B,) -> (B,).
    """
    if not 0 <= label_smoothing < 0.5:
        raise ValueError("robust DPO needs 0 <= label_smoothing < 0.5")
    h = _h(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, beta)
    return (-(1 - label_smoothing) * F.logsigmoid(h) + label_smoothing * F.logsigmoid(-h)) / (1 - 2 * label_smoothing)


def ipo_loss(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, beta: float = 0.1) -> torch.Tensor:
    """L = (u_w − u_l − 1/(2β))².

    IPO (Azar et al. 2023, arXiv 2310.12036); docs/algorithms.md §6. (B,) -> (B,).
    Convention: the log-probs given are what the caller chose; the paper's form uses sequence sums, some
    implementations pass per-token means. tether's DPO stage says which it passes.
    """
    u = (chosen_logps - ref_chosen_logps) - (rejected_logps - ref_rejected_logps)
    return (u - 1.0 / (2.0 * beta)) ** 2


def ipo_norm_loss(
    chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, chosen_tokens, rejected_tokens, beta=0.1
) -> torch.Tensor:
    """L = (u_w/|y_w| − u_l/|y_l| − 1/(2β))², u the summed log-ratio log π(y) − log π_ref(y), |y| its token count.

    Length-normalised IPO (docs/algorithms.md §6): each log-ratio divided by its response's length, as TRL's and
    LLaMA-Factory's ``ipo`` compute it (the form the IPO authors' reported results use), so β keeps one meaning
    across response lengths; ``ipo_loss`` is the paper's form on sums. (B,) each, token counts ≥ 1 -> (B,).
    """
    u_w = (chosen_logps - ref_chosen_logps) / chosen_tokens
    u_l = (rejected_logps - ref_rejected_logps) / rejected_tokens
    return (u_w - u_l - 1.0 / (2.0 * beta)) ** 2


def weighted_loss_sum(losses: dict[str, torch.Tensor], weights: dict[str, float]) -> torch.Tensor:
    """L = Σ_j w_j L_j: several per-pair losses of one batch (each (B,)) summed with their weights (docs/algorithms.md
    §6; TRL's loss_type list with loss_weights, e.g. MPO). The names of ``weights`` and ``losses`` must agree."""
    if set(losses) != set(weights):
        raise ValueError(f"losses {sorted(losses)} and weights {sorted(weights)} name different losses")
    return sum(w * losses[name] for name, w in weights.items())


def hinge_loss(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, beta: float = 0.1) -> torch.Tensor:
    """L = max(0, 1 − h), h = β (u_w − u_l).

    SLiC-style hinge (Zhao et al. 2023, arXiv 2305.10425); docs/algorithms.md §6. (B,) -> (B,).
    Differs from the paper: SLiC's calibration loss compares policy log-probs alone (margin δ, no reference);
    this is the reference-relative form the DPO family uses, with margin 1 and scale β.
    """
    return torch.relu(1 - _h(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, beta))


def simpo_loss(
    chosen_logps, rejected_logps, chosen_lengths, rejected_lengths, beta: float = 2.0, gamma: float = 0.5
) -> torch.Tensor:
    """L = − log σ( (β/|y_w|) log π(y_w) − (β/|y_l|) log π(y_l) − γ ).

    SimPO (Meng et al. 2024, arXiv 2405.14734), reference-free and length-normalised; docs/algorithms.md §6.
    Sequence log-probs and token counts |y|, all (B,) -> (B,).
    """
    return -F.logsigmoid(beta * chosen_logps / chosen_lengths - beta * rejected_logps / rejected_lengths - gamma)


_LN2 = math.log(2.0)


def log1mexp(x: torch.Tensor) -> torch.Tensor:
    """log(1 − eˣ) for x ≤ 0, accurate over the whole range (Mächler 2012, "Accurately computing log(1 − exp(−|a|))").

    log(−expm1(x)) for x > −ln 2 (where 1 − eˣ is small and eˣ would cancel), log1p(−eˣ) otherwise (where eˣ is
    small). Elementwise, any shape. log1mexp(0) = −inf; x > 0 is outside the domain (NaN). Each branch is fed only
    inputs of its own side, so the branch not taken never produces inf/NaN and never spoils the gradient.
    """
    near_zero = x > -_LN2
    cut = torch.full_like(x, -_LN2)
    small = torch.log(-torch.expm1(torch.where(near_zero, x, cut)))
    large = torch.log1p(-torch.exp(torch.where(near_zero, cut, x)))
    return torch.where(near_zero, small, large)


def _log_odds(mean_logps: torch.Tensor) -> torch.Tensor:
    """log odds(y) = log p − log(1 − p), p = exp(x), x the mean token log-prob; x is capped just below 0 (see ORPO)."""
    x = mean_logps.clamp(max=-torch.finfo(mean_logps.dtype).tiny)
    return x - log1mexp(x)


def orpo_odds_ratio_loss(chosen_mean_logps, rejected_mean_logps) -> torch.Tensor:
    """L_OR = − log σ( log odds(y_w) − log odds(y_l) ),  odds(y) = p / (1 − p),  p = exp(mean token logp of y).

    ORPO's preference term (Hong et al. 2024, arXiv 2403.07691), reference-free, on per-token mean log-probs
    (B,) -> (B,). The full ORPO loss is L_SFT(y_w) + λ L_OR; the SFT term is the caller's. log(1 − p) is
    ``log1mexp`` of the mean log-prob, so the log-odds keep growing as p → 1 (≈ 23.03 at x = −1e−10) instead of
    saturating. A mean log-prob of exactly 0 (p = 1 in floating point, which float32 reaches on confident
    tokens) is capped at −(the smallest normal number of its dtype) so the log-odds stay finite (≈ 87 in
    float32); that element gets no gradient through the odds term.
    """
    return -F.logsigmoid(_log_odds(chosen_mean_logps) - _log_odds(rejected_mean_logps))


def beta_dpo_margins(logps: torch.Tensor, ref_logps: torch.Tensor, beta0: float, scaled: bool = True) -> torch.Tensor:
    """scaled:  M_i = β_0 ( (logπ(y_w) − logπ_ref(y_w)) − (logπ(y_l) − logπ_ref(y_l)) ) = β_0 (u_w − u_l);
    unscaled: M_i = u_w − u_l.

    β-DPO's per-pair implicit-reward margin (Wu et al. 2024, arXiv 2407.08639), the statistic its batch β and
    pair weights are computed from. The paper's text defines it as the difference of implicit rewards
    r = β_0 log(π/π_ref), the scaled form, which tether has used so far; the authors' released code
    (junkangwu/beta-DPO, trainers.py) uses the unscaled gap u_w − u_l, and ``beta0`` is then ignored.
    logps, ref_logps: (B, K), best first; y_w is the first column and y_l the LAST one. Returns (B,).
    """
    u = logps - ref_logps
    gap = u[:, 0] - u[:, -1]
    return beta0 * gap if scaled else gap


def beta_dpo_beta(batch_margins: torch.Tensor, beta0: float, alpha: float, reference_margin: float) -> float:
    """β_b = max(1e-3, β_0 (1 + α (M_b − M_0))).

    β-DPO's per-batch β (Wu et al. 2024, arXiv 2407.08639; docs/algorithms.md §6): M_b the batch mean of the
    margins (``beta_dpo_margins``), M_0 a running average kept by the caller. Returns a Python float (the β of a
    step is a number, not part of the graph).
    """
    return max(1e-3, beta0 * (1.0 + alpha * (float(batch_margins.mean()) - reference_margin)))


def listwise_dpo_loss(
    ranked_logps: torch.Tensor, ranked_ref_logps: torch.Tensor, beta: float = 0.1, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """L = − Σ_{k=1}^{K−1} log [ exp(β u_(k)) / Σ_{j≥k} exp(β u_(j)) ].

    Plackett–Luce over K ranked responses (Rafailov et al. 2023, arXiv 2305.18290, appendix A.3;
    docs/algorithms.md §6), best first, (B, K) -> (B,); ``mask`` (B, K) marks real entries of shorter lists.
    For K = 2 it is DPO.
    """
    from tether.algorithms.reward import plackett_luce_loss

    return plackett_luce_loss(beta * (ranked_logps - ranked_ref_logps), mask)


def implicit_rewards(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, beta: float):
    """r̂(y) = β (log π(y) − log π_ref(y)), for chosen and for rejected; (B,) each.

    DPO's implicit reward (Rafailov et al. 2023, arXiv 2305.18290; docs/algorithms.md §6): the logged
    rewards/chosen and rewards/rejected.
    """
    return beta * (chosen_logps - ref_chosen_logps), beta * (rejected_logps - ref_rejected_logps)


def beta_dpo_pair_weights(margins: torch.Tensor, running_mean: float, running_std: float) -> torch.Tensor:
    """w_i = exp(−(M_i − M_0)² / (2 σ²)), σ the running standard deviation (floored at 1e-6).

    β-DPO's data weighting (Wu et al. 2024, arXiv 2407.08639; docs/algorithms.md §6): a pair whose margin M_i
    sits near the running mean M_0 counts more. (B,) -> (B,). Unnormalised: the caller divides by the step's mean
    weight so the weights average 1 over the optimizer step's batch.
    Differs from the paper: the paper samples pairs with these weights (without replacement); tether weights
    every pair's loss instead.
    """
    return torch.exp(-((margins - running_mean) ** 2) / (2 * max(running_std, 1e-6) ** 2))


def kto_reference_point(mismatched_logps: torch.Tensor, mismatched_ref_logps: torch.Tensor) -> torch.Tensor:
    """KTO's reference point z_0 (docs/algorithms.md §6.5): max(0, mean_i [log π_θ(y'_i|x_i) − log π_ref(y'_i|x_i)]),
    y'_i a completion written for another prompt — a batch estimate of KL(π_θ ‖ π_ref). (N,) -> scalar, detached:
    the paper does not back-propagate through it."""
    log_ratios = (mismatched_logps - mismatched_ref_logps).detach()
    return kto_reference_point_from_sums(log_ratios.sum(), len(log_ratios))


def kto_reference_point_from_sums(log_ratio_sum: torch.Tensor | float, count: torch.Tensor | float) -> torch.Tensor:
    """z_0 = max(0, Σ_i log-ratio_i / n) from the sum and the count, which add up over micro-batches and processes
    (a whole optimizer step's estimate)."""
    return torch.clamp(torch.as_tensor(log_ratio_sum, dtype=torch.float64) / count, min=0.0)


def kto_loss(
    logps: torch.Tensor,
    ref_logps: torch.Tensor,
    desirable: torch.Tensor,
    reference_point: torch.Tensor | float,
    beta: float = 0.1,
    desirable_weight: float = 1.0,
    undesirable_weight: float = 1.0,
) -> torch.Tensor:
    """KTO (Ethayarajh et al. 2024, arXiv 2402.01306, eq. 8; docs/algorithms.md §6.5), per example (B,):

    r = log π_θ(y|x) − log π_ref(y|x) (sequence sums), z_0 = ``reference_point`` (kto_reference_point);
    v = λ_D σ(β (r − z_0)) for a desirable y, λ_U σ(β (z_0 − r)) for an undesirable one; loss = λ_y − v.
    ``desirable``: (B,) bool."""
    r = logps - ref_logps
    weight = torch.where(desirable, torch.full_like(r, desirable_weight), torch.full_like(r, undesirable_weight))
    value = weight * torch.sigmoid(beta * torch.where(desirable, r - reference_point, reference_point - r))
    return weight - value


@dataclass(frozen=True)
class PreferenceParams:
    """The numbers the family's losses read: β (DPO's temperature; SimPO's scale), the label-smoothing / flip rate
    ε (cdpo, robust), SimPO's margin γ and ORPO's weight λ. A loss reads only its own."""

    beta: float
    label_smoothing: float = 0.0
    simpo_gamma: float = 0.5
    orpo_lambda: float = 0.1
    weights: tuple = ()  # loss weighted: ((name, weight), ...) of COMPOSABLE losses


def _pair(name: str, logps: torch.Tensor, ref_logps: torch.Tensor | None, needs_reference: bool = True):
    """(w, l, ref_w, ref_l) columns of a (B, 2) pair, with the family's two input errors."""
    if needs_reference and ref_logps is None:
        raise ValueError(f"{name} needs reference log-probabilities")
    if logps.shape[1] != 2:
        raise ValueError(f"{name} is a pairwise loss; ranked lists of {logps.shape[1]} need loss listwise")
    if ref_logps is None:
        return logps[:, 0], logps[:, 1], None, None
    return logps[:, 0], logps[:, 1], ref_logps[:, 0], ref_logps[:, 1]


def _sigmoid(logps, ref_logps, tokens, params: PreferenceParams, list_mask=None):
    w, l, rw, rl = _pair("sigmoid", logps, ref_logps)
    return dpo_sigmoid_loss(w, l, rw, rl, params.beta)


def _cdpo(logps, ref_logps, tokens, params: PreferenceParams, list_mask=None):
    w, l, rw, rl = _pair("cdpo", logps, ref_logps)
    return dpo_sigmoid_loss(w, l, rw, rl, params.beta, params.label_smoothing)


def _robust(logps, ref_logps, tokens, params: PreferenceParams, list_mask=None):
    w, l, rw, rl = _pair("robust", logps, ref_logps)
    return robust_dpo_loss(w, l, rw, rl, params.beta, params.label_smoothing)


def _ipo(logps, ref_logps, tokens, params: PreferenceParams, list_mask=None):
    w, l, rw, rl = _pair("ipo", logps, ref_logps)
    return ipo_loss(w, l, rw, rl, params.beta)


def _ipo_norm(logps, ref_logps, tokens, params: PreferenceParams, list_mask=None):
    w, l, rw, rl = _pair("ipo_norm", logps, ref_logps)
    return ipo_norm_loss(w, l, rw, rl, tokens[:, 0].clamp(min=1), tokens[:, 1].clamp(min=1), params.beta)


def _weighted(logps, ref_logps, tokens, params: PreferenceParams, list_mask=None):
    if not params.weights:
        raise ValueError("loss weighted needs weights: {loss name: weight}")
    weights = dict(params.weights)
    parts = {name: PREFERENCE_LOSSES[name](logps, ref_logps, tokens, params, list_mask) for name in weights}
    return weighted_loss_sum(parts, weights)


def _hinge(logps, ref_logps, tokens, params: PreferenceParams, list_mask=None):
    w, l, rw, rl = _pair("hinge", logps, ref_logps)
    return hinge_loss(w, l, rw, rl, params.beta)


def _simpo(logps, ref_logps, tokens, params: PreferenceParams, list_mask=None):
    w, l, _, _ = _pair("simpo", logps, ref_logps, needs_reference=False)
    return simpo_loss(w, l, tokens[:, 0], tokens[:, 1], params.beta, params.simpo_gamma)


def _orpo(logps, ref_logps, tokens, params: PreferenceParams, list_mask=None):
    w, l, _, _ = _pair("orpo", logps, ref_logps, needs_reference=False)
    mean_w, mean_l = w / tokens[:, 0], l / tokens[:, 1]
    return -mean_w + params.orpo_lambda * orpo_odds_ratio_loss(mean_w, mean_l)


def _beta_dpo(logps, ref_logps, tokens, params: PreferenceParams, list_mask=None):
    w, l, rw, rl = _pair("beta_dpo", logps, ref_logps)
    return dpo_sigmoid_loss(w, l, rw, rl, params.beta)


def _listwise(logps, ref_logps, tokens, params: PreferenceParams, list_mask=None):
    if ref_logps is None:
        raise ValueError("listwise needs reference log-probabilities")
    return listwise_dpo_loss(logps, ref_logps, params.beta, list_mask)


# name -> loss(logps (B, K), ref_logps (B, K) | None, tokens (B, K), params, list_mask (B, K) | None) -> (B,)
PREFERENCE_LOSSES: dict[str, Callable[..., torch.Tensor]] = {
    "sigmoid": _sigmoid,
    "cdpo": _cdpo,
    "robust": _robust,
    "ipo": _ipo,
    "ipo_norm": _ipo_norm,
    "hinge": _hinge,
    "simpo": _simpo,
    "orpo": _orpo,
    "beta_dpo": _beta_dpo,
    "listwise": _listwise,
    "weighted": _weighted,
}
REFERENCE_FREE = ("simpo", "orpo")
# the pairwise losses a weighted sum may take: each compares the pair through the reference at one shared β
COMPOSABLE = ("sigmoid", "cdpo", "robust", "ipo", "ipo_norm", "hinge")  # = choices.COMPOSABLE_LOSSES
PAIR_LOSSES = tuple(PREFERENCE_LOSSES)


def preference_loss(
    name: str,
    logps: torch.Tensor,
    ref_logps: torch.Tensor | None,
    tokens: torch.Tensor,
    beta: float,
    label_smoothing: float = 0.0,
    gamma: float = 0.5,
    orpo_lambda: float = 0.1,
    list_mask: torch.Tensor | None = None,
    weights: dict[str, float] | None = None,
) -> torch.Tensor:
    """Every member of the family behind one signature, (B,) per-example losses: PREFERENCE_LOSSES[name].

    logps, ref_logps, tokens: (B, K), best first (K = 2: chosen, rejected): Σ log π over each response's tokens,
    the same under the reference (None for the reference-free losses) and the token counts |y|.

    sigmoid: DPO; cdpo: DPO with label smoothing ε; robust: robust DPO; ipo: IPO on sequence sums (the paper's
    form); ipo_norm: IPO on length-normalised log-ratios (TRL's ipo); hinge: SLiC; weighted: Σ w_j L_j over
    ``weights`` {name: w} of COMPOSABLE losses; beta_dpo: the DPO loss at the β the caller computed for this batch (beta_dpo_beta);
    simpo: SimPO with margin γ; orpo: ORPO, −mean log π(y_w) + λ·L_OR; listwise: Plackett–Luce over the K
    ranked responses (for K = 2 it equals sigmoid). Raises ValueError for an unknown name, a missing reference
    and a ranked list (K > 2) given to a pairwise loss.
    """
    if name not in PREFERENCE_LOSSES:
        raise ValueError(f"unknown preference loss {name!r}; choose from {PAIR_LOSSES}")
    params = PreferenceParams(beta, label_smoothing, gamma, orpo_lambda, tuple((weights or {}).items()))
    return PREFERENCE_LOSSES[name](logps, ref_logps, tokens, params, list_mask)
