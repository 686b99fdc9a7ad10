"""A causal language model read as a judge: the log-probabilities it gives chosen next tokens (the verdicts) after
each of many prompts, in batches, each distinct prompt once (docs/algorithms.md §12).

Rows are left-padded, so every prompt's last token sits in the batch's last column and the head runs there alone
(``logits_to_keep=1``: no vocabulary-wide logits at other positions); position ids count each row's own tokens from
0, so a prompt's verdict does not depend on the batch it is in (tested). Log-softmax over the whole vocabulary in
float32; the forwards are counted under the phase ``judge`` (models/work.py).
"""

from __future__ import annotations

from pathlib import Path

import torch

from tether.models.work import phase


class JudgeLM:
    """A frozen causal LM from a local folder, with its own tokenizer."""

    def __init__(self, path: str | Path, device: str | torch.device = "cpu", dtype: str = "float32", batch_size=16):
        from tether.models.lm import load_model, load_tokenizer

        self.path = Path(path)
        self.tokenizer = load_tokenizer(path)
        self.model = load_model(path, self.tokenizer, dtype=dtype).to(device).eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.device, self.batch_size = device, batch_size
        self.context = getattr(self.model.config, "max_position_embeddings", None)  # the scorer checks prompts fit

    @torch.no_grad()
    def next_token_logprobs(self, ids: list[list[int]], targets: list[int]) -> torch.Tensor:
        """(N, K) float32: log p(targets[k] | ids[n]) over the full vocabulary, in the order given."""
        distinct = list(dict.fromkeys(tuple(row) for row in ids))
        order = sorted(range(len(distinct)), key=lambda i: len(distinct[i]))
        out = torch.zeros(len(distinct), len(targets))
        pad = self.tokenizer.pad_token_id
        index = torch.tensor(targets, device=self.device)
        with phase("judge"):
            for start in range(0, len(order), self.batch_size):
                chunk = order[start : start + self.batch_size]
                width = max(len(distinct[i]) for i in chunk)
                input_ids = torch.full((len(chunk), width), pad, dtype=torch.long)
                mask = torch.zeros((len(chunk), width), dtype=torch.long)
                for r, i in enumerate(chunk):
                    row = distinct[i]
                    input_ids[r, width - len(row) :] = torch.tensor(row)
                    mask[r, width - len(row) :] = 1
                positions = (mask.cumsum(-1) - 1).clamp(min=0)
                logits = self.model(
                    input_ids=input_ids.to(self.device),
                    attention_mask=mask.to(self.device),
                    position_ids=positions.to(self.device),
                    logits_to_keep=1,
                ).logits[:, -1, :]
                out[chunk] = torch.log_softmax(logits.float(), -1).index_select(-1, index).cpu()
        where = {row: i for i, row in enumerate(distinct)}
        return out[[where[tuple(row)] for row in ids]] if ids else out
