"""The audit's monitor: pure functions over the figures of a run's trusted check (--audit: a share of the training
responses scored by a check the policy never trains on; docs/monitors.md) — its pooled blocks, the fall between
them in standard errors, and `audit_divergence`. Same contract as tether/diagnostics/monitors.py;
tether/diagnostics/watch.py runs it and reads the pools for `audit_confirmed`."""

from __future__ import annotations

import math

from tether.diagnostics.monitors import Alarm, MonitorSettings


def audit_pool(rows: list[dict], last: int) -> dict:
    """Steps' audit figures pooled (rows with audit/n > 0): responses n, the audit's mean and population variance,
    the proxy's mean on the same responses; ``last``: the pool's last step, carried for messages."""
    n = sum(r["audit/n"] for r in rows)
    mean = sum(r["audit/n"] * r["audit/score_mean"] for r in rows) / n
    second = sum(r["audit/n"] * (r["audit/score_std"] ** 2 + r["audit/score_mean"] ** 2) for r in rows) / n
    proxy = sum(r["audit/n"] * r["audit/proxy_mean"] for r in rows) / n
    return {"last": last, "n": n, "mean": mean, "var": max(second - mean * mean, 0.0), "proxy": proxy}


def audit_blocks(metrics: list[dict], w: int) -> list[dict]:
    """The audit's figures pooled over consecutive blocks of w steps (1–w, w+1–2w, …), blocks with no audited
    response left out."""
    blocks: dict[int, list[dict]] = {}
    for m in metrics:
        if m.get("audit/n"):
            blocks.setdefault((int(m["step"]) - 1) // w, []).append(m)
    return [audit_pool(rows, (k + 1) * w) for k, rows in sorted(blocks.items())]


def audit_drop(best: dict, now: dict) -> float | None:
    """How many standard errors of the difference the pool ``now`` lies below ``best``, √(s²_best/n_best +
    s²_now/n_now); None when either has fewer than 2 responses or the audit did not fall (or the proxy fell: then
    the policy is not winning the proxy at the check's expense)."""
    if best["n"] < 2 or now["n"] < 2:
        return None
    drop = best["mean"] - now["mean"]
    if drop <= 0 or now["proxy"] < best["proxy"]:
        return None
    se = math.sqrt(best["var"] / best["n"] + now["var"] / now["n"])
    return drop / se if se else math.inf


def audit_fall(best: dict, now: dict, errors: float) -> dict:
    """An audit alarm's statistics: the pools' means, the fall in standard errors, the proxy's means, responses."""
    return {
        "subject": "audit",
        "audit_mean": now["mean"],
        "audit_mean_at_best": best["mean"],
        "standard_errors": errors,
        "proxy_mean": now["proxy"],
        "proxy_mean_at_best": best["proxy"],
        "responses": now["n"],
    }


def audit_divergence(
    metrics: list[dict], samples: list[dict], s: MonitorSettings, whole_blocks: bool = False
) -> list[Alarm]:
    """The trusted check falls while the proxy on the same responses does not: over blocks of audit_window steps, a
    block's audited mean is audit_z standard errors of the difference below the best block before it, and its proxy
    mean is at least that block's; a block of fewer than 2 audited responses has no standard error and is never
    the best. ``whole_blocks``: only blocks whose last step is logged (the live check during a run, which would
    otherwise test the block it is in after each of its steps; its last step's check and a replay of the finished
    files read the last block however far it got)."""
    latest = max((int(m["step"]) for m in metrics), default=0)
    blocks = [b for b in audit_blocks(metrics, s.audit_window) if not whole_blocks or b["last"] <= latest]
    for j, now in enumerate(blocks):
        earlier = [b for b in blocks[:j] if b["n"] >= 2]
        if not earlier:
            continue
        best = max(earlier, key=lambda b: b["mean"])
        errors = audit_drop(best, now)
        if errors is not None and errors >= s.audit_z:
            stats = audit_fall(best, now, errors)
            msg = (
                f"the audit fell from {best['mean']:.3g} (steps to {best['last']}) to {now['mean']:.3g} (steps to "
                f"{now['last']}), {stats['standard_errors']:.1f} standard errors, while the proxy on the same "
                f"responses went {best['proxy']:.3g} → {now['proxy']:.3g}"
            )
            step = max(int(m["step"]) for m in metrics if m.get("audit/n") and int(m["step"]) <= now["last"])
            return [Alarm("audit_divergence", step, msg, stats)]
    return []
