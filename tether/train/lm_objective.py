"""The language-model objective of the offline loop: the summed negative log-likelihood of the trained target tokens
(docs/algorithms.md §1). `tether sft` trains on a response's tokens with it, `tether judge` on a verdict's."""

from __future__ import annotations

from tether.algorithms.logprobs import token_logprobs
from tether.algorithms.sft import sft_nll_sum
from tether.models.packing import model_inputs


class SFTObjective:
    """Σ of −logp over trained target tokens; the loop divides by the step's trained-token count."""

    unit = "tokens"
    reports_perplexity = True

    def count(self, batch: dict) -> int:
        return int(batch["loss_mask"][:, 1:].sum())

    def loss_sum(self, model, batch: dict):
        logits = model(**model_inputs(batch), use_cache=False).logits  # (B, T, V)
        logprobs = token_logprobs(logits[:, :-1], batch["input_ids"][:, 1:])  # (B, T-1): position t predicts t+1
        return sft_nll_sum(logprobs, batch["loss_mask"][:, 1:]), {}
