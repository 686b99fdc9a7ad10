"""The lab's agent stages over seeds: the calculator (GRPO learns to call `calc`) and the shop with the state
reward vs the claim reward, rerun from a finished lab's tool-SFT models with other seeds.

    .venv/bin/python examples/agent_on_lab.py --lab runs/lab --seeds 1,2 --output runs/agents-seeds

Each seed changes the sampling and the prompt order of the GRPO runs (the tool-SFT models and the held-out prompts
stay the lab's). Prints one JSON line per run and, per figure, the mean and the spread (min–max) over the seeds,
the lab's own seed included when its runs are there.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import transformers

from tether.lab.agents import run_lab_agent_grpo
from tether.lab.settings import LabConfig


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def runs_for_seed(lab: Path, out: Path, seed: int, cfg: LabConfig, shop_rewards: list[str]) -> dict:
    common = dict(
        steps=cfg.agent_steps,
        prompts_per_step=cfg.agent_prompts_per_step,
        group_size=cfg.agent_group_size,
        eval_every=cfg.agent_eval_every,
        seed=seed,
        temperature=cfg.agent_temperature,
    )
    results = {
        "calc_grpo": run_lab_agent_grpo(
            out / f"calc_grpo-seed{seed}",
            False,
            model_dir=lab / "calc_sft" / "final",
            env="tether.lab.agents:CalcEnv",
            prompts=lab / "world" / "arith_rl.jsonl",
            eval_rows=read_rows(lab / "world" / "arith_eval.jsonl")[: cfg.calc_eval_problems],
            lr=cfg.calc_lr,
            without_tools=True,
            max_turns=3,
            max_total_tokens=200,
            max_new_tokens=80,
            **common,
        )
    }
    for reward in shop_rewards:
        results[f"shop_{reward}"] = run_lab_agent_grpo(
            out / f"shop_{reward}-seed{seed}",
            False,
            model_dir=lab / "shop_sft" / "final",
            env=f"tether.lab.agents:ShopEnv(reward='{reward}')",
            prompts=lab / "agent_world" / "shop_rl.jsonl",
            eval_rows=read_rows(lab / "agent_world" / "shop_eval.jsonl"),
            lr=cfg.shop_lr,
            max_turns=4,
            max_total_tokens=240,
            max_new_tokens=80,
            **common,
        )
    return results


FIGURES = ("success_rate", "claimed_unverified_rate", "tool_use_rate", "accuracy_no_tools")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lab", default="runs/lab", help="A finished `tether lab` folder (with its agent stages).")
    parser.add_argument("--seeds", default="1,2", help="Comma-separated seeds to run besides the lab's own.")
    parser.add_argument(
        "--shop-rewards",
        default="state,claim",
        help="Shop reward designs: state, claim, calls (1 per call that succeeded).",
    )
    parser.add_argument(
        "--temperature",
        type=float,
        default=LabConfig().agent_temperature,
        help="Sampling temperature of the GRPO runs (the lab's: 0.7).",
    )
    parser.add_argument("--output", default="runs/agents-seeds")
    args = parser.parse_args()
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    lab, out = Path(args.lab), Path(args.output)
    by_run: dict[str, list[dict]] = {}
    summary = lab / "summary.json"
    if summary.is_file() and args.temperature == LabConfig().agent_temperature:  # the lab's own runs (its seed)
        for name, r in json.loads(summary.read_text()).get("agents", {}).items():
            by_run.setdefault(name, []).append(r)
    for seed in [int(s) for s in args.seeds.split(",") if s]:
        cfg = LabConfig(agent_temperature=args.temperature)
        for name, r in runs_for_seed(lab, out, seed, cfg, args.shop_rewards.split(",")).items():
            by_run.setdefault(name, []).append(r)
            print(
                json.dumps(
                    {
                        "run": name,
                        "seed": seed,
                        "start": r["start"],
                        "final": r["final"],
                        "alarms": [(a["monitor"], a["step"]) for a in r["alarms"]],
                    }
                ),
                flush=True,
            )
    for name, results in by_run.items():
        for key in FIGURES:
            finals = [r["final"][key] for r in results if key in r["final"]]
            if finals:
                print(
                    f"{name:12s} {key:26s} end: mean {sum(finals) / len(finals):.3f}, range {min(finals):.3f}–"
                    f"{max(finals):.3f} over {len(finals)} seeds ({', '.join(f'{x:.2f}' for x in finals)})"
                )
        alarms = [sorted({a["monitor"] for a in r["alarms"]}) for r in results]
        print(f"{name:12s} alarms per seed: {alarms}")


if __name__ == "__main__":
    main()
