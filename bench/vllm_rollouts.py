"""The vLLM backend against the HF backend: generation throughput, the lab's GRPO step time and learning curve, and
the sampler/trainer mismatch with and without truncated importance sampling.

    .venv/bin/python bench/vllm_rollouts.py --lab runs/lab          # after `make lab`; writes bench-vllm/results.json
    .venv/bin/python bench/vllm_rollouts.py --lab runs/lab --part throughput     # one part only

Every figure comes from one run of this script on this machine, and the comparisons are ratios within it:
- **throughput**: tokens per second of each backend sampling the lab GRPO stage's batch shape (32 prompts x 8
  responses, 48 new tokens, temperature 1) from random models of the lab's size (0.66 M parameters) and of about
  30 M, every response run to its full budget (the stop set is one token a random model never writes), so both
  backends do the same work; the median of 3 timed rounds after one warm-up round; vLLM's weight push (write and
  reload) timed alone;
- **start** (``--source DIR`` for the other arm, e.g. a worktree of an earlier commit): what a run waits for before
  its first step on each side — the engine's start and its first rollout — and the steady tokens per second, on the
  30 M shape, each start a fresh process (as every run is), the two sources interleaved, ``--repeats`` pairs;
- **lab**: the lab's GRPO stage (outcome reward, 40 steps of 32 x 8, from the lab's SFT model) on each backend,
  seeds 0 and 1, plus the vLLM backend with token_truncate at 2 (seed 0): step time split into generation and the rest,
  held-out greedy accuracy at every evaluation (evaluated the same way for every run: tether.lab.rl), and the
  sampler/trainer mismatch figures (rollout/sampler_*) over the steps.
The processes use the machine's threads (torch.get_num_threads()); vLLM's engine process gets as many.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

SHAPES = {
    "lab": dict(hidden=128, layers=2, heads=4, vocab=1024),
    "30M": dict(hidden=512, layers=6, heads=8, vocab=8192),
}


def random_model(folder: Path, hidden: int, layers: int, heads: int, vocab: int):
    from tether.lab.tokenizer import train_bpe_tokenizer
    from tether.models.lm import build_tiny_model, load_model

    corpus = [f"{i} + {j} = {i + j}. The answer is {i + j}." for i in range(200) for j in range(0, 200, 7)]
    tokenizer = train_bpe_tokenizer(corpus, vocab_size=vocab)
    build_tiny_model("llama", tokenizer, folder, seed=0, hidden=hidden, layers=layers, heads=heads, max_positions=256)
    return load_model(folder), tokenizer


def workload(tokenizer):
    """The lab GRPO stage's batch shape: 32 prompts × 8 responses of 48 new tokens at temperature 1, with a stop token
    a random model (almost) never writes, so every response runs its whole budget and both sides do the same work."""
    from types import SimpleNamespace

    prompts = [f"{i} + {2 * i} =" for i in range(32) for _ in range(8)]
    sampling = SimpleNamespace(
        max_new_tokens=48,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        generation_batch=0,
        drop_finished_rows=True,
        rollout_size=len(prompts),
        vllm_kv_cache_gib=0.0,
        vllm_sleep=False,
    )
    return prompts, sampling, [len(tokenizer) - 1]


def tokens_per_s(backend, prompts, sampling, never) -> float:
    """The median of 3 timed rollouts' tokens per second (each with its own seeds)."""
    rates = []
    for r in range(3):
        t = time.perf_counter()
        rollout = backend.generate(prompts, sampling, never, seeds=[r * 1000 + i for i in range(len(prompts))])
        rates.append(float(rollout.lengths.sum()) / (time.perf_counter() - t))
    return statistics.median(rates)


def throughput(out: Path) -> dict:
    from tether.models.lm import count_parameters
    from tether.rollout.backends import HFGenerate, VLLMBackend

    results = {}
    for name, dims in SHAPES.items():
        model, tokenizer = random_model(out / f"model-{name}", **dims)
        prompts, sampling, never = workload(tokenizer)
        row = {"parameters": count_parameters(model)[0]}
        t0 = time.perf_counter()
        backends = {"hf": HFGenerate(model, tokenizer), "vllm": VLLMBackend(model, tokenizer, sampling)}
        row["vllm_start_s"] = time.perf_counter() - t0
        for backend_name, backend in backends.items():
            backend.generate(prompts, sampling, never, seeds=list(range(len(prompts))))  # warm-up
            row[f"{backend_name}_tokens_per_s"] = tokens_per_s(backend, prompts, sampling, never)
        pushes = []
        for _ in range(3):
            t = time.perf_counter()
            backends["vllm"].weights_updated(model)
            backends["vllm"].push_weights()
            pushes.append(time.perf_counter() - t)
        row["vllm_push_s"] = statistics.median(pushes)
        row["speedup"] = row["vllm_tokens_per_s"] / row["hf_tokens_per_s"]
        results[name] = row
        print(name, json.dumps(row), flush=True)
    return results


def start_once(out: Path, shape: str) -> dict:
    """One fresh process's engine: seconds to start it and draw the first rollout (what a run waits for before its
    first step), then the steady tokens per second (median of 3 rollouts)."""

    from tether.rollout.backends import VLLMBackend

    model, tokenizer = random_model(out / f"model-{shape}", **SHAPES[shape])
    prompts, sampling, never = workload(tokenizer)
    t0 = time.perf_counter()
    backend = VLLMBackend(model, tokenizer, sampling)
    backend.generate(prompts, sampling, never, seeds=list(range(len(prompts))))
    first = time.perf_counter() - t0
    return {"start_and_first_rollout_s": first, "tokens_per_s": tokens_per_s(backend, prompts, sampling, never)}


