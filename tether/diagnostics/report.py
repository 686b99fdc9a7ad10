"""`tether report RUN_DIR [RUN_DIR …]`: one self-contained HTML page for one run or a comparison of several.

Plots are PNGs drawn with matplotlib and embedded as data URIs; the page has no script and loads nothing from
the network. For each run: every logged metric against the step (alarms marked), in the order a reader needs them
(READING_ORDER: score, gold or task metrics, KL, length and entropy, the rest, the alarm counters; a metric that
never changed is one line, not a plot), with its one-line meaning from the metrics glossary (docs/metrics.md); the
alarms with their evidence, the best- and worst-scored samples of the last sample step, and the resolved config.
For several runs: every shared metric on one axis per metric, and — for runs with a gold reward — gold and proxy
score against √KL(π‖π_ref) (Gao et al. 2022), one line per run.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import re
from pathlib import Path

from tether.diagnostics.watch import read_jsonl

# docs/metrics.md, shipped inside the package: tether/glossary.md is a link to it in the repository, and the wheel
# holds a copy (setuptools copies the file a link points to), so an installed tether captions its plots too.
GLOSSARY_PATH = Path(__file__).resolve().parent.parent / "glossary.md"
PREFIXES = ("train/", "eval0/", "eval/")


def load_glossary(path: Path = GLOSSARY_PATH) -> list[tuple[re.Pattern, str, str, str | None]]:
    """(pattern, meaning, healthy, stage) for every key in the first column of docs/metrics.md's tables; stage is
    the `tether <stage>` a section's heading names (None for a section that names none). `<name>` in a key matches
    one path segment; several keys in one cell share the row."""
    if not path.is_file():
        return []
    rows = []
    stage = None
    for line in path.read_text().splitlines():
        if line.startswith("## "):
            named = re.search(r"`tether (\w+)", line)
            stage = named.group(1) if named else None
            continue
        cells = [c.strip() for c in _cells(line)]
        if len(cells) < 2 or not cells[0].startswith("`"):
            continue
        meaning, healthy = cells[1], cells[2] if len(cells) > 2 else ""
        keys = re.findall(r"`([^`]+)`", cells[0])
        for key in keys:
            key = re.sub(r"\s*\(.*\)$", "", key)
            if key.startswith("/") and "/" in keys[0]:  # `advantage/mean`, `/std`: the same stem
                key = keys[0].rsplit("/", 1)[0] + key
            pattern = (
                re.escape(key)
                .replace(re.escape("<name>"), "[^/]+")
                .replace(re.escape("<key>"), ".+")
                .replace(re.escape("<unit>"), "[^/]+")
                .replace(re.escape("…"), ".*")
            )
            rows.append((re.compile(f"^{pattern}$"), meaning, healthy, stage))
    return rows


def _cells(line: str) -> list[str]:
    """A markdown table row's cells; an escaped '\\|' or a '|' inside `code` does not split."""
    cells, current, in_code = [], "", False
    for ch in line.strip().strip("|"):
        if ch == "`":
            in_code = not in_code
        if ch == "|" and current.endswith("\\"):  # an escaped pipe
            current = current[:-1] + ch
        elif ch == "|" and not in_code:
            cells.append(current)
            current = ""
        else:
            current += ch
    return cells + [current]


def explain(metric: str, glossary, stage: str | None = None) -> tuple[str, str]:
    """(meaning, healthy) of a metric: the definition in the run's own stage's section first (a DPO run's
    `train/loss` is the DPO loss, not SFT's), then any section's."""
    candidates = [metric] + [metric[len(p) :] for p in PREFIXES if metric.startswith(p)]
    for own_section in (True, False):
        for name in candidates:
            for pattern, meaning, healthy, section in glossary:
                if (section == stage or not own_section) and pattern.match(name):
                    return meaning, healthy
    return "", ""


def run_stage(config: dict, summary: dict) -> str | None:
    """The stage a run folder holds, from summary.json, or from its config.yaml's sections while it runs."""
    if summary.get("stage"):
        return str(summary["stage"]).split()[0]
    sections = set(config)
    for stage, marker in (("dpo", "dpo"), ("ppo", "critic"), ("grpo", "algo"), ("rm", "rm")):
        if marker in sections:
            return stage
    return "sft" if "data" in sections else None


