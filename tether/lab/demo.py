"""The built-in SFT demo: a tiny model learns worked addition, with no files from the user.

It writes its own data and a randomly initialised 2-layer Llama (with a BPE
tokenizer trained on the data) into <output>/demo-inputs/, then runs the
ordinary `tether sft` path on them and checks the result by generating.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

from tether.lab.tokenizer import train_bpe_tokenizer
from tether.models.lm import build_tiny_model


def addition_example(rng: random.Random, max_operand: int) -> dict:
    a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
    return {
        "prompt": f"What is {a} + {b}?\n",
        "completion": f"{a} + {b} = {a + b}. The answer is {a + b}.",
        "answer": a + b,
    }


def write_demo_inputs(
    folder: str | Path, seed: int = 0, n_train: int = 4000, n_eval: int = 200, max_operand: int = 60
) -> dict:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    rows = [addition_example(rng, max_operand) for _ in range(n_train + n_eval)]
    for name, part in (("train.jsonl", rows[:n_train]), ("eval.jsonl", rows[n_train:])):
        (folder / name).write_text("".join(json.dumps(r) + "\n" for r in part))
    model_dir = folder / "model"
    if not (model_dir / "config.json").is_file():
        tok = train_bpe_tokenizer((r["prompt"] + r["completion"] for r in rows), vocab_size=300)
        build_tiny_model("llama", tok, model_dir, seed=seed, hidden=128, layers=2, heads=4, max_positions=64)
    return {
        "model.path": str(model_dir),
        "data.path": str(folder / "train.jsonl"),
        "data.eval_path": str(folder / "eval.jsonl"),
        "data.max_length": 64,
        "optim.lr": 1e-3,
        "optim.warmup_ratio": 0.05,
        "train.batch_size": 64,
        "train.micro_batch_size": 64,
        "train.max_steps": 500,
        "train.eval_every": 50,
        "train.save_every": 100,
        "train.log_every": 25,
    }


def answer_accuracy(completions: list[str], answers: list[int]) -> float:
    hits = 0
    for text, answer in zip(completions, answers):
        match = re.search(r"The answer is (-?\d+)\.", text)
        hits += bool(match and int(match.group(1)) == answer)
    return hits / max(1, len(answers))
