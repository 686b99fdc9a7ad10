"""1 process vs 2, DDP vs FSDP, fp32 vs bf16, with and without gradient checkpointing: step times and peak memory.

    .venv/bin/python bench/scaling.py --lab runs/lab            # after `make lab`; writes bench-scaling/results.json

Every figure comes from one run of this script on this machine, and the comparisons are ratios within it:
- the lab's SFT stage settings (batch 64, from the lab's pretrained model), 20 steps, on 1 process, on 2 processes
  (data parallel) and on 2 processes with --fsdp: mean step time after the first step, and each process's peak
  resident memory;
- the lab's GRPO stage (arithmetic, outcome reward, 32 prompts x 8 from the lab's SFT model), 8 steps with
  --response-seeds, on 1 and on 2 processes: step time, and whether both runs trained the same model (they must:
  tests/test_online_parallel.py), measured by `tether eval` on held-out arithmetic;
- memory layouts on a wider random model (about 30 M parameters, where model state shows above the Python and
  torch runtime): SFT steps in fp32, --mixed-precision bf16, --dtype bf16, --gradient-checkpointing, and on 2
  processes with and without --fsdp (16 sequences of up to 128 tokens a step).
Processes are limited to one thread each (OMP_NUM_THREADS=1), so 2 processes use this machine's 2 cores; the
1-process runs are measured with 1 thread (the same per-process work) and with 2 threads (the same cores).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tether(args: list[str], processes: int, out: Path, log: Path, threads: int = 1) -> dict:
    """Run a tether command on N processes of ``threads`` threads each; returns its summary.json."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false"}
    launcher = (
        [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--multi_gpu",
            "--num_processes",
            str(processes),
            "--num_machines",
            "1",
            "--mixed_precision",
            "no",
            "--dynamo_backend",
            "no",
            "--main_process_port",
            str(free_port()),
            "-m",
            "tether",
        ]
        if processes > 1
        else [sys.executable, "-m", "tether"]
    )
    t0 = time.perf_counter()
    with log.open("w") as handle:
        proc = subprocess.run(
            launcher + args + ["--output", str(out), "--overwrite", "--report-to", "none"],
            env=env,
            cwd=ROOT,
            stdout=handle,
            stderr=subprocess.STDOUT,
        )
    if proc.returncode != 0:
        raise SystemExit(f"failed ({proc.returncode}): see {log}")
    summary = json.loads((out / "summary.json").read_text())
    summary["bench_wall_s"] = time.perf_counter() - t0
    return summary


def metrics(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]


def sft_step_s(out: Path) -> float:
    return statistics.mean(m["time/step_s"] for m in metrics(out)[1:] if "time/step_s" in m)


def grpo_step_s(out: Path) -> float:
    phases = ("time/generate_score_s", "time/logprobs_s", "time/update_s")
    return statistics.mean(sum(m[p] for p in phases) for m in metrics(out)[1:])


def arith_accuracy(model: Path, data: Path, out: Path) -> float:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "tether",
            "eval",
            "--model",
            str(model),
            "--task",
            "lab-arith",
            "--data",
            str(data),
            "--limit",
            "200",
            "--output",
            str(out),
        ],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    return json.loads(out.read_text())["accuracy"]


