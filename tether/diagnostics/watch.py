"""Running the monitors: the registry of every monitor (text and metric monitors in monitors.py, the agent monitors
in agent_monitors.py, the judge's in judge_monitors.py), `check_all` over a run's records, and the live hook of the
online trainers (`RunMonitor`: new alarms appended to alarms.jsonl and printed). `tether diagnose RUN_DIR` calls the same `check_all` on the
finished files, so the live and the offline verdicts are the same function of the same records."""

from __future__ import annotations

from tether.diagnostics.agent_monitors import claimed_without_state, tool_call_spam, tool_dominance, turn_piling
from tether.diagnostics.judge_monitors import judge_injection, judge_position, judge_verbosity
from tether.diagnostics.monitors import (
    Alarm,
    MonitorSettings,
    audit_divergence,
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
    off_policy_drift,
    phrase_surge,
    repetition,
    tool_dominance,
    claimed_without_state,
    judge_verbosity,
)  # read only the samples
MONITORS = METRIC_MONITORS + SAMPLE_MONITORS


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
    on the run's files, append new alarms to alarms.jsonl, print them, and say whether to stop."""

    def __init__(self, output, stop_on_alarm: bool = False, settings: MonitorSettings | None = None):
        from pathlib import Path

        settings = settings or MonitorSettings()
        self.output = Path(output)
        self.stop_on_alarm = stop_on_alarm
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

    def check(self) -> bool:
        import json

        from tether.console import console

        self._read_new("metrics.jsonl")
        # The sample monitors' verdicts change only when samples arrive; the metric monitors run every step.
        monitors = MONITORS if self._read_new("samples.jsonl") else METRIC_MONITORS
        fresh = self.watch.new_alarms(self.rows["metrics.jsonl"], self.rows["samples.jsonl"], monitors)
        if fresh:
            with (self.output / "alarms.jsonl").open("a") as handle:
                for alarm in fresh:
                    handle.write(json.dumps(alarm.as_dict()) + "\n")
            for alarm in fresh:
                console.print(format_alarm(alarm), style="bold red")
        return bool(fresh) and self.stop_on_alarm
