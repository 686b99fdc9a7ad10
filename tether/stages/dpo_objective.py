"""DPO's objective on the offline loop: the DPO family's losses (docs/algorithms.md §6) over every response of a
micro-batch in one forward, with β-DPO's running statistics and KTO's reference point per optimizer step."""

from __future__ import annotations

import torch

from tether.algorithms.masks import last_action_index
from tether.algorithms.preference import (
    REFERENCE_FREE,
    beta_dpo_beta,
    beta_dpo_margins,
    beta_dpo_pair_weights,
    implicit_rewards,
    kto_loss,
    kto_reference_point,
    kto_reference_point_from_sums,
    preference_loss,
)
from tether.models.packing import group_rows, sequence_logprob_sums


class DPOObjective:
    """Σ over preference examples of the chosen loss (+ sft_coef × the chosen answer's mean token NLL), each example's
    sum times its β-DPO weight when weighting is on (docs/algorithms.md §9).

    One forward scores every response of the micro-batch (collate puts the K responses of each example in
    K row blocks); the loop divides by the step's example count, so accumulation and processes do not change
    the gradient. Statistics (summed here, averaged by the loop) are the glossary's train/rewards/*,
    train/logps/*, train/accuracy, train/beta.
    """

    unit = "pairs"

    def __init__(self, d, beta_state: dict | None = None, chunked_head: bool = False):
        self.d = d
        self.chunked_head = chunked_head  # the LM head applied in chunks (ModelSection.chunked_head)
        self.beta = d.effective_beta
        self.needs_reference = d.loss not in REFERENCE_FREE
        # β-DPO's running margin statistics (M_0, σ) and those the step's weights use, restored on resume
        self.state = beta_state or {"mean": None, "std": 1.0}
        self._weight_norm = None  # the step's mean pair weight (β-DPO weighting)
        self.reference_point = None  # KTO's z_0 for this optimizer step (begin_step)

    def count(self, batch: dict) -> int:
        return int(batch["list_mask"].shape[0])

    def sequence_logps(self, model, batch: dict):
        """(B, K) Σ log π over each response's tokens and (B, K) token counts, from one forward (padded or packed)."""
        b, k = batch["list_mask"].shape
        sums, tokens = sequence_logprob_sums(model, batch, k * b, self.chunked_head)  # (K·B,) response-major
        return sums.view(k, b).T, tokens.view(k, b).T

    def block_logps(self, model, batch: dict, block: int) -> torch.Tensor:
        """(B,) Σ log π over the tokens of every example's ``block``-th response (one block of the batch's rows)."""
        b = batch["list_mask"].shape[0]
        return sequence_logprob_sums(model, group_rows(batch, block, b), b, self.chunked_head)[0]

    def _margins(self, logps, ref) -> torch.Tensor:
        return beta_dpo_margins(logps, ref, self.d.effective_beta, scaled=self.d.beta_dpo_margin == "scaled")

    @torch.no_grad()
    def begin_step(self, model, micro_batches: list[dict], reduce) -> None:
        """KTO: the step's reference point z_0 from every mismatched completion of the step (all processes).
        β-DPO: β for this step from the whole step batch's mean margin; the running M_0 and σ move after.
        The pair weights of this step use the statistics from before the move (kept as old_mean, old_std), the
        same ones their normalisation was computed with, so they average exactly 1 over the step."""
        if self.d.loss == "kto":
            total = torch.zeros(2, dtype=torch.float64)  # Σ mismatched log-ratio, n
            for batch in micro_batches:
                logps = self.block_logps(model, batch, 1)  # the mismatched completions
                ratio = (logps - batch["reference_logps"][:, 1].to(logps.device)).double().cpu()
                total += torch.stack([ratio.sum(), torch.tensor(float(len(ratio)), dtype=torch.float64)])
            total = reduce(total).cpu()
            self.reference_point = float(kto_reference_point_from_sums(total[0], total[1]))
            return
        if self.d.loss != "beta_dpo":
            return
        total = torch.zeros(4, dtype=torch.float64)  # Σ M, Σ M², Σ w, n
        old_mean, old_std = self.state["mean"], self.state["std"]
        for batch in micro_batches:
            logps, _ = self.sequence_logps(model, batch)
            m = self._margins(logps, batch["reference_logps"]).double().cpu()
            w = beta_dpo_pair_weights(m, old_mean, old_std) if old_mean is not None else torch.ones_like(m)
            total += torch.stack([m.sum(), (m * m).sum(), w.sum(), torch.tensor(float(len(m)), dtype=torch.float64)])
        total = reduce(total).cpu()
        n = float(total[3])
        batch_mean = float(total[0]) / n
        batch_std = max(float(total[1]) / n - batch_mean**2, 0.0) ** 0.5
        reference_margin = batch_mean if old_mean is None else old_mean
        self.beta = beta_dpo_beta(
            torch.tensor([batch_mean]), self.d.effective_beta, self.d.beta_dpo_alpha, reference_margin
        )
        self._weight_norm = float(total[2]) / n
        mom = self.d.beta_dpo_momentum
        self.state = {
            "mean": batch_mean if old_mean is None else mom * old_mean + (1 - mom) * batch_mean,
            "std": batch_std if old_mean is None else mom * old_std + (1 - mom) * batch_std,
            "old_mean": old_mean,
            "old_std": old_std,
        }

    def loss_sum(self, model, batch: dict):
        d = self.d
        if d.loss == "kto":
            return self._kto(model, batch)
        logps, tokens = self.sequence_logps(model, batch)
        ref = batch.get("reference_logps")
        if self.needs_reference and ref is None:
            raise RuntimeError("reference log-probabilities are missing from the batch")
        losses = preference_loss(
            d.loss,
            logps,
            ref if self.needs_reference else None,
            tokens,
            self.beta,
            d.label_smoothing,
            d.simpo_gamma,
            d.orpo_lambda,
            batch["list_mask"],
            d.loss_weights,
        )
        chosen_nll = -logps[:, 0] / tokens[:, 0].clamp(min=1)
        if d.sft_coef:
            losses = losses + d.sft_coef * chosen_nll
        weights = self._pair_weights(model, logps, ref)
        if weights is not None:  # w_i [ℓ(i) + α_sft NLL̄(i)] (§9): a pair weighed near 0 is left out whole
            losses = losses * weights
        return losses.sum(), self._statistics(logps, ref, tokens, chosen_nll, batch["list_mask"], len(losses))

    def _pair_weights(self, model, logps, ref) -> torch.Tensor | None:
        """β-DPO's pair weights w_i / w̄ (B,) for a training micro-batch, or None (every weight 1): without
        --beta-dpo-weighting, in evaluation, at the first step (no running σ yet), and when every weight of the
        step underflows (σ far smaller than the spread of its margins: equal weights rather than a division by 0)."""
        d = self.d
        if not (d.loss == "beta_dpo" and d.beta_dpo_weighting and model.training):
            return None
        if self.state.get("old_mean") is None or not self._weight_norm or self._weight_norm <= 1e-12:
            return None
        m = self._margins(logps.detach(), ref)
        return beta_dpo_pair_weights(m, self.state["old_mean"], self.state["old_std"]) / self._weight_norm

    def _kto(self, model, batch: dict):
        """Training: z_0 of the whole step (begin_step), so only the labelled completions are forwarded here;
        evaluation: this micro-batch's own estimate from its mismatched completions."""
        d = self.d
        ref = batch.get("reference_logps")
        if ref is None:
            raise RuntimeError("reference log-probabilities are missing from the batch")
        logps = self.block_logps(model, batch, 0)
        ref = ref.to(logps.device)
        desirable = batch["desirable"].to(logps.device)
        if model.training and self.reference_point is not None:
            z0 = torch.tensor(self.reference_point, device=logps.device)
        else:
            with torch.no_grad():
                z0 = kto_reference_point(self.block_logps(model, batch, 1), ref[:, 1])
        losses = kto_loss(logps, ref[:, 0], desirable, z0, self.beta, d.kto_desirable_weight, d.kto_undesirable_weight)
        with torch.no_grad():
            r = logps.detach() - ref[:, 0]
            n = len(losses)
            stats = {
                "kto/reference_point": z0.detach() * n,
                "kto/reward": (self.beta * r).sum(),
                "rewards/accuracy": ((r > z0) == desirable).float().sum(),
                "logps/chosen": logps.detach().sum(),
                "beta": torch.tensor(self.beta * n),
            }
        return losses.sum(), stats

    @torch.no_grad()
    def _statistics(self, logps, ref, tokens, chosen_nll, list_mask, n: int) -> dict:
        last = last_action_index(list_mask)  # the worst-ranked real response
        worst = logps.gather(1, last[:, None]).squeeze(1)
        if self.needs_reference:
            r_chosen, r_rejected = implicit_rewards(
                logps[:, 0], worst, ref[:, 0], ref.gather(1, last[:, None]).squeeze(1), self.beta
            )
        else:  # the reference-free losses' own implicit reward: (β/|y|) log π(y)
            r_chosen = self.beta * logps[:, 0] / tokens[:, 0].clamp(min=1)
            r_rejected = self.beta * worst / tokens.gather(1, last[:, None]).squeeze(1).clamp(min=1)
        margins = r_chosen - r_rejected
        return {
            "rewards/chosen": r_chosen.sum(),
            "rewards/rejected": r_rejected.sum(),
            "rewards/margins": margins.sum(),
            "rewards/accuracy": (margins > 0).float().sum(),
            "logps/chosen": logps[:, 0].detach().sum(),
            "logps/rejected": worst.detach().sum(),
            "nll/chosen": chosen_nll.detach().sum(),
            "beta": torch.tensor(self.beta * n),
        }
