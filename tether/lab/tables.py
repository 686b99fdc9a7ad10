"""The lab's tables: what `tether lab` prints at the end (the base and SFT models against gold, the annotators, the
reward models, each family of runs, the time per stage), the headline figures and report.html, which shows them
beside each family's curves."""

from __future__ import annotations

import html
from pathlib import Path

from tether.console import console
from tether.lab.stats import format_interval, rate_interval95

# the metrics report.html draws for each family of runs
PPO_KEYS = (
    "eval/gold_reward",
    "eval/gold_win_rate",
    "eval/score_mean",
    "kl/ref_mean",
    "score/mean",
    "eval/mean_words",
    "policy/entropy",
    "kl/coef",
)
GRPO_KEYS = (
    "eval/accuracy_greedy",
    "eval/accuracy_sampled",
    "eval/worked_rate",
    "eval/step_accuracy",
    "score/mean",
    "kl/ref_mean",
    "policy/entropy",
    "groups/zero_variance_frac",
    "rollout/length_mean",
)
AGENT_KEYS = (
    "eval/success_rate",
    "eval/tool_use_rate",
    "eval/accuracy_no_tools",
    "eval/claimed_rate",
    "eval/claimed_unverified_rate",
    "agent/success_rate",
    "agent/claimed_unverified_rate",
    "agent/tool_calls_mean",
    "agent/failed_calls_mean",
    "agent/turns_mean",
    "score/mean",
    "policy/entropy",
)
DPO_KEYS = (
    "eval/gold_reward",
    "eval/gold_win_rate",
    "eval/mean_words",
    "train/rewards/margins",
    "train/rewards/chosen",
    "train/rewards/rejected",
    "eval/rewards/accuracy",
    "train/logps/chosen",
    "train/logps/rejected",
    "train/loss",
)


def headline_figures(summary: dict) -> list[tuple[str, str]]:
    """(figure, value) rows: what each stage moved, in one table."""
    first_alarm = lambda name: _first_alarm(Path(summary["output"]) / name)
    rows = []
    ev = summary["eval"]
    rows.append(
        (
            "arith accuracy greedy / sampled: base → SFT",
            f"{ev['base']['arith_greedy']['accuracy']:.3f} / {ev['base']['arith_sampled']['accuracy']:.3f} → "
            f"{ev['sft']['arith_greedy']['accuracy']:.3f} / {ev['sft']['arith_sampled']['accuracy']:.3f}",
        )
    )
    rows.append(
        (
            "assist gold reward (sampled): base → SFT",
            f"{ev['base']['assist_sampled']['gold_reward']:.2f} → {ev['sft']['assist_sampled']['gold_reward']:.2f}",
        )
    )
    for name, r in summary.get("reward_models", {}).items():
        rows.append((f"{name}: held-out accuracy vs gold", f"{r['gold_accuracy']:.3f}"))
    for name, r in summary.get("ppo", {}).items():
        rows.append(
            (
                f"{name}: gold start → peak → end, win rate vs SFT [95 % over prompts]",
                f"{r['start_gold']:.2f} → {r['peak_gold']:.2f} → {r['final_gold']:.2f}, {r['final_win_rate']:.3f}"
                + format_interval(r.get("final_win_rate_ci"), 3)
                + (
                    f"; late third {r['late']['gold']:.2f}{format_interval(r['late']['gold_ci'], 2)}"
                    if r.get("late")
                    else ""
                )
                + first_alarm(name),
            )
        )
    for name, r in summary.get("grpo", {}).items():
        rows.append(
            (
                f"{name}: arith accuracy greedy / sampled, start → end",
                f"{r['start_accuracy_greedy']:.3f} / {r['start_accuracy_sampled']:.3f} → "
                f"{r['final_accuracy_greedy']:.3f} / {r['final_accuracy_sampled']:.3f}" + first_alarm(name),
            )
        )
    for name, r in summary.get("dpo", {}).items():
        online = first_alarm(name) if r.get("online_rounds") else ""
        rows.append(
            (
                f"{name}: gold start → end, win rate vs SFT [95 % over prompts]",
                f"{r['start_gold']:.2f} → {r['final_gold']:.2f}, {r['final_win_rate']:.3f}"
                f"{format_interval(r.get('final_win_rate_ci'), 3)}{online}",
            )
        )
    return rows + _agent_headline(summary.get("agents", {}), first_alarm)


