"""GPU-ready numbers (issue 54, part 6): where a GRPO step's time goes on a 0.5 B-shaped model, per backend, against
the limits the device sets — one prepared run for when an accelerator is lent (under 10 minutes on one H100/H200).

    python3 bench/gpu_phases.py --out $OUT                                    # on the GPU: both backends, bf16 autocast
    python3 bench/gpu_phases.py --shape tiny --device cpu --steps 2 --out /tmp/gpu-phases   # the plumbing, on a CPU

The model: random weights of Qwen2-0.5B's shape (hidden 896, 24 layers, 14 heads, 2 KV heads, MLP 4864, tied
vocabulary of 151,936: 494 M parameters), a word-level tokenizer of as many tokens, prompts of random words. A
random model never writes its stop token, so every response runs to max_new_tokens and both backends do the same
work. Per backend (hf: tether's KV-cache sampler on the trained weights; vllm: an engine with its own copy, skipped
where vLLM is not installed), ``--steps`` GRPO steps of P prompts × G responses; from each step's metrics.jsonl row:
time/generate_score_s, time/logprobs_s, time/update_s, and the forwards each phase ran (forwards/*, positions/*);
vLLM's weight push (write + reload in place) is timed alone after the run.

The limits, from the device's spec (a table of known GPUs, or --peak-tflops / --hbm-gbs) and measured here (a large
bf16 matmul; a device-to-device copy):
- a decode step reads every weight once: at least weight bytes / HBM bandwidth, and 2·N·rows FLOPs;
- a forward over T tokens: 2·N·T FLOPs (the log-prob passes), forward + backward 6·N·T (the update);
N = the matmul parameters (embedding excluded, output projection included). Each phase's seconds are printed
against its floor: floor / measured is the share of the device the phase reached.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

SHAPES = {  # hidden, layers, heads, kv heads, MLP, vocabulary
    "0.5b": (896, 24, 14, 2, 4864, 151936),
    "tiny": (128, 2, 2, 1, 256, 512),  # head_dim 64, which vLLM's CPU attention takes
}
# dense bf16 tensor-core FLOP/s and HBM bytes/s from the vendors' data sheets (SXM parts)
DEVICES = {"H200": (989e12, 4.8e12), "H100": (989e12, 3.35e12), "A100": (312e12, 2.0e12), "L40S": (362e12, 0.864e12)}


def build(folder: Path, shape: str):
    """A random Qwen2 of ``shape`` with a word-level tokenizer of its vocabulary, saved to ``folder``."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

    hidden, layers, heads, kv, mlp, vocab = SHAPES[shape]
    words = {"<pad>": 0, "<eos>": 1, "<unk>": 2, **{f"w{i}": i for i in range(3, vocab)}}
    core = Tokenizer(WordLevel(words, unk_token="<unk>"))
    core.pre_tokenizer = WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    config = AutoConfig.for_model(
        "qwen2",
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        intermediate_size=mlp,
        vocab_size=vocab,
        tie_word_embeddings=True,
        max_position_embeddings=1024,
        bos_token_id=None,
        eos_token_id=1,
        pad_token_id=0,
    )
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(str(folder))
    # a folder of its own (model.tokenizer): beside a Qwen2 config.json, AutoTokenizer would read it as Qwen2's BPE
    tokenizer.save_pretrained(str(folder.parent / "tokenizer"))
    matmul = sum(p.numel() for n, p in model.named_parameters() if "embed" not in n) + hidden * vocab
    return folder, matmul, sum(p.numel() for p in model.parameters())


def measured_limits(device: str) -> dict:
    """This device's bf16 matmul FLOP/s (8192³, best of 5) and copy bandwidth (1 GiB, best of 5), or {} on a CPU."""
    import torch

    if device != "cuda":
        return {}
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    x = torch.empty(2**29, device="cuda", dtype=torch.bfloat16)
    best_mm, best_copy = float("inf"), float("inf")
    for _ in range(5):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        a @ a
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        x.clone()
        torch.cuda.synchronize()
        best_mm, best_copy = min(best_mm, t1 - t0), min(best_copy, time.perf_counter() - t1)
    return {"bf16_flops": 2 * 8192**3 / best_mm, "copy_bytes_per_s": 2 * x.numel() * 2 / best_copy}


def spec_limits(args) -> dict:
    import torch

    name = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    known = next((v for k, v in DEVICES.items() if k in name), (None, None))
    return {
        "device": name,
        "peak_flops": args.peak_tflops * 1e12 or known[0],
        "hbm_bytes_per_s": args.hbm_gbs * 1e9 or known[1],
    }


