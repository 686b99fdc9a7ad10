"""Running the monitors: the registry of every monitor (text and metric monitors in monitors.py, the agent monitors
in agent_monitors.py, the judge's in judge_monitors.py, the audit's in audit_monitors.py), `check_all` over a run's records, and the live hook of the
online trainers (`RunMonitor`: new alarms appended to alarms.jsonl and printed). `tether diagnose RUN_DIR` calls the same `check_all` on the
finished files, so the live and the offline verdicts are the same function of the same records."""

from __future__ import annotations

from tether.diagnostics.agent_monitors import claimed_without_state, tool_call_spam, tool_dominance, turn_piling
from tether.diagnostics.audit_monitors import audit_blocks, audit_divergence, audit_drop, audit_fall, audit_pool
from tether.diagnostics.judge_monitors import judge_injection, judge_position, judge_verbosity
from tether.diagnostics.monitors import (
    Alarm,
    MonitorSettings,
    entropy_collapse,
    format_without_correctness,
    image_blind_reward,
    length_correlation,
    off_policy_drift,
    phrase_surge,
    proxy_up_task_down,
    repetition,
    score_and_kl_rising,
)

METRIC_MONITORS = (
    proxy_up_task_down,
    score_and_kl_rising,
    entropy_collapse,
    format_without_correctness,
    tool_call_spam,
    turn_piling,
    off_policy_drift,
    judge_position,
    judge_injection,
    audit_divergence,
    image_blind_reward,
)
SAMPLE_MONITORS = (
    length_correlation,
    phrase_surge,
    repetition,
    tool_dominance,
    claimed_without_state,
    judge_verbosity,
)  # read only the samples
GENERIC_MONITORS = tuple(
    m
    for m in dict.fromkeys(METRIC_MONITORS + SAMPLE_MONITORS)
    if m not in (audit_divergence, claimed_without_state, proxy_up_task_down)
)  # they read the proxy, KL, lengths, texts, probes: signs of a hack, not a trusted check of the task


def audit_confirmed(metrics: list[dict], samples: list[dict], s: MonitorSettings) -> list[Alarm]:
    """A generic monitor's alarm that the audit confirms: from the first generic alarm's step on, at a step t whose
    last w = audit_confirm_window steps (t − w, t] hold audited responses, their audit mean lies audit_confirm_z
    standard errors below the best block of w steps (1–w, w+1–2w, …) that ends by t − w, the proxy on them not
    fallen (the statistic of audit_divergence, on a window that slides and with a lower bar, because the generic
    alarm already points at the run). Silent without an audit."""
    audited = [m for m in metrics if m.get("audit/n")]
    if not audited:
        return []
    generic = check_all(metrics, samples, s, GENERIC_MONITORS)
    if not generic:
        return []
    first, w = generic[0], s.audit_confirm_window
    for t in sorted({int(m["step"]) for m in audited if int(m["step"]) >= first.step}):
        window = [m for m in audited if t - w < int(m["step"]) <= t]
        earlier = [
            b
            for b in audit_blocks([m for m in audited if int(m["step"]) <= t - w], w)
            if b["last"] <= t - w and b["n"] >= 2
        ]
        if not window or not earlier:
            continue
        now, best = audit_pool(window, t), max(earlier, key=lambda b: b["mean"])
        errors = audit_drop(best, now)
        if errors is not None and errors >= s.audit_confirm_z:
            stats = {**audit_fall(best, now, errors), "confirms": first.monitor, "confirms_step": first.step}
            msg = (
                f"the audit confirms {first.monitor} (step {first.step}): over steps {t - w + 1}–{t} it fell to "
                f"{now['mean']:.3g} from {best['mean']:.3g} (steps to {best['last']}), {errors:.1f} standard errors, "
                f"while the proxy on the same responses went {best['proxy']:.3g} → {now['proxy']:.3g}"
            )
            return [Alarm("audit_confirmed", t, msg, stats)]
    return []


EVERY_STEP_MONITORS = METRIC_MONITORS + (audit_confirmed,)  # their verdicts can change with each step's metrics
MONITORS = EVERY_STEP_MONITORS + SAMPLE_MONITORS
TRUSTED_MONITORS = (proxy_up_task_down, audit_divergence, claimed_without_state, audit_confirmed)


