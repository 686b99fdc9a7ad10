"""bf16 sampling under an fp32 trainer, timed: GRPO on the 29.9 M-parameter Llama of bench/stages.py, each phase.

    .venv/bin/python bench/sampling_dtype.py --lab runs/lab                     # hf and vllm, 2 repeats
    .venv/bin/python bench/sampling_dtype.py --lab runs/lab --backends hf --repeats 3

For each backend, `tether grpo` runs with the trained weights' own dtype (fp32) and with `--sampling-dtype bf16
--off-policy-correction token_truncate --is-ratio-max 2`, interleaved (fp32, bf16, fp32, bf16, ...), each a fresh process on one pinned core with one thread
(bench/stages.py run_once). Printed per arm: the median over steps after the first of each logged phase
(time/generate_s is sampling with the reward; time/update_s the forward, backward and AdamW), the step, its ratio
to the fp32 arm of the same backend and repeat (median and range over repeats), and the sampler gap (median
rollout/sampler_kl). The learning side (gold and accuracy curves on the lab's own stages) is
bench/precision_online.py --precisions fp32,bf16_sampling.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _bench_module(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


stages = _bench_module("stages")


def grpo_args(lab: Path, model: Path, out: Path, backend: str, steps: int) -> list[str]:
    return [
        "grpo",
        "--model",
        str(model),
        "--prompts",
        str(lab / "world" / "arith_rl.jsonl"),
        "--reward",
        "tether.lab.rewards:arith_correct,tether.lab.rewards:arith_format=0.5",
        "--max-steps",
        str(steps),
        "--prompts-per-step",
        "8",
        "--group-size",
        "4",
        "--max-new-tokens",
        "48",
        "--lr",
        "1e-6",
        "--eval-every",
        "0",
        "--rollout-backend",
        backend,
        "--output",
        str(out),
        "--report-to",
        "none",
        "--save-every",
        "0",
        "--overwrite",
        "--seed",
        "0",
    ]


def phases(out: Path) -> dict:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    later = [r for r in rows if r.get("step", 0) > 1]
    result = {k: statistics.median(r.get(k, 0.0) for r in later) for k in later[0] if k.startswith("time/")}
    result["step_s"] = statistics.median(sum(v for k, v in r.items() if k.startswith("time/")) for r in later)
    gap = [r["rollout/sampler_kl"] for r in later if "rollout/sampler_kl" in r]
    if gap:
        result["sampler_kl"] = statistics.median(gap)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lab", default="runs/lab", help="A finished `tether lab` folder (tokenizer and data).")
    parser.add_argument("--backends", default="hf,vllm")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--work", default="runs/bench-sampling-dtype")
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    lab, work = Path(args.lab).resolve(), Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    model = stages.build_model(lab, work / "model-29m")
    arms = {
        "fp32": [],
        "bf16": ["--sampling-dtype", "bf16", "--off-policy-correction", "token_truncate", "--is-ratio-max", "2"],
    }
    results: dict = {}
    for backend in args.backends.split(","):
        for repeat in range(args.repeats):
            for arm, extra in arms.items():
                out = work / f"{backend}-{arm}-{repeat}"
                run = stages.run_once([*grpo_args(lab, model, out, backend, args.steps), *extra], None)
                results.setdefault(backend, {}).setdefault(arm, []).append({**run, **phases(out)})
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    for backend, by_arm in results.items():
        print(f"\n{backend}: median seconds per step after the first ({args.repeats} repeats, steps {args.steps})")
        keys = sorted(k for k in by_arm["fp32"][0] if k.startswith("time/"))
        print(f"{'arm':6s} " + " ".join(f"{k.removeprefix('time/'):>14s}" for k in keys) + f" {'step':>8s} ratio")
        for arm, runs in by_arm.items():
            cells = [statistics.median(r[k] for r in runs) for k in keys]
            ratios = [r["step_s"] / b["step_s"] for r, b in zip(runs, by_arm["fp32"])]
            step = statistics.median(r["step_s"] for r in runs)
            line = " ".join(f"{c:14.3f}" for c in cells) + f" {step:8.3f} {statistics.median(ratios):.2f}"
            line += f" [{min(ratios):.2f}, {max(ratios):.2f}]"
            gap = [r["sampler_kl"] for r in runs if "sampler_kl" in r]
            print(f"{arm:6s} {line}" + (f"  sampler KL {statistics.median(gap):.2e}" if gap else ""))


if __name__ == "__main__":
    main()
