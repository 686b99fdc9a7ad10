"""Peak memory per process of sharded online RL (`tether grpo --fsdp`, `tether ppo --fsdp`) against one process and
against data parallelism, on random Llama models of two sizes.

    .venv/bin/python bench/sharded_online.py --lab runs/lab          # writes bench-sharded-online/results.json

The lab supplies the tokenizer, the arithmetic prompts and their reward functions (`make lab` first). For each model
size the same short run (GRPO with the KL in the loss, so a reference is held; PPO with a separate critic, on the
smaller model) goes on
1 process, on 2 processes (data parallel) and on 2 processes with --fsdp; each process's peak resident memory is
summary.json's `peak_memory`. Beside each figure: the state arithmetic of docs/scaling.md for that layout, so the
difference (the Python and torch runtime, activations, the gathered layer, communication buffers, the allocator's
peak) is visible. Memory, not time, is compared: step times on this 2-core machine say nothing about a GPU run.
`peak_rss_mib_training` is each process's peak at the end of the last step; `peak_rss_mib_with_checkpoint` adds the
last checkpoint, whose gathers of the full weights and AdamW states land in process 0's CPU memory.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scaling import tether  # noqa: E402 - the shared launcher of this folder's benchmarks

SIZES = {  # name: build_tiny_model dimensions (random Llama models)
    "34M": dict(hidden=512, layers=8, heads=8, max_positions=512),
    "270M": dict(hidden=1024, layers=16, heads=16, max_positions=512),
}


def model_of(lab: Path, folder: Path, dims: dict) -> Path:
    from tether.models.lm import build_tiny_model, load_tokenizer

    if (folder / "config.json").is_file():
        return folder
    return build_tiny_model("llama", load_tokenizer(lab / "sft" / "final"), folder, **dims)


def _numel(f, key: str) -> int:
    n = 1
    for d in f.get_slice(key).get_shape():
        n *= d
    return n


def state_mib(params: int, stage: str, processes: int, sharded: bool) -> float:
    """docs/scaling.md's arithmetic: the trained policy 16 bytes a parameter (fp32 weights, gradients, two AdamW
    moments), the frozen reference 4 (fp32), PPO's separate critic 16 more; sharded: each of those / N, plus the
    policy's gathered copy for sampling (4 bytes a parameter) whole on every process."""
    trained = 16 * (2 if stage == "ppo" else 1)
    per_param = (trained + 4) / (processes if sharded else 1) + (4 if sharded else 0)
    return per_param * params / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lab", default="runs/lab", help="A finished `tether lab` folder.")
    parser.add_argument("--out", default="bench-sharded-online", help="Where the runs and results.json go.")
    parser.add_argument("--sizes", default=",".join(SIZES), help="Comma-separated names of SIZES to run.")
    args = parser.parse_args()
    lab, out = Path(args.lab).resolve(), Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    world = lab / "world"
    results = []
    for size in args.sizes.split(","):
        model = model_of(lab, out / f"model-{size}", SIZES[size])
        params = _total(model)
        common = [
            "--model",
            str(model),
            "--prompts",
            str(world / "arith_rl.jsonl"),
            "--reward",
            "tether.lab.rewards:arith_correct",
            "--prompts-per-step",
            "4",
            "--group-size",
            "4",
            "--max-new-tokens",
            "16",
            "--max-steps",
            "2",
            "--eval-every",
            "0",
            "--save-every",
            "0",
            "--response-seeds",
            "--adamw",
            "foreach",
        ]
        stages = {
            "grpo": ["grpo", *common, "--kl-coef", "0.04"],
            "ppo": ["ppo", *common, "--critic-layout", "separate", "--minibatch", "8"],
        }
        if size != "34M":  # PPO's data-parallel pair at 270 M: 2 x ~11 GiB, more than a 24 GiB machine can spare
            stages.pop("ppo")
        for stage, command in stages.items():
            for layout, n, extra in (
                ("1 process", 1, []),
                ("2 processes", 2, []),
                ("2 processes --fsdp", 2, ["--fsdp"]),
            ):
                run = out / f"{stage}-{size}-{layout.replace(' ', '-').replace('--', '')}"
                summary = tether(command + extra, n, run, run.with_suffix(".log"))
                row = {
                    "model": size,
                    "parameters": params,
                    "stage": stage,
                    "layout": layout,
                    "peak_rss_mib_training": summary["peak_memory"]["before_final_save"]["rss_mib"],
                    "peak_rss_mib_with_checkpoint": summary["peak_memory"]["rss_mib"],
                    "state_arithmetic_mib": round(state_mib(params, stage, n, bool(extra)), 1),
                }
                results.append(row)
                print(json.dumps(row), flush=True)
    (out / "results.json").write_text(json.dumps(results, indent=2))
    print(f"results: {out / 'results.json'}")


def _total(folder: Path) -> int:
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        return sum(_numel(f, k) for k in f.keys())


if __name__ == "__main__":
    main()
