"""One PPO run on a finished lab with your own settings, gold measured along the way.

`tether lab` already runs a KL sweep (0, 0.05, 0.2) and the adaptive controller; this script is for trying
other settings on the same world:

    .venv/bin/python examples/ppo_on_lab.py --lab runs/lab --kl-coef 0.1 --steps 80 --output runs/ppo-kl0.1
    .venv/bin/python examples/ppo_on_lab.py --lab runs/lab --adaptive-target 4 --output runs/ppo-ada4

It prints the proxy score next to the gold reward and the gold win rate against the SFT model at every
evaluation (4 sampled answers per held-out request), then the run's figures.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import transformers

from tether.lab.rl import run_lab_ppo


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lab", default="runs/lab", help="A finished `tether lab` folder.")
    parser.add_argument("--kl-coef", type=float, default=0.2, help="β (the initial β with --adaptive-target).")
    parser.add_argument("--adaptive-target", type=float, default=0.0, help="Target KL in nats; 0 = fixed β.")
    parser.add_argument("--kl-horizon", type=int, default=160)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default="runs/ppo-lab")
    parser.add_argument(
        "--reward-model",
        default="rm_filtered",
        choices=("rm", "rm_filtered"),
        help="Which of the lab's reward models: trained on all pairs or on the agreed ones.",
    )
    args = parser.parse_args()
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    figures = run_lab_ppo(
        Path(args.output),
        False,
        lab=Path(args.lab),
        reward_model=args.reward_model,
        kl_coef=args.kl_coef,
        adaptive_target=args.adaptive_target,
        steps=args.steps,
        prompts_per_step=32,
        lr=args.lr,
        eval_every=args.eval_every,
        eval_samples=4,
        seed=args.seed,
        kl_horizon=args.kl_horizon,
    )
    for point in figures.pop("curve"):
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in point.items()}))
    print(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
