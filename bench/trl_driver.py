"""TRL's side of bench/vs_trl.py: one workload through TRL's own trainer, in one process.

    .venv/bin/python bench/trl_driver.py sft --model M --data sft.jsonl --output O --steps 5 --batch 16 --micro 8

The workloads are TRL's real classes (SFTTrainer, DPOTrainer, RewardTrainer, GRPOTrainer, RLOOTrainer) with the
settings bench/vs_trl.py matches to tether's (docs/performance.md names each one and those that could not be
matched). The data file is read in its own order (sequential sampler, no dataset shuffle): vs_trl.py writes it in
the order tether's run visits it. Writes <output>/trl_steps.json: TRL's log history and, per optimizer step, the
process CPU and wall seconds between the trainer's step-begin and step-end callbacks, and (GRPO, RLOO) the CPU
seconds inside the trainer's generation, reward and generate-and-score methods, so that the step splits into
tether's phases: generation + rewards, log-probs (the rest of generate-and-score), update (the rest of the step).

Only the standard library is imported at the top: tether's GRPO runs import `letter_share` from here.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def letter_share(completions, **_) -> list[float]:
    """The share of a response's characters that are letters: a reward that differs between a random model's
    responses (so no group has equal scores), in TRL's and tether's form (text or a message list)."""
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [sum(ch.isalpha() for ch in t) / max(len(t), 1) for t in texts]


def _common(args) -> dict:
    """TrainingArguments matched to tether's runs: fp32 unless --bf16 (TRL's default is bf16), no gradient
    checkpointing (TRL's default is on, tether's off), constant learning rate without warm-up, no weight decay,
    gradient clipping at 1.0, fused AdamW (transformers' default on torch ≥ 2.8, tether's default), one log row
    per step, no checkpoints, no evaluation, the CPU."""
    return dict(
        output_dir=args.output,
        max_steps=args.steps,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        optim="adamw_torch_fused",
        bf16=args.bf16,
        gradient_checkpointing=False,
        logging_steps=1,
        save_strategy="no",
        eval_strategy="no",
        report_to="none",
        disable_tqdm=True,
        use_cpu=True,
        seed=args.seed,
        dataloader_num_workers=0,
    )


def _offline(args, common: dict) -> dict:
    # batch = micro × accumulation on one process; the examples in the file's order, as tether visits them
    return dict(
        common,
        per_device_train_batch_size=args.micro,
        gradient_accumulation_steps=args.batch // args.micro,
        max_length=args.max_length,
        train_sampling_strategy="sequential",
    )


def _online(args, common: dict) -> dict:
    rows = args.prompts_per_step * args.group_size
    micro = min(rows, args.micro)
    # one generation per optimizer step (steps_per_generation = accumulation): on policy, as tether's default
    return dict(
        common,
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=rows // micro,
        num_generations=args.group_size,
        max_completion_length=args.max_new_tokens,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        epsilon=0.2,
        num_iterations=1,
        shuffle_dataset=False,
        log_completions=False,
    )


def build_trainer(args, callbacks: list):
    from datasets import Dataset
    from transformers import AutoTokenizer

    rows = [json.loads(line) for line in Path(args.data).read_text().splitlines() if line.strip()]
    dataset = Dataset.from_list(rows)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    common = _common(args)
    kwargs = dict(model=args.model, train_dataset=dataset, processing_class=tokenizer, callbacks=callbacks)
    if args.workload == "sft":
        from trl import SFTConfig, SFTTrainer

        # prompt/completion rows: TRL's loss on the completion only (completion_only_loss), as tether's
        return SFTTrainer(args=SFTConfig(**_offline(args, common)), **kwargs)
    if args.workload == "dpo":
        from trl import DPOConfig, DPOTrainer

        return DPOTrainer(args=DPOConfig(**_offline(args, common), beta=0.1, loss_type=["sigmoid"]), **kwargs)
    if args.workload == "rm":
        from trl import RewardConfig, RewardTrainer

        return RewardTrainer(args=RewardConfig(**_offline(args, common)), **kwargs)
    if args.workload == "grpo":
        from trl import GRPOConfig, GRPOTrainer

        # tether's grpo recipe: group-std advantages (ε 1e-4), token ratio clipped at 0.2, per-sequence token mean,
        # k3 KL in the loss with β 0.04
        config = GRPOConfig(**_online(args, common), beta=0.04, loss_type="grpo", scale_rewards="group")
        return GRPOTrainer(reward_funcs=[letter_share], args=config, **kwargs)
    if args.workload == "rloo":
        from trl import RLOOConfig, RLOOTrainer

        # tether's rloo recipe has no KL term: β 0 (TRL then loads no reference model)
        config = RLOOConfig(**_online(args, common), beta=0.0, normalize_advantages=False)
        return RLOOTrainer(reward_funcs=[letter_share], args=config, **kwargs)
    raise SystemExit(f"unknown workload {args.workload!r}")


# TRL's methods timed on the online trainers (an instance attribute shadows the method for the trainer's own calls)
TIMED = {"_generate": "generate", "_calculate_rewards": "rewards", "_generate_and_score_completions": "prepare"}


def time_methods(trainer, totals: dict) -> None:
    """Add each TIMED method's process CPU seconds to ``totals[name]``."""
    for method, name in TIMED.items():
        if hasattr(trainer, method):
            original = getattr(trainer, method)

            def timed(*a, _original=original, _name=name, **k):
                start = time.process_time()
                try:
                    return _original(*a, **k)
                finally:
                    totals[_name] = totals.get(_name, 0.0) + time.process_time() - start

            setattr(trainer, method, timed)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workload", choices=("sft", "dpo", "rm", "grpo", "rloo"))
    parser.add_argument("--model", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--lr", type=float, required=True)
    parser.add_argument("--batch", type=int, default=16, help="Offline: examples per optimizer step.")
    parser.add_argument("--micro", type=int, default=8, help="Examples (online: responses) per forward.")
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--prompts-per-step", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    return parser


def main() -> None:
    args = build_parser().parse_args()

    from transformers import TrainerCallback

    steps: list[dict] = []
    totals: dict[str, float] = {}

    class StepClock(TrainerCallback):
        def on_step_begin(self, *_, **__):
            self.start = (time.process_time(), time.perf_counter())

        def on_step_end(self, *_, **__):
            cpu, wall = self.start
            steps.append({"cpu_s": time.process_time() - cpu, "wall_s": time.perf_counter() - wall, **totals})
            totals.clear()

    trainer = build_trainer(args, [StepClock()])
    time_methods(trainer, totals)
    trainer.train()
    out = {"steps": steps, "log_history": trainer.state.log_history}
    Path(args.output, "trl_steps.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
