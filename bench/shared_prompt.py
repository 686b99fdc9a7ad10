"""A prompt forwarded once for all its responses (`--share-prompt`, the default) against once per response.

    .venv/bin/python bench/shared_prompt.py --lab runs/lab                  # DPO: the lab's pairs, + 160-token contexts
    .venv/bin/python bench/shared_prompt.py --lab runs/lab --stage grpo --steps 2 --repeats 2

A vs_trl workload (bench/vs_trl.py: the 29.9 M-parameter Llama, fp32; DPO: 16 pairs a step in micro-batches of 8;
GRPO: 4 prompts x 8 responses of up to 64 tokens) run as `python -m tether <stage>` with and without
`--no-share-prompt`, the two arms interleaved, each a fresh process on one pinned core with one thread. CPU seconds
per step = (CPU of a 1 + --steps run - CPU of a 1-step run) / --steps, as vs_trl measures it. ``--contexts``: tokens
of passage (the world's pretraining text) put before each question, so the prompt's share grows as in documents or
retrieval (0: the lab's data as it is; DPO's pairs are then cut at 256 tokens, with a context at 512). Printed per
context: each arm's median CPU s/step over the repeats, the ratio shared / per response with its min-max, and the
positions a step computes in each layout (DPO: rows x width of the collated micro-batches, counted, not timed; GRPO:
its reference and update forwards' positions/* from metrics.jsonl).
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


def with_contexts(world: Path, out: Path, tokens: int, name: str) -> Path:
    """The world's <name>.jsonl with a passage of about ``tokens`` words of pretraining text before each question
    (a different passage per row); the file itself where ``tokens`` is 0."""
    if tokens == 0:
        return world / f"{name}.jsonl"
    corpus = [json.loads(line) for line in (world / "pretrain.jsonl").read_text().splitlines()[:2000]]
    words = " ".join(m["content"] for r in corpus for m in r.get("messages", [])).split()
    rows = [json.loads(line) for line in (world / f"{name}.jsonl").read_text().splitlines() if line.strip()]
    for i, row in enumerate(rows):
        start = (i * 997) % max(1, len(words) - tokens)
        passage = " ".join(words[start : start + tokens])
        row["prompt"][-1]["content"] = f"Context: {passage}\n\n{row['prompt'][-1]['content']}"
    path = out / f"{name}-context{tokens}.jsonl"
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
    parser.add_argument("--stage", default="dpo", choices=("dpo", "grpo"))
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
    workload = vs.WORKLOADS[args.stage]
    (work / "runs").mkdir(exist_ok=True)
    results = []
    for context in (int(c) for c in args.contexts.split(",")):
        data = with_contexts(lab / "world", work, context, workload["data"])
        s = dict(workload) if args.stage == "grpo" or context == 0 else dict(workload, max_length=512)
        world = work / f"world-{args.stage}-context{context}"  # tether_args reads <world>/<data>.jsonl
        world.mkdir(exist_ok=True)
        (world / f"{workload['data']}.jsonl").write_text(data.read_text())
        per_arm: dict[str, list[float]] = {"shared": [], "per_response": []}
        counted: dict[str, float] = {}
        for repeat in range(args.repeats):
            for arm, extra in (("shared", []), ("per_response", ["--no-share-prompt"])):
                cpu = {}
                for n in (1, 1 + args.steps):
                    out = work / "runs" / f"{args.stage}-c{context}-{arm}-r{repeat}-{n}"
                    run = vs.run_tether(vs.tether_args(args.stage, s, world, model, out, n, False) + extra)
                    cpu[n] = run["cpu_s"]
                per_arm[arm].append((cpu[1 + args.steps] - cpu[1]) / args.steps)
                if args.stage == "grpo":  # the long run's reference and update positions, a step's mean
                    rows = run["rows"]
                    counted[arm] = statistics.mean(
                        r.get("positions/reference", 0) + r["positions/update"] for r in rows
                    )
            print(
                f"context {context} repeat {repeat + 1}: shared {per_arm['shared'][-1]:.2f} s, per response "
                f"{per_arm['per_response'][-1]:.2f} s",
                flush=True,
            )
        if args.stage == "dpo":
            counted = positions(data, tokenizer, 1 + args.steps, s["batch"], s["micro"], s["max_length"], 0)
        ratios = [a / b for a, b in zip(per_arm["shared"], per_arm["per_response"])]
        row = {
            "stage": args.stage,
            "context_tokens": context,
            "shared_s": statistics.median(per_arm["shared"]),
            "per_response_s": statistics.median(per_arm["per_response"]),
            "ratio": statistics.median(ratios),
            "ratio_range": [min(ratios), max(ratios)],
            "positions": counted,
            "runs": per_arm,
        }
        results.append(row)
        (work / f"shared_prompt_{args.stage}.json").write_text(json.dumps(results, indent=1))
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
