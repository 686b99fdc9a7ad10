"""bf16 against fp32 on a lab stage: the same SFT from the lab's pretrained model, the learning curve and the step time.

    .venv/bin/python bench/precision_lab.py --lab runs/lab                        # 150 steps, seeds 0 and 1
    .venv/bin/python bench/precision_lab.py --lab runs/lab --steps 450 --seeds 0,1,2

Each run is `tether sft` with the lab's SFT recipe (its data, batch, learning rate, completion-only loss) for
``--steps`` steps, evaluated on the lab's held-out demonstrations every ``--steps // 5`` steps, in three
precisions:

- ``fp32``: the default;
- ``autocast``: ``--mixed-precision bf16`` (forwards in bf16, weights, gradients and AdamW states in fp32);
- ``bf16``: ``--dtype bf16`` (everything in bf16; no fp32 master weights).

Printed per precision: the held-out loss at each evaluation (mean over seeds, and the spread between seeds: the
noise a precision's difference must exceed) and the median step time. Runs are sequential in one process each;
compare within one run of this script.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

PRECISIONS = {"fp32": [], "autocast": ["--mixed-precision", "bf16"], "bf16": ["--dtype", "bf16"]}


def run(lab: Path, out: Path, precision: str, seed: int, steps: int) -> dict:
    from tether.lab.settings import LabConfig

    cfg = LabConfig()
    world = lab / "world"
    folder = out / f"{precision}-seed{seed}"
    command = [
        sys.executable,
        "-m",
        "tether",
        "sft",
        "--model",
        str(lab / "pretrain" / "final"),
        "--data",
        str(world / "sft.jsonl"),
        "--eval-data",
        str(world / "sft_eval.jsonl"),
        "--max-length",
        str(cfg.pack_length),
        "--batch-size",
        str(cfg.sft_batch),
        "--micro-batch-size",
        str(cfg.sft_batch),
        "--lr",
        str(cfg.sft_lr),
        "--warmup-ratio",
        "0.05",
        "--max-steps",
        str(steps),
        "--eval-every",
        str(max(1, steps // 5)),
        "--save-every",
        "0",
        "--seed",
        str(seed),
        "--report-to",
        "none",
        "--overwrite",
        "--output",
        str(folder),
        *PRECISIONS[precision],
    ]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    curve = {r["step"]: r["eval/loss"] for r in rows if "eval/loss" in r}
    return {"curve": curve, "step_s": statistics.median(r["time/step_s"] for r in rows if "time/step_s" in r)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lab", default="runs/lab")
    parser.add_argument("--out", default="runs/bench-precision")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--precisions", default="fp32,autocast,bf16")
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    results = {
        p: [run(Path(args.lab), Path(args.out), p, s, args.steps) for s in seeds] for p in args.precisions.split(",")
    }
    steps = sorted(results[next(iter(results))][0]["curve"])
    print(f"held-out loss of the lab's SFT, {args.steps} steps, seeds {seeds}: mean (spread max - min)")
    print(f"{'precision':10s} " + " ".join(f"{'step ' + str(s):>16s}" for s in steps) + f" {'step s':>8s}")
    for p, runs in results.items():
        cells = []
        for s in steps:
            values = [r["curve"][s] for r in runs]
            cells.append(f"{statistics.mean(values):8.4f} ({max(values) - min(values):.4f})")
        print(
            f"{p:10s} " + " ".join(f"{c:>16s}" for c in cells) + f" {statistics.median(r['step_s'] for r in runs):8.3f}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