def run_backend(backend: str, folder: Path, out: Path, args) -> dict:
    """``args.steps`` GRPO steps on ``backend``; the step rows of metrics.jsonl and, for vllm, the push's seconds."""
    import random

    from tether.config import build_config
    from tether.stages.grpo import run_grpo
    from tether.stages.grpo_config import GRPOConfig

    rng = random.Random(0)
    vocab = SHAPES[args.shape][-1]
    prompts = out / "prompts.jsonl"
    rows = [{"prompt": " ".join(f"w{rng.randrange(3, vocab)}" for _ in range(args.prompt_tokens))} for _ in range(64)]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    engines = []

    def backend_of(policy, tokenizer):  # keep the engine to time its weight push afterwards
        from tether.rollout.backends import BACKENDS

        made = BACKENDS[backend](policy, tokenizer, cfg.rollout)
        engines.append(made)
        return made

    cfg = build_config(
        GRPOConfig,
        overrides={
            "model.path": str(folder),
            "model.tokenizer": str(folder.parent / "tokenizer"),
            "model.device": args.device,
            "model.mixed_precision": args.mixed_precision,
            "rollout.prompts": str(prompts),
            "rollout.backend": backend,
            "rollout.prompts_per_step": args.prompts,
            "rollout.group_size": args.group,
            "rollout.max_new_tokens": args.new_tokens,
            "train.max_steps": args.steps,
            "train.output": str(out / backend),
            "train.eval_every": 0,
            "train.save_every": 0,
            "train.report_to": ["none"],
            "train.overwrite": True,
        },
    )
    run_grpo(cfg, scorer=lambda texts: [float(len(t)) / 1000 for t in texts], backend=backend_of)
    steps = [json.loads(line) for line in (out / backend / "metrics.jsonl").read_text().splitlines()]
    result = {"steps": steps}
    if backend == "vllm" and engines:
        engine = engines[0]
        engine.weights_updated(engine.model)
        t0 = time.perf_counter()
        engine.push_weights()
        result["weight_push_s"] = time.perf_counter() - t0
    return result


def floors(step: dict, matmul: int, weight_bytes: int, limits: dict, rows: int) -> dict:
    """Each phase's floor in seconds at the spec's limits (None where a limit is unknown)."""
    flops, bandwidth = limits.get("peak_flops"), limits.get("hbm_bytes_per_s")
    if not flops or not bandwidth:
        return {}
    decode_steps = step["rollout/length_mean"]  # every response runs to its budget
    decode = decode_steps * max(weight_bytes / bandwidth, 2 * matmul * rows / flops)
    logprob_positions = sum(
        v for k, v in step.items() if k.startswith("positions/") and k[10:] in ("logprobs", "reference")
    )
    return {
        "generate": decode,
        "logprobs": 2 * matmul * logprob_positions / flops,
        "update": 6 * matmul * step.get("positions/update", 0) / flops,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--shape", default="0.5b", choices=sorted(SHAPES))
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--mixed-precision", default="bf16", choices=("bf16", "no"))
    parser.add_argument("--backends", default="hf,vllm")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--peak-tflops", type=float, default=0.0, help="dense bf16 peak if the device is not known")
    parser.add_argument("--hbm-gbs", type=float, default=0.0, help="memory bandwidth (GB/s) if the device is not known")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    folder, matmul, params = build(out / "model", args.shape)
    limits = {**spec_limits(args), **measured_limits(args.device)}
    weight_bytes = params * (2 if args.mixed_precision == "bf16" else 4)
    report = {"shape": args.shape, "parameters": params, "matmul_parameters": matmul, "limits": limits, "runs": {}}
    rows = args.prompts * args.group
    for backend in args.backends.split(","):
        if backend == "vllm":
            from tether.rollout.vllm_backend import vllm_version

            if vllm_version() is None:
                report["runs"][backend] = {"skipped": "vLLM is not installed here"}
                continue
        run = run_backend(backend, folder, out, args)
        last = run["steps"][-1]  # the steps after the first (kernels picked, caches warm) are alike: the last one
        generated = last["rollout/length_mean"] * rows
        run["summary"] = {
            "generate_score_s": last["time/generate_score_s"],
            "logprobs_s": last["time/logprobs_s"],
            "update_s": last["time/update_s"],
            "tokens_per_s": generated / last["time/generate_score_s"],
            "floors_s": floors(last, matmul, weight_bytes, limits, rows),
        }
        report["runs"][backend] = run
        summary = run["summary"]
        print(f"{backend}: {summary['tokens_per_s']:,.0f} generated tokens/s", flush=True)
        for phase, floor in summary["floors_s"].items():
            seconds = summary[f"{phase}_s" if phase != "generate" else "generate_score_s"]
            print(f"  {phase:9s} {seconds:8.3f} s   floor {floor:8.4f} s   reached {floor / seconds:6.1%}")
        if "weight_push_s" in run:
            print(f"  weight push {run['weight_push_s']:.3f} s ({weight_bytes / run['weight_push_s'] / 1e9:.1f} GB/s)")
    (out / "gpu_phases.json").write_text(json.dumps(report, indent=1))
    print(f"-> {out / 'gpu_phases.json'}")


if __name__ == "__main__":
    main()
