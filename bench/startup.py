"""How long the command line takes to answer before any work: `tether --help` and each stage's `--help`.

    .venv/bin/python bench/startup.py [--runs 5] [--python OTHER_CHECKOUT/.venv/bin/python]

Each command runs `--runs` times in a fresh process; prints the median and the fastest wall time. A help text needs
only the settings (tether/config.py, tether/sections.py, tether/stages/*_config.py), never torch or transformers.
The last row is what the reward functions' worker process imports before it can load them (tether/rewards/worker.py;
every run with --reward starts one, and another after a call that timed out): neither torch nor transformers either.
Timings are machine-dependent and noisy: compare commands within one run, or two checkouts with --python.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

COMMANDS = (["--help"], ["sft", "--help"], ["rm", "--help"], ["dpo", "--help"], ["ppo", "--help"], ["grpo", "--help"])
REWARD_WORKER = ["-c", "import tether.rewards.worker, tether.rewards.loading"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--python", default=sys.executable, help="The interpreter whose tether to time.")
    args = parser.parse_args()
    for command in [["-m", "tether", *c] for c in COMMANDS] + [REWARD_WORKER]:
        times = []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            done = subprocess.run([args.python, *command], capture_output=True, text=True)
            times.append(time.perf_counter() - t0)
            if done.returncode != 0:
                raise SystemExit(f"{' '.join(command)} failed: {done.stderr[-500:]}")
        name = "the reward worker's imports" if command == REWARD_WORKER else "tether " + " ".join(command[2:])
        print(f"{name:28s} median {statistics.median(times):.2f} s, fastest {min(times):.2f} s ({args.runs} runs)")


if __name__ == "__main__":
    main()
