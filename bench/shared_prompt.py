"""DPO with each example's prompt forwarded once (`--share-prompt`, the default) against once per response.

    .venv/bin/python bench/shared_prompt.py --lab runs/lab                  # the lab's pairs, then + 160-token contexts
    .venv/bin/python bench/shared_prompt.py --lab runs/lab --contexts 0 --repeats 5

The vs_trl DPO workload (bench/vs_trl.py: the 29.9 M-parameter Llama, 16 pairs a step in micro-batches of 8, fp32),
run as `python -m tether dpo` with and without `--no-share-prompt`, the two arms interleaved, each a fresh process
on one pinned core with one thread. CPU seconds per step = (CPU of a 1 + --steps run - CPU of a 1-step run) /
--steps, as vs_trl measures it. ``--contexts``: tokens of passage (the world's pretraining text) put before each
pair's question, so the prompt's share of a pair grows as in documents or retrieval (0: the lab's pairs as they
are; those pairs' longest is then 256 tokens, with a context 512). Printed per context: each arm's median CPU
s/step over the repeats, the ratio shared / per response with its min-max, and the positions a step computes in
each layout (rows x width of the collated micro-batches over the run's steps, counted, not timed).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _vs_trl():
    spec = importlib.util.spec_from_file_location("bench_vs_trl", HERE / "vs_trl.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def with_contexts(world: Path, out: Path, tokens: int) -> Path:
    """The world's prefs.jsonl with a passage of about ``tokens`` words of pretraining text before each question
    (a different passage per pair); the file itself where ``tokens`` is 0."""
    if tokens == 0:
        return world / "prefs.jsonl"
    corpus = [json.loads(line) for line in (world / "pretrain.jsonl").read_text().splitlines()[:2000]]
    words = " ".join(m["content"] for r in corpus for m in r.get("messages", [])).split()
    rows = [json.loads(line) for line in (world / "prefs.jsonl").read_text().splitlines() if line.strip()]
    for i, row in enumerate(rows):
        start = (i * 997) % max(1, len(words) - tokens)
        passage = " ".join(words[start : start + tokens])
        row["prompt"][-1]["content"] = f"Context: {passage}\n\n{row['prompt'][-1]['content']}"
    path = out / f"prefs-context{tokens}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def positions(data: Path, tokenizer, steps: int, batch: int, micro: int, max_length: int, seed: int) -> dict:
    """Positions (rows x width) the run's first ``steps`` steps compute, in each layout, and the longest pair."""
    from tether.data.dpo import collate_policy_preferences, tokenize_policy_preferences
    from tether.data.records import read_records
    from tether.train.offline import EpochOrder

    examples, _ = tokenize_policy_preferences(read_records(str(data)), tokenizer, max_length)
    order = EpochOrder(len(examples), seed)
    counted = {"shared": 0, "per_response": 0}
    for step in range(steps):
        chosen = [examples[i] for i in order.batch(step, batch)]
        for lo in range(0, batch, micro):
            for arm, share in (("shared", True), ("per_response", False)):
                layout = collate_policy_preferences(chosen[lo : lo + micro], tokenizer.pad_token_id, True, share)
                counted[arm] += layout["input_ids"].numel()
    return {arm: n / steps for arm, n in counted.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lab", default="runs/lab", help="A folder with the lab's world/ and sft/final.")
    parser.add_argument("--work", default="runs/bench-shared-prompt")
    parser.add_argument("--contexts", default="0,160", help="Tokens of passage before each question, per table row.")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=4, help="Steps measured after the warm-up step.")
    args = parser.parse_args()

    from tether.models.lm import load_tokenizer

    vs = _vs_trl()
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    lab = vs.prepare_lab(Path(args.lab).resolve())
    model = vs.stages.build_model(lab, work / "model")
    tokenizer = load_tokenizer(lab / "sft" / "final")
    workload = vs.WORKLOADS["dpo"]
    results = []
    for context in (int(c) for c in args.contexts.split(",")):
        data = with_contexts(lab / "world", work, context)
        s = dict(workload, max_length=workload["max_length"] if context == 0 else 512)
        world = work / f"world-context{context}"  # tether_args reads <world>/<data>.jsonl
        world.mkdir(exist_ok=True)
        (world / "prefs.jsonl").write_text(data.read_text())
        counted = positions(data, tokenizer, 1 + args.steps, s["batch"], s["micro"], s["max_length"], 0)
        per_arm: dict[str, list[float]] = {"shared": [], "per_response": []}
        for repeat in range(args.repeats):
            for arm, extra in (("shared", []), ("per_response", ["--no-share-prompt"])):
                cpu = {}
                for n in (1, 1 + args.steps):
                    out = work / "runs" / f"c{context}-{arm}-r{repeat}-{n}"
                    cpu[n] = vs.run_tether(vs.tether_args("dpo", s, world, model, out, n, False) + extra)["cpu_s"]
                per_arm[arm].append((cpu[1 + args.steps] - cpu[1]) / args.steps)
            print(
                f"context {context} repeat {repeat + 1}: shared {per_arm['shared'][-1]:.2f} s, per response "
                f"{per_arm['per_response'][-1]:.2f} s",
                flush=True,
            )
        ratios = [a / b for a, b in zip(per_arm["shared"], per_arm["per_response"])]
        row = {
            "context_tokens": context,
            "shared_s": statistics.median(per_arm["shared"]),
            "per_response_s": statistics.median(per_arm["per_response"]),
            "ratio": statistics.median(ratios),
            "ratio_range": [min(ratios), max(ratios)],
            "positions": counted,
            "runs": per_arm,
        }
        results.append(row)
        (work / "shared_prompt.json").write_text(json.dumps(results, indent=1))
    print("\ncontext  shared s  per-response s  ratio [min-max]   positions/step shared / per response (ratio)")
    for r in results:
        p = r["positions"]
        print(
            f"{r['context_tokens']:7d} {r['shared_s']:9.2f} {r['per_response_s']:15.2f} {r['ratio']:6.2f} "
            f"[{r['ratio_range'][0]:.2f}-{r['ratio_range'][1]:.2f}]   {p['shared']:.0f} / {p['per_response']:.0f} "
            f"({p['shared'] / p['per_response']:.2f})"
        )


if __name__ == "__main__":
    main()
