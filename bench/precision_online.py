"""bf16 against fp32 on the lab's online stages: PPO (β = 0.2) and GRPO (outcome), learning curve and step time.

    .venv/bin/python bench/precision_online.py --lab runs/lab                       # seeds 0 and 1, both stages
    .venv/bin/python bench/precision_online.py --lab runs/lab --stages grpo --seeds 0,1,2
    .venv/bin/python bench/precision_online.py --lab runs/lab --precisions fp32,bf16_sampling

Each run is the lab's own stage (`run_lab_ppo` with the ppo_kl0.2 settings, `run_lab_grpo` with grpo_outcome's,
from the lab's SFT model and reward model, gold evaluations included) with the training seed given, in two
precisions (``--precisions``, two of):

- ``fp32``: the default;
- ``autocast``: ``model.mixed_precision = bf16`` (every forward, sampling included, under bf16 autocast; weights,
  gradients and AdamW states in fp32);
- ``bf16_sampling``: ``rollout.sampling_dtype = bf16`` with token_truncate at 2 (``rollout.off_policy_correction``, ``rollout.is_ratio_max``) (a bfloat16 copy of the
  policy samples; the trainer stays fp32 and corrects the sampler gap by truncated importance sampling).

The two precisions of one seed run side by side, each a fresh process on its own core with one thread, so both
share the machine's load; step times are compared within such a pair. Printed per stage and precision: the
figure the stage exists to move at each evaluation (PPO: gold reward; GRPO: greedy arithmetic accuracy), as the
mean over seeds with the spread between seeds (the noise a precision's difference must exceed), and the median
step time (the sum of the logged phases, steps after the first).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

from tether.lab.settings import PRECISIONS  # the lab's own (`tether lab --set precision=NAME`)

FIGURE = {"ppo": "gold", "grpo": "accuracy_greedy"}


def run_one(lab: Path, folder: Path, stage: str, precision: str, seed: int) -> None:
    """One run in this process (called through ``--one``); writes result.json into folder."""
    from tether.lab.rl import run_lab_grpo, run_lab_ppo
    from tether.lab.settings import LabConfig, precision_settings

    cfg, extra = LabConfig(), precision_settings(precision, samples=True, policy_gradient=True)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    if stage == "ppo":
        figures = run_lab_ppo(
            folder,
            False,
            lab=lab,
            reward_model=cfg.ppo_reward_model,
            kl_coef=0.2,
            adaptive_target=0.0,
            steps=cfg.ppo_steps,
            prompts_per_step=cfg.ppo_prompts_per_step,
            lr=cfg.ppo_lr,
            eval_every=cfg.ppo_eval_every,
            eval_samples=cfg.ppo_eval_samples,
            seed=seed,
            kl_horizon=cfg.ppo_kl_horizon,
            extra=extra,
        )
    else:
        figures = run_lab_grpo(
            folder,
            False,
            lab=lab,
            recipe=cfg.grpo_recipe,
            rewards="outcome",
            steps=cfg.grpo_steps,
            prompts_per_step=cfg.grpo_prompts_per_step,
            group_size=cfg.grpo_group_size,
            lr=cfg.grpo_lr,
            eval_every=cfg.grpo_eval_every,
            eval_problems=cfg.grpo_eval_problems,
            seed=seed,
            extra=extra,
        )
    metrics = [json.loads(line) for line in (folder / "run" / "metrics.jsonl").read_text().splitlines() if line.strip()]
    later = [m for m in metrics if m.get("step", 0) > 0][1:]
    steps = [sum(v for k, v in m.items() if k.startswith("time/")) for m in later]
    phases = {k: statistics.median(m.get(k, 0.0) for m in later) for k in later[0] if k.startswith("time/")}
    gap = [m["rollout/sampler_kl"] for m in later if "rollout/sampler_kl" in m]
    curve = {c["step"]: c[FIGURE[stage]] for c in figures["curve"]}
    result = {"curve": curve, "step_s": statistics.median(steps), "phases": phases}
    if gap:
        result["sampler_kl_median"] = statistics.median(gap)
    (folder / "result.json").write_text(json.dumps(result))


def launch(lab: Path, folder: Path, stage: str, precision: str, seed: int, core: int) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    command = [sys.executable, __file__, "--one", stage, precision, str(seed), "--lab", str(lab), "--out", str(folder)]
    if shutil.which("taskset") and (os.cpu_count() or 1) > core:
        command = ["taskset", "-c", str(core), *command]
    return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=open(folder.with_suffix(".log"), "w"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lab", default="runs/lab")
    parser.add_argument("--out", default="runs/bench-precision-online")
    parser.add_argument("--stages", default="ppo,grpo")
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--precisions", default="fp32,autocast", help="two of: " + ", ".join(PRECISIONS))
    parser.add_argument("--json", default="")
    parser.add_argument("--one", nargs=3, metavar=("STAGE", "PRECISION", "SEED"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    lab, out = Path(args.lab).resolve(), Path(args.out).resolve()
    if args.one:
        run_one(lab, out, args.one[0], args.one[1], int(args.one[2]))
        return
    out.mkdir(parents=True, exist_ok=True)
    seeds = [int(s) for s in args.seeds.split(",")]
    precisions = args.precisions.split(",")
    if len(precisions) != 2 or not set(precisions) <= set(PRECISIONS):
        raise SystemExit(f"--precisions: two of {', '.join(PRECISIONS)}, got {args.precisions}")
    results: dict = {}
    for stage in args.stages.split(","):
        for seed in seeds:
            procs = {
                p: launch(lab, out / f"{stage}-{p}-seed{seed}", stage, p, seed, core)
                for core, p in enumerate(precisions)
            }
            for p, proc in procs.items():
                if proc.wait() != 0:
                    raise SystemExit(f"{stage} {p} seed {seed} failed: see {out / f'{stage}-{p}-seed{seed}.log'}")
                result = json.loads((out / f"{stage}-{p}-seed{seed}" / "result.json").read_text())
                results.setdefault(stage, {}).setdefault(p, []).append(result)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    for stage, by_precision in results.items():
        steps = sorted(by_precision[precisions[0]][0]["curve"], key=int)
        print(f"\n{stage}: {FIGURE[stage]} at each evaluation, seeds {seeds}: mean (spread max - min)")
        print(f"{'precision':14s} " + " ".join(f"{'step ' + s:>15s}" for s in steps) + f" {'step s':>8s} {'ratio':>6s}")
        base = statistics.median(r["step_s"] for r in by_precision[precisions[0]])
        for p, runs in by_precision.items():
            cells = []
            for s in steps:
                values = [r["curve"][s] for r in runs]
                cells.append(f"{statistics.mean(values):.3f} ({max(values) - min(values):.3f})")
            step = statistics.median(r["step_s"] for r in runs)
            print(f"{p:14s} " + " ".join(f"{c:>15s}" for c in cells) + f" {step:8.3f} {step / base:6.2f}")
        for p, runs in by_precision.items():
            phases = {k: statistics.median(r["phases"][k] for r in runs) for k in runs[0]["phases"]}
            gap = [r["sampler_kl_median"] for r in runs if "sampler_kl_median" in r]
            print(f"  {p}: median phases " + ", ".join(f"{k} {v:.3f} s" for k, v in sorted(phases.items())))
            if gap:
                print(f"  {p}: sampler KL (k3, median step) {', '.join(f'{g:.2e}' for g in gap)}")


if __name__ == "__main__":
    main()
