"""PPO on the lab's assist world against the lab's reward model, with gold measured along the way.

The lab stage for PPO is not built yet; this script is how its figures were first measured:

    .venv/bin/python examples/ppo_on_lab.py --lab runs/lab --kl-coef 0.0 --steps 60 --output runs/ppo-kl0
    .venv/bin/python examples/ppo_on_lab.py --lab runs/lab --kl-coef 0.2 --steps 40 --output runs/ppo-kl0.2

Every --eval-every steps it prints the proxy score on held-out prompts next to the gold reward and the gold
win rate against the SFT model (2 sampled answers per prompt, temperature 1).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import transformers

from tether.config import build_config
from tether.lab.evaluate import Decoding, evaluate_task
from tether.models import load_model, load_tokenizer
from tether.stages.ppo import run_ppo
from tether.stages.ppo_config import PPOConfig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lab", default="runs/lab", help="A finished `tether lab` folder.")
    parser.add_argument("--kl-coef", type=float, default=0.2)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--output", default="runs/ppo-lab")
    parser.add_argument("--reward-model", default="rm", choices=("rm", "rm_filtered"),
                        help="Which of the lab's reward models: trained on all pairs or on the agreed ones.")
    args = parser.parse_args()
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    lab = Path(args.lab)
    rows = [json.loads(line) for line in (lab / "world" / "assist_eval.jsonl").read_text().splitlines()]
    sft_tok = load_tokenizer(lab / "sft" / "final")
    sft = load_model(lab / "sft" / "final", sft_tok)
    decoding = Decoding(temperature=1.0, samples=2, seed=0, max_new_tokens=64)

    def gold(policy, tokenizer) -> dict:
        figures = evaluate_task(policy, tokenizer, "lab-assist", rows, decoding, sft, sft_tok)
        return {k: figures[k] for k in ("gold_reward", "gold_win_rate", "mean_words", "confident_rate", "distinct_2")}

    cfg = build_config(PPOConfig, overrides={
        "roles.policy": str(lab / "sft" / "final"), "roles.reward_model": str(lab / args.reward_model / "run" / "final"),
        "rollout.prompts": str(lab / "world" / "assist_rl.jsonl"), "rollout.eval_prompts": str(lab / "world" / "assist_eval.jsonl"),
        "rollout.prompts_per_step": 32, "rollout.max_new_tokens": 64, "ppo.steps": args.steps, "ppo.minibatch": 16,
        "ppo.policy_lr": args.lr, "ppo.critic_lr": 1e-4, "ppo.kl_coef": args.kl_coef, "run.output": args.output,
        "run.overwrite": True, "run.eval_every": args.eval_every, "run.save_every": 0, "run.sample_every": 10,
        "run.report_to": ["none"], "run.log_every": 10}, source="example")
    summary = run_ppo(cfg, evaluate_fn=gold)
    for point in summary["eval_history"]:
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in point.items()}))


if __name__ == "__main__":
    main()
