"""Process reward models in the lab: the step-level questions, answered with a gold step label (issue: PRMs).

From a finished lab (`make lab`: runs/lab), on the arith world, where every written step is known right or wrong:

1. **Solutions** sampled from the SFT model (temperature 1) on arith_rl.jsonl, cut into sentences; each sentence's
   **gold** label is the lab's own step check (the step's arithmetic right and continuing from the right previous
   result; the final sentence: the answer is right), as `tether.lab.rewards:arith_steps` gives it.
2. **Math-Shepherd labels** for the same solutions, without the gold check: from each step's prefix the SFT model
   writes N continuations, and the step is right when any reaches the right answer (`tether data prm-labels`).
3. **Two PRMs** (`tether prm`, from the SFT model) on gold and on Math-Shepherd labels, both measured on held-out
   gold-labelled steps: step accuracy, AUROC, first-wrong-step accuracy.
4. **GRPO** on arith (the lab's settings) rewarded by the outcome (answer right), by the rule-based process reward
   (each step checked), and by the gold-trained PRM's step probabilities — each with the format reward — and GRPO
   from the pretrained base instead of SFT, over seeds: held-out accuracy, gold step accuracy (is the PRM
   exploited?), format rate.

    .venv/bin/python examples/prm_on_lab.py --lab runs/lab --output runs/prm-lab --seeds 0,1

`--seeds "" --labels gold` trains the gold-labelled PRM alone (what examples/monitor_bench.py --scenarios prm reads).
Each part is cached in --output (rerun to continue). Prints JSON lines and the tables docs/lab.md quotes.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import time
from pathlib import Path

import transformers

from tether.config import build_config
from tether.lab import arith
from tether.lab.rl import run_lab_grpo
from tether.models.chat import render_chat
from tether.models.lm import load_model, load_tokenizer
from tether.rollout.texts import generate_texts

SENTENCE = re.compile(r"[^.]*\.")
FORMAT = ["tether.lab.rewards:arith_format=0.5"]


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def sentences(completion: str) -> list[str]:
    return [s.strip() for s in SENTENCE.findall(completion) if s.strip()]


def gold_labels(steps: list[str], question: str) -> list[bool]:
    """Sentence k of a worked answer: the k-th expected step, right and continuing from the right previous result;
    the answer sentence: the answer is right; anything else: wrong."""
    gold = arith.check_arith(" ".join(steps), arith.parse_question(question))
    out = []
    for k, s in enumerate(steps):
        if s.startswith("The answer is"):
            out.append(bool(gold.correct))
        else:
            out.append(k < len(gold.steps) and bool(gold.steps[k]))
    return out


def sample_solutions(lab: Path, out: Path, n_prompts: int, samples: int, seed: int) -> list[dict]:
    path = out / "solutions.jsonl"
    if path.is_file():
        return read_rows(path)
    tok = load_tokenizer(lab / "sft" / "final")
    model = load_model(lab / "sft" / "final", tok)
    rows = read_rows(lab / "world" / "arith_rl.jsonl")
    random.Random(seed).shuffle(rows)
    rows = rows[:n_prompts]
    prompts = [render_chat(tok, r["prompt"], True) for r in rows for _ in range(samples)]
    texts = generate_texts(model, tok, prompts, 48, 1.0, seed=seed)
    solutions = []
    for k, (prompt, text) in enumerate(zip(prompts, texts)):
        row = rows[k // samples]
        steps = sentences(text)
        if steps:
            solutions.append(
                {
                    "prompt": prompt,
                    "completions": steps,
                    "labels": gold_labels(steps, row["question"]),
                    "question": row["question"],
                    "answer": row["answer"],
                }
            )
    path.write_text("".join(json.dumps(r) + "\n" for r in solutions))
    return solutions


def shepherd_labels(lab: Path, out: Path, solutions: list[dict], samples: int, seed: int) -> tuple[list[dict], str]:
    from tether.lab.rewards import arith_correct
    from tether.stages.prm_labels import step_labels

    path = out / "solutions_shepherd.jsonl"
    cost_path = out / "shepherd_cost.txt"
    if path.is_file():
        return read_rows(path), cost_path.read_text()
    tok = load_tokenizer(lab / "sft" / "final")
    model = load_model(lab / "sft" / "final", tok)

    def generate(contexts):
        texts = generate_texts(model, tok, contexts, 48, 1.0, seed=seed)
        return [(t, len(tok(t, add_special_tokens=False)["input_ids"])) for t in texts]

    def check(rows, texts):  # texts: the prefix's steps and the continuation, scored as a whole solution
        return [score > 0.5 for score in arith_correct(texts, [r["question"] for r in rows])]

    labelled, cost = step_labels(solutions, lambda r: r["completions"], generate, check, samples, " ")
    line = cost.line(len(labelled), sum(len(r["labels"]) for r in labelled))
    path.write_text("".join(json.dumps(r) + "\n" for r in labelled))
    cost_path.write_text(line)
    return labelled, line


def train_prm(lab: Path, folder: Path, train: list[dict], held_out: Path, seed: int) -> dict:
    from tether.stages.prm import run_prm
    from tether.stages.prm_config import PRMConfig

    if (folder / "summary.json").is_file():
        return json.loads((folder / "summary.json").read_text())
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / "train.jsonl"
    data.write_text("".join(json.dumps({k: r[k] for k in ("prompt", "completions", "labels")}) + "\n" for r in train))
    overrides = {
        "model.path": str(lab / "sft" / "final"),
        "data.path": str(data),
        "data.eval_path": str(held_out),
        "data.step_separator": " ",
        "optim.lr": 3e-4,
        "train.batch_size": 32,
        "train.epochs": 20.0,  # 2 epochs at 1e-4 stopped at loss 0.62, above the base rate's 0.46: too short
        "train.eval_every": 0,
        "train.save_every": 0,
        "train.seed": seed,
        "train.output": str(folder),
        "train.overwrite": True,
        "train.report_to": ["none"],
    }
    return run_prm(build_config(PRMConfig, overrides=overrides, source="prm lab"))


def grpo(lab: Path, out: Path, name: str, seed: int, extra: dict, rewards: str = "outcome") -> dict:
    folder = out / f"{name}-seed{seed}"
    figures_path = folder / "figures.json"
    if figures_path.is_file():
        return json.loads(figures_path.read_text())
    folder.mkdir(parents=True, exist_ok=True)
    figures = run_lab_grpo(
        folder,
        False,
        lab=lab,
        recipe="grpo",
        rewards=rewards,
        steps=40,
        prompts_per_step=32,
        group_size=8,
        lr=5e-5,
        eval_every=10,
        eval_problems=200,
        seed=seed,
        extra=extra,
    )
    metrics = read_rows(folder / "run" / "metrics.jsonl")
    prm_key = "reward/process_reward_model/mean"
    if prm_key in metrics[0]:
        figures["prm_score_first5"] = sum(m[prm_key] for m in metrics[:5]) / 5
        figures["prm_score_last5"] = sum(m[prm_key] for m in metrics[-5:]) / 5
    figures_path.write_text(json.dumps(figures))
    return figures


def alarms(run_dir: Path) -> list[str]:
    """The monitors on the run's records, recomputed (as `tether diagnose` does): "monitor (step): subject"."""
    from tether.diagnostics.watch import check_all, read_jsonl

    found = check_all(read_jsonl(run_dir / "metrics.jsonl"), read_jsonl(run_dir / "samples.jsonl"))
    return [f"{a.monitor} ({a.step}): {a.statistics.get('subject', '')}" for a in found]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lab", default="runs/lab")
    parser.add_argument("--output", default="runs/prm-lab")
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--prompts", type=int, default=300, help="arith prompts to sample solutions for")
    parser.add_argument("--samples", type=int, default=2, help="solutions per prompt")
    parser.add_argument("--shepherd-samples", type=int, default=4, help="Math-Shepherd's N per step")
    parser.add_argument(
        "--labels",
        default="gold,shepherd",
        help="the PRMs to train: gold, shepherd or both (gold: no Math-Shepherd run)",
    )
    args = parser.parse_args()
    transformers.utils.logging.set_verbosity_error()
    lab, out = Path(args.lab), Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]  # none: the PRMs only
    labels = [x for x in args.labels.split(",") if x.strip()]
    if not labels or set(labels) - {"gold", "shepherd"}:
        parser.error(f"--labels {args.labels}: gold, shepherd or both")
    if seeds and "gold" not in labels:
        parser.error("--seeds: the GRPO runs train on the gold-labelled PRM; add gold to --labels (or --seeds '')")
    t0 = time.perf_counter()
    solutions = sample_solutions(lab, out, args.prompts, args.samples, 0)
    cut = int(len(solutions) * 0.8)
    held_out = out / "held_out_gold.jsonl"
    held_out.write_text(
        "".join(json.dumps({k: r[k] for k in ("prompt", "completions", "labels")}) + "\n" for r in solutions[cut:])
    )
    steps = [x for r in solutions for x in r["labels"]]
    figures = {"solutions": len(solutions), "steps": len(steps), "wrong_step_share": 1 - sum(steps) / len(steps)}
    training = {"gold": solutions[:cut]}
    cost = None
    if "shepherd" in labels:
        shepherd, cost = shepherd_labels(lab, out, solutions[:cut], args.shepherd_samples, 0)
        agree = [a == b for r, s in zip(solutions[:cut], shepherd) for a, b in zip(r["labels"], s["labels"])]
        figures.update({"shepherd_cost": cost, "shepherd_agrees_with_gold": sum(agree) / len(agree)})
        training["shepherd"] = shepherd
    print(json.dumps(figures))
    prms = {}
    for label in labels:
        rows = training[label]
        summary = train_prm(lab, out / f"prm_{label}", rows, held_out, 0)
        prms[label] = {
            k: summary.get(f"eval/{k}")
            for k in ("step_accuracy", "auroc", "first_wrong_step_accuracy", "wrong_step_share")
        }
        print(json.dumps({"prm": label, **prms[label]}))
    if not seeds:
        return
    prm_dir = str(out / "prm_gold" / "final")
    runs = {
        "outcome": ({}, "outcome"),
        "rule process": ({}, "process"),
        "learned PRM": ({"rewards.reward": FORMAT, "rewards.process_reward_model": prm_dir}, "outcome"),
        "outcome, from base": ({"model.path": str(lab / "pretrain" / "final")}, "outcome"),
    }
    table = {}
    for name, (extra, rewards) in runs.items():
        for seed in seeds:
            f = grpo(lab, out, name.replace(" ", "_").replace(",", ""), seed, extra, rewards)
            row = {
                k: f.get(k)
                for k in (
                    "start_accuracy_greedy",
                    "final_accuracy_greedy",
                    "final_accuracy_sampled",
                    "prm_score_first5",
                    "prm_score_last5",
                )
            }
            row["step_accuracy"] = [f["curve"][0]["step_accuracy"], f["curve"][-1]["step_accuracy"]]
            row["alarms"] = alarms(out / f"{name.replace(' ', '_').replace(',', '')}-seed{seed}" / "run")
            row["format_rate"] = [f["curve"][0]["format_rate"], f["curve"][-1]["format_rate"]]
            table.setdefault(name, []).append(row)
            print(json.dumps({"grpo": name, "seed": seed, **row}))
    (out / "tables.json").write_text(json.dumps({"prms": prms, "grpo": table, "cost": cost}, indent=2))
    print(json.dumps({"minutes": round((time.perf_counter() - t0) / 60, 1)}))


if __name__ == "__main__":
    main()
