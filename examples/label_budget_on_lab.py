"""PPO, offline DPO and online DPO at the same number of preference labels, on a finished lab, judged by gold.

Online DPO in `make lab` shows the annotator panel rounds × prompts pairs of its own samples (6 × 192 = 1,152)
and trains on those the panel agrees on. This script gives the offline methods the same label budget: the first
--labels pairs of the world's `prefs.jsonl`, through the same agreement filter (`--min-agreement`), then

- offline DPO (sigmoid) on the kept pairs, with the lab's DPO settings;
- a reward model on the kept pairs (the lab's RM settings), then PPO at β = --kl-coef against it (the lab's PPO
  settings): the pairs train the reward model, which PPO then queries once per sampled answer.

The table puts them next to the lab's online DPO run, its offline DPO on pairs sampled once from the SFT model
(the same labels, drawn before the first step), and the lab's full-budget runs (all 3,000 pairs shown to the
panel), with each method's labels, reward-model calls, gold at the end and gold win rate against the SFT model
(95 % bootstrap interval over held-out requests).

    .venv/bin/python examples/label_budget_on_lab.py --lab runs/lab [--labels 1152] [--json runs/label-budget.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import transformers
import yaml

from tether.lab.reward_eval import filtered_preferences, train_lab_rm
from tether.lab.rl import run_lab_dpo, run_lab_ppo


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lab", default="runs/lab", help="A finished `tether lab` folder (with dpo_sigmoid_online).")
    parser.add_argument("--labels", type=int, default=0, help="Pairs shown to the panel; 0 = as many as online DPO's.")
    parser.add_argument("--min-agreement", type=float, default=0.8)
    parser.add_argument("--kl-coef", type=float, default=0.2)
    parser.add_argument("--dpo-steps", type=int, default=60, help="The lab's DPO steps (32 pairs each).")
    parser.add_argument("--ppo-steps", type=int, default=60, help="The lab's PPO steps.")
    parser.add_argument("--prompts-per-step", type=int, default=32, help="PPO's sampled answers per step.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default="runs/label-budget")
    parser.add_argument("--json", default="", help="Write the table's figures here.")
    args = parser.parse_args()
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    lab, out = Path(args.lab), Path(args.output).resolve()
    summary = json.loads((lab / "summary.json").read_text())
    online = summary["dpo"]["dpo_sigmoid_online"]
    online_shown = sum(r["prompts"] for r in online["online_rounds"])
    online_kept = sum(r["pairs"] for r in online["online_rounds"])
    labels = args.labels or online_shown
    out.mkdir(parents=True, exist_ok=True)
    source = lab / "world" / "prefs.jsonl"
    rows = source.read_text().splitlines()
    if labels > len(rows):
        raise SystemExit(f"--labels {labels}: {source} holds {len(rows)} pairs")
    (out / "shown.jsonl").write_text("".join(line + "\n" for line in rows[:labels]))
    kept = filtered_preferences(out / "shown.jsonl", out / "kept.jsonl", args.min_agreement)["kept"]
    print(f"{labels} pairs shown to the panel, {kept} kept at agreement >= {args.min_agreement}")

    dpo = run_lab_dpo(
        out / "dpo",
        False,
        lab=lab,
        pairs=out / "kept.jsonl",
        loss="sigmoid",
        beta=0.0,
        steps=args.dpo_steps,
        batch=32,
        lr=5e-5,
        eval_every=max(1, args.dpo_steps // 3),
        eval_samples=4,
        seed=args.seed,
    )
    rm = train_lab_rm(
        out / "rm",
        False,
        sft_dir=lab / "sft" / "final",
        pairs=out / "kept.jsonl",
        eval_pairs=lab / "world" / "prefs_eval.jsonl",
        epochs=2.0,
        batch=32,
        lr=3e-4,
        seed=args.seed,
    )
    # run_lab_ppo reads <lab>/<reward_model>/run/final; an absolute reward_model path replaces <lab>/ (pathlib)
    ppo = run_lab_ppo(
        out / "ppo",
        False,
        lab=lab,
        reward_model=str(out / "rm"),
        kl_coef=args.kl_coef,
        adaptive_target=0.0,
        steps=args.ppo_steps,
        prompts_per_step=args.prompts_per_step,
        lr=5e-5,
        eval_every=max(1, args.ppo_steps // 6),
        eval_samples=4,
        seed=args.seed,
        kl_horizon=160,
    )
    full = summary["reward_models"]["rm_filtered"]["filtering"]
    lab_ppo = summary["ppo"].get(f"ppo_kl{args.kl_coef:g}")
    table = [("online DPO (lab)", online_shown, online_kept, 0, online)]
    once = summary["dpo"].get("dpo_sigmoid_sft_samples")
    if once:  # the same labels, all drawn from the SFT model before the first step
        table.append(
            (
                "offline DPO on SFT samples (lab)",
                once["online_rounds"][0]["prompts"],
                once["online_rounds"][0]["pairs"],
                0,
                once,
            )
        )
    table += [
        ("offline DPO", labels, kept, 0, dpo),
        (f"PPO β={args.kl_coef:g} (RM on them)", labels, kept, args.ppo_steps * args.prompts_per_step, ppo),
        ("offline DPO (lab, all)", full["of"], full["kept"], 0, summary["dpo"]["dpo_sigmoid"]),
    ]
    if lab_ppo:
        lab_config = yaml.safe_load((lab / f"ppo_kl{args.kl_coef:g}" / "run" / "config.yaml").read_text())
        calls = lab_ppo["steps"] * lab_config["rollout"]["prompts_per_step"]
        table.append((f"PPO β={args.kl_coef:g} (lab, all)", full["of"], full["kept"], calls, lab_ppo))
    print(
        f"\nrm on {kept} pairs: held-out accuracy {rm['eval_accuracy']:.3f}, against gold {rm['gold_accuracy']:.3f} "
        f"(the lab's rm_filtered: {summary['reward_models']['rm_filtered']['gold_accuracy']:.3f})"
    )
    print(
        f"{'method':<28} {'shown':>6} {'kept':>6} {'RM calls':>8} {'gold: start → end':>20} {'win rate vs SFT [95 %]':>26}"
    )
    figures = []
    for name, shown, used, calls, r in table:
        ci = r.get("final_win_rate_ci") or [float("nan")] * 2
        print(
            f"{name:<28} {shown:>6} {used:>6} {calls:>8} {r['start_gold']:>9.3f} → {r['final_gold']:<8.3f} "
            f"{r['final_win_rate']:>10.3f} [{ci[0]:.3f}, {ci[1]:.3f}]"
        )
        figures.append(
            {
                "method": name,
                "shown": shown,
                "kept": used,
                "rm_calls": calls,
                **{k: r.get(k) for k in ("start_gold", "final_gold", "final_win_rate", "final_win_rate_ci")},
            }
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"labels": labels, "kept": kept, "rm": rm, "table": figures}, indent=2))


if __name__ == "__main__":
    main()