def wide_model(lab: Path, folder: Path) -> Path:
    if (folder / "config.json").is_file():
        return folder
    from tether.models.lm import build_tiny_model, load_tokenizer

    return build_tiny_model(
        "llama", load_tokenizer(lab / "sft" / "final"), folder, hidden=512, layers=8, heads=8, max_positions=512
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lab", default="runs/lab", help="A finished `tether lab` folder.")
    parser.add_argument("--out", default="bench-scaling", help="Where the runs and results.json go.")
    args = parser.parse_args()
    lab, out = Path(args.lab).resolve(), Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    world = lab / "world"
    results: dict = {"machine": f"{os.cpu_count()} cores", "rows": []}

    def record(group: str, layout: str, summary: dict, step_s: float, **extra) -> None:
        row = {
            "group": group,
            "layout": layout,
            "step_s": round(step_s, 4),
            "peak_rss_mib": summary["peak_memory"]["rss_mib"],
            **extra,
        }
        results["rows"].append(row)
        print(json.dumps(row), flush=True)

    sft = [
        "sft",
        "--model",
        str(lab / "pretrain" / "final"),
        "--data",
        str(world / "sft.jsonl"),
        "--eval-data",
        str(world / "sft_eval.jsonl"),
        "--max-length",
        "256",
        "--batch-size",
        "64",
        "--micro-batch-size",
        "32",
        "--lr",
        "5e-4",
        "--max-steps",
        "20",
        "--eval-every",
        "0",
        "--save-every",
        "0",
        "--log-every",
        "1",
    ]
    for layout, n, threads, extra in (
        ("1 process", 1, 1, []),
        ("1 process, 2 threads", 1, 2, []),
        ("2 processes", 2, 1, []),
        ("2 processes --fsdp", 2, 1, ["--fsdp"]),
    ):
        run = out / f"sft-{n}x{threads}{'-fsdp' if extra else ''}"
        record(
            "lab SFT model (0.66 M)",
            layout,
            tether(sft + extra, n, run, run.with_suffix(".log"), threads),
            sft_step_s(run),
            final_loss=metrics(run)[-1]["train/loss"],
        )

    grpo = [
        "grpo",
        "--model",
        str(lab / "sft" / "final"),
        "--prompts",
        str(world / "arith_rl.jsonl"),
        "--reward",
        "tether.lab.rewards:arith_correct",
        "--reward",
        "tether.lab.rewards:arith_format=0.5",
        "--prompts-per-step",
        "32",
        "--group-size",
        "8",
        "--max-new-tokens",
        "48",
        "--lr",
        "5e-5",
        "--max-steps",
        "8",
        "--eval-every",
        "0",
        "--save-every",
        "0",
        "--sample-every",
        "1",
        "--response-seeds",
    ]
    for name, n, threads in (("1 process", 1, 1), ("1 process, 2 threads", 1, 2), ("2 processes", 2, 1)):
        run = out / f"grpo-{n}x{threads}"
        summary = tether(grpo, n, run, run.with_suffix(".log"), threads)
        record(
            "lab GRPO (arith, 32 x 8)",
            name,
            summary,
            grpo_step_s(run),
            held_out_accuracy=arith_accuracy(run / "final", world / "arith_eval.jsonl", run.with_suffix(".eval.json")),
            score_mean=statistics.mean(m["score/mean"] for m in metrics(run)),
        )
    same = [json.loads(x)["response"] for x in (out / "grpo-1x1" / "samples.jsonl").read_text().splitlines()] == [
        json.loads(x)["response"] for x in (out / "grpo-2x1" / "samples.jsonl").read_text().splitlines()
    ]
    results["grpo_same_samples_on_1_and_2_processes"] = same
    results["sft_accuracy_before_grpo"] = arith_accuracy(
        lab / "sft" / "final", world / "arith_eval.jsonl", out / "sft-model.eval.json"
    )

    wide = wide_model(lab, out / "wide-model")
    short = [
        "sft",
        "--model",
        str(wide),
        "--data",
        str(world / "sft.jsonl"),
        "--max-length",
        "128",
        "--batch-size",
        "16",
        "--micro-batch-size",
        "8",
        "--lr",
        "5e-4",
        "--max-steps",
        "4",
        "--eval-every",
        "0",
        "--save-every",
        "0",
        "--log-every",
        "1",
        "--eval-fraction",
        "0",
    ]
    for layout, n, extra in (
        ("fp32", 1, []),
        ("--mixed-precision bf16", 1, ["--mixed-precision", "bf16"]),
        ("--dtype bf16", 1, ["--dtype", "bf16"]),
        ("--gradient-checkpointing", 1, ["--gradient-checkpointing"]),
        ("2 processes", 2, []),
        ("2 processes --fsdp", 2, ["--fsdp"]),
    ):
        run = out / f"wide-{layout.strip('-').replace(' ', '-')}"
        record(
            "wide random model (SFT)", layout, tether(short + extra, n, run, run.with_suffix(".log")), sft_step_s(run)
        )
    (out / "results.json").write_text(json.dumps(results, indent=2))
    print(f"results: {out / 'results.json'}")


if __name__ == "__main__":
    main()