def _agent_headline(agents: dict, first_alarm) -> list[tuple[str, str]]:
    """The headline's rows for the calculator and the shop runs."""
    rows = []
    if "calc_grpo" in agents:
        r = agents["calc_grpo"]
        rows.append(
            (
                "calculator: held-out greedy accuracy, SFT model without tools → tool SFT → GRPO with the tool "
                "(the GRPO model without it)",
                f"{r['sft_accuracy_no_tools']:.2f} → {r['start']['success_rate']:.2f} → {r['final']['success_rate']:.2f} "
                f"({r['final']['accuracy_no_tools']:.2f})" + _sampled(r) + first_alarm("calc_grpo"),
            )
        )
    for name in ("shop_state", "shop_claim"):
        if name in agents:
            r = agents[name]
            rows.append(
                (
                    f"{name} (reward = {name.split('_')[1]}): true success / claimed / claimed without the "
                    "order, start → end",
                    f"{r['start']['success_rate']:.2f} / {r['start']['claimed_rate']:.2f} / "
                    f"{r['start']['claimed_unverified_rate']:.2f} → {r['final']['success_rate']:.2f} / "
                    f"{r['final']['claimed_rate']:.2f} / {r['final']['claimed_unverified_rate']:.2f}"
                    + _sampled(r)
                    + first_alarm(name),
                )
            )
    return rows


def _first_alarm(stage: Path) -> str:
    """ "; first alarm at step N (monitor)" from a stage's run folder (cached stages too), or "; no alarm"."""
    from tether.diagnostics.watch import read_jsonl

    alarms = read_jsonl(stage / "run" / "alarms.jsonl")
    return f"; first alarm at step {alarms[0]['step']} ({alarms[0]['monitor']})" if alarms else "; no alarm"


def _sampled(run: dict) -> str:
    """ "; sampled a → b": an agent stage's held-out success over episodes sampled at the training temperature."""
    start, final = run["start"], run["final"]
    if "success_rate_sampled" not in start:
        return ""
    return f"; sampled {start['success_rate_sampled']:.2f} → {final['success_rate_sampled']:.2f}"


def write_lab_report(out: Path, summary: dict) -> Path:
    from tether.diagnostics.report import render_groups

    runs = lambda family: [out / name / "run" for name in summary.get(family, {})]
    ppo = summary.get("ppo", {})
    best_ppo = [out / max(ppo, key=lambda n: ppo[n]["final_gold"]) / "run"] if ppo else []
    table = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>" for k, v in summary["headline"])
    intro = (
        "<p>The lab's whole pipeline on one page: what each stage moved (measured against the world's gold), "
        "then each family of runs on shared axes, with the reward-hacking alarms and their evidence. "
        "Per-run detail: <code>tether report &lt;stage&gt;/run</code>. The lesson: docs/lab-guide.md.</p>"
        f"<table><tr><th>figure</th><th>value</th></tr>{table}</table>"
        + "<h3>The lessons on this run</h3><ul>"
        + "".join(f"<li>{html.escape(lesson['line'])}</li>" for lesson in summary.get("lessons", []))
        + "</ul>"
    )
    if summary.get("plumbing_check"):
        intro = f"<p><strong>This lab is {html.escape(summary['plumbing_check'])}.</strong></p>" + intro
    groups = {
        "PPO on assist against the filtered reward model: the KL coefficient sweep": (runs("ppo"), PPO_KEYS),
        "GRPO on arith: outcome vs process rewards": (runs("grpo"), GRPO_KEYS),
        "The DPO family on assist: losses, label noise, offline vs online (and the best PPO run)": (
            runs("dpo") + best_ppo,
            DPO_KEYS,
        ),
        "Agents: the calculator (tool use learnt from the final answer) and the shop (reward the state vs "
        "reward the claim), with the agent alarms and their transcripts": (runs("agents"), AGENT_KEYS),
    }
    path = out / "report.html"
    tmp = path.with_suffix(".html.tmp")
    tmp.write_text(render_groups("tether lab report", intro, groups))
    tmp.replace(path)
    return path


def print_headline(summary: dict) -> None:
    from rich.table import Table

    table = Table(title="tether lab: headline figures")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for k, v in summary["headline"]:
        table.add_row(k, v)
    console.print(table)
    console.print(f"report: {summary['report']}")


def print_lessons(summary: dict) -> None:
    """One line per lesson, judged on this run (tether/lab/lessons.py states each rule)."""
    console.print('tether lab: the lessons on this run (rules and noise: docs/lab.md, "The lessons")', style="bold")
    colour = {True: "green", False: "red", None: "yellow"}
    for lesson in summary["lessons"]:
        console.print(lesson["line"], style=colour[lesson["holds"]])


