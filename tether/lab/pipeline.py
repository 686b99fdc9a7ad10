"""`tether lab`: build the world, pretrain a tiny model from scratch, fine-tune it, and measure both against gold.

`run_lab` runs the plan (plan.py: each stage with its settings and the stages it reads; the settings in
settings.py, the stages' runners in runners.py); tether/lab/schedule.py caches each stage on its recipe and
tether's code, resumes a killed one, and runs the ready ones side by side with ``workers`` > 1. Then the lessons
(lessons.py) are judged on the figures, and the tables, the headline and report.html (tables.py) show them.
`run_base` is the base model alone, for the recipe's robustness over seeds (examples/lab_seeds.py).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from tether.console import console
from tether.lab.evaluate import GREEDY, generate_for, score_arith, written_step_accuracy
from tether.lab.lessons import lab_lessons
from tether.lab.plan import base_plan, lab_plan
from tether.lab.runners import read_rows
from tether.lab.schedule import Stages
from tether.lab.settings import LabConfig, plumbing_note
from tether.lab.tables import headline_figures, print_headline, print_lab_table, print_lessons, write_lab_report
from tether.models.lm import load_model, load_tokenizer


def run_lab(
    output: str | Path = "runs/lab",
    cfg: LabConfig = LabConfig(),
    fresh: bool = False,
    report: bool = True,
    workers: int = 1,
) -> dict:
    """Every stage of ``cfg`` into ``output``; ``report``: then the tables, report.html and summary.json (False:
    the stages' figures only, returned — a subset of the stages run into a lab folder without replacing its
    summary and report). ``workers`` > 1: stages whose inputs are ready run side by side on that many processes
    (`tether lab` uses one per core); the figures are the same."""
    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    note = plumbing_note(cfg)
    if note:
        console.print(f"tether lab: {note}", style="bold yellow")
    stages = Stages(out, fresh)
    plan = lab_plan(out, cfg)
    t0 = time.perf_counter()
    results = stages.run_plan(plan, workers, rebuild=(lab_plan, (out, cfg)))
    summary = {
        "output": str(out),
        "world": results["world"],
        "pretrain": results["pretrain"],
        "sft": results["sft"],
        "eval": results["eval"],
    }
    for family in ("reward_models", "ppo", "grpo", "dpo", "agents"):
        summary[family] = {s.name: results[s.name] for s in plan if s.family == family}
    summary.update(
        seconds=stages.timings,
        cached=stages.cached,
        workers=workers,
        stages_wall_seconds=round(time.perf_counter() - t0, 1),
    )
    if not report:
        return summary
    t0 = time.perf_counter()
    summary["plumbing_check"] = note
    summary["headline"] = headline_figures(summary)
    summary["lessons"] = [lesson.as_dict() for lesson in lab_lessons(summary, cfg.grpo_eval_problems)]
    summary["report"] = str(write_lab_report(out, summary))
    stages.timings["report"], stages.cached["report"] = time.perf_counter() - t0, False
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print_lab_table(summary)
    print_headline(summary)
    print_lessons(summary)
    if note:
        console.print(f"tether lab: {note}", style="bold yellow")
    return summary


def run_base(output: str | Path, cfg: LabConfig = LabConfig(), fresh: bool = False) -> dict:
    """The base model alone: world, init and pretrain into ``output`` (cached as in run_lab, so a later run_lab
    there reuses them), then its greedy accuracy on the first cfg.eval_arith held-out arith problems (with the share
    of the addition and of the subtraction steps it writes that are right) and the pretraining curve (held-out loss
    at each evaluation). What the recipe's robustness over seeds and vocabularies is measured with
    (examples/lab_seeds.py --base-only)."""
    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    stages = Stages(out, fresh)
    results = stages.run_plan(base_plan(out, cfg))
    rows = read_rows(out / "world" / "arith_eval.jsonl")[: cfg.eval_arith]
    tok = load_tokenizer(out / "pretrain" / "final")
    completions = generate_for(load_model(out / "pretrain" / "final", tok), tok, rows, GREEDY)
    greedy = {**score_arith(rows, completions), **written_step_accuracy(completions)}
    metrics = read_rows(out / "pretrain" / "metrics.jsonl")
    return {
        "vocab": results["init"]["vocab"],
        "pretrain": results["pretrain"],
        "seconds": stages.timings["pretrain"],
        "arith_greedy": {
            k: greedy[k]
            for k in (
                "accuracy",
                "format_rate",
                "step_accuracy",
                "n",
                "addition_steps",
                "addition_steps_right",
                "subtraction_steps",
                "subtraction_steps_right",
            )
        },
        "curve": [(m["step"], m["eval/loss"]) for m in metrics if "eval/loss" in m],
    }
