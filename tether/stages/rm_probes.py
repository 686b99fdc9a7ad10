"""What a trained reward model learned besides the labels: bias probes and normalisation statistics.

- length correlation: Pearson r between score and response length (words) over held-out responses;
- counterfactual probes: the same answer with a filler sentence or a confident opener added; the mean score
  shift, its std and how often the score went up (a faithful model moves these little or down);
- your own probes: rows {prompt, original, modified, probe} scored the same way;
- normalisation: per-head mean and std of scores over a reference set, saved beside the model for RL stages.
"""

from __future__ import annotations

import copy
import math

from tether.data.preferences import render_response
from tether.models.reward import check_lengths, score_token_ids

DEFAULT_PROBES = {
    "filler": lambda text: "That is a great question. " + text,
    "confident": lambda text: "Definitely, " + text[:1].lower() + text[1:],
}


def _content(response) -> str:
    return response if isinstance(response, str) else response[-1]["content"]


def _with_content(response, text: str):
    if isinstance(response, str):
        return text
    changed = copy.deepcopy(response)
    changed[-1]["content"] = text
    return changed


def _responses(row: dict) -> list:
    if "chosen" in row and "rejected" in row:
        return [row["chosen"], row["rejected"]]
    return list(row.get("responses", [])) or ([row["response"]] if "response" in row else [])


def pearson(xs: list[float], ys: list[float]) -> float:
    n = len(xs)
    if n < 2:
        return float("nan")
    mx, my = sum(xs) / n, sum(ys) / n
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else float("nan")


class ScoreMemo:
    """Scores of texts under one model, each distinct token sequence scored once across the probes and the
    normalisation (the held-out responses the length probe scores are the counterfactual probes' originals and, by
    default, the normalisation set). ``known``: {token ids: scores} already computed with these weights (the final
    held-out evaluation's). ``scored`` counts the sequences that went through the model here."""

    def __init__(self, rm, tokenizer, known: dict | None = None):
        self.rm, self.tokenizer, self.seen, self.scored = rm, tokenizer, dict(known or {}), 0

    def __call__(self, texts: list[str], max_length: int):
        import torch

        keys = [tuple(ids) for ids in self.tokenizer(texts, add_special_tokens=False)["input_ids"]] if texts else []
        check_lengths(keys, max_length)
        new = list(dict.fromkeys(k for k in keys if k not in self.seen))
        if new:  # tokenised once: the keys are the ids the model reads
            for key, row in zip(new, score_token_ids(self.rm, [list(k) for k in new], self.tokenizer.pad_token_id)):
                self.seen[key] = row
            self.scored += len(new)
        return torch.stack([self.seen[k] for k in keys]) if texts else torch.zeros(0, len(self.rm.head_names))


def _shift(score, originals: list[str], modified: list[str], max_length: int) -> dict:
    a = score(originals, max_length)[:, 0]
    b = score(modified, max_length)[:, 0]
    delta = b - a
    return {
        "n": len(delta),
        "mean_shift": round(delta.mean().item(), 4),
        "std": round(delta.std(unbiased=False).item(), 4),
        "fraction_up": round((delta > 0).float().mean().item(), 4),
    }


def normalization_stats(rm, tokenizer, rows: list[dict], max_length: int, score: ScoreMemo | None = None) -> dict:
    texts = [
        render_response(tokenizer, r.get("prompt"), resp, "reference", "response")
        for r in rows
        for resp in _responses(r)
    ]
    if not texts:
        raise ValueError("normalisation needs at least one reference response")
    scores = (score or ScoreMemo(rm, tokenizer))(texts, max_length)  # (N, heads)
    return {
        name: {
            "mean": scores[:, h].mean().item(),
            "std": max(scores[:, h].std(unbiased=False).item(), 1e-6),
            "n": len(texts),
        }
        for h, name in enumerate(rm.head_names)
    }


def run_probes(
    rm,
    tokenizer,
    eval_rows: list[dict],
    norm_rows: list[dict],
    probe_rows: list[dict],
    max_length: int,
    known: dict | None = None,
) -> tuple[dict, dict]:
    """``known``: {token ids: scores} the final evaluation computed with these weights, not scored again."""
    score = ScoreMemo(rm, tokenizer, known)
    pairs = [(r.get("prompt"), resp) for r in eval_rows for resp in _responses(r)]
    texts = [render_response(tokenizer, p, resp, "probe", "response") for p, resp in pairs]
    scores = score(texts, max_length)[:, 0].tolist()
    lengths = [len(_content(resp).split()) for _, resp in pairs]
    probes: dict = {
        "length_correlation": round(pearson(lengths, scores), 4),
        "responses": len(pairs),
        "counterfactual": {},
    }
    originals = [(r.get("prompt"), r["chosen"]) for r in eval_rows if "chosen" in r]
    for name, transform in DEFAULT_PROBES.items():
        if not originals:
            break
        before = [render_response(tokenizer, p, resp, "probe", "chosen") for p, resp in originals]
        after = [
            render_response(tokenizer, p, _with_content(resp, transform(_content(resp))), "probe", "chosen")
            for p, resp in originals
        ]
        probes["counterfactual"][name] = _shift(score, before, after, max_length + 32)  # room for the added words
    by_name: dict[str, list] = {}
    for row in probe_rows:
        by_name.setdefault(row.get("probe", "custom"), []).append(row)
    for name, rows in by_name.items():
        before = [render_response(tokenizer, r.get("prompt"), r["original"], "probe file", "original") for r in rows]
        after = [render_response(tokenizer, r.get("prompt"), r["modified"], "probe file", "modified") for r in rows]
        probes["counterfactual"][name] = _shift(score, before, after, max_length)
    normalization = normalization_stats(rm, tokenizer, norm_rows, max_length, score)
    probes["texts_scored"] = score.scored  # distinct texts through the model (each once)
    return probes, normalization