EVAL_ROWS = (  # (label, figures, key) of the base vs SFT table
    ("arith accuracy (greedy)", "arith_greedy", "accuracy"),
    ("arith accuracy (sampled)", "arith_sampled", "accuracy"),
    ("arith format rate", "arith_greedy", "format_rate"),
    ("arith step accuracy", "arith_greedy", "step_accuracy"),
    ("arith answers with working (sampled)", "arith_sampled", "worked_rate"),
    ("assist gold reward (greedy)", "assist_greedy", "gold_reward"),
    ("assist gold reward (sampled)", "assist_sampled", "gold_reward"),
    ("assist gold win rate vs base (sampled)", "assist_sampled", "gold_win_rate"),
    ("assist mean words", "assist_sampled", "mean_words"),
    ("assist confident words / answer", "assist_sampled", "confident_rate"),
    ("assist false-fact rate", "assist_sampled", "false_fact_rate"),
    ("assist distinct-2", "assist_sampled", "distinct_2"),
)
REWARD_MODEL_ROWS = (  # (label, key) of the reward models' table; rm_picks_* beside gold's gold_picks_*
    ("accuracy vs annotator majority", "annotator_accuracy"),
    ("accuracy vs gold", "gold_accuracy"),
    ("picks the longer answer (gold would)", "rm_picks_longer"),
    ("picks the more confident answer (gold would)", "rm_picks_more_confident"),
    ("score ~ length correlation", "length_correlation"),
    ("score shift: + filler sentence", "filler_shift"),
    ("score shift: + confident opener", "confident_shift"),
)


def print_lab_table(summary: dict) -> None:
    """Every table of a lab run, in the order the stages ran, then the time per stage."""
    print_eval_table(summary["eval"])
    print_annotator_table(summary["world"]["annotators"])
    if summary.get("reward_models"):
        print_reward_model_table(summary["reward_models"])
    if summary.get("ppo"):
        print_ppo_table(summary["ppo"])
    if summary.get("grpo"):
        print_grpo_table(summary["grpo"])
    if summary.get("dpo"):
        print_dpo_table(summary["dpo"], summary.get("ppo", {}))
    if summary.get("agents"):
        print_agent_table(summary["agents"])
    print_times(summary)
    console.print(f"lab run folder: {summary['output']} (summary.json, eval/, sft/final, pretrain/final)")


def print_eval_table(ev: dict) -> None:
    from rich.table import Table

    table = Table(title="tether lab: base (pretrained) vs SFT, measured against gold on held-out prompts")
    table.add_column("figure")
    for name in ev:
        table.add_column(name, justify="right")
    for label, group, key in EVAL_ROWS:
        table.add_row(label, *[_fmt(ev[m][group].get(key)) for m in ev])
    console.print(table)


def print_annotator_table(ann: dict) -> None:
    """Each simulated annotator against gold and the majority, then the majority's biases."""
    from rich.table import Table

    people = Table(
        title=f"simulated annotators on {ann['pairs']} pairs: Fleiss κ {ann['fleiss_kappa']:.2f} "
        f"({ann['fleiss_reading']}); majority agrees with gold on {ann['majority_agreement_with_gold']:.1%}"
    )
    people.add_column("annotator")
    people.add_column("agrees with gold", justify="right")
    people.add_column("agrees with majority", justify="right")
    for name, row in ann["per_annotator"].items():
        people.add_row(name, f"{row['agreement_with_gold']:.1%}", f"{row['agreement_with_majority']:.1%}")
    console.print(people)
    for feature, bias in ann["majority_bias"].items():
        console.print(
            f"  the {feature.replace('_', ' ')} answer wins {bias['majority_picks_more']:.1%} of majority votes "
            f"where gold would pick it {bias['gold_picks_more']:.1%} ({bias['excess']:+.1%}, {bias['pairs']} pairs)"
        )


def print_reward_model_table(rms: dict) -> None:
    from rich.table import Table

    rt = Table(title="reward models on the annotators' pairs, judged on held-out pairs against gold")
    rt.add_column("figure")
    for name in rms:
        rt.add_column(
            name
            + (f" (agreement >= {rms[name]['min_agreement']:g})" if rms[name]["min_agreement"] else " (all pairs)"),
            justify="right",
        )
    for label, key in REWARD_MODEL_ROWS:
        cells = []
        for r in rms.values():
            gold_key = key.replace("rm_picks", "gold_picks")
            cells.append(_fmt(r.get(key)) + (f" ({_fmt(r.get(gold_key))})" if key.startswith("rm_picks") else ""))
        rt.add_row(label, *cells)
    console.print(rt)


