"""Every group-family recipe on the lab's arith world with the same budget, side by side.

    .venv/bin/python examples/grpo_recipes_on_lab.py --lab runs/lab --steps 40 --output runs/grpo-recipes

Each recipe starts from the lab's SFT model with the outcome rewards (correct answer + 0.5 x format); held-out
accuracy (200 problems, greedy and sampled at T = 1) is measured every 10 steps. Prints one JSON line per
recipe and a table.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import transformers

from tether.lab.rl import run_lab_grpo
from tether.stages.grpo_recipes import RECIPES


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lab", default="runs/lab", help="A finished `tether lab` folder.")
    parser.add_argument("--recipes", default=",".join(RECIPES), help="Comma-separated recipe names.")
    parser.add_argument("--rewards", default="outcome", choices=("outcome", "process"))
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--prompts-per-step", type=int, default=32)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default="runs/grpo-recipes")
    args = parser.parse_args()
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    results = {}
    for name in args.recipes.split(","):
        figures = run_lab_grpo(
            Path(args.output) / name,
            False,
            lab=Path(args.lab),
            recipe=name,
            rewards=args.rewards,
            steps=args.steps,
            prompts_per_step=args.prompts_per_step,
            group_size=args.group_size,
            lr=args.lr,
            eval_every=10,
            eval_problems=200,
            seed=args.seed,
        )
        results[name] = figures
        print(
            json.dumps(
                {
                    "recipe": name,
                    **{k: v for k, v in figures.items() if k != "curve"},
                    "sampled_curve": [c["accuracy_sampled"] for c in figures["curve"]],
                    "greedy_curve": [c["accuracy_greedy"] for c in figures["curve"]],
                    "worked_curve": [c["worked_rate"] for c in figures["curve"]],
                }
            ),
            flush=True,
        )
    from tether.lab.tables import print_grpo_table

    print_grpo_table(results)


if __name__ == "__main__":
    main()
