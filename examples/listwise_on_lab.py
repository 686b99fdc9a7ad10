"""Listwise (K = 4 rankings) against pairs cut from the same rankings, DPO on a finished lab, judged by gold.

The lab's world holds `rankings.jsonl`: K = 4 answers per request, each annotator's ranking and the panel's Borda
consensus. Three DPO runs from the SFT model see the same requests and the same consensus rankings:

- `listwise`: Plackett–Luce over the 4 ranked answers (`--loss listwise`, docs/algorithms.md);
- `all pairs`: the K(K−1)/2 = 6 ordered pairs of each ranking, sigmoid DPO;
- `best vs worst`: one pair per ranking, its first against its last, sigmoid DPO.

Each run takes the same optimizer steps and rows per step (a row is one ranking or one pair), so listwise and
best-vs-worst see each ranking about equally often, and all-pairs sees six times as many rows of the same labels.

    .venv/bin/python examples/listwise_on_lab.py --lab runs/lab [--steps 60] [--json runs/listwise.json]

Before training it prints how often the consensus orders a pair the way gold does (the labels' quality, which
the three runs share). Then a table: gold reward and the gold win rate against the SFT model (95 % bootstrap
interval over held-out requests) at the end, and the mean words per answer.
"""

from __future__ import annotations

import argparse
import json
from itertools import combinations
from pathlib import Path

import transformers

from tether.lab.rl import run_lab_dpo


def read_rankings(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def ranking_pairs(rankings: list[dict], which: str) -> list[dict]:
    """Pairs from each consensus ranking (best first): ``all`` its 6 ordered pairs, ``best_worst`` first vs last."""
    pairs = []
    for r in rankings:
        order = r["ranking"]
        chosen_rejected = combinations(order, 2) if which == "all" else [(order[0], order[-1])]
        pairs += [
            {"prompt": r["prompt"], "chosen": r["responses"][a], "rejected": r["responses"][b]}
            for a, b in chosen_rejected
        ]
    return pairs


def consensus_gold_agreement(rankings: list[dict]) -> dict[str, float]:
    """Share of the pairs gold separates that the consensus orders as gold does: all pairs, and first vs last."""

    def share(which: str) -> float:
        right = total = 0
        for r in rankings:
            order, gold = r["ranking"], r["gold"]
            for a, b in combinations(order, 2) if which == "all" else [(order[0], order[-1])]:
                if gold[a] != gold[b]:
                    total += 1
                    right += gold[a] > gold[b]
        return right / max(1, total)

    return {"all pairs": share("all"), "best vs worst": share("best_worst")}


def write_jsonl(rows: list[dict], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lab", default="runs/lab", help="A finished `tether lab` folder.")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch", type=int, default=32, help="Rows (rankings or pairs) per optimizer step.")
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default="runs/listwise-lab")
    parser.add_argument("--json", default="", help="Write the runs' figures here.")
    args = parser.parse_args()
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    lab, out = Path(args.lab), Path(args.output)
    rankings = read_rankings(lab / "world" / "rankings.jsonl")
    agreement = consensus_gold_agreement(rankings)
    print(
        f"{len(rankings)} rankings of {len(rankings[0]['responses'])}; the consensus orders as gold does: "
        + ", ".join(f"{k} {v:.3f}" for k, v in agreement.items())
    )
    data = {
        "listwise": ("listwise", lab / "world" / "rankings.jsonl"),
        "all pairs": ("sigmoid", write_jsonl(ranking_pairs(rankings, "all"), out / "data" / "all_pairs.jsonl")),
        "best vs worst": (
            "sigmoid",
            write_jsonl(ranking_pairs(rankings, "best_worst"), out / "data" / "best_worst.jsonl"),
        ),
    }
    runs = {}
    for name, (loss, path) in data.items():
        folder = out / name.replace(" ", "_")
        runs[name] = run_lab_dpo(
            folder,
            False,
            lab=lab,
            pairs=path,
            loss=loss,
            beta=0.0,
            steps=args.steps,
            batch=args.batch,
            lr=args.lr,
            eval_every=max(1, args.steps // 3),
            eval_samples=4,
            seed=args.seed,
        )
    print(f"\nDPO from the SFT model on {len(rankings)} consensus rankings, {args.steps} steps of {args.batch} rows")
    print(f"{'data':<14} {'rows':>6} {'gold: start → end':>20} {'win rate vs SFT [95 %]':>28} {'words':>6}")
    for name, r in runs.items():
        ci = r.get("final_win_rate_ci") or [float("nan")] * 2
        print(
            f"{name:<14} {r['train_examples']:>6} {r['start_gold']:>9.3f} → {r['final_gold']:<8.3f} "
            f"{r['final_win_rate']:>12.3f} [{ci[0]:.3f}, {ci[1]:.3f}] {r['curve'][-1]['words']:>6.1f}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"consensus_gold_agreement": agreement, "runs": runs}, indent=2))


if __name__ == "__main__":
    main()
