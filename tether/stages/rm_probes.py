"""What a trained reward model learned besides the labels: bias probes and normalisation statistics.

- length correlation: Pearson r between score and response length (words) over held-out responses;
- counterfactual probes: the same answer with a filler sentence or a confident opener added; the mean score
  shift, its std and how often the score went up or down (a faithful model moves these little or down);
- your own probes: rows {prompt, original, modified, probe} scored the same way;
- a reading of each figure (read_probes): what it means and whether it is high, by a stated rule;
- normalisation: per-head mean and std of scores over a reference set, saved beside the model for RL stages.
"""

from __future__ import annotations

import copy
import math
import statistics

import torch

from tether.data.preferences import render_response
from tether.data.probes import ADDED, DEFAULT_PROBES  # noqa: F401 - their old home
from tether.diagnostics.monitors import MonitorSettings
from tether.models.reward import check_lengths, score_token_ids
from tether.models.vision import PER_TOKEN

# |r| of score with length from which the length probe reads high: r² ≥ 0.09, length alone accounting for about a
# tenth of the variance of the scores (docs/reward-models.md, "Reading the probes")
LENGTH_R_HIGH = 0.3
# a counterfactual shift matters from this share of the held-out scores' std: the RL stages divide the score by that
# std (normalize_reward), so the policy sees the addition worth at least 0.1 of a typical difference between answers
SHIFT_HIGH = 0.1


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
        "up": int((delta > 0).sum()),
        "down": int((delta < 0).sum()),
    }


def read_length_correlation(r: float, n: int) -> dict:
    """The length probe's reading: r of score with length over ``n`` held-out responses is high when
    |r| ≥ max(LENGTH_R_HIGH, 2/√n) — length alone accounting for at least 9 % of the scores' variance (r²), and r
    beyond chance: with no correlation, r over n responses has a standard error of about 1/√n."""
    if not math.isfinite(r):
        return {"high": False, "threshold": None, "reading": "no reading: the scores or the lengths do not vary"}
    bound = max(LENGTH_R_HIGH, 2 / math.sqrt(n))
    high = abs(r) >= bound
    return {
        "high": high,
        "threshold": round(bound, 4),
        "reading": f"the score {'rises' if r > 0 else 'falls'} with length, which alone accounts for {100 * r * r:.0f} % of "
        f"its variance over {n} responses; {'high' if high else 'not high'} (high from |r| = {bound:.2f}, the "
        f"larger of {LENGTH_R_HIGH}, a 9 % share, and 2/√{n}, beyond chance)",
    }


def read_shift(added: str, shift: dict, score_std: float) -> dict:
    """A counterfactual probe's reading: ``added`` raised the score of ``up`` answers and lowered it for ``down``. A
    model indifferent to the addition raises as many as it lowers (a sign test: of m = up + down changed scores, up
    is Binomial(m, ½), standard error √m/2); high when up − down > 2√m, two standard errors above that — compared
    as (up − down)² > 4m with up > down, in integers — and the mean change is at least SHIFT_HIGH × ``score_std``
    (the held-out scores' std)."""
    up, down, n, mean = shift["up"], shift["down"], shift["n"], shift["mean_shift"]
    lead, changed = up - down, up + down
    beyond, large = lead * lead > 4 * changed, mean >= SHIFT_HIGH * score_std
    if lead > 0 and beyond and large:
        verdict = "high: the model pays for the addition itself, which a policy trained on it can learn to write"
    elif lead > 0 and beyond:
        verdict = f"not high: it raises the score beyond chance, by less than {SHIFT_HIGH} of the scores' std"
    elif lead < 0 and beyond:
        verdict = "not high: the model lowers the score for it"
    else:
        verdict = "not high: within what a model indifferent to it gives"
    size = f", {mean / score_std:+.2f} of the held-out scores' std" if score_std > 0 else ""
    return {
        "high": lead > 0 and beyond and large,
        "threshold": round(2 * math.sqrt(changed), 4),
        "reading": f"{added} raised the score of {up} and lowered it for {down} of {n} answers (mean change "
        f"{mean:+.3f}{size}); {verdict} (high when raised − lowered > 2√(raised + lowered) = "
        f"{2 * math.sqrt(changed):.1f} and the mean change ≥ {SHIFT_HIGH} std)",
    }


def read_probes(probes: dict) -> dict:
    """{figure: {high, threshold, reading}} for the length correlation and every counterfactual probe."""
    readings = {"length_correlation": read_length_correlation(probes["length_correlation"], probes["responses"])}
    for name, shift in probes["counterfactual"].items():
        added = ADDED.get(name, f"probe '{name}' (the probe file's modified answer)")
        readings[name] = read_shift(added, shift, probes["score_std"])
    return readings


