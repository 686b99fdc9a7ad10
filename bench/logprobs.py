"""Benchmark: chunked token_logprobs against the naive full log-softmax (and against chunks of whole rows, the
chunking before position chunks), time and peak memory.

Each variant runs in its own process so peak resident memory (ru_maxrss) is
its own; compare the ratios printed in one run (machines here are shared).

    .venv/bin/python bench/logprobs.py [--batch 16 --length 512 --vocab 32000]
    .venv/bin/python bench/logprobs.py --batch 1 --length 4096 --vocab 151936 --repeats 1   # a long sequence
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time


def run_one(variant: str, batch: int, length: int, vocab: int, repeats: int) -> dict:
    import torch

    from tether.algorithms.logprobs import token_logprobs

    torch.manual_seed(0)
    logits = torch.randn(batch, length, vocab)
    targets = torch.randint(0, vocab, (batch, length))
    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    for _ in range(repeats):
        if variant == "naive":
            out = torch.log_softmax(logits / 0.7, -1).gather(-1, targets[..., None]).squeeze(-1)
        elif variant == "rows":  # the chunking before this version: 8 whole rows (all their positions) at a time
            out = token_logprobs(logits, targets, temperature=0.7, chunk_positions=8 * length)
        else:  # as many positions as hold CHUNK_LOGITS logits
            out = token_logprobs(logits, targets, temperature=0.7)
    seconds = (time.perf_counter() - start) / repeats
    peak_extra_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base_rss) / 1024
    return {
        "variant": variant,
        "seconds": round(seconds, 4),
        "extra_peak_mb": round(peak_extra_mb, 1),
        "checksum": round(float(out.sum()), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child", default="")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_one(args.child, args.batch, args.length, args.vocab, args.repeats)))
        return
    logits_mb = args.batch * args.length * args.vocab * 4 / 2**20
    print(f"logits ({args.batch}, {args.length}, {args.vocab}) float32 = {logits_mb:.0f} MB")
    results = []
    for variant in ("naive", "rows", "chunked"):
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
        ]
        results.append(json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout))
        print(results[-1])
    naive, rows, chunked = results
    for name, result in (("rows", rows), ("chunked", chunked)):
        print(
            f"{name} / naive: time x{result['seconds'] / naive['seconds']:.2f}, "
            f"extra peak memory x{result['extra_peak_mb'] / max(naive['extra_peak_mb'], 1e-9):.2f}"
        )


if __name__ == "__main__":
    main()
