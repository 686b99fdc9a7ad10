"""tether against TRL on the 29 M workloads (issue 54): CPU seconds per optimizer step and peak memory, as ratios.

    .venv/bin/python bench/vs_trl.py                          # sft, dpo, rm, grpo, rloo in fp32, 3 repeats
    .venv/bin/python bench/vs_trl.py --bf16                   # the same under bf16 autocast on both sides
    .venv/bin/python bench/vs_trl.py --growth --repeats 1 --steps 2   # GRPO: group size 4/8/16 x 32/64/128 tokens

Each workload runs on the 29.9 M-parameter Llama of bench/stages.py (7 layers, hidden 512, the lab's tokenizer,
random weights) with the lab's data, as `python -m tether <stage>` and as TRL's own trainer (bench/trl_driver.py),
with the same batch, micro-batch, lengths, group size, response budget, learning rate and steps; the data reaches
TRL in the order tether's run visits it. docs/performance.md lists every matched setting and those that could not
be matched. Every run is a fresh process on one pinned core with one thread (OMP_NUM_THREADS=1, taskset -c 0 where
present), tether and TRL interleaved (tether, TRL, tether, TRL, ...).

CPU seconds per step: each side runs 1 step and 1 + --steps steps; (CPU of the long run - CPU of the 1-step run)
/ --steps is the cost of a step after the warm-up, everything the step causes included (data, the reference pass,
logging), start-up and the final save cancelled. Peak RSS is the long run's (wait4). The ratio tether / TRL is
taken per repeat; the table gives the median and the min-max over repeats. Beside them, from inside the runs:
tether's phases (metrics.jsonl time/*, forwards/*, positions/*) and TRL's (its methods timed by the driver).

Needs a folder with the lab's world/ and its tokenizer in sft/final (`tether lab` makes one); without --lab the
world and the tokenizer alone are built into <work>/lab (about 15 s; no model is trained).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
ONLINE = ("grpo", "rloo")
PHASES = ("generate_score", "logprobs", "update")


def _bench_module(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


stages = _bench_module("stages")  # build_model and run_once: the 29 M model and tether's measured process

# One workload's settings, handed to both sides. Offline: examples per step (batch), per forward (micro), longest
# example; online: prompts per step x group size responses of at most max_new_tokens, micro responses per forward.
WORKLOADS = {
    "sft": dict(data="sft", batch=16, micro=8, max_length=256, lr=2e-5),
    "dpo": dict(data="prefs", batch=16, micro=8, max_length=256, lr=1e-6),
    "rm": dict(data="prefs", batch=16, micro=8, max_length=256, lr=1e-5),
    "grpo": dict(data="arith_rl", prompts_per_step=4, group_size=8, max_new_tokens=64, micro=32, lr=1e-6),
    "rloo": dict(data="arith_rl", prompts_per_step=4, group_size=8, max_new_tokens=64, micro=32, lr=1e-6),
}


def prepare_lab(lab: Path) -> Path:
    """The lab's world/ and tokenizer (sft/final): an existing lab folder, or the lab's first two stages."""
    if (lab / "world" / "sft.jsonl").is_file() and (lab / "sft" / "final" / "tokenizer.json").is_file():
        return lab
    from tether.lab.pipeline import LabConfig, base_plan

    world, init = base_plan(lab, LabConfig())[:2]
    world.run(lab / "world", False)
    init.run(lab / "sft" / "final", False)  # the tokenizer (and the lab's untrained 0.66 M model beside it)
    return lab


def trl_files(world: Path, folder: Path, seed: int) -> dict[str, Path]:
    """The lab's files for TRL, in the order tether's run visits them (tether's EpochOrder, first epoch): SFT
    demonstrations as prompt/completion messages, preference pairs as prompt/chosen/rejected, prompts as they are."""
    from tether.train.offline import EpochOrder

    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for name in ("sft", "prefs", "arith_rl"):
        rows = [json.loads(line) for line in (world / f"{name}.jsonl").read_text().splitlines() if line.strip()]
        rows = [rows[i] for i in EpochOrder(len(rows), seed).slice(0, len(rows))]
        if name == "sft":
            rows = [{"prompt": r["messages"][:-1], "completion": r["messages"][-1:]} for r in rows]
        elif name == "prefs":
            rows = [{k: r[k] for k in ("prompt", "chosen", "rejected")} for r in rows]
        out[name] = folder / f"{name}.jsonl"
        out[name].write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out


def tether_args(name: str, s: dict, world: Path, model: Path, out: Path, steps: int, bf16: bool) -> list[str]:
    stage = "grpo" if name in ONLINE else name
    args = [stage, "--model", str(model), "--max-steps", str(steps), "--lr", str(s["lr"]), "--weight-decay", "0"]
    args += ["--lr-schedule", "constant", "--warmup-ratio", "0", "--output", str(out), "--seed", "0"]
    args += ["--report-to", "none", "--save-every", "0", "--overwrite"]
    args += ["--mixed-precision", "bf16"] if bf16 else []
    if name in ONLINE:
        args += ["--prompts", str(world / f"{s['data']}.jsonl"), "--reward", "bench.trl_driver:letter_share"]
        args += ["--prompts-per-step", str(s["prompts_per_step"]), "--group-size", str(s["group_size"])]
        args += ["--max-new-tokens", str(s["max_new_tokens"]), "--micro-batch-size", str(s["micro"])]
        return args + ["--eval-every", "0"] + (["--recipe", "rloo"] if name == "rloo" else [])
    args += ["--data", str(world / f"{s['data']}.jsonl"), "--eval-fraction", "0", "--max-length", str(s["max_length"])]
    return args + ["--batch-size", str(s["batch"]), "--micro-batch-size", str(s["micro"])]


def trl_args(name: str, s: dict, files: dict, model: Path, out: Path, steps: int, bf16: bool) -> list[str]:
    args = [name, "--model", str(model), "--data", str(files[s["data"]]), "--output", str(out)]
    args += ["--steps", str(steps), "--lr", str(s["lr"]), "--micro", str(s["micro"])] + (["--bf16"] if bf16 else [])
    if name in ONLINE:
        args += ["--prompts-per-step", str(s["prompts_per_step"]), "--group-size", str(s["group_size"])]
        return args + ["--max-new-tokens", str(s["max_new_tokens"])]
    return args + ["--batch", str(s["batch"]), "--max-length", str(s["max_length"])]


def run_tether(args: list[str]) -> dict:
    """stages.run_once with this checkout first on the path; plus the step rows of its metrics.jsonl."""
    figures = stages.run_once(args, str(REPO))
    output = Path(args[args.index("--output") + 1])
    rows = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    return {**figures, "rows": [r for r in rows if r.get("step", 0) > 0]}


def run_trl(args: list[str]) -> dict:
    """bench/trl_driver.py as run_once runs tether: fresh process, one thread, pinned, CPU and peak RSS by wait4."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    command = [sys.executable, str(HERE / "trl_driver.py"), *args]
    if shutil.which("taskset"):
        command = ["taskset", "-c", "0", *command]
    output = Path(args[args.index("--output") + 1])
    shutil.rmtree(output, ignore_errors=True)
    output.mkdir(parents=True)
    t0 = time.perf_counter()
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    stderr = proc.stderr.read()
    if status != 0:
        raise SystemExit(f"TRL {args[0]} failed ({status}): {stderr[-3000:]}")
    steps = json.loads((output / "trl_steps.json").read_text())["steps"]
    return {"cpu_s": usage.ru_utime + usage.ru_stime, "wall_s": wall, "peak_mib": usage.ru_maxrss / 1024, "rows": steps}


def tether_phases(rows: list[dict]) -> dict:
    """Mean seconds per step after the first (wall: tether logs perf_counter), each online phase, and the
    forwards and positions of the last step by phase."""
    rows = rows[1:] or rows
    out = {}
    if "time/update_s" in rows[0]:
        out = {p: statistics.mean(r[f"time/{p}_s"] for r in rows) for p in PHASES}
        out["step_s"] = sum(out.values())
    else:
        out["step_s"] = statistics.mean(r["time/step_s"] for r in rows)
    out["forwards"] = {k.split("/", 1)[1]: v for k, v in rows[-1].items() if k.startswith("forwards/")}
    out["positions"] = {k.split("/", 1)[1]: v for k, v in rows[-1].items() if k.startswith("positions/")}
    return out


def trl_phases(rows: list[dict]) -> dict:
    """Mean process CPU seconds per step after the first, and the online trainers' split into tether's phases:
    generation + rewards, the other no-grad work of generate-and-score (old and reference log-probs), the update."""
    rows = rows[1:] or rows
    out = {"step_s": statistics.mean(r["cpu_s"] for r in rows)}
    if "prepare" in rows[0]:
        generate = statistics.mean(r.get("generate", 0.0) + r.get("rewards", 0.0) for r in rows)
        prepare = statistics.mean(r["prepare"] for r in rows)
        out.update(generate_score=generate, logprobs=prepare - generate, update=out["step_s"] - prepare)
    return out


def measure(name: str, s: dict, ctx: dict, steps: int, bf16: bool, tag: str) -> dict:
    """One repeat of one workload: tether 1 step, TRL 1 step, tether 1 + steps, TRL 1 + steps."""
    runs: dict = {"tether": {}, "trl": {}}
    for n in (1, 1 + steps):
        for side in ("tether", "trl"):
            out = ctx["work"] / side / f"{tag}-{n}"
            out.parent.mkdir(parents=True, exist_ok=True)
            if side == "tether":
                runs[side][n] = run_tether(tether_args(name, s, ctx["world"], ctx["model"], out, n, bf16))
            else:
                runs[side][n] = run_trl(trl_args(name, s, ctx["files"], ctx["model"], out, n, bf16))
    result = {}
    for side, by_steps in runs.items():
        short, long = by_steps[1], by_steps[1 + steps]
        inside = tether_phases(long["rows"]) if side == "tether" else trl_phases(long["rows"])
        result[side] = {
            "step_cpu_s": (long["cpu_s"] - short["cpu_s"]) / steps,
            "peak_mib": long["peak_mib"],
            "cpu_s": [short["cpu_s"], long["cpu_s"]],
            "inside": inside,
        }
    result["ratio"] = result["tether"]["step_cpu_s"] / result["trl"]["step_cpu_s"]
    result["rss_ratio"] = result["tether"]["peak_mib"] / result["trl"]["peak_mib"]
    return result


def summarise(repeats: list[dict]) -> dict:
    ratios, rss = [r["ratio"] for r in repeats], [r["rss_ratio"] for r in repeats]
    side = lambda k, f: statistics.median(r[k][f] for r in repeats)
    return {
        "tether_step_cpu_s": side("tether", "step_cpu_s"),
        "trl_step_cpu_s": side("trl", "step_cpu_s"),
        "ratio": statistics.median(ratios),
        "ratio_range": [min(ratios), max(ratios)],
        "tether_peak_mib": side("tether", "peak_mib"),
        "trl_peak_mib": side("trl", "peak_mib"),
        "rss_ratio": statistics.median(rss),
        "rss_ratio_range": [min(rss), max(rss)],
    }


def shares(inside: dict) -> str:
    """generate+score / log-probs / update as shares of their sum ("-" for the offline stages)."""
    if "update" not in inside:
        return "-"
    total = sum(inside[p] for p in PHASES)
    return " / ".join(f"{inside[p] / total:.0%}" for p in PHASES)


TARGETS = {"sft": 0.6, "dpo": 0.6, "grpo": 0.75, "rloo": 0.75}


def print_table(summary: dict, precision: str) -> None:
    print(f"\n{precision}: CPU s per step after warm-up, tether / TRL per repeat (median, min-max); peak RSS")
    print(
        f"{'workload':9s} {'tether s':>9s} {'TRL s':>8s} {'ratio':>6s} {'spread':>11s} {'target':>6s} "
        f"{'tether MiB':>10s} {'TRL MiB':>8s} {'RSS ratio':>9s}"
    )
    for name, row in summary.items():
        lo, hi = row["ratio_range"]
        target = f"{TARGETS[name]:.2f}" if name in TARGETS else "-"
        print(
            f"{name:9s} {row['tether_step_cpu_s']:9.2f} {row['trl_step_cpu_s']:8.2f} {row['ratio']:6.2f} "
            f"{lo:5.2f}-{hi:<5.2f} {target:>6s} {row['tether_peak_mib']:10.0f} {row['trl_peak_mib']:8.0f} "
            f"{row['rss_ratio']:9.2f}"
        )


def compare(ctx: dict, names: list[str], repeats: int, steps: int, bf16: bool) -> dict:
    """Every workload, repeats x (tether, TRL) interleaved; the JSON is rewritten after each repeat."""
    precision = "bf16" if bf16 else "fp32"
    result: dict = {"precision": precision, "steps": steps, "repeats": repeats, "runs": {}, "summary": {}}
    for name in names:
        for repeat in range(repeats):
            run = measure(name, WORKLOADS[name], ctx, steps, bf16, f"{name}-{precision}-r{repeat}")
            result["runs"].setdefault(name, []).append(run)
            print(
                f"{name} {precision} repeat {repeat + 1}: tether {run['tether']['step_cpu_s']:.2f} s, "
                f"TRL {run['trl']['step_cpu_s']:.2f} s, ratio {run['ratio']:.2f}",
                flush=True,
            )
            ctx["save"](result)
        result["summary"][name] = summarise(result["runs"][name])
    ctx["save"](result)
    print_table(result["summary"], precision)
    for name in names:
        run = result["runs"][name][-1]
        t, r = run["tether"]["inside"], run["trl"]["inside"]
        print(
            f"  {name}: inside the runs, tether {t['step_s']:.2f} s/step (wall) {shares(t)}, "
            f"TRL {r['step_s']:.2f} s/step (CPU) {shares(r)}; tether forwards {t['forwards']}"
        )
    return result


def growth(ctx: dict, repeats: int, steps: int, bf16: bool) -> dict:
    """GRPO against group size (4, 8, 16) and response budget (32, 64, 128 tokens), 4 prompts per step."""
    precision = "bf16" if bf16 else "fp32"
    result: dict = {"precision": precision, "steps": steps, "repeats": repeats, "cells": []}
    for group in (4, 8, 16):
        for tokens in (32, 64, 128):
            s = dict(WORKLOADS["grpo"], group_size=group, max_new_tokens=tokens)
            runs = [measure("grpo", s, ctx, steps, bf16, f"growth-g{group}-t{tokens}-r{r}") for r in range(repeats)]
            cell = {"group_size": group, "max_new_tokens": tokens, **summarise(runs), "runs": runs}
            result["cells"].append(cell)
            ctx["save"](result)
            t, r = runs[-1]["tether"]["inside"], runs[-1]["trl"]["inside"]
            print(
                f"G {group:2d} T {tokens:3d}: tether {cell['tether_step_cpu_s']:6.2f} s  TRL "
                f"{cell['trl_step_cpu_s']:6.2f} s  ratio {cell['ratio']:.2f}  phases tether {shares(t)}  "
                f"TRL {shares(r)}",
                flush=True,
            )
    return result


def provenance() -> dict:
    """The commit, the date and the libraries: figures depend on all three (and on the machine)."""
    from importlib.metadata import version

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    return {
        "commit": commit.stdout.strip(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "command": " ".join(sys.argv),
        **{lib: version(lib) for lib in ("torch", "transformers", "trl", "accelerate")},
        "taskset": bool(shutil.which("taskset")),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lab", default="", help="A folder with the lab's world/ and sft/final (tokenizer).")
    parser.add_argument("--work", default="runs/vs-trl", help="Folder for the model, the data and the runs.")
    parser.add_argument("--workloads", default="sft,dpo,rm,grpo,rloo")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=4, help="Steps measured after the warm-up step.")
    parser.add_argument("--bf16", action="store_true", help="tether --mixed-precision bf16; TRL bf16=True.")
    parser.add_argument("--growth", action="store_true", help="The GRPO growth table instead of the workloads.")
    parser.add_argument("--json", default="", help="Default: <work>/vs_trl[_growth]_<precision>.json")
    args = parser.parse_args()
    unknown = set(args.workloads.split(",")) - set(WORKLOADS)
    if unknown or args.steps < 1 or args.repeats < 1:
        parser.error(f"unknown workloads {sorted(unknown)} or --steps/--repeats below 1")
    work = Path(args.work).resolve()
    lab = prepare_lab(Path(args.lab).resolve() if args.lab else work / "lab")
    precision = "bf16" if args.bf16 else "fp32"
    target = Path(args.json or work / f"vs_trl{'_growth' if args.growth else ''}_{precision}.json")
    origin = provenance()
    ctx = {
        "work": work,
        "world": lab / "world",
        "model": stages.build_model(lab, work / "model30m"),
        "files": trl_files(lab / "world", work / "trl_data", seed=0),
        "save": lambda result: target.write_text(json.dumps({"provenance": origin, **result}, indent=1)),
    }
    if args.growth:
        growth(ctx, args.repeats, args.steps, args.bf16)
    else:
        compare(ctx, args.workloads.split(","), args.repeats, args.steps, args.bf16)
    print(f"\nwritten: {target}")


if __name__ == "__main__":
    main()
