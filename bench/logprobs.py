"""Benchmark: chunked token_logprobs against the naive full log-softmax (and against chunks of whole rows, the
chunking before position chunks), time and peak memory; with --head H, the LM head's forward and backward from
H-wide hidden states: applied whole then token_logprobs, against linear_token_logprobs (--chunked-head).

Each variant runs in its own process so peak resident memory (ru_maxrss) is
its own; compare the ratios printed in one run (machines here are shared).

    .venv/bin/python bench/logprobs.py [--batch 16 --length 512 --vocab 32000]
    .venv/bin/python bench/logprobs.py --batch 1 --length 4096 --vocab 151936 --repeats 1   # a long sequence
    .venv/bin/python bench/logprobs.py --batch 1 --length 4096 --vocab 151936 --repeats 1 --head 256
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time


def _timed(step, repeats: int) -> tuple:
    """(the last output of ``step()``, its seconds per call and the peak resident memory it added, in MB)."""
    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    for _ in range(repeats):
        out = step()
    seconds = (time.perf_counter() - start) / repeats
    peak_extra_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base_rss) / 1024
    return out, {"seconds": round(seconds, 4), "extra_peak_mb": round(peak_extra_mb, 1)}


def run_head(variant: str, positions: int, vocab: int, width: int, repeats: int) -> dict:
    """Forward and backward of Σ log π through the LM head, its weight's and the hidden states' gradients kept."""
    import torch

    from tether.algorithms.logprobs import linear_token_logprobs, token_logprobs

    torch.manual_seed(0)
    hidden = torch.randn(positions, width, requires_grad=True)
    weight = (torch.randn(vocab, width) / width**0.5).requires_grad_()
    targets = torch.randint(0, vocab, (positions,))
    weight.grad, hidden.grad = torch.zeros_like(weight), torch.zeros_like(hidden)  # allocated before the baseline

    def step():
        if variant == "whole_head":
            out = token_logprobs(torch.nn.functional.linear(hidden, weight)[None], targets[None])[0]
        else:
            out = linear_token_logprobs(hidden, weight, None, targets)
        out.sum().backward()
        return out

    out, figures = _timed(step, repeats)
    checksums = {"checksum": round(float(out.sum()), 2), "grad_checksum": round(float(weight.grad.abs().sum()), 2)}
    return {"variant": variant, **figures, **checksums}


def run_one(variant: str, batch: int, length: int, vocab: int, repeats: int) -> dict:
    import torch

    from tether.algorithms.logprobs import token_logprobs

    torch.manual_seed(0)
    logits = torch.randn(batch, length, vocab)
    targets = torch.randint(0, vocab, (batch, length))

    def step():
        if variant == "naive":
            return torch.log_softmax(logits / 0.7, -1).gather(-1, targets[..., None]).squeeze(-1)
        if variant == "rows":  # the chunking before this version: 8 whole rows (all their positions) at a time
            return token_logprobs(logits, targets, temperature=0.7, chunk_positions=8 * length)
        return token_logprobs(logits, targets, temperature=0.7)  # as many positions as hold CHUNK_LOGITS logits

    out, figures = _timed(step, repeats)
    return {"variant": variant, **figures, "checksum": round(float(out.sum()), 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--head", type=int, default=0, help="Hidden width: the LM head's forward and backward.")
    parser.add_argument("--child", default="")
    args = parser.parse_args()
    if args.child:
        if args.head:
            result = run_head(args.child, args.batch * args.length, args.vocab, args.head, args.repeats)
        else:
            result = run_one(args.child, args.batch, args.length, args.vocab, args.repeats)
        print(json.dumps(result))
        return
    logits_mb = args.batch * args.length * args.vocab * 4 / 2**20
    print(f"logits ({args.batch}, {args.length}, {args.vocab}) float32 = {logits_mb:.0f} MB")
    variants = ("whole_head", "chunked_head") if args.head else ("naive", "rows", "chunked")
    results = []
    for variant in variants:
        cmd = [
            sys.executable,
            __file__,
            "--child",
            variant,
            "--batch",
            str(args.batch),
            "--length",
            str(args.length),
            "--vocab",
            str(args.vocab),
            "--repeats",
            str(args.repeats),
            "--head",
            str(args.head),
        ]
        results.append(json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout))
        print(results[-1])
    naive, *others = results
    for name, result in zip(variants[1:], others):
        print(
            f"{name} / {variants[0]}: time x{result['seconds'] / naive['seconds']:.2f}, "
            f"extra peak memory x{result['extra_peak_mb'] / max(naive['extra_peak_mb'], 1e-9):.2f}"
        )


if __name__ == "__main__":
    main()