def check_all(
    metrics: list[dict], samples: list[dict], settings: MonitorSettings = MonitorSettings(), monitors=MONITORS
) -> list[Alarm]:
    """The monitors' alarms on the records so far, ordered by step."""
    alarms = [a for monitor in monitors for a in monitor(metrics, samples, settings)]
    return sorted(alarms, key=lambda a: (a.step, a.monitor))


class AlarmWatch:
    """Live use in a trainer: re-run the monitors on the records so far, report only alarms not reported yet."""

    def __init__(self, settings: MonitorSettings = MonitorSettings(), reported: list[dict] | None = None):
        self.settings = settings
        self.reported = {(a["monitor"], a["statistics"].get("subject", "")) for a in (reported or [])}

    def new_alarms(self, metrics: list[dict], samples: list[dict], monitors=MONITORS) -> list[Alarm]:
        fresh = [a for a in check_all(metrics, samples, self.settings, monitors) if a.key not in self.reported]
        self.reported |= {a.key for a in fresh}
        return fresh


def read_jsonl(path) -> list[dict]:
    """Rows of a JSONL file; a last line cut short by a kill is skipped."""
    import json
    from pathlib import Path

    path = Path(path)
    rows = []
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                rows.append(json.loads(line)) if line.strip() else None
            except json.JSONDecodeError:
                continue
    return rows


def format_alarm(alarm: Alarm, width: int = 140) -> str:
    lines = [f"ALARM {alarm.monitor} at step {alarm.step}: {alarm.message}"]
    stats = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in alarm.statistics.items() if k != "subject"}
    lines.append(f"  evidence: {stats}")
    for sample in alarm.samples:
        text = sample["response"].replace("\n", " ")
        lines.append(f"  sample (score {sample['score']:.3f}): {text[:width]}" + ("…" if len(text) > width else ""))
    return "\n".join(lines)


class RunMonitor:
    """The live hook of the online trainers: after a step's metrics and samples are written, re-run the monitors
    on the run's files, append new alarms to alarms.jsonl, print them, and say whether to stop: on any new alarm,
    or with ``stops="trusted"`` on a new alarm of TRUSTED_MONITORS."""

    def __init__(
        self, output, stop_on_alarm: bool = False, settings: MonitorSettings | None = None, stops: str = "any"
    ):
        from pathlib import Path

        settings = settings or MonitorSettings()
        self.output = Path(output)
        self.stop_on_alarm = stop_on_alarm
        self.stopping = {m.__name__ for m in (MONITORS if stops == "any" else TRUSTED_MONITORS)}
        self.watch = AlarmWatch(settings, read_jsonl(self.output / "alarms.jsonl"))  # a resumed run's earlier alarms
        # The files only grow during a run: read each from where the last check stopped.
        self.rows = {"metrics.jsonl": [], "samples.jsonl": []}
        self.offsets = {"metrics.jsonl": 0, "samples.jsonl": 0}

    def _read_new(self, name: str) -> int:
        import json

        path = self.output / name
        if not path.is_file():
            return 0
        with path.open("rb") as handle:
            handle.seek(self.offsets[name])
            data = handle.read()
        complete = data[: data.rfind(b"\n") + 1]  # a line still being written waits for the next check
        self.offsets[name] += len(complete)
        new = [json.loads(line) for line in complete.decode().splitlines() if line.strip()]
        self.rows[name] += new
        return len(new)

    def check(self, last: bool = False) -> bool:
        """``last``: the run's last step, after which no record comes: audit_divergence reads its last block however
        far it got, as a replay of the finished files does; before it, only whole blocks."""
        import json
        from functools import partial

        from tether.console import console

        self._read_new("metrics.jsonl")
        # The sample monitors' verdicts change only when samples arrive; the metric monitors run every step.
        monitors = MONITORS if self._read_new("samples.jsonl") else EVERY_STEP_MONITORS
        if not last:
            whole = partial(audit_divergence, whole_blocks=True)
            monitors = tuple(whole if m is audit_divergence else m for m in monitors)
        fresh = self.watch.new_alarms(self.rows["metrics.jsonl"], self.rows["samples.jsonl"], monitors)
        if fresh:
            with (self.output / "alarms.jsonl").open("a") as handle:
                for alarm in fresh:
                    handle.write(json.dumps(alarm.as_dict()) + "\n")
            for alarm in fresh:
                console.print(format_alarm(alarm), style="bold red")
        return self.stop_on_alarm and any(a.monitor in self.stopping for a in fresh)
