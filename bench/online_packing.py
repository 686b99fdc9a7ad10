"""Benchmark: the online stages' log-prob forwards on padded rows against padding-free rows (tether/rollout/).

Rollouts are rebuilt from an online run's samples.jsonl (each logged step's prompts and responses, tokenised
again with the run's tokenizer), so their lengths are the run's real ones. Per rollout, interleaved and repeated
(the median is kept), it times the two forwards of a step:

- ``no-grad``: old / reference log-probs (torch.no_grad);
- ``update``: log-probs and entropy, forward and backward, as an update's micro-batch computes them;

each on padded rows (--no-padding-free) and on padding-free rows (the default), and counts the positions each
computes. Ratios are padding-free ÷ padded, within one run.

    .venv/bin/python bench/online_packing.py --run runs/lab/grpo_outcome [--run runs/lab/ppo_kl0.2 ...]
        [--model DIR (default: the run's final/)] [--threads 1] [--repeats 5] [--generate 32,16,8,4] [--decode]
        [--json out.json]

``--decode`` samples each rollout's prompts again, with finished rows dropped (decoding.decode, the default)
and with generate(), and times both.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path


def rollouts_from_samples(run: Path, tokenizer, limit: int) -> list:
    """One Rollout per logged step of ``run``'s samples.jsonl (prompt left-padded, response right-padded, EOS kept
    where the response was not truncated)."""
    import torch

    from tether.rollout.batch import Rollout

    steps: dict[int, list[dict]] = {}
    for line in (run / "samples.jsonl").read_text().splitlines():
        row = json.loads(line)
        steps.setdefault(row["step"], []).append(row)
    out = []
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    for step in sorted(steps)[:limit]:
        rows = steps[step]
        prompts = [tokenizer(r["prompt"], add_special_tokens=False)["input_ids"] for r in rows]
        responses = [
            tokenizer(r["response"], add_special_tokens=False)["input_ids"] + ([] if r.get("truncated") else [eos])
            for r in rows
        ]
        p, t = max(map(len, prompts)), max(map(len, responses))
        prompt_ids = torch.full((len(rows), p), pad)
        prompt_mask = torch.zeros(len(rows), p, dtype=torch.long)
        response_ids = torch.full((len(rows), t), pad)
        response_mask = torch.zeros(len(rows), t, dtype=torch.long)
        for b, (x, y) in enumerate(zip(prompts, responses)):
            prompt_ids[b, p - len(x) :], prompt_mask[b, p - len(x) :] = torch.tensor(x), 1
            response_ids[b, : len(y)], response_mask[b, : len(y)] = torch.tensor(y), 1
        out.append(
            Rollout(
                prompt_ids,
                prompt_mask,
                response_ids,
                response_mask,
                torch.tensor([bool(r.get("truncated")) for r in rows]),
                [r["prompt"] for r in rows],
                [r["response"] for r in rows],
            )
        )
    return out


def positions(rollout) -> tuple[int, int, int]:
    """(real tokens, padded positions, padding-free positions) of one forward over the rollout."""
    from tether.rollout.forward import _packed_layout, _PackedRollout

    real = int(rollout.prompt_mask.sum() + rollout.response_mask.sum())
    padded = rollout.prompt_ids.numel() + rollout.response_ids.numel()
    packed = _PackedRollout(rollout, _packed_layout(rollout)).inputs["input_ids"].numel()
    return real, padded, packed


def time_forwards(model, rollout, temperature: float, repeats: int) -> dict[str, dict[str, float]]:
    import torch

    from tether.rollout.forward import response_logprobs

    def no_grad(free: bool):
        with torch.no_grad():
            response_logprobs(model, rollout, temperature, padding_free=free)

    def update(free: bool):
        logp, entropy = response_logprobs(model, rollout, temperature, with_entropy=True, padding_free=free)
        (logp.sum() + 0.01 * entropy.sum()).backward()
        model.zero_grad(set_to_none=True)

    times = {(name, free): [] for name in ("no-grad", "update") for free in (False, True)}
    for name, fn in (("no-grad", no_grad), ("update", update)):
        fn(False), fn(True)  # warm-up
        for _ in range(repeats):
            for free in (False, True):  # interleaved: drift hits both sides alike
                start = time.perf_counter()
                fn(free)
                times[(name, free)].append(time.perf_counter() - start)
    return {
        name: {
            "padded_s": statistics.median(times[(name, False)]),
            "padding_free_s": statistics.median(times[(name, True)]),
        }
        for name in ("no-grad", "update")
    }


def time_generation(model, tokenizer, rollout, row_counts: list[int], repeats: int) -> dict[int, float]:
    """Seconds per token step of model.generate with the KV cache, for each number of rows, every row running the
    same number of steps (no stop token), on the rollout's own prompts. Shows how a step's cost follows the rows it
    computes: what a generate loop that dropped finished rows could save."""
    import torch

    steps = int(rollout.response_ids.shape[1])
    out = {}
    for rows in row_counts:
        ids, mask = rollout.prompt_ids[:rows], rollout.prompt_mask[:rows]
        kwargs = dict(
            input_ids=ids,
            attention_mask=mask,
            do_sample=True,
            max_new_tokens=steps,
            min_new_tokens=steps,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
        with torch.no_grad():
            model.generate(**kwargs)  # warm-up
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                model.generate(**kwargs)
                times.append(time.perf_counter() - start)
        out[rows] = statistics.median(times) / steps
    return out


def time_decoding(model, tokenizer, rollouts: list, temperature: float, max_new_tokens: int, repeats: int) -> dict:
    """Seconds to sample each rollout's prompts again with decoding.decode (finished rows dropped) and with
    generate() (every row kept to the longest), interleaved, the median of ``repeats``; each response from its own
    seed, so both sample the same tokens (checked: ``same_tokens``)."""
    import torch

    from tether.rollout.backends import generate_from_ids, response_seeds

    compact_s, generate_s, same, new_tokens = [], [], True, 0
    for r in rollouts:
        contexts = [ids[mask.bool()].tolist() for ids, mask in zip(r.prompt_ids, r.prompt_mask)]
        seeds = response_seeds(0, range(len(contexts)))
        run = lambda compact: generate_from_ids(
            model, tokenizer, contexts, max_new_tokens, temperature, seeds=seeds, compact=compact
        )
        times = {True: [], False: []}
        with torch.no_grad():
            a, b = run(True), run(False)  # warm-up, and the check that both draw the same tokens
            same = same and torch.equal(a.response_ids, b.response_ids)
            new_tokens += int(a.response_mask.sum())
            for _ in range(repeats):
                for compact in (True, False):
                    start = time.perf_counter()
                    run(compact)
                    times[compact].append(time.perf_counter() - start)
        compact_s.append(statistics.median(times[True]))
        generate_s.append(statistics.median(times[False]))
    return {
        "compact_s": sum(compact_s) / len(rollouts),
        "generate_s": sum(generate_s) / len(rollouts),
        "ratio": sum(compact_s) / sum(generate_s),
        "same_tokens": same,
        "new_tokens": new_tokens / len(rollouts),
    }


def row_stopping_saving(rollouts: list, per_step: dict[int, float]) -> float:
    """Predicted generation time with finished rows dropped ÷ time with every row kept to the longest, from the
    rollouts' real response lengths and the measured cost of a token step at each row count (linear between)."""
    counts = sorted(per_step)

    def cost(rows: int) -> float:
        if rows <= counts[0]:
            return per_step[counts[0]] * max(rows, 1) / counts[0] if rows else 0.0
        for lo, hi in zip(counts, counts[1:]):
            if rows <= hi:
                return per_step[lo] + (per_step[hi] - per_step[lo]) * (rows - lo) / (hi - lo)
        return per_step[counts[-1]] * rows / counts[-1]

    kept = dropped = 0.0
    for r in rollouts:
        lengths = r.response_mask.sum(-1).tolist()
        steps = max(lengths)
        kept += steps * cost(len(lengths))
        dropped += sum(cost(sum(n > t for n in lengths)) for t in range(steps))
    return dropped / kept


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", action="append", required=True, help="An online run folder with samples.jsonl.")
    parser.add_argument("--model", default="", help="Model folder (default: each run's final/).")
    parser.add_argument("--steps", type=int, default=6, help="Logged steps (rollouts) per run.")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--generate", default="", help="Row counts (e.g. 32,16,8,4) to time generate's token step at.")
    parser.add_argument(
        "--decode",
        action="store_true",
        help="Time sampling the rollouts' prompts with finished rows dropped (decoding.decode) against generate().",
    )
    parser.add_argument("--json", default="")
    args = parser.parse_args()

    import torch

    from tether.models.lm import load_model, load_tokenizer

    torch.set_num_threads(args.threads)
    report = {}
    for run in map(Path, args.run):
        folder = args.model or str(run / "final")
        tokenizer = load_tokenizer(folder)
        model = load_model(folder, tokenizer)
        model.eval()
        temperature = _config(run).get("rollout", {}).get("temperature", 1.0)
        rows = []
        rollouts = rollouts_from_samples(run, tokenizer, args.steps)
        for rollout in rollouts:
            real, padded, packed = positions(rollout)
            rows.append(
                {
                    "rows": len(rollout.responses),
                    "real_tokens": real,
                    "padded_positions": padded,
                    "padding_free_positions": packed,
                    **time_forwards(model, rollout, temperature, args.repeats),
                }
            )
        total = lambda key, sub=None: sum(r[key][sub] if sub else r[key] for r in rows)
        summary = {
            "rollouts": len(rows),
            "padding_share": 1 - total("real_tokens") / total("padded_positions"),
            "padding_free_share": 1 - total("real_tokens") / total("padding_free_positions"),
            "positions_ratio": total("padding_free_positions") / total("padded_positions"),
        }
        for name in ("no-grad", "update"):
            summary[f"{name}_ratio"] = total(name, "padding_free_s") / total(name, "padded_s")
            summary[f"{name}_padded_s"] = total(name, "padded_s") / len(rows)
        if args.generate:
            counts = sorted({min(int(n), len(rollouts[0].responses)) for n in args.generate.split(",")}, reverse=True)
            per_step = time_generation(model, tokenizer, rollouts[0], counts, args.repeats)
            summary["generate_s_per_token_step"] = per_step
            summary["generate_row_stopping_ratio"] = row_stopping_saving(rollouts, per_step)
            print(
                f"{run}: generate, seconds per token step by rows: "
                + ", ".join(f"{n}: {t * 1e3:.2f} ms" for n, t in per_step.items())
                + f"; dropping finished rows would take x{summary['generate_row_stopping_ratio']:.2f} of the time"
            )
        if args.decode:
            rollout_cfg = _config(run).get("rollout", {})
            summary["decode"] = time_decoding(
                model, tokenizer, rollouts, temperature, rollout_cfg.get("max_new_tokens", 64), args.repeats
            )
            d = summary["decode"]
            print(
                f"{run}: sampling {d['new_tokens']:.0f} new tokens a rollout: finished rows dropped "
                f"{d['compact_s']:.3f} s, generate() {d['generate_s']:.3f} s: x{d['ratio']:.2f} "
                f"({'the same tokens' if d['same_tokens'] else 'DIFFERENT TOKENS'})"
            )
        report[str(run)] = {"summary": summary, "rollouts": rows}
        print(
            f"{run}: {len(rows)} rollouts of {rows[0]['rows']} responses; padding {summary['padding_share']:.1%} "
            f"-> {summary['padding_free_share']:.1%}; positions x{summary['positions_ratio']:.2f}; "
            f"no-grad forward x{summary['no-grad_ratio']:.2f} (padded {summary['no-grad_padded_s'] * 1e3:.1f} ms); "
            f"update forward+backward x{summary['update_ratio']:.2f} (padded {summary['update_padded_s'] * 1e3:.1f} ms)"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))


def _config(run: Path) -> dict:
    import yaml

    path = run / "config.yaml"
    return yaml.safe_load(path.read_text()) if path.exists() else {}


if __name__ == "__main__":
    main()
