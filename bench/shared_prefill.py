"""A group's prompt prefilled once: sampling time with and without it, against the prompt's length.

    .venv/bin/python bench/shared_prefill.py --lab runs/lab                      # prompts of 32, 256, 1024 tokens
    .venv/bin/python bench/shared_prefill.py --lab runs/lab --lengths 512 --group 16

GRPO samples G responses to each prompt; `decode` (tether/rollout/decoding.py) prefills each distinct prompt once
and copies its cache to the G rows (SHARE_PREFILL). This measures what that saves: 4 prompts of P random tokens,
G = 8 responses each (32 rows), 64 new tokens, on a random 7-layer Llama of hidden 512 (the 29.9 M shape of
bench/stages.py, with positions for 1,088 tokens), one thread, sampled with per-row seeds, shared and per-row
prefill interleaved ``--repeats`` times. Printed per length: the median seconds of each, their ratio, the prefill
positions each reads (U × P against B × P), and whether the two drew the same tokens (they must: the copies hold the
numbers a per-row prefill computes).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lab", default="runs/lab")
    parser.add_argument("--out", default="runs/bench-shared-prefill")
    parser.add_argument("--lengths", default="32,256,1024")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    import torch

    from tether.models.lm import build_tiny_model, load_model, load_tokenizer
    from tether.rollout import decoding
    from tether.rollout.backends import generate_from_ids, response_seeds

    torch.set_num_threads(1)
    lengths = [int(n) for n in args.lengths.split(",")]
    tokenizer = load_tokenizer(Path(args.lab) / "sft" / "final")
    folder = Path(args.out) / "model"
    if not (folder / "config.json").is_file():
        positions = max(lengths) + args.new_tokens
        build_tiny_model("llama", tokenizer, folder, seed=0, hidden=512, layers=7, heads=8, max_positions=positions)
    model = load_model(folder, tokenizer)
    stops = [tokenizer.eos_token_id]
    generator = torch.Generator().manual_seed(0)
    print(f"{'prompt tokens':>13s} {'shared s':>9s} {'per-row s':>9s} {'ratio':>6s} {'prefill positions':>19s} same")
    for length in lengths:
        # token ids from the middle of the vocabulary: no special token, no stop
        prompts = torch.randint(16, len(tokenizer) - 16, (args.prompts, length), generator=generator).tolist()
        contexts = [p for p in prompts for _ in range(args.group)]
        seeds = response_seeds(0, range(len(contexts)))
        times: dict[bool, list[float]] = {True: [], False: []}
        drawn = {}
        for _ in range(args.repeats):
            for share in (True, False):
                decoding.SHARE_PREFILL = share
                start = time.perf_counter()
                rollout = generate_from_ids(
                    model, tokenizer, contexts, args.new_tokens, 1.0, stop_ids=stops, seeds=seeds, compact=True
                )
                times[share].append(time.perf_counter() - start)
                drawn[share] = rollout.response_ids
        shared, per_row = statistics.median(times[True]), statistics.median(times[False])
        read = f"{args.prompts * length:,} / {len(contexts) * length:,}"
        same = "yes" if torch.equal(drawn[True], drawn[False]) else "NO"
        print(f"{length:13d} {shared:9.3f} {per_row:9.3f} {shared / per_row:6.2f} {read:>19s} {same}")
    decoding.SHARE_PREFILL = True


if __name__ == "__main__":
    main()
