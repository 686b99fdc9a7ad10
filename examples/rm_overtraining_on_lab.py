"""A reward model trained too long on a finished lab: held-out accuracy rising then falling, the over-fitting
detector's step, and the score distribution at the best and at the last step.

The reward model starts from the lab's SFT model and trains on the first --pairs of the agreement-filtered pairs
for --epochs epochs, evaluated every --eval-every steps on the held-out pairs (`prefs_eval.jsonl`, the
annotators' labels). The detector (`--overfit-drop`, `--overfit-patience`, docs/reward-models.md) only watches:
the run goes on to the end, so the table shows what happens after the step it fires at. `best/` (the best
held-out accuracy) and `final/` are then judged against gold on the same held-out pairs.

    .venv/bin/python examples/rm_overtraining_on_lab.py --lab runs/lab [--pairs 300 --epochs 24] [--json F]

Prints the evaluation curve (train loss and accuracy of the step, held-out loss and accuracy, the chosen and
rejected score distributions), the best step and the detector's step, then best against last: held-out
accuracy by the annotators' labels and by gold, the margin, and each side's mean, spread and quantiles.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import transformers

from tether.config import build_config
from tether.data.records import read_records
from tether.lab.reward_eval import gold_judged_figures
from tether.stages.rm import RMConfig, run_rm

DISTRIBUTION = ("mean", "std", "q10", "q50", "q90")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lab", default="runs/lab", help="A finished `tether lab` folder.")
    parser.add_argument("--pairs", type=int, default=300, help="Training pairs: the first N filtered pairs.")
    parser.add_argument("--epochs", type=float, default=24)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--overfit-drop", type=float, default=0.02)
    parser.add_argument("--overfit-patience", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default="runs/rm-overtraining")
    parser.add_argument("--json", default="", help="Write the curve and the best/last figures here.")
    args = parser.parse_args()
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    lab, out = Path(args.lab), Path(args.output)
    rows = (lab / "rm_filtered" / "prefs_filtered.jsonl").read_text().splitlines()[: args.pairs]
    out.mkdir(parents=True, exist_ok=True)
    (out / "pairs.jsonl").write_text("".join(line + "\n" for line in rows))
    eval_pairs = lab / "world" / "prefs_eval.jsonl"
    overrides = {
        "model.path": str(lab / "sft" / "final"),
        "data.path": str(out / "pairs.jsonl"),
        "data.eval_path": str(eval_pairs),
        "data.max_length": 256,
        "optim.lr": args.lr,
        "optim.warmup_ratio": 0.05,
        "optim.lr_schedule": "constant",
        "train.output": str(out / "run"),
        "train.batch_size": args.batch,
        "train.micro_batch_size": args.batch,
        "train.epochs": args.epochs,
        "train.eval_every": args.eval_every,
        "train.save_every": 0,
        "train.log_every": args.eval_every,
        "train.seed": args.seed,
        "train.overwrite": True,
        "rm.overfit_drop": args.overfit_drop,
        "rm.overfit_patience": args.overfit_patience,
        "rm.early_stop": False,
    }
    summary = run_rm(build_config(RMConfig, overrides=overrides, source="example"))
    metrics = [json.loads(line) for line in (out / "run" / "metrics.jsonl").read_text().splitlines() if line.strip()]
    curve = [m for m in metrics if "eval/accuracy" in m]
    best = max(curve, key=lambda m: m["eval/accuracy"])  # the first of the best, as best/ keeps it
    fired = next((m["step"] for m in curve if m.get("eval/overfit_alarm")), None)
    print(
        f"\nreward model from the SFT model on {len(rows)} filtered pairs, {summary['steps']} steps "
        f"({args.epochs:g} epochs), constant lr {args.lr:g}; held-out: {eval_pairs.name}"
    )
    print(
        f"{'step':>5} {'train loss':>10} {'train acc':>9} {'eval loss':>9} {'eval acc':>8}   chosen mean±sd   rejected mean±sd"
    )
    for m in curve:
        print(
            f"{m['step']:>5} {m.get('train/loss', float('nan')):>10.3f} {m.get('train/accuracy', float('nan')):>9.3f} "
            f"{m['eval/loss']:>9.3f} {m['eval/accuracy']:>8.3f}   {m['eval/chosen_mean']:6.2f} ± {m['eval/chosen_std']:<5.2f}"
            f"   {m['eval/rejected_mean']:6.2f} ± {m['eval/rejected_std']:.2f}"
        )
    print(
        f"best held-out accuracy {best['eval/accuracy']:.3f} at step {best['step']}; "
        + (f"the detector fired at step {fired}" if fired else "the detector did not fire")
    )
    held_out = [r.fields for r in read_records(eval_pairs)]
    judged = {
        "best": (best, gold_judged_figures(out / "run" / "best", held_out, 256)),
        "last": (curve[-1], gold_judged_figures(out / "run" / "final", held_out, 256)),
    }
    print(
        f"\n{'':<24} {'best (step ' + str(best['step']) + ')':>16} {'last (step ' + str(curve[-1]['step']) + ')':>16}"
    )
    lines = [
        ("held-out accuracy (labels)", lambda m, g: m["eval/accuracy"]),
        ("held-out accuracy (gold)", lambda m, g: g["gold_accuracy"]),
        ("held-out loss", lambda m, g: m["eval/loss"]),
        ("margin", lambda m, g: m["eval/margin"]),
    ]
    for side in ("chosen", "rejected"):
        lines += [(f"{side} {k}", lambda m, g, k=f"eval/{side}_{k}": m[k]) for k in DISTRIBUTION]
    lines += [
        ("picks the longer", lambda m, g: g["rm_picks_longer"]),
        ("picks the more confident", lambda m, g: g["rm_picks_more_confident"]),
    ]
    for label, value in lines:
        print(f"{label:<24} {value(*judged['best']):>16.3f} {value(*judged['last']):>16.3f}")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "curve": curve,
                    "best_step": best["step"],
                    "detector_step": fired,
                    "gold": {k: g for k, (_, g) in judged.items()},
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