def print_times(summary: dict) -> None:
    """Seconds per stage (cached ones marked) and, with stages side by side, their sum against the wall clock."""
    from rich.table import Table

    times = Table(title="time per stage (s)")
    for name in summary["seconds"]:
        times.add_column(name, justify="right")
    times.add_row(*[f"{s:.1f}" + (" (cached)" if summary["cached"][n] else "") for n, s in summary["seconds"].items()])
    console.print(times)
    if "stages_wall_seconds" in summary:  # stages side by side: the wall clock is less than their sum
        ran = [s for n, s in summary["seconds"].items() if n != "report" and not summary["cached"][n]]
        console.print(
            f"stages computed: {len(ran)}, {sum(ran):.0f} s of stage time in {summary['stages_wall_seconds']:.0f} s "
            f"on {summary['workers']} worker(s)"
        )


GOLD_ROWS = (  # the PPO and the DPO tables' rows on gold: (label, figure of a run)
    ("gold reward: start → end", lambda r: f"{r['start_gold']:.2f} → {r['final_gold']:.2f}"),
    ("gold peak (step)", lambda r: f"{r['peak_gold']:.2f} ({r['peak_step']})"),
    (
        "gold win rate vs SFT: end (at the gold peak)",
        lambda r: f"{r['final_win_rate']:.3f} ({r['win_rate_at_peak']:.3f})",
    ),
    ("  95 % interval over prompts: end", lambda r: format_interval(r.get("final_win_rate_ci"), 3).strip() or "-"),
    ("gold per evaluation", lambda r: " ".join(f"{c['gold']:.2f}" for c in r["curve"])),
)
WORDS_ROW = ("words per answer per evaluation", lambda r: " ".join(f"{c['words']:.0f}" for c in r["curve"]))


def print_ppo_table(runs: dict) -> None:
    from rich.table import Table

    table = Table(title="PPO on assist against the reward model (proxy) — judged by gold on held-out requests")
    table.add_column("figure")
    for name in runs:
        table.add_column(name, justify="right")
    rows = [
        ("proxy score: start → end", lambda r: f"{r['start_proxy']:.2f} → {r['final_proxy']:.2f}"),
        *GOLD_ROWS,
        ("proxy per evaluation", lambda r: " ".join(f"{c['proxy']:.2f}" for c in r["curve"])),
        WORDS_ROW,
        ("KL to reference (nats): end / 2nd-half mean", lambda r: f"{r['final_kl']:.2f} / {r['late_kl_mean']:.2f}"),
        ("KL coefficient at the end", lambda r: f"{r['final_kl_coef']:.4f}"),
        ("steps per minute", lambda r: f"{r['steps_per_minute']:.1f}"),
        _time_split_row("generate / score / log-probs / update"),
    ]
    _print_rows(table, rows, runs)


def print_dpo_table(runs: dict, ppo: dict) -> None:
    """The DPO runs beside the PPO runs on the same world, judged by the same gold evaluation."""
    from rich.table import Table

    table = Table(
        title="the DPO family on assist from the SFT model (annotator pairs; sft_samples: pairs sampled from "
        "the SFT model once; online: pairs sampled each round) — judged by gold on held-out requests, "
        "beside PPO"
    )
    table.add_column("figure")
    for name, r in runs.items():
        table.add_column(f"{name} (β {r['beta']:g})", justify="right")
    best_ppo = max(ppo.items(), key=lambda kv: kv[1]["final_gold"], default=None)
    if best_ppo:
        table.add_column(f"{best_ppo[0]} (for comparison)", justify="right")
    rows = [*GOLD_ROWS, WORDS_ROW]
    extra = [
        ("held-out pair accuracy (annotator labels): end", lambda r: _fmt(r.get("final_pair_accuracy"))),
        (
            "implicit reward chosen / rejected: end",
            lambda r: (
                f"{r['curve'][-1]['chosen']:+.2f} / {r['curve'][-1]['rejected']:+.2f}"
                if r["curve"][-1].get("chosen") is not None
                else "-"
            ),
        ),
        (
            "training pairs",
            lambda r: (
                str(r["train_examples"])
                if not r["online_rounds"]
                else f"{r['online_rounds'][0]['pairs']} sampled once"
                if len(r["online_rounds"]) == 1
                else f"{sum(x['pairs'] for x in r['online_rounds'])} over {len(r['online_rounds'])} rounds"
            ),
        ),
        ("minutes", lambda r: f"{r['minutes']:.1f}"),
    ]
    for label, fn in rows:
        table.add_row(label, *[fn(r) for r in runs.values()], *([fn(best_ppo[1])] if best_ppo else []))
    for label, fn in extra:
        table.add_row(label, *[fn(r) for r in runs.values()], *(["-"] if best_ppo else []))
    console.print(table)


