"""DPO-family runs on a finished lab with your own settings, gold measured along the way.

`tether lab` runs sigmoid, IPO, SimPO and β-DPO on the filtered pairs, sigmoid on all pairs and online sigmoid;
this script tries other settings on the same world:

    .venv/bin/python examples/dpo_on_lab.py --lab runs/lab --loss simpo --lr 1e-5 --output runs/dpo-simpo-1e-5
    .venv/bin/python examples/dpo_on_lab.py --lab runs/lab --loss sigmoid --data all --output runs/dpo-all
    .venv/bin/python examples/dpo_on_lab.py --lab runs/lab --loss sigmoid --data online --rounds 6 --output runs/dpo-on
    .venv/bin/python examples/dpo_on_lab.py --lab runs/lab --loss kto --data unpaired --output runs/kto
    .venv/bin/python examples/dpo_on_lab.py --lab runs/lab --sft-coef 1 --output runs/dpo-rpo   # DPO + chosen NLL

`--data unpaired` keeps one side of each filtered pair — the chosen answer of even rows, the rejected of odd
ones — labelled true or false: KTO's data, with half the labelled answers of the pairs and no two answers to a
prompt. (`--loss kto --data filtered` splits every pair in two instead.)

Prints the gold reward, the gold win rate against the SFT model (4 sampled answers per held-out request) and the
held-out pair accuracy at every evaluation, then the run's figures as one JSON line.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import transformers

from tether.lab.rl import run_lab_dpo


def unpaired_labels(pairs: Path, output: Path) -> Path:
    """One labelled answer per pair: chosen (label true) on even rows, rejected (label false) on odd ones."""
    output.mkdir(parents=True, exist_ok=True)
    rows = [json.loads(line) for line in pairs.read_text().splitlines() if line.strip()]
    path = output / "unpaired.jsonl"
    path.write_text(
        "".join(
            json.dumps({"prompt": r["prompt"], "completion": r["rejected" if i % 2 else "chosen"], "label": not i % 2})
            + "\n"
            for i, r in enumerate(rows)
        )
    )
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lab", default="runs/lab", help="A finished `tether lab` folder.")
    parser.add_argument("--loss", default="sigmoid", help="Any `tether dpo --loss`.")
    parser.add_argument("--beta", type=float, default=0.0, help="0 = the loss's usual β.")
    parser.add_argument("--data", default="filtered", choices=("filtered", "all", "online", "unpaired"))
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--rounds", type=int, default=6, help="Online rounds (--data online).")
    parser.add_argument("--prompts-per-round", type=int, default=192)
    parser.add_argument("--min-agreement", type=float, default=0.8, help="Online: the panel's agreement filter.")
    parser.add_argument(
        "--sft-coef",
        type=float,
        default=0.0,
        help="Adds this times the chosen answer's mean token NLL to the loss (RPO, dpo.sft_coef).",
    )
    parser.add_argument(
        "--eval-samples",
        type=int,
        default=16,
        help="Sampled answers per held-out request (the lab's dpo_eval_samples).",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default="runs/dpo-lab")
    args = parser.parse_args()
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    lab = Path(args.lab)
    pairs = {
        "filtered": lab / "rm_filtered" / "prefs_filtered.jsonl",
        "all": lab / "world" / "prefs.jsonl",
        "online": None,
        "unpaired": lab / "rm_filtered" / "prefs_filtered.jsonl",
    }[args.data]
    if args.data == "unpaired":
        pairs = unpaired_labels(pairs, Path(args.output))
    online = {}
    if args.data == "online":
        online = {
            "online.rounds": args.rounds,
            "rollout.prompts_per_step": args.prompts_per_round,
            "online.steps_per_round": max(1, args.steps // args.rounds),
            "online.judge": f"tether.lab.rewards:assist_panel_judge(min_agreement={args.min_agreement})",
        }
    figures = run_lab_dpo(
        Path(args.output),
        False,
        lab=lab,
        pairs=pairs,
        loss=args.loss,
        beta=args.beta,
        steps=args.steps,
        batch=args.batch,
        lr=args.lr,
        eval_every=20,
        eval_samples=args.eval_samples,
        seed=args.seed,
        extra={**online, "dpo.sft_coef": args.sft_coef},
    )
    for c in figures["curve"]:
        print(
            f"step {c['step']:3d}  gold {c['gold']:.3f}  win rate vs SFT {c['win_rate']:.3f}  words {c['words']:.1f}  "
            f"held-out pair accuracy {c['accuracy'] if c['accuracy'] is None else round(c['accuracy'], 3)}"
        )
    print(json.dumps({k: v for k, v in figures.items() if k != "curve"}))


if __name__ == "__main__":
    main()