def normalization_stats(rm, tokenizer, rows: list[dict], max_length: int, score: ScoreMemo | None = None) -> dict:
    texts = [
        render_response(tokenizer, r.get("prompt"), resp, "reference", "response")
        for r in rows
        for resp in _responses(r)
    ]
    if not texts:
        raise ValueError("normalisation needs at least one reference response")
    return stats_of_scores((score or ScoreMemo(rm, tokenizer))(texts, max_length), rm.head_names)


def stats_of_scores(scores, head_names: list[str]) -> dict:
    """{head: {mean, std, n}} of (N, heads) scores: what reward normalisation divides by."""
    return {
        name: {
            "mean": scores[:, h].mean().item(),
            "std": max(scores[:, h].std(unbiased=False).item(), 1e-6),
            "n": scores.shape[0],
        }
        for h, name in enumerate(head_names)
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
        "score_std": round(statistics.pstdev(scores), 6) if scores else 0.0,  # the shifts' yardstick
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
    probes["readings"] = read_probes(probes)
    return probes, normalization


# A reward model that reads the image moves its score when the scene is another one's; one whose score moves by less
# than this share of its spread over responses is reading the text alone (the image-blind reward, docs/reward-models.md;
# the run's monitor image_blind_reward reads the same rule)
IMAGE_BLIND_SHARE = MonitorSettings().image_shift_min


def _pixels(vision: dict) -> dict:
    """The image side of a response's vision inputs (its per-token markers belong to its text)."""
    return {k: v for k, v in vision.items() if k not in PER_TOKEN}


def _same_shapes(a: dict, b: dict) -> bool:
    a, b = _pixels(a), _pixels(b)
    return a.keys() == b.keys() and all(a[k].shape == b[k].shape for k in a)


@torch.no_grad()
def image_probe(rm, examples: list, pad_id: int, micro: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(own, swapped): (N, heads) scores of the held-out responses that show images, with their own record's images
    and with another record's pixels (the next one whose pixel tensors have the same shapes, so the image tokens
    still fit; a record with no such partner is left out of both)."""
    from dataclasses import replace

    shown = [e for e in examples if e.vision is not None]
    pairs = []
    for i, example in enumerate(shown):
        partner = next((o for o in shown[i + 1 :] + shown[:i] if _same_shapes(o.vision, example.vision)), None)
        if partner is not None:
            pairs.append((example, replace(example, vision={**example.vision, **_pixels(partner.vision)})))

    own = preference_scores(rm, [o for o, _ in pairs], pad_id, micro, device)
    return own, preference_scores(rm, [other for _, other in pairs], pad_id, micro, device)


@torch.no_grad()
def preference_scores(rm, examples: list, pad_id: int, micro: int, device) -> torch.Tensor:
    """(N, heads) scores of every response of ``examples`` (pairs: each micro-batch's chosen, then its rejected),
    with each record's images, in evaluation mode."""
    from tether.data.preferences import collate_preferences
    from tether.models.packing import score_inputs

    was_training, out = rm.training, []
    rm.eval()
    try:
        for start in range(0, len(examples), micro):
            batch = {k: v.to(device) for k, v in collate_preferences(examples[start : start + micro], pad_id).items()}
            out.append(rm(**score_inputs(batch)).float().cpu())
    finally:
        rm.train(was_training)
    return torch.cat(out) if out else torch.zeros(0, len(rm.head_names))


def image_reading(own: torch.Tensor, swapped: torch.Tensor) -> dict:
    """The image probe's figures and reading: mean |s(own image) − s(another scene)| against the scores' spread."""
    if own.numel() == 0:
        return {"responses": 0, "mean_abs_shift": 0.0, "shift_over_std": 0.0, "high": False,
                "reading": "no held-out response shows an image: not measured"}  # fmt: skip
    shift = float((own - swapped).abs().mean())
    share = shift / max(float(own.std(unbiased=False)), 1e-12)
    blind = share < IMAGE_BLIND_SHARE
    return {
        "responses": int(own.numel()),
        "mean_abs_shift": round(shift, 6),
        "shift_over_std": round(share, 4),
        "high": blind,
        "reading": (
            f"below {IMAGE_BLIND_SHARE} score std: the score barely depends on the image, an image-blind reward"
            if blind
            else f"at least {IMAGE_BLIND_SHARE} score std: the score depends on the image"
        ),
    }
