"""The agent/* figures of a step's episodes, from the records episodes.py keeps of each (samples.jsonl's "agent"):
turns, calls, how episodes ended, the environment's own numbers, success and claims (docs/metrics.md)."""

from __future__ import annotations

from collections import Counter


def agent_metrics(records: list[dict]) -> dict:
    """agent/* of one step's episodes (docs/metrics.md)."""
    n = max(len(records), 1)
    calls = Counter()
    for r in records:
        calls.update(r["calls"])
    total_calls = sum(calls.values())
    out = {
        "agent/turns_mean": sum(r["turns"] for r in records) / n,
        "agent/tool_calls_mean": total_calls / n,
        "agent/failed_calls_mean": sum(r["failed_calls"] for r in records) / n,
        "agent/env_tokens_mean": sum(r["env_tokens"] for r in records) / n,
        "agent/done_frac": sum(r["end"] == "done" for r in records) / n,
        "agent/out_of_turns_frac": sum(r["end"] == "turns" for r in records) / n,
        "agent/out_of_tokens_frac": sum(r["end"] == "tokens" for r in records) / n,
        "agent/top_tool_share": max(calls.values()) / total_calls if total_calls else 0.0,
        "agent/unparsed_call_frac": sum(r.get("unparsed_turns", 0) for r in records)
        / max(sum(r["turns"] for r in records), 1),
    }
    info_names = sorted({k for r in records for k in r.get("info", {})})
    for name in info_names:  # the environment's own numbers (StepResult.info), per episode
        out[f"env/{name}"] = sum(r.get("info", {}).get(name, 0.0) for r in records) / n
    for name, count in sorted(calls.items()):
        out[f"agent/calls/{name}"] = count / n
    judged = [r for r in records if r["success"] is not None]
    if judged:
        out["agent/success_rate"] = sum(bool(r["success"]) for r in judged) / len(judged)
    claims = [r for r in records if r["claimed"] is not None]
    if claims:
        out["agent/claimed_rate"] = sum(bool(r["claimed"]) for r in claims) / len(claims)
        both = [r for r in claims if r["success"] is not None]
        if both:
            out["agent/claimed_unverified_rate"] = sum(bool(r["claimed"]) and not r["success"] for r in both) / len(
                both
            )
    return out
