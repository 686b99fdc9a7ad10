"""Before/after: the stages' real commands on a ~30 M-parameter Llama and the lab's data, timed as whole processes.

    .venv/bin/python bench/stages.py --lab runs/lab                                  # this checkout
    .venv/bin/python bench/stages.py --lab runs/lab --source /path/to/older/checkout  # another tether, same venv
    .venv/bin/python bench/stages.py --lab runs/lab --stages sft,dpo --vocab 151936   # a Qwen-sized vocabulary
    .venv/bin/python bench/stages.py --lab runs/lab --stages sft,dpo --source . --this-flags=--chunked-head  # an option

Each workload (sft, rm, dpo, ppo on the 30 M model; grpo_lab and ppo_lab: the lab's own SFT model, reward
model and settings, whose responses end at different lengths) runs as `python -m tether <stage> ...` in a fresh process on one pinned core with
one thread (OMP_NUM_THREADS=1, taskset -c 0 where present), `--repeats` times interleaved with the other checkout
when `--source` is given. Reported per run: the median `time/step_s` of metrics.jsonl (the step alone), the
process's CPU seconds and wall seconds (start-up, data, reference pass, probes, final save: everything), and its
peak resident memory. `--source DIR` puts an older checkout first on PYTHONPATH, so both use this venv's libraries:
only tether's code differs. Compare ratios within one run; the machine's speed drifts between runs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path


def build_model(lab: Path, folder: Path, vocab: int = 0) -> Path:
    """A 7-layer Llama, hidden 512 (29.9 M parameters), with the lab's tokenizer: random weights, fixed seed. With
    ``vocab`` its embeddings and LM head have that many rows (the data uses the tokenizer's 1,024; the rest are
    there to cost what a large vocabulary's head and log-softmax cost)."""
    if (folder / "config.json").is_file():
        return folder
    from transformers import AutoModelForCausalLM

    from tether.models.lm import build_tiny_model, load_tokenizer

    tokenizer = load_tokenizer(lab / "sft" / "final")
    build_tiny_model("llama", tokenizer, folder, seed=0, hidden=512, layers=7, heads=8, max_positions=512)
    if vocab:
        model = AutoModelForCausalLM.from_pretrained(folder)
        model.resize_token_embeddings(vocab, mean_resizing=False)
        model.save_pretrained(folder)
    return folder


def workloads(lab: Path, model: Path, rm: Path, out: Path) -> dict[str, list[str]]:
    world = lab / "world"
    common = ["--report-to", "none", "--save-every", "0", "--overwrite", "--seed", "0"]
    return {
        "sft": [
            "sft",
            "--model",
            str(model),
            "--data",
            str(world / "sft.jsonl"),
            "--eval-fraction",
            "0",
            "--max-steps",
            "6",
            "--batch-size",
            "16",
            "--micro-batch-size",
            "8",
            "--max-length",
            "256",
            "--output",
            str(out / "sft"),
            *common,
        ],
        "rm": [
            "rm",
            "--model",
            str(model),
            "--data",
            str(world / "prefs.jsonl"),
            "--eval-data",
            str(world / "prefs_eval.jsonl"),
            "--max-steps",
            "6",
            "--batch-size",
            "16",
            "--micro-batch-size",
            "8",
            "--max-length",
            "256",
            "--eval-every",
            "0",
            "--output",
            str(out / "rm"),
            *common,
        ],
        "dpo": [
            "dpo",
            "--model",
            str(model),
            "--data",
            str(world / "prefs.jsonl"),
            "--eval-fraction",
            "0",
            "--max-steps",
            "6",
            "--batch-size",
            "16",
            "--micro-batch-size",
            "8",
            "--max-length",
            "256",
            "--output",
            str(out / "dpo"),
            *common,
        ],
        "ppo": [
            "ppo",
            "--model",
            str(model),
            "--reward-model",
            str(rm),
            "--prompts",
            str(world / "assist_rl.jsonl"),
            "--max-steps",
            "4",
            "--prompts-per-step",
            "8",
            "--max-new-tokens",
            "32",
            "--eval-every",
            "0",
            "--output",
            str(out / "ppo"),
            *common,
        ],
        # the lab's own models and settings: a trained policy's responses end at different lengths (a random
        # model's run to the budget), which is what generation that drops finished rows is for
        "grpo_lab": [
            "grpo",
            "--model",
            str(lab / "sft" / "final"),
            "--prompts",
            str(world / "arith_rl.jsonl"),
            "--reward",
            "tether.lab.rewards:arith_correct,tether.lab.rewards:arith_format=0.5",
            "--max-steps",
            "6",
            "--prompts-per-step",
            "32",
            "--group-size",
            "8",
            "--max-new-tokens",
            "48",
            "--lr",
            "5e-5",
            "--eval-every",
            "0",
            "--output",
            str(out / "grpo_lab"),
            *common,
        ],
        "ppo_lab": [
            "ppo",
            "--model",
            str(lab / "sft" / "final"),
            "--reward-model",
            str(lab / "rm_filtered" / "run" / "final"),
            "--prompts",
            str(world / "assist_rl.jsonl"),
            "--max-steps",
            "6",
            "--prompts-per-step",
            "32",
            "--max-new-tokens",
            "64",
            "--minibatch",
            "16",
            "--lr",
            "5e-5",
            "--kl-coef",
            "0.2",
            "--eval-every",
            "0",
            "--output",
            str(out / "ppo_lab"),
            *common,
        ],
    }


def run_once(args: list[str], source: str | None) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    if source:
        env["PYTHONPATH"] = source
    command = [sys.executable, "-m", "tether", *args]
    if shutil.which("taskset"):
        command = ["taskset", "-c", "0", *command]
    output = Path(args[args.index("--output") + 1])
    shutil.rmtree(output, ignore_errors=True)  # no cache (DPO's reference log-probs) carried over from a run before
    t0 = time.perf_counter()
    # cwd elsewhere: `python -m` puts the working directory first on sys.path, ahead of PYTHONPATH's checkout
    proc = subprocess.Popen(
        command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=output.parent
    )
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    stderr = proc.stderr.read()
    if status != 0:
        raise SystemExit(f"tether {args[0]} failed ({status}): {stderr[-2000:]}")
    rows = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    # offline stages log time/step_s; online ones their phases (time/generate_s, time/update_s, ...), summed here
    steps = [
        r["time/step_s"] if "time/step_s" in r else sum(v for k, v in r.items() if k.startswith("time/"))
        for r in rows
        if r.get("step", 0) > 0
    ]
    steps = steps[1:] or steps  # the first step warms up
    return {
        "step_s": statistics.median(steps),
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "wall_s": wall,
        "peak_mib": usage.ru_maxrss / 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lab", default="runs/lab", help="A finished `tether lab` folder (tokenizer and data).")
    parser.add_argument("--source", default="", help="Another tether checkout to compare (put first on PYTHONPATH).")
    parser.add_argument("--stages", default="sft,rm,dpo,ppo")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--work", default="runs/bench-stages", help="Folder for the model and the runs.")
    parser.add_argument("--json", default="")
    parser.add_argument(
        "--vocab", type=int, default=0, help="Rows of the model's vocabulary (default: the lab's 1,024)."
    )
    parser.add_argument(
        "--this-flags", default="", help="Flags added to this checkout's commands only (e.g. --chunked-head)."
    )
    args = parser.parse_args()
    lab, work = Path(args.lab).resolve(), Path(args.work).resolve()
    for side in ("this", "source"):
        (work / side).mkdir(parents=True, exist_ok=True)
    model = build_model(lab, work / (f"model30m-v{args.vocab}" if args.vocab else "model30m"), args.vocab)
    sides = {
        "this": str(Path(__file__).resolve().parent.parent),
        **({"source": str(Path(args.source).resolve())} if args.source else {}),
    }
    results: dict = {side: {} for side in sides}
    rm_final = work / "this" / "rm" / "final"
    for stage in args.stages.split(","):
        for _ in range(args.repeats):
            for side, source in sides.items():
                plan = workloads(lab, model, rm_final, work / side)[stage]
                if side == "this":
                    plan = plan + args.this_flags.split()
                if stage == "ppo" and not (rm_final / "config.json").is_file():
                    run_once(workloads(lab, model, rm_final, work / "this")["rm"], None)
                results[side].setdefault(stage, []).append(run_once(plan, source))
                if args.json:  # kept as it goes: a long comparison that fails late keeps what it measured
                    Path(args.json).write_text(json.dumps({"runs": results}, indent=2))
    print(f"{'stage':6s} {'side':7s} {'step s':>8s} {'cpu s':>8s} {'wall s':>8s} {'peak MiB':>9s}")
    summary = {}
    for stage in args.stages.split(","):
        for side in sides:
            runs = results[side][stage]
            row = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            summary.setdefault(stage, {})[side] = row
            print(
                f"{stage:6s} {side:7s} {row['step_s']:8.3f} {row['cpu_s']:8.1f} {row['wall_s']:8.1f} {row['peak_mib']:9.0f}"
            )
        if args.source:
            a, b = summary[stage]["this"], summary[stage]["source"]
            ratios = {k: a[k] / b[k] for k in a}
            summary[stage]["ratio"] = ratios
            print(
                f"{stage:6s} {'ratio':7s} {ratios['step_s']:8.2f} {ratios['cpu_s']:8.2f} {ratios['wall_s']:8.2f} "
                f"{ratios['peak_mib']:9.2f}   (this ÷ source)"
            )
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": results, "summary": summary}, indent=2))


if __name__ == "__main__":
    main()
