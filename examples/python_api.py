"""Every stage from Python, on a world built here: worked addition and a tiny random Llama (no downloads).

    .venv/bin/python examples/python_api.py --output runs/api            # sft, rm, dpo, kto, grpo, ppo in turn
    .venv/bin/python examples/python_api.py --output runs/api --stage grpo

Each stage takes in-memory inputs — a `datasets.Dataset`, lists of dicts, a loaded model, Python reward functions —
and returns a RunResult (run.output, run.summary, run.final, run.load()). docs/python-api.md walks through it.
"""

from __future__ import annotations

import argparse
import json
import random
import re
from pathlib import Path

import tether

STAGES = ("sft", "rm", "dpo", "kto", "grpo", "ppo")


def addition_rows(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(0, 20), rng.randint(0, 20)
        rows.append(
            {
                "prompt": f"What is {a} + {b}?\n",
                "completion": f"{a} + {b} = {a + b}. The answer is {a + b}.",
                "answer": str(a + b),
            }
        )
    return rows


def wrong(row: dict, rng: random.Random) -> str:
    """The same worked answer with a wrong sum: what a preference pair's rejected side looks like here."""
    a, b = re.findall(r"\d+", row["prompt"])[:2]
    s = int(a) + int(b) + rng.choice([-2, -1, 1, 2])
    return f"{a} + {b} = {s}. The answer is {s}."


def build_base_model(folder: Path):
    """A 2-layer Llama with a BPE tokenizer trained on the world's text, returned loaded (model, tokenizer)."""
    from tether.lab.tokenizer import train_bpe_tokenizer
    from tether.models.lm import build_tiny_model, load_model, load_tokenizer

    if not (folder / "config.json").is_file():
        rows = addition_rows(2000, seed=1)
        tokenizer = train_bpe_tokenizer((r["prompt"] + r["completion"] for r in rows), vocab_size=300)
        build_tiny_model("llama", tokenizer, folder, seed=0, hidden=64, layers=2, heads=4, max_positions=64)
    tokenizer = load_tokenizer(folder)
    return load_model(folder, tokenizer), tokenizer


# TRL's reward-function convention: completions (and any dataset column, here `answer`) as keyword arguments.
def correct_answer(completions, answer, **kwargs):
    found = [re.search(r"The answer is (-?\d+)", c) for c in completions]
    return [1.0 if m and m.group(1) == a else 0.0 for m, a in zip(found, answer)]


def run_stage(stage: str, output: Path, steps: int) -> tether.RunResult:
    from datasets import Dataset

    rng = random.Random(0)
    rows = addition_rows(600, seed=0)
    sft_final = output / "sft" / "final"
    if stage == "sft":  # a loaded model and a datasets.Dataset
        model, tokenizer = build_base_model(output / "base")
        return tether.sft(
            model=model,
            tokenizer=tokenizer,
            data=Dataset.from_list(rows),
            output=str(output / "sft"),
            max_length=64,
            lr=3e-3,
            batch_size=32,
            micro_batch_size=32,
            max_steps=steps * 30,
            eval_every=0,
            overwrite=True,
            report_to=["none"],
        )
    pairs = [{"prompt": r["prompt"], "chosen": r["completion"], "rejected": wrong(r, rng)} for r in rows]
    if stage == "rm":  # a config dataclass, then settings as keywords (TRL's names work too)
        config = tether.RMConfig()
        return tether.rm(
            config,
            model=str(sft_final),
            data=pairs,
            output=str(output / "rm"),
            learning_rate=1e-3,
            batch_size=32,
            micro_batch_size=32,
            max_steps=steps,
            eval_every=0,
            overwrite=True,
            report_to=["none"],
            max_length=64,
        )
    if stage == "dpo":
        return tether.dpo(
            model=str(sft_final),
            data=pairs,
            output=str(output / "dpo"),
            loss="sigmoid",
            beta=0.1,
            lr=1e-3,
            batch_size=32,
            micro_batch_size=32,
            max_steps=steps,
            eval_every=0,
            overwrite=True,
            report_to=["none"],
            max_length=64,
        )
    if stage == "kto":  # unpaired labels: each completion marked desirable or not
        unpaired = [
            {"prompt": p["prompt"], "completion": p["chosen"] if i % 2 else p["rejected"], "label": bool(i % 2)}
            for i, p in enumerate(pairs)
        ]
        return tether.dpo(
            model=str(sft_final),
            data=unpaired,
            output=str(output / "kto"),
            loss="kto",
            beta=0.1,
            lr=1e-3,
            batch_size=32,
            micro_batch_size=32,
            max_steps=steps,
            eval_every=0,
            overwrite=True,
            report_to=["none"],
            max_length=64,
        )
    prompts = [{"prompt": r["prompt"], "answer": r["answer"]} for r in rows]
    if stage == "grpo":  # a reward function as a Python object
        return tether.grpo(
            model=str(sft_final),
            prompts=prompts,
            reward_funcs=[correct_answer],
            output=str(output / "grpo"),
            num_generations=4,
            prompts_per_step=8,
            max_completion_length=24,
            learning_rate=1e-4,
            max_steps=steps,
            eval_every=0,
            save_every=0,
            overwrite=True,
            report_to=["none"],
        )
    if stage == "ppo":  # the reward model trained above plus a weighted reward function
        return tether.ppo(
            model=str(sft_final),
            prompts=prompts,
            reward_model=str(output / "rm" / "final"),
            reward_funcs=[(correct_answer, 0.5)],
            output=str(output / "ppo"),
            prompts_per_step=8,
            max_new_tokens=16,
            lr=1e-4,
            max_steps=steps,
            eval_every=0,
            save_every=0,
            overwrite=True,
            report_to=["none"],
        )
    raise ValueError(stage)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default="runs/api")
    parser.add_argument("--stage", default="all", choices=("all",) + STAGES)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    output = Path(args.output)
    figures = {}
    for stage in STAGES if args.stage == "all" else (args.stage,):
        run = run_stage(stage, output, args.steps)
        figures[stage] = {
            k: v for k, v in run.summary.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
        }
        print(f"{stage}: {run.final}")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
