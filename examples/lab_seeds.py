"""The lab's headline stages over seeds: each figure's mean, spread and per-seed values.

A seed is a whole lab of its own: its world (other problems, requests, pairs and votes), its tokenizer and base
model, and every stage after them. The headline stages are pretrain, sft, eval, both reward models, PPO at
β = 0 and β = 0.2, GRPO with outcome rewards, and offline DPO (sigmoid) on the annotators' pairs and on the SFT
model's own samples; the other stages are left out.

    .venv/bin/python examples/lab_seeds.py --seeds 0,1,2 [--lab runs/lab] [--json runs/lab-seeds.json]

Seed 0 runs into --lab, so the stages `make lab` already computed there are reused (its summary and report are
left as they are); seed k runs into <lab>-seed<k>. `--base-only` stops after pretraining and reports the base
model's greedy arithmetic and held-out pretraining loss per seed (what the pretraining recipe's robustness is
measured with); `--vocab N` trains an N-token vocabulary instead of the recipe's (folders <lab>-vocab<N>[-seed<k>]):

    .venv/bin/python examples/lab_seeds.py --seeds 0,1,2 --base-only
    .venv/bin/python examples/lab_seeds.py --seeds 0 --base-only --vocab 768

The spread is the sample standard deviation over seeds, next
to the range; each seed's evaluation also carries its own 95 % bootstrap interval over prompts (summary.json).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import replace
from pathlib import Path

import transformers

from tether.config import ConfigError
from tether.lab.pipeline import run_base, run_lab
from tether.lab.settings import QUICK, LabConfig, lab_settings

HEADLINE = dict(
    agent_stages=False,
    grpo_rewards=("outcome",),
    ppo_kl_coefs=(0.0, 0.2),
    ppo_adaptive_target=0,
    dpo_losses=("sigmoid",),
    dpo_nll_coef=0.0,
    dpo_unfiltered=False,
    dpo_online=False,
)


def seed_config(base: LabConfig, seed: int, changes: dict) -> LabConfig:
    """The lab of one seed: the headline stages of ``base``, with the items of --set over the headline's own choices
    (dpo_online=true runs the online DPO stage too)."""
    return replace(base, seed=seed, **{**HEADLINE, **changes})


def headline(summary: dict) -> dict[str, float]:
    """The figures the lab's headline table leads with, as numbers."""
    ev, ppo, dpo = summary["eval"], summary["ppo"], summary["dpo"]
    alarms = ppo["ppo_kl0"]["alarms"]
    return {
        "base arith accuracy (greedy)": ev["base"]["arith_greedy"]["accuracy"],
        "SFT arith accuracy (greedy)": ev["sft"]["arith_greedy"]["accuracy"],
        "SFT assist gold (sampled)": ev["sft"]["assist_sampled"]["gold_reward"],
        "rm_filtered accuracy vs gold": summary["reward_models"]["rm_filtered"]["gold_accuracy"],
        "PPO β=0.2 gold at the end": ppo["ppo_kl0.2"]["final_gold"],
        "PPO β=0.2 win rate vs SFT": ppo["ppo_kl0.2"]["final_win_rate"],
        "PPO β=0 gold peak": ppo["ppo_kl0"]["peak_gold"],
        "PPO β=0 gold at the end": ppo["ppo_kl0"]["final_gold"],
        "PPO β=0 proxy at the end": ppo["ppo_kl0"]["final_proxy"],
        "PPO β=0 first alarm (step; 0 = none)": float(alarms[0]["step"]) if alarms else 0.0,
        "DPO sigmoid gold at the end": dpo["dpo_sigmoid"]["final_gold"],
        "DPO sigmoid win rate vs SFT": dpo["dpo_sigmoid"]["final_win_rate"],
        "DPO sigmoid on SFT samples win rate vs SFT": dpo["dpo_sigmoid_sft_samples"]["final_win_rate"],
        "GRPO outcome arith greedy: start": summary["grpo"]["grpo_outcome"]["start_accuracy_greedy"],
        "GRPO outcome arith greedy: end": summary["grpo"]["grpo_outcome"]["final_accuracy_greedy"],
    }


def base_figures(base: dict) -> dict[str, float]:
    return {
        "vocabulary (tokens)": float(base["vocab"]),
        "base arith accuracy (greedy)": base["arith_greedy"]["accuracy"],
        "base arith step accuracy (greedy)": base["arith_greedy"]["step_accuracy"],
        "base: addition steps right (of those written)": base["arith_greedy"]["addition_steps_right"],
        "base: subtraction steps right (of those written)": base["arith_greedy"]["subtraction_steps_right"],
        "pretraining held-out loss at the end": base["curve"][-1][1],
        "pretraining seconds": base["seconds"],
    }


def spread(values: list[float]) -> dict[str, float]:
    return {
        "mean": statistics.fmean(values),
        "sd": statistics.stdev(values) if len(values) > 1 else 0.0,
        "min": min(values),
        "max": max(values),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2", help="Comma-separated seeds.")
    parser.add_argument("--lab", default="runs/lab", help="Seed 0's lab folder; seed k goes to <lab>-seed<k>.")
    parser.add_argument("--json", default="", help="Write the per-seed figures and their spread here.")
    parser.add_argument("--quick", action="store_true", help="The quick lab's world and model (the tests use it).")
    parser.add_argument("--base-only", action="store_true", help="Stop after pretraining: the base model's figures.")
    parser.add_argument(
        "--vocab", type=int, default=0, help="Vocabulary size instead of the recipe's (0: the recipe's)."
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="Another value for a LabConfig field (repeatable), e.g. pretrain_lr_schedule=constant; "
        "the folders get a suffix naming it.",
    )
    parser.add_argument("--workers", type=int, default=1, help="Processes running a lab's ready stages side by side.")
    args = parser.parse_args()
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    seeds = [int(s) for s in args.seeds.split(",")]
    try:
        changes = lab_settings(args.set)
    except ConfigError as err:
        raise SystemExit(str(err)) from None
    per_seed, seconds = {}, {}
    for seed in seeds:
        lab = f"{args.lab}-vocab{args.vocab}" if args.vocab else args.lab
        lab += "".join(f"-{k}={v}" for k, v in changes.items())
        folder = Path(lab if seed == 0 else f"{lab}-seed{seed}")
        cfg = seed_config(QUICK if args.quick else LabConfig(), seed, changes)
        cfg = replace(cfg, vocab_size=args.vocab) if args.vocab else cfg
        start = time.perf_counter()
        if args.base_only:
            per_seed[seed] = base_figures(run_base(folder, cfg))
        else:
            per_seed[seed] = headline(run_lab(folder, cfg, report=False, workers=args.workers))
        seconds[seed] = round(time.perf_counter() - start, 1)
    names = list(per_seed[seeds[0]])
    table = {
        name: {**spread([per_seed[s][name] for s in seeds]), "seeds": {s: per_seed[s][name] for s in seeds}}
        for name in names
    }
    width = max(map(len, names))
    print(f"\nthe lab's headline figures over seeds {args.seeds} (mean ± sample sd [min, max]; per seed)")
    for name, row in table.items():
        print(
            f"{name:<{width}}  {row['mean']:6.3f} ± {row['sd']:.3f} [{row['min']:.3f}, {row['max']:.3f}]  "
            + " ".join(f"{v:.3f}" for v in row["seeds"].values())
        )
    print("seconds per seed: " + ", ".join(f"{s}: {t:.0f}" for s, t in seconds.items()))
    if args.json:
        Path(args.json).write_text(json.dumps({"figures": table, "seconds": seconds}, indent=1))


if __name__ == "__main__":
    main()
