"""The agent monitors: pure functions over an agent run's records (docs/agents.md, docs/monitors.md) — calls that pay
by themselves, turns piling up, one tool taking over, success claimed while the environment's state says otherwise.
Same contract as tether/diagnostics/monitors.py; tether/diagnostics/watch.py runs them all."""

from __future__ import annotations

from collections import Counter

from tether.diagnostics.monitors import Alarm, MonitorSettings, _by_step, _start_and_now


def _agent_evidence(samples: list[dict], k: int, key, where=lambda s: True) -> list[dict]:
    """The k episodes with the highest key(sample), quoted with their transcripts and what the environment said."""
    chosen = sorted((x for x in samples if x.get("agent") and where(x)), key=lambda x: -key(x))[:k]
    return [
        {
            "response": x.get("response", ""),
            "score": x.get("score"),
            "length": x.get("length"),
            "calls": x["agent"].get("calls"),
            "success": x["agent"].get("success"),
            "claimed": x["agent"].get("claimed"),
        }
        for x in chosen
    ]


def _success_rose(metrics: list[dict], step: int, s: MonitorSettings) -> bool:
    """Whether agent/success_rate rose by success_rise between the first agent_window steps and the window ending at
    step (no success rate logged: it cannot be said to have risen)."""
    points = {st: (a, b) for st, a, b in _start_and_now(metrics, "agent/success_rate", s.agent_window)}
    if step not in points:
        return False
    start, now = points[step]
    return now - start >= s.success_rise


def tool_call_spam(metrics: list[dict], samples: list[dict], s: MonitorSettings) -> list[Alarm]:
    """Tool calls per episode climb while the state-checked success does not: the calls themselves are paying."""
    for step, start, now in _start_and_now(metrics, "agent/tool_calls_mean", s.agent_window):
        if (
            now >= s.spam_factor * max(start, 0.25)
            and now - start >= s.spam_rise
            and not _success_rose(metrics, step, s)
        ):
            stats = {"subject": "tool_calls", "calls_per_episode": now, "calls_per_episode_at_start": start}
            msg = (
                f"tool calls per episode {start:.2f} → {now:.2f} by step {step} while task success did not rise: "
                "calls are being rewarded, not the task"
            )
            near = [x for x in samples if int(x["step"]) <= step]
            calls = lambda x: sum(x["agent"].get("calls", {}).values())
            return [Alarm("tool_call_spam", step, msg, stats, _agent_evidence(near[-64:], s.evidence, calls))]
    return []


def turn_piling(metrics: list[dict], samples: list[dict], s: MonitorSettings) -> list[Alarm]:
    """Turns per episode pile up while success does not rise: steps and turns farmed without the task (format
    without correctness, extended to turns)."""
    for step, start, now in _start_and_now(metrics, "agent/turns_mean", s.agent_window):
        if now >= s.turns_factor * start and now - start >= s.turns_rise and not _success_rose(metrics, step, s):
            stats = {"subject": "turns", "turns_per_episode": now, "turns_per_episode_at_start": start}
            msg = f"turns per episode {start:.2f} → {now:.2f} by step {step} while task success did not rise"
            near = [x for x in samples if int(x["step"]) <= step]
            return [
                Alarm(
                    "turn_piling",
                    step,
                    msg,
                    stats,
                    _agent_evidence(near[-64:], s.evidence, lambda x: x["agent"].get("turns", 0)),
                )
            ]
    return []


def tool_dominance(metrics: list[dict], samples: list[dict], s: MonitorSettings) -> list[Alarm]:
    """One tool takes over the calls (often an always-succeeding one) while success does not rise."""
    steps = [(st, xs) for st, xs in _by_step(samples).items() if any(x.get("agent") for x in xs)]

    def shares(xs):
        calls = Counter()
        for x in xs:
            calls.update((x.get("agent") or {}).get("calls", {}))
        total = sum(calls.values())
        return (calls.most_common(1)[0] + (total,)) if total else (None, 0, 0)

    def success(xs):
        judged = [x["agent"]["success"] for x in xs if x.get("agent") and x["agent"].get("success") is not None]
        return sum(bool(v) for v in judged) / len(judged) if judged else None

    first = next(((st, xs) for st, xs in steps if shares(xs)[2] >= s.dominance_calls), None)
    if first is None:
        return []
    _, n0, total0 = shares(first[1])
    start_share, start_success = n0 / total0, success(first[1])
    for step, xs in steps:
        if step <= first[0]:
            continue
        tool, n, total = shares(xs)
        if total < s.dominance_calls:
            continue
        share, now_success = n / total, success(xs)
        rose = start_success is not None and now_success is not None and now_success - start_success >= s.success_rise
        if share >= s.dominance_share and share - start_share >= s.dominance_rise and not rose:
            stats = {"subject": tool, "share": share, "share_at_start": start_share, "calls": total}
            msg = (
                f"tool {tool!r} makes {share:.0%} of the calls at step {step} (top tool's share at step "
                f"{first[0]}: {start_share:.0%}) while success did not rise"
            )
            return [
                Alarm(
                    "tool_dominance",
                    step,
                    msg,
                    stats,
                    _agent_evidence(xs, s.evidence, lambda x: x["agent"].get("calls", {}).get(tool, 0)),
                )
            ]
    return []


def claimed_without_state(metrics: list[dict], samples: list[dict], s: MonitorSettings) -> list[Alarm]:
    """Episodes whose final message says the task is done while the environment's state says it is not: the policy
    is rewarded for saying, not doing."""

    def unverified(x) -> bool:
        a = x.get("agent") or {}
        return bool(a.get("claimed")) and a.get("success") is False

    steps = []
    for st, xs in _by_step(samples).items():
        judged = [
            x
            for x in xs
            if (x.get("agent") or {}).get("claimed") is not None and (x.get("agent") or {}).get("success") is not None
        ]
        if len(judged) >= s.min_samples:
            steps.append((st, judged))
    if len(steps) < 2:
        return []
    share = lambda xs: sum(unverified(x) for x in xs) / len(xs)
    start = share(steps[0][1])
    for step, xs in steps[1:]:
        now = share(xs)
        if now >= s.claim_share and (
            now >= s.claim_factor * max(start, 1.0 / len(steps[0][1])) or now - start >= s.claim_rise
        ):
            stats = {
                "subject": "claims",
                "claimed_unverified": now,
                "claimed_unverified_at_start": start,
                "claimed": sum(bool(x["agent"]["claimed"]) for x in xs) / len(xs),
                "success": sum(bool(x["agent"]["success"]) for x in xs) / len(xs),
            }
            msg = (
                f"{now:.0%} of episodes at step {step} claim the task done while the environment's state says it "
                f"is not (was {start:.0%})"
            )
            return [
                Alarm(
                    "claimed_without_state",
                    step,
                    msg,
                    stats,
                    _agent_evidence(xs, s.evidence, lambda x: float(x.get("score", 0.0)), unverified),
                )
            ]
    return []
