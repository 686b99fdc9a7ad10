"""The language-model objective of the offline loop: the summed negative log-likelihood of the trained target tokens
(docs/algorithms.md §1). `tether sft` trains on a response's tokens with it, `tether judge` on a verdict's."""

from __future__ import annotations

from tether.algorithms.sft import sft_nll_sum
from tether.models.packing import scored_token_logprobs


class SFTObjective:
    """Σ of −logp over trained target tokens; the loop divides by the step's trained-token count."""

    unit = "tokens"
    reports_perplexity = True

    def __init__(self, chunked_head: bool = False):
        self.chunked_head = chunked_head  # the LM head applied in chunks (ModelSection.chunked_head)

    def count(self, batch: dict) -> int:
        return int(batch["loss_mask"][:, 1:].sum())

    def loss_sum(self, model, batch: dict):
        # (B, T-1): position t predicts t+1; logits computed at the trained positions only
        logprobs = scored_token_logprobs(model, batch, self.chunked_head)
        return sft_nll_sum(logprobs, batch["loss_mask"][:, 1:]), {}
