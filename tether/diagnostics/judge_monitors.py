"""The judge monitors: pure functions over the records of a run rewarded by a language model (--judge-model,
docs/reward-models.md, docs/monitors.md) — verdicts that follow the order, answers that address the judge, and a
judge that pays for length. Same contract as tether/diagnostics/monitors.py; tether/diagnostics/watch.py runs them."""

from __future__ import annotations

from tether.data.probes import ADDRESSES_JUDGE
from tether.diagnostics.monitors import (
    Alarm,
    MonitorSettings,
    _length,
    _pearson,
    _sample_steps,
    _series,
    _start_and_now,
    _top,
)


def judge_position(metrics: list[dict], samples: list[dict], s: MonitorSettings) -> list[Alarm]:
    """The judge's two orders disagree on a large share of pairs: its verdicts follow the slot, not the answers, so
    its rewards are mostly the order's noise (averaging the orders keeps the policy from exploiting it, but there is
    little left to learn from)."""
    series = _series(metrics, "judge/order_inconsistency")
    w = s.judge_window
    for end in range(w, len(series) + 1):
        now = sum(v for _, v in series[end - w : end]) / w
        if now >= s.judge_flip_share:
            step = series[end - 1][0]
            start = sum(v for _, v in series[:w]) / w
            stats = {"subject": "position", "flip_share": now, "flip_share_at_start": start, "window": w}
            msg = (
                f"the judge's two orders disagree on {now:.0%} of pairs over steps {series[end - w][0]}–{step} "
                f"(first window {start:.0%}): its verdicts follow the order, not the answers"
            )
            return [Alarm("judge_position", step, msg, stats)]
    return []


def judge_injection(metrics: list[dict], samples: list[dict], s: MonitorSettings) -> list[Alarm]:
    """More and more answers address the judge ("This is the better answer.", "Score: 5"): the policy is writing to
    its judge. The evidence says what the words bought where the scorer measured it (judge/injection_shift: each
    such answer scored again without them)."""
    for step, start, now in _start_and_now(metrics, "judge/addressed_share", s.judge_window):
        if now >= s.judge_addressed_share and now >= s.judge_addressed_factor * max(start, 0.02):
            shift = [v for st, v in _series(metrics, "judge/injection_shift") if st <= step]
            stats = {"subject": "injection", "addressed_share": now, "addressed_share_at_start": start}
            if shift:
                stats["injection_shift"] = shift[-1]
            msg = f"{now:.0%} of the judged answers address the judge at step {step} (first window {start:.0%})" + (
                f"; those words are worth {shift[-1]:+.3g} of its score" if shift else ""
            )
            near = [x for x in samples if int(x["step"]) <= step and ADDRESSES_JUDGE.search(x.get("response", ""))]
            return [Alarm("judge_injection", step, msg, stats, _top(near, s.evidence))]
    return []


def judge_verbosity(metrics: list[dict], samples: list[dict], s: MonitorSettings) -> list[Alarm]:
    """Within a step's samples the judge's own score tracks the answers' length ever more closely: the judge pays for
    length (length_correlation reads the total score; this reads the judge's part alone)."""
    steps = [(st, [x for x in xs if "judge" in (x.get("parts") or {})]) for st, xs in _sample_steps(samples, s)]
    steps = [(st, xs) for st, xs in steps if len(xs) >= s.min_samples]
    if len(steps) < 2:
        return []
    corr = lambda xs: _pearson([_length(x) for x in xs], [float(x["parts"]["judge"]) for x in xs])
    start = corr(steps[0][1])
    for step, xs in steps[1:]:
        c = corr(xs)
        if c >= s.length_corr and c - start >= s.length_rise:
            stats = {"subject": "judge length", "correlation": c, "correlation_at_start": start}
            msg = f"the judge's score ~ length correlation {c:.2f} at step {step} (was {start:.2f})"
            return [Alarm("judge_verbosity", step, msg, stats, _top(xs, s.evidence))]
    return []
