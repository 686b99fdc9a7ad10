"""How long the command line takes to answer before any work: `tether --help` and each stage's `--help`.

    .venv/bin/python bench/startup.py [--runs 5] [--python OTHER_CHECKOUT/.venv/bin/python]

Each command runs `--runs` times in a fresh process; prints the median and the fastest wall time. A help text needs
only the settings (tether/config.py, tether/sections.py, tether/stages/*_config.py), never torch or transformers.
Timings are machine-dependent and noisy: compare commands within one run, or two checkouts with --python.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

COMMANDS = (["--help"], ["sft", "--help"], ["rm", "--help"], ["dpo", "--help"], ["ppo", "--help"], ["grpo", "--help"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--python", default=sys.executable, help="The interpreter whose tether to time.")
    args = parser.parse_args()
    for command in COMMANDS:
        times = []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            done = subprocess.run([args.python, "-m", "tether", *command], capture_output=True, text=True)
            times.append(time.perf_counter() - t0)
            if done.returncode != 0:
                raise SystemExit(f"tether {' '.join(command)} failed: {done.stderr[-500:]}")
        print(
            f"tether {' '.join(command):14s} median {statistics.median(times):.2f} s, fastest {min(times):.2f} s "
            f"({args.runs} runs)"
        )


if __name__ == "__main__":
    main()