def start_pairs(out: Path, sources: dict[str, Path], repeats: int, shape: str = "30M") -> dict:
    """``start_once`` in a fresh process per source, interleaved; medians and each source ÷ the first."""
    import os
    import subprocess
    import sys

    rows: dict[str, list[dict]] = {name: [] for name in sources}
    for _ in range(repeats):
        for name, source in sources.items():
            env = {**os.environ, "PYTHONPATH": str(Path(source).resolve())}
            command = [sys.executable, __file__, "--part", "start-once", "--shape", shape, "--out", str(out)]
            done = subprocess.run(command, env=env, capture_output=True, text=True)
            if done.returncode != 0:
                raise SystemExit(f"{name} ({source}) failed:\n{done.stderr[-3000:]}")
            rows[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(name, rows[name][-1], flush=True)
    result = {}
    for name, measured in rows.items():
        result[name] = {k: statistics.median(m[k] for m in measured) for k in measured[0]}
        result[name]["runs"] = measured
    first = next(iter(sources))
    for name in sources:
        for k in ("start_and_first_rollout_s", "tokens_per_s"):
            result[name][f"{k}_ratio"] = result[name][k] / result[first][k]
    return result


def lab_runs(lab: Path, out: Path) -> dict:
    from tether.lab.rl import run_lab_grpo

    runs = {
        "hf-seed0": ("hf", 0, {}),
        "vllm-seed0": ("vllm", 0, {}),
        "hf-seed1": ("hf", 1, {}),
        "vllm-seed1": ("vllm", 1, {}),
        "vllm-tis2-seed0": (
            "vllm",
            0,
            {"rollout.off_policy_correction": "token_truncate", "rollout.is_ratio_max": 2.0},
        ),
    }
    results = {}
    for name, (backend, seed, extra) in runs.items():
        folder = out / name
        folder.mkdir(parents=True, exist_ok=True)
        t = time.perf_counter()
        figures = run_lab_grpo(
            folder,
            False,
            lab=lab,
            recipe="grpo",
            rewards="outcome",
            steps=40,
            prompts_per_step=32,
            group_size=8,
            lr=5e-5,
            eval_every=10,
            eval_problems=200,
            seed=seed,
            extra={"rollout.backend": backend, "train.log_every": 1, **extra},
        )
        wall = time.perf_counter() - t
        metrics = [json.loads(x) for x in (folder / "run" / "metrics.jsonl").read_text().splitlines()]
        gen = [m["time/generate_score_s"] for m in metrics[1:]]  # step 1 includes the engine's start
        rest = [m["time/logprobs_s"] + m["time/update_s"] for m in metrics[1:]]
        row = {
            "wall_s": wall,
            "generate_score_s_median": statistics.median(gen),
            "logprobs_update_s_median": statistics.median(rest),
            "accuracy_greedy": [(c["step"], c["accuracy_greedy"]) for c in figures["curve"]],
        }
        if backend == "vllm":
            for key in ("sampler_logprob_diff_mean", "sampler_logprob_diff_max", "sampler_kl"):
                values = [m[f"rollout/{key}"] for m in metrics]
                row[key] = {"mean": statistics.mean(values), "max": max(values)}
            if "rollout/is_weight_mean" in metrics[0]:
                row["is_weight_mean"] = statistics.mean(m["rollout/is_weight_mean"] for m in metrics)
                row["is_changed_share_max"] = max(m["rollout/is_changed_share"] for m in metrics)
        results[name] = row
        print(name, json.dumps(row), flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lab", type=Path, default=Path("runs/lab"), help="a finished `tether lab` folder")
    parser.add_argument("--out", type=Path, default=Path("bench-vllm"))
    parser.add_argument("--part", choices=("all", "throughput", "lab", "start", "start-once"), default="all")
    parser.add_argument("--source", type=Path, help="start: the other arm's checkout (e.g. a git worktree)")
    parser.add_argument("--repeats", type=int, default=3, help="start: interleaved pairs")
    parser.add_argument("--shape", choices=tuple(SHAPES), default="30M")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.part == "start-once":  # one arm's process (start_pairs runs it under the arm's PYTHONPATH)
        print(json.dumps(start_once(args.out, args.shape)))
        return
    if args.part == "start":
        if args.source is None or not (args.source / "tether" / "__init__.py").is_file():
            raise SystemExit(f"--part start compares this checkout with --source DIR, a checkout ({args.source})")
        sources = {"this": Path(__file__).resolve().parent.parent, "source": args.source}
        results = start_pairs(args.out, sources, args.repeats, args.shape)
        (args.out / "start.json").write_text(json.dumps(results, indent=1))
        print(json.dumps({k: {m: v for m, v in r.items() if m != "runs"} for k, r in results.items()}, indent=1))
        return
    results = {"threads": torch.get_num_threads(), "torch": torch.__version__}
    if args.part in ("all", "throughput"):
        results["throughput"] = throughput(args.out)
    if args.part in ("all", "lab"):
        if not (args.lab / "sft" / "final").is_dir():
            raise SystemExit(f"{args.lab}: no sft/final; run `make lab` first (or pass --lab)")
        results["lab"] = lab_runs(args.lab, args.out)
    path = args.out / "results.json"
    if path.is_file() and args.part != "all":  # one part re-measured: the other part's figures stay
        results = {**json.loads(path.read_text()), **results}
    path.write_text(json.dumps(results, indent=1))
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