def loss_kind(stage: str | None, config: dict) -> str:
    """What a run's `loss` measures: the stage, and for DPO-family runs the loss (sigmoid and kto are not on one
    scale)."""
    if stage == "dpo":
        return f"dpo {config.get('dpo', {}).get('loss', 'sigmoid')}"
    return stage or "?"


def _plain(text: str) -> str:
    """Markdown cell → text (code ticks and emphasis dropped)."""
    return re.sub(r"[`*]", "", text)


class Run:
    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        if not (self.folder / "metrics.jsonl").is_file():
            raise FileNotFoundError(f"{self.folder}: no metrics.jsonl (is it a tether run folder?)")
        self.metrics = read_jsonl(self.folder / "metrics.jsonl")
        self.samples = read_jsonl(self.folder / "samples.jsonl")
        self.alarms = read_jsonl(self.folder / "alarms.jsonl")
        self.config_text = (self.folder / "config.yaml").read_text() if (self.folder / "config.yaml").is_file() else ""
        self.summary = (
            json.loads((self.folder / "summary.json").read_text()) if (self.folder / "summary.json").is_file() else {}
        )
        self.name = self.label()
        try:
            import yaml

            config = yaml.safe_load(self.config_text) if self.config_text else {}
        except yaml.YAMLError:
            config = {}
        config = config if isinstance(config, dict) else {}
        self.stage = run_stage(config, self.summary)
        self.loss_kind = loss_kind(self.stage, config)

    def label(self) -> str:
        parts = [p for p in self.folder.parts[-3:] if p not in ("run",)]
        return "/".join(parts[-2:])

    def series(self) -> dict[str, list[tuple[int, float]]]:
        """metric → [(step, value)], eval0/<k> folded into eval/<k> at step 0."""
        out: dict[str, list[tuple[int, float]]] = {}
        for row in self.metrics:
            for key, value in row.items():
                if key == "step" or isinstance(value, bool) or not isinstance(value, (int, float)):
                    continue
                if not math.isfinite(float(value)):
                    continue
                name, step = (
                    (key.replace("eval0/", "eval/", 1), 0) if key.startswith("eval0/") else (key, int(row["step"]))
                )
                out.setdefault(name, []).append((step, float(value)))
        return {k: sorted(v) for k, v in sorted(out.items())}


def _png(fig) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=80, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def _plot(
    title: str,
    lines: list[tuple[str, list[tuple[float, float]]]],
    alarms: list[tuple[str, int]],
    xlabel="step",
    size=(3.6, 2.3),
) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=size)
    for label, points in lines:
        xs, ys = [p[0] for p in points], [p[1] for p in points]
        ax.plot(xs, ys, marker="o" if len(xs) < 15 else None, markersize=3, linewidth=1.2, label=label)
    for i, (monitor, step) in enumerate(alarms):
        ax.axvline(step, color="#c0392b", linestyle="--", linewidth=1, label="alarm" if i == 0 else None)
    ax.set_title(title, fontsize=8)
    ax.set_xlabel(xlabel, fontsize=7)
    ax.tick_params(labelsize=6)
    ax.grid(alpha=0.3)
    if len(lines) > 1 or alarms:
        ax.legend(fontsize=6)
    return _png(fig)


def overoptimisation_plot(runs: list[Run]) -> str | None:
    """Gold and proxy (held-out evaluations) against √KL at the evaluation steps, one line per run."""
    gold_lines, proxy_lines = [], []
    for run in runs:
        series = run.series()
        gold, proxy, kl = (dict(series.get(k, [])) for k in ("eval/gold_reward", "eval/score_mean", "kl/ref_mean"))
        if not gold or not kl:
            continue
        points = []
        for step in sorted(gold):
            kl_at = 0.0 if step == 0 else kl.get(step)
            if kl_at is not None:
                points.append((math.sqrt(max(kl_at, 0.0)), step))
        gold_lines.append((run.name, [(x, gold[s]) for x, s in points]))
        if proxy:
            proxy_lines.append((run.name, [(x, proxy[s]) for x, s in points if s in proxy]))
    if not gold_lines:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(8, 3))
    for ax, lines, title in (
        (axes[0], gold_lines, "gold reward"),
        (axes[1], proxy_lines, "proxy (reward-model) score"),
    ):
        for label, points in lines:
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", markersize=3, label=label)
        ax.set_xlabel("√KL(π‖π_ref), nats^½ (policy's KL to the reference at that step)", fontsize=7)
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    return _png(fig)


CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:24px;color:#222;max-width:1500px}
h1{font-size:22px} h2{font-size:18px;border-bottom:1px solid #ddd;padding-bottom:4px;margin-top:32px}
.grid{display:flex;flex-wrap:wrap;gap:12px}
.card{border:1px solid #e3e3e3;border-radius:6px;padding:8px;width:300px;font-size:12px}
.card img{width:100%} .meaning{color:#333} .healthy{color:#2d7a46}
.alarm{border-left:4px solid #c0392b;background:#fdf2f1;padding:8px 12px;margin:8px 0;font-size:13px}
table{border-collapse:collapse;font-size:12px} td,th{border:1px solid #ddd;padding:4px 6px;vertical-align:top}
pre{background:#f6f6f6;padding:10px;font-size:11px;overflow:auto;max-height:400px}
.wide img{max-width:100%}
.thumb{width:64px;height:64px;image-rendering:pixelated;margin-right:2px}
.flat{font-size:12px;color:#555}
"""


def _esc(x) -> str:
    return html.escape(str(x))


def _alarm_html(alarm: dict) -> str:
    stats = ", ".join(
        f"{k} = {round(v, 4) if isinstance(v, float) else v}" for k, v in alarm["statistics"].items() if k != "subject"
    )
    samples = "".join(f"<li>score {s['score']:.3f}: {_esc(s['response'][:300])}</li>" for s in alarm.get("samples", []))
    return (
        f"<div class='alarm'><b>{_esc(alarm['monitor'])}</b> at step {alarm['step']}: {_esc(alarm['message'])}"
        f"<br><small>{_esc(stats)}</small><ul>{samples}</ul></div>"
    )


def _samples_html(run: Run, k: int = 5) -> str:
    if not run.samples:
        return "<p>No samples.jsonl.</p>"
    last = max(int(s["step"]) for s in run.samples)
    rows = sorted((s for s in run.samples if int(s["step"]) == last), key=lambda s: -float(s.get("score", 0)))
    shown = rows[:k] + (rows[-k:] if len(rows) > 2 * k else rows[k:])
    pictures = any(s.get("images") for s in shown)  # a vision-language policy's: each prompt's images beside it
    body = "".join(
        f"<tr><td>{float(s.get('score', 0)):.3f}</td><td>{_esc(s.get('length', ''))}</td>"
        + (f"<td>{_thumbnails(s.get('images') or [])}</td>" if pictures else "")
        + f"<td>{_esc(str(s.get('prompt', ''))[-120:])}</td><td>{_esc(s.get('response', ''))}</td></tr>"
        for s in shown
    )
    return (
        f"<p>Step {last}: the {min(k, len(rows))} highest- and lowest-scored of {len(rows)} responses.</p>"
        "<table><tr><th>score</th><th>length</th>"
        + ("<th>image</th>" if pictures else "")
        + f"<th>prompt (end)</th><th>response</th></tr>{body}</table>"
    )


def _thumbnails(refs: list[str]) -> str:
    """Each image of a sample as an inline thumbnail (the report stays one file): a path is read and shrunk, a
    thumbnail ``data:`` URI shown as it is; a path that is gone is named instead."""
    from tether.data.images import thumbnail_uri

    out = []
    for ref in refs:
        if ref.startswith("data:image/"):
            out.append(f"<img class='thumb' src='{_esc(ref)}'>")
        elif Path(ref).is_file():
            from PIL import Image

            with Image.open(ref) as image:
                out.append(f"<img class='thumb' src='{thumbnail_uri(image.convert('RGB'))}' title='{_esc(ref)}'>")
        else:
            out.append(f"<small>(image not found: {_esc(ref)})</small>")
    return "".join(out)


# The report's reading order: what training is for (the score or reward), the gold or task figure it stands in for,
# how far the policy moved from its reference (KL), then lengths and entropy, the optimisation and the rest, and last
# the alarm counters (failed reward calls, "no opinion" answers, the over-fitting alarm), which read 0 when all is
# well. Each group lists its patterns in reading order; a key is placed by the first pattern (in this order) that
# matches it with its train/ or eval/ prefix set aside, so a held-out figure sits beside its training one. An eval/ key
# no pattern names is a task metric (the lab's gold figures); any other joins "Other". A group no key joins is not
# drawn (a DAPO run, β = 0, has no KL group).
READING_ORDER = (  # (title, its patterns in reading order, separated by spaces)
    (
        "Score and reward",
        "score/mean score_mean score/std reward/[^/]+/mean reward/[^/]+ reward/[^/]+/std rewards/accuracy "
        "rewards/margins rewards/.+ kto/reward",  # reward/[^/]+: eval/reward/<name>, beside reward/<name>/mean
    ),
    (
        "Gold and task metrics",
        "gold_reward gold_win_rate gold.* (agent/)?success_rate.* accuracy.* best_accuracy step_accuracy "
        "first_wrong_step_accuracy auroc (agent/)?claimed.* margin (chosen|rejected)_.+",
    ),
    ("KL to the reference", "kl/ref_mean kl/.+ kto/reference_point policy/approx_kl beta"),
    (
        "Length and entropy",
        "rollout/length_mean length_mean rollout/terminated_length_mean rollout/truncated_frac mean_words "
        "(policy/)?entropy",
    ),
    (
        "Loss and optimisation",
        "loss policy/loss value/loss ppl (policy/|value/)?grad_norm lr advantage/.+ return/.+ value/.+ policy/.+ "
        "groups/.+ sampling/.+ (logps|nll)/.+ epoch",
    ),
    ("Agents and environments", "agent/.+ env/.+"),
    ("Sampler (vLLM, --sampling-dtype) and the off-policy correction", "rollout/sampler_.+ rollout/is_.+"),
    ("Time and work", "time/.+ perf/.+ tokens pairs steps forwards/.+ positions/.+"),
    ("Other", ""),
    ("Alarm counters", "reward/[^/]+/errors reward/[^/]+/none overfit_alarm agent/unparsed_call_frac"),
)
_TASK, _OTHER = 1, len(READING_ORDER) - 2
_PATTERNS = [[re.compile(p) for p in patterns.split()] for _, patterns in READING_ORDER]
_SEARCH = sorted(  # alarm counters first: reward/<name>/errors is not a reward component
    range(len(READING_ORDER)), key=lambda g: (READING_ORDER[g][0] != "Alarm counters", g)
)


def reading_place(key: str) -> tuple[int, int, str, int]:
    """Where a metric goes in the report: (group, pattern in the group, the key without its train/ or eval/ prefix,
    0 for a training figure and 1 for a held-out one); sorting by it is READING_ORDER."""
    prefix = next((p for p in ("train/", "eval/") if key.startswith(p)), "")
    stem = key[len(prefix) :]
    for group in _SEARCH:
        for i, pattern in enumerate(_PATTERNS[group]):
            if pattern.fullmatch(stem):
                return group, i, stem, int(prefix == "eval/")
    return (_TASK if prefix == "eval/" else _OTHER), len(_PATTERNS[_TASK]), stem, int(prefix == "eval/")


def metric_groups(keys) -> list[tuple[str, list[str]]]:
    """[(group title, its metric names in reading order)] in READING_ORDER, groups with no metric left out."""
    groups: dict[int, list[str]] = {}
    for key in sorted(keys, key=reading_place):
        groups.setdefault(reading_place(key)[0], []).append(key)
    return [(READING_ORDER[g][0], names) for g, names in sorted(groups.items())]


def flat_value(points: list[tuple[int, float]]) -> float | None:
    """The value of a metric that never changed over the run (every logged value equal), else None."""
    values = {v for _, v in points}
    return values.pop() if len(values) == 1 else None


def _number(value: float) -> str:
    return f"{value:.4g}"


def _flat_line(items: list[tuple[str, str, str]]) -> str:
    """The group's unchanged metrics as one line: (key, value text, meaning) each, the meaning on hover."""
    if not items:
        return ""
    shown = " · ".join(f"<span title='{_esc(_plain(m))}'>{_esc(k)} {_esc(v)}</span>" for k, v, m in items)
    return f"<p class='flat'>unchanged over the run: {shown}</p>"


def _group_html(title: str, cards: list[str], flat: list[tuple[str, str, str]]) -> str:
    grid = f"<div class='grid'>{''.join(cards)}</div>" if cards else ""
    return f"<h4>{_esc(title)}</h4>{grid}{_flat_line(flat)}"


def _run_metrics_html(run: "Run", glossary) -> str:
    """One run's metrics by READING_ORDER: a panel for each that moved, one line for those that never did."""
    series, marks = run.series(), [(a["monitor"], int(a["step"])) for a in run.alarms]
    parts = []
    for title, names in metric_groups(series):
        cards, flat = [], []
        for key in names:
            meaning, healthy = explain(key, glossary, run.stage)
            value = flat_value(series[key])
            if value is None:
                cards.append(_card(key, _plot(key, [(run.name, series[key])], marks), meaning, healthy))
            else:
                flat.append((key, _number(value), meaning))
        parts.append(_group_html(title, cards, flat))
    return "".join(parts)


def _comparison_html(runs: list["Run"], glossary) -> str:
    """Every metric the runs share, by READING_ORDER: on one axis per metric (per kind of loss), or — when it never
    changed in any run — in the group's one line with each run's value."""
    all_series = [r.series() for r in runs]
    shared = set.intersection(*(set(s) for s in all_series))
    if not shared:
        return "<p>These runs log no metric in common.</p>"
    parts = []
    for title, names in metric_groups(shared):
        cards, flat = [], []
        for key in names:
            values = [flat_value(s[key]) for s in all_series]
            if all(v is not None for v in values):
                text = (
                    _number(values[0])
                    if len(set(values)) == 1
                    else ", ".join(f"{r.name} {_number(v)}" for r, v in zip(runs, values))
                )
                flat.append((key, text, explain(key, glossary, runs[0].stage)[0]))
                continue
            for kind, members in _axes(key, runs):  # losses of different kinds never share an axis
                title_k = key if kind is None else f"{key} ({kind})"
                meaning, healthy = explain(key, glossary, members[0].stage)
                lines = [(r.name, s[key]) for r, s in zip(runs, all_series) if r in members]
                cards.append(_card(title_k, _plot(title_k, lines, []), meaning, healthy))
        parts.append(_group_html(title, cards, flat))
    return "".join(parts)


def render_report(folders: list[str | Path], glossary_path: Path = GLOSSARY_PATH) -> str:
    runs = [Run(f) for f in folders]
    glossary = load_glossary(glossary_path)
    parts = [
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>tether report</title><style>{CSS}</style>"
        "</head><body>",
        f"<h1>tether report: {_esc(', '.join(r.name for r in runs))}</h1>",
    ]
    parts.append(
        "<p>Every curve is a metric from the run's metrics.jsonl against the optimizer step; dashed red "
        "lines mark reward-hacking alarms. Under each plot: what the metric means and what healthy looks "
        "like (docs/metrics.md).</p>"
    )
    picture = overoptimisation_plot(runs)
    if picture:
        parts.append(
            "<h2>Over-optimisation: gold and proxy against √KL</h2><div class='wide'>"
            f"<img alt='gold and proxy against sqrt KL' src='{picture}'></div><p>Gao et al. (2022): as the "
            "policy moves away from the reference, the proxy score keeps rising while the gold reward rises "
            "then falls. A larger KL coefficient keeps the policy at smaller √KL.</p>"
        )
    if len(runs) > 1:
        parts.append("<h2>Comparison</h2>" + _comparison_html(runs, glossary))
    for run in runs:
        parts.append(f"<h2>{_esc(run.name)}</h2>")
        headline = {k: v for k, v in run.summary.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if headline:
            parts.append(
                "<p>"
                + " · ".join(
                    f"{_esc(k)} {v:.4g}" if isinstance(v, float) else f"{_esc(k)} {v}" for k, v in headline.items()
                )
                + "</p>"
            )
        parts.append(
            f"<h3>Alarms ({len(run.alarms)})</h3>"
            + ("".join(_alarm_html(a) for a in run.alarms) or "<p>None raised.</p>")
        )
        parts.append("<h3>Metrics</h3>" + _run_metrics_html(run, glossary))
        parts.append("<h3>Samples</h3>" + _samples_html(run))
        parts.append(f"<h3>Resolved config</h3><pre>{_esc(run.config_text or '(no config.yaml)')}</pre>")
    parts.append("</body></html>")
    return "".join(parts)


def render_groups(
    title: str, intro: str, groups: dict[str, tuple[list[Path], tuple]], glossary_path: Path = GLOSSARY_PATH
) -> str:
    """A page of several families of runs (the lab): per family, the over-optimisation picture where there is
    gold, the chosen metrics of every run on shared axes, and every alarm with its evidence."""
    glossary = load_glossary(glossary_path)
    parts = [
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{_esc(title)}</title><style>{CSS}</style>"
        f"</head><body><h1>{_esc(title)}</h1>{intro}"
    ]
    for name, (folders, keys) in groups.items():
        runs = [Run(f) for f in folders if (Path(f) / "metrics.jsonl").is_file()]
        if not runs:
            continue
        parts.append(f"<h2>{_esc(name)}</h2>")
        picture = overoptimisation_plot(runs)
        if picture:
            parts.append(
                f"<div class='wide'><img alt='gold and proxy against sqrt KL' src='{picture}'></div>"
                "<p>Gold and proxy score at each evaluation against √KL(π‖π_ref) (Gao et al. 2022): the proxy "
                "keeps rising with distance from the reference while gold rises, then falls.</p>"
            )
        all_series = [r.series() for r in runs]
        parts.append("<div class='grid'>")
        for key in keys:
            for kind, members in _axes(key, [r for r, s in zip(runs, all_series) if key in s]):
                title = key if kind is None else f"{key} ({kind})"
                lines = [(r.name, s[key]) for r, s in zip(runs, all_series) if r in members]
                meaning, healthy = explain(key, glossary, members[0].stage)
                marks = [(a["monitor"], int(a["step"])) for r in runs for a in r.alarms] if len(runs) == 1 else []
                parts.append(_card(title, _plot(title, lines, marks), meaning, healthy))
        parts.append("</div>")
        alarms = [(r.name, a) for r in runs for a in r.alarms]
        parts.append(
            f"<h3>Alarms ({len(alarms)})</h3>"
            + ("".join(f"<p><b>{_esc(n)}</b></p>{_alarm_html(a)}" for n, a in alarms) or "<p>None raised.</p>")
        )
    parts.append("</body></html>")
    return "".join(parts)


def _axes(key: str, runs: list[Run]) -> list[tuple[str | None, list[Run]]]:
    """[(kind, runs)]: one axis for most metrics; a loss gets one axis per kind of loss among the runs (a DPO
    sigmoid loss, a KTO loss and a Bradley–Terry loss are on different scales)."""
    if not runs:
        return []
    if not key.split("/")[-1] == "loss" or len({r.loss_kind for r in runs}) == 1:
        return [(None, runs)]
    kinds: dict[str, list[Run]] = {}
    for r in runs:
        kinds.setdefault(r.loss_kind, []).append(r)
    return list(kinds.items())


def _card(key: str, image: str, meaning: str, healthy: str) -> str:
    text = (
        f"<div class='meaning'>{_esc(_plain(meaning))}</div>"
        if meaning
        else "<div class='meaning'>(not in the glossary)</div>"
    )
    if healthy and healthy != "—":
        text += f"<div class='healthy'>healthy: {_esc(_plain(healthy))}</div>"
    return f"<div class='card'><img alt='{_esc(key)}' src='{image}'>{text}</div>"


def write_report(folders: list[str | Path], output: str | Path) -> Path:
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_suffix(output.suffix + ".tmp")
    tmp.write_text(render_report(folders))
    tmp.replace(output)
    return output