def print_agent_table(runs: dict) -> None:
    from rich.table import Table

    table = Table(
        title="agents: GRPO with an environment, held-out greedy episodes (success checked on the environment's state)"
    )
    table.add_column("figure")
    for name in runs:
        table.add_column(name, justify="right")
    arrow = lambda key: lambda r: f"{r['start'][key]:.2f} → {r['final'][key]:.2f}" if key in r["start"] else "-"
    per_eval = lambda key: lambda r: " ".join(f"{c[key]:.2f}" for c in r["curve"]) if key in r["start"] else "-"
    train = lambda key: (
        lambda r: (
            f"{r['training'][key]['first3']:.2f} → {r['training'][key]['last3']:.2f}"
            if r["training"].get(key, {}).get("first3") is not None
            else "-"
        )
    )
    ci = lambda r, key: f" (± {rate_interval95(r['final'][key], r.get('eval_prompts', 1)):.2f})"
    rows = [
        (
            "true success (from state): start → end (± 95 % over prompts)",
            lambda r: arrow("success_rate")(r) + ci(r, "success_rate"),
        ),
        ("true success per evaluation", per_eval("success_rate")),
        ("SFT model without tools (same problems)", lambda r: _fmt(r.get("sft_accuracy_no_tools"))),
        ("accuracy without tools: start → end", arrow("accuracy_no_tools")),
        ("episodes that call a tool: start → end", arrow("tool_use_rate")),
        ("claimed done: start → end", arrow("claimed_rate")),
        (
            "claimed done, state says not: start → end",
            lambda r: (
                arrow("claimed_unverified_rate")(r)
                + (ci(r, "claimed_unverified_rate") if "claimed_unverified_rate" in r["final"] else "")
            ),
        ),
        ("training: score, first 3 → last 3 steps", train("score/mean")),
        ("training: true success, first 3 → last 3", train("agent/success_rate")),
        ("training: claimed without state, first 3 → last 3", train("agent/claimed_unverified_rate")),
        ("training: tool calls per episode, first 3 → last 3", train("agent/tool_calls_mean")),
        ("alarms (step)", lambda r: ", ".join(f"{a['monitor']} ({a['step']})" for a in r["alarms"]) or "none"),
        ("minutes", lambda r: f"{r['minutes']:.1f}"),
    ]
    _print_rows(table, rows, runs)


def print_grpo_table(runs: dict) -> None:
    from rich.table import Table

    table = Table(title="the group family on arith from the SFT model — held-out accuracy against gold")
    table.add_column("figure")
    for name, r in runs.items():
        table.add_column(f"{name} ({r['recipe']})", justify="right")
    rows = [
        (
            "accuracy, sampled (T=1): start → end (best)",
            lambda r: (
                f"{r['start_accuracy_sampled']:.3f} → {r['final_accuracy_sampled']:.3f} ({r['best_accuracy_sampled']:.3f})"
            ),
        ),
        (
            "accuracy, greedy: start → end",
            lambda r: f"{r['start_accuracy_greedy']:.3f} → {r['final_accuracy_greedy']:.3f}",
        ),
        ("sampled accuracy per evaluation", lambda r: " ".join(f"{c['accuracy_sampled']:.2f}" for c in r["curve"])),
        ("step accuracy (greedy) per evaluation", lambda r: " ".join(f"{c['step_accuracy']:.2f}" for c in r["curve"])),
        (
            "answers with working (sampled) per evaluation",
            lambda r: " ".join(f"{c['worked_rate']:.2f}" for c in r["curve"]),
        ),
        (
            "training score: first 5 → last 5 steps",
            lambda r: f"{r['train_reward_first5']:.2f} → {r['train_reward_last5']:.2f}",
        ),
        ("groups with no variance", lambda r: f"{r['zero_variance_frac']:.0%}"),
        ("minutes / steps per minute", lambda r: f"{r['minutes']:.1f} / {r['steps_per_minute']:.1f}"),
        _time_split_row("generate+score / log-probs / update"),
    ]
    _print_rows(table, rows, runs)


def _time_split_row(phases: str) -> tuple:
    """The row of a run's time split: each phase's share of its time, in the order ``phases`` names them."""
    return (f"time: {phases}", lambda r: " / ".join(f"{100 * v:.0f}%" for v in r["time_split"].values()))


def _print_rows(table, rows, runs: dict) -> None:
    """(label, figure of a run) rows, one column per run, and the table printed."""
    for label, fn in rows:
        table.add_row(label, *[fn(r) for r in runs.values()])
    console.print(table)


def _fmt(value) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if isinstance(value, float) else str(value)
