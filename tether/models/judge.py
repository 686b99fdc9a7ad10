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


def judge_stop_ids(tokenizer) -> list[int]:
    """Where a judge's written answer ends: its EOS and its chat template's end of turn."""
    from tether.models.lm import end_of_turn_id

    return sorted({i for i in (tokenizer.eos_token_id, end_of_turn_id(tokenizer)) if isinstance(i, int)})


class JudgeLM:
    """A frozen causal LM from a local folder, with its own tokenizer."""

    normalised = False  # next_token_logprobs are over the whole vocabulary: their sum is the verdicts' mass

    def __init__(self, model, tokenizer, batch_size: int = 16, path: str | Path = ""):
        """``model``: a causal LM already loaded (a folder's, or one in training: `tether judge` reads it as it
        learns); its parameters are read, never changed."""
        self.model, self.tokenizer, self.batch_size, self.path = model, tokenizer, batch_size, Path(path)
        self.device = next(model.parameters()).device
        self.context = getattr(model.config, "max_position_embeddings", None)  # the scorer checks prompts fit

    @classmethod
    def load(cls, path: str | Path, device: str | torch.device = "cpu", dtype: str = "float32", batch_size=16):
        """A frozen judge from a local folder, with its own tokenizer."""
        from tether.models.lm import load_model, load_tokenizer

        tokenizer = load_tokenizer(path)
        model = load_model(path, tokenizer, dtype=dtype).to(device).eval()
        for p in model.parameters():
            p.requires_grad_(False)
        return cls(model, tokenizer, batch_size, path)

    @staticmethod
    def _left_padded(rows: list[tuple[int, ...]], pad: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(input_ids, attention_mask, position_ids): rows left-padded, positions counting each row's own tokens."""
        width = max(len(row) for row in rows)
        input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for r, row in enumerate(rows):
            input_ids[r, width - len(row) :] = torch.tensor(row)
            mask[r, width - len(row) :] = 1
        return input_ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)

    @torch.no_grad()
    def generate(self, ids: list[list[int]], max_new_tokens: int) -> tuple[list[str], int]:
        """(greedy answers after each prompt, to the judge's end of sequence, special tokens dropped; the tokens
        written, stops included): a text read."""
        out: list[str] = []
        written = 0
        stops = judge_stop_ids(self.tokenizer)
        with phase("judge"):
            for start in range(0, len(ids), self.batch_size):
                rows = [tuple(r) for r in ids[start : start + self.batch_size]]
                input_ids, mask, _ = self._left_padded(rows, self.tokenizer.pad_token_id)
                new = self.model.generate(
                    input_ids=input_ids.to(self.device),
                    attention_mask=mask.to(self.device),
                    do_sample=False,
                    temperature=None,
                    top_p=None,
                    top_k=None,
                    max_new_tokens=max_new_tokens,
                    pad_token_id=self.tokenizer.pad_token_id,
                    eos_token_id=stops or None,
                )[:, input_ids.shape[1] :]
                out += self.tokenizer.batch_decode(new, skip_special_tokens=True)
                # generate() pads a finished row after its stop: a row's tokens end at its first stop
                written += sum(next((k + 1 for k, t in enumerate(row) if t in stops), len(row)) for row in new.tolist())
        return out, written

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
                input_ids, mask, positions = self._left_padded([distinct[i] for i in chunk], pad)
                logits = self.model(
                    input_ids=input_ids.to(self.device),
                    attention_mask=mask.to(self.device),
                    position_ids=positions.to(self.device),
                    logits_to_keep=1,
                ).logits[:, -1, :]
                out[chunk] = torch.log_softmax(logits.float(), -1).index_select(-1, index).cpu()
        where = {row: i for i, row in enumerate(distinct)}
        return out[[where[tuple(row)] for row in ids]] if ids else out
