"""Online RL in the lab: PPO on the assist world against a lab reward model, judged by gold along the way.

The proxy (the reward model the policy is trained on) and gold (the world's true reward, which training never
sees) are measured on the same held-out requests at every evaluation, so the over-optimisation curve —
proxy up, gold up then down — is read straight off eval/score_mean and eval/gold_reward.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tether.config import build_config
from tether.lab.evaluate import Decoding, generate_for, score_assist
from tether.lab.stats import bootstrap_interval, logged_interval, mean_standard_error
from tether.models.lm import load_model, load_tokenizer

GOLD_KEYS = (
    "gold_reward",
    "gold_win_rate",
    "mean_words",
    "confident_rate",
    "false_fact_rate",
    "distinct_2",
    "true_facts",
    "gold_reward_low",
    "gold_reward_high",
    "gold_win_rate_low",
    "gold_win_rate_high",
)


def finished_summary(run_dir: Path, resume: bool) -> dict | None:
    """A resumed lab stage whose run already finished (killed before stage.json was written) is not trained again."""
    path = run_dir / "summary.json"
    return json.loads(path.read_text()) if resume and path.is_file() else None


def train_settings(run_dir: Path, resume: bool, steps: int, every: int, seed: int, **more) -> dict:
    """The train section every lab run shares, as dotted overrides: the run folder (resumed, or overwritten when
    computed again), ``steps`` optimizer steps, evaluation, checkpoint and log every ``every`` steps, the stage's
    seed, TensorBoard beside metrics.jsonl; ``more``: further train fields by name (``sample_every=1``)."""
    settings = {
        "train.output": str(run_dir),
        "train.resume": resume,
        "train.overwrite": not resume,
        "train.max_steps": steps,
        "train.eval_every": every,
        "train.save_every": every,
        "train.log_every": every,
        "train.seed": seed,
        "train.report_to": ["tensorboard"],
    }
    return settings | {f"train.{name}": value for name, value in more.items()}


class GoldAssistEval:
    """evaluate_fn for run_ppo: gold reward and gold win rate against the SFT model on held-out requests.

    The SFT model's answers are sampled once (the same seed and settings each time) and reused, so every
    evaluation compares against the same reference answers and at step 0 the win rate is exactly 0.5.
    """

    def __init__(self, rows: list[dict], sft_dir: Path, decoding: Decoding, record: Path | None = None):
        self.rows, self.decoding, self.record = rows, decoding, record
        tok = load_tokenizer(sft_dir)
        self.reference = generate_for(load_model(sft_dir, tok), tok, rows, decoding)

    @classmethod
    def for_lab(cls, lab: Path, samples: int, seed: int, record: Path | None = None) -> "GoldAssistEval":
        """The lab's held-out assist requests, `samples` answers each at T = 1 (64 tokens), against its SFT model;
        with ``record`` (a run folder), every evaluation's gold per answer is kept there (``write_gold_by_prompt``)."""
        rows = [
            json.loads(line) for line in (lab / "world" / "assist_eval.jsonl").read_text().splitlines() if line.strip()
        ]
        decoding = Decoding(temperature=1.0, samples=samples, seed=seed, max_new_tokens=64)
        return cls(rows, lab / "sft" / "final", decoding, record)

    def __call__(self, policy, tokenizer, step: int) -> dict:
        completions = generate_for(policy, tokenizer, self.rows, self.decoding)
        figures = score_assist(self.rows, completions, self.reference)
        if self.record is not None:
            write_gold_by_prompt(self.record, step, figures["gold_by_prompt"])
        return {k: figures[k] for k in GOLD_KEYS}


GOLD_BY_PROMPT = "gold_by_prompt"  # <run>/gold_by_prompt/step-<step>.json: one evaluation's gold, answer by answer


def write_gold_by_prompt(run_dir: Path, step: int, gold: list[list[float]]) -> None:
    """Keep one evaluation's gold per answer, grouped by prompt, under its step: written whole or not at all (a
    temporary file renamed), and written again, identical, by a resumed run that evaluates the step again."""
    folder = run_dir / GOLD_BY_PROMPT
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"step-{step:06d}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"step": step, "gold": gold}))
    tmp.replace(path)


def clear_gold_record(run_dir: Path, resume: bool) -> None:
    """A run computed afresh (train.overwrite) starts its gold record afresh too: --overwrite removes the run's own
    files only, and a record left by an earlier, longer run in the folder would be pooled into this one's late third."""
    if not resume:
        shutil.rmtree(run_dir / GOLD_BY_PROMPT, ignore_errors=True)


def read_gold_by_prompt(run_dir: Path) -> dict[int, list[list[float]]]:
    """Every kept evaluation of a run, step → gold per answer grouped by prompt ({} for a run that kept none)."""
    folder = run_dir / GOLD_BY_PROMPT
    records = [json.loads(path.read_text()) for path in sorted(folder.glob("step-*.json"))] if folder.is_dir() else []
    return {r["step"]: r["gold"] for r in records}


# The late window: the evaluations in the last third of a run. An unconstrained policy does not settle: on the
# lab its length cycles against the 64-token limit (about 20 steps a cycle at β = 0), so one evaluation lands on a
# phase of the cycle by chance and gold read there swings by more than its interval (docs/lab.md, "Where β = 0
# ends: the late third"). Pooling the late evaluations' answers prompt by prompt reads where the run ended up, with
# the bootstrap over prompts as its noise.
def late_gold(gold_by_step: dict[int, list[list[float]]], last_step: int) -> dict | None:
    """Gold pooled over the evaluations at steps s with 3 s ≥ 2 · last_step (the last third; step 0 never counts, nor
    a step past last_step):
    each prompt's answers from every late evaluation together, the mean over all of them and its 95 % bootstrap
    interval over prompts (stats.bootstrap_interval). None when no late evaluation was kept."""
    steps = sorted(s for s in gold_by_step if 0 < s <= last_step and 3 * s >= 2 * last_step)
    if not steps:
        return None
    prompts = {len(gold_by_step[s]) for s in steps}
    if len(prompts) != 1:
        raise ValueError(f"late_gold: the late evaluations hold different numbers of prompts: {sorted(prompts)}")
    pooled = [[g for s in steps for g in gold_by_step[s][i]] for i in range(prompts.pop())]
    answers = [g for per_prompt in pooled for g in per_prompt]
    return {"steps": steps, "gold": sum(answers) / len(answers), "gold_ci": list(bootstrap_interval(pooled))}


def run_lab_ppo(
    folder: Path,
    resume: bool,
    *,
    lab: Path,
    reward_model: str,
    kl_coef: float,
    adaptive_target: float,
    steps: int,
    prompts_per_step: int,
    lr: float,
    eval_every: int,
    eval_samples: int,
    seed: int,
    kl_horizon: int = 320,
    extra: dict | None = None,
) -> dict:
    """One PPO run on assist_rl.jsonl; returns the curves and the figures the lab table shows. ``extra``: further
    overrides of the stage's options by dotted name (e.g. ``{"model.mixed_precision": "bf16"}``, or a judge's
    ``judge.*`` with ``reward_model=""``)."""
    from tether.stages.ppo import run_ppo
    from tether.stages.ppo_config import PPOConfig

    world = lab / "world"
    run_dir = folder / "run"
    clear_gold_record(run_dir, resume)
    gold = GoldAssistEval.for_lab(lab, eval_samples, seed, record=run_dir)
    summary = finished_summary(run_dir, resume)
    if summary is None:
        cfg = build_config(
            PPOConfig,
            source="lab",
            overrides={
                "model.path": str(lab / "sft" / "final"),
                "rewards.reward_model": str(lab / reward_model / "run" / "final") if reward_model else "",
                "rollout.prompts": str(world / "assist_rl.jsonl"),
                "rollout.eval_prompts": str(world / "assist_eval.jsonl"),
                "rollout.prompts_per_step": prompts_per_step,
                "rollout.max_new_tokens": 64,
                "algo.minibatch": 16,
                "optim.lr": lr,
                "critic.lr": 1e-4,
                "algo.kl_coef": kl_coef,
                "algo.adaptive_kl": adaptive_target > 0,
                "algo.target_kl": adaptive_target or 6.0,
                "algo.kl_horizon": kl_horizon,
                **train_settings(
                    run_dir, resume, steps, eval_every, seed, sample_every=eval_every, best_metric="eval/gold_reward"
                ),
                **(extra or {}),
            },
        )
        summary = run_ppo(cfg, evaluate_fn=gold)
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {**lab_ppo_figures(summary, metrics), "late": late_gold(read_gold_by_prompt(run_dir), steps)}


def gold_course(curve: list[dict]) -> dict:
    """Gold at the start, the end and its peak, the win rate against the SFT model at the end and at the peak, and
    the final intervals, from an assist run's evaluations (the PPO and the DPO stages' curves)."""
    peak = max(curve, key=lambda c: c["gold"])
    return {
        "start_gold": curve[0]["gold"],
        "final_gold": curve[-1]["gold"],
        "peak_gold": peak["gold"],
        "peak_step": peak["step"],
        "final_win_rate": curve[-1]["win_rate"],
        "win_rate_at_peak": peak["win_rate"],
        "final_win_rate_ci": curve[-1]["win_rate_ci"],
        "final_gold_ci": curve[-1]["gold_ci"],
    }


def lab_ppo_figures(summary: dict, metrics: list[dict]) -> dict:
    """Curves (per evaluation), start/peak/final gold, KL, throughput and the time split per phase."""
    history = summary["eval_history"]
    curve = [
        {
            "step": h["step"],
            "proxy": h["eval/score_mean"],
            "gold": h["eval/gold_reward"],
            "win_rate": h["eval/gold_win_rate"],
            "words": h["eval/mean_words"],
            "distinct_2": h["eval/distinct_2"],
            "gold_ci": logged_interval(h, "gold_reward"),
            "win_rate_ci": logged_interval(h, "gold_win_rate"),
        }
        for h in history
    ]
    for point in curve:  # KL to the reference of the training rollouts at that step (0 before training)
        point["kl"] = next((m["kl/ref_mean"] for m in metrics if m["step"] == point["step"]), 0.0)
    phases = ("generate", "score", "logprobs", "update")
    seconds = {ph: sum(m[f"time/{ph}_s"] for m in metrics) for ph in phases}
    total = sum(seconds.values())
    late = metrics[len(metrics) // 2 :]  # after warm-up: the second half of the run
    return {
        "curve": curve,
        **gold_course(curve),
        "start_proxy": curve[0]["proxy"],
        "final_proxy": curve[-1]["proxy"],
        "final_kl": metrics[-1]["kl/ref_mean"],
        "late_kl_mean": sum(m["kl/ref_mean"] for m in late) / len(late),
        "final_kl_coef": summary["final_kl_coef"],
        "steps": len(metrics),
        "steps_per_minute": 60 * len(metrics) / total,
        "time_split": {ph: s / total for ph, s in seconds.items()},
        "best": summary.get("best"),
        "alarms": summary.get("alarms", []),
        "stopped_at": summary.get("stopped_at"),
    }


class ArithAccuracyEval:
    """evaluate_fn for run_grpo: held-out arith accuracy, greedy and sampled at the training temperature.

    ``samples`` answers are sampled per problem: the sampled accuracy is their mean, and ``accuracy_sampled_se`` its
    standard error over problems (the spread of the per-problem means / √n; a problem's answers are not independent
    of each other, so they are not counted as separate draws). More answers per problem lower the part of the noise
    that comes from sampling, not the part that comes from which problems were drawn. ``accuracy_sampled_n`` stays
    the number of problems: the monitors' rate rule (docs/monitors.md) then uses √(p(1 − p)/n), which is never below
    the true standard error of a mean of per-problem means, so the alarm is conservative."""

    def __init__(self, rows: list[dict], temperature: float, seed: int, max_new_tokens: int, samples: int = 1):
        if samples < 1:
            raise ValueError(f"ArithAccuracyEval: samples must be at least 1, got {samples}")
        self.rows = rows
        self.sampled = Decoding(temperature=temperature, samples=samples, seed=seed, max_new_tokens=max_new_tokens)
        self.greedy = Decoding(temperature=0.0, samples=1, seed=seed, max_new_tokens=max_new_tokens)

    def __call__(self, policy, tokenizer, step: int) -> dict:
        from tether.lab.evaluate import score_arith

        greedy = score_arith(self.rows, generate_for(policy, tokenizer, self.rows, self.greedy))
        completions = generate_for(policy, tokenizer, self.rows, self.sampled)
        sampled = score_arith(self.rows, completions)
        per_problem = [score_arith([row], [answers])["accuracy"] for row, answers in zip(self.rows, completions)]
        n = len(self.rows)  # the count the monitors' noise rule reads (docs/monitors.md)
        return {
            "accuracy_greedy": greedy["accuracy"],
            "accuracy_sampled": sampled["accuracy"],
            "accuracy_sampled_se": mean_standard_error(per_problem),
            "step_accuracy": greedy["step_accuracy"],
            "format_rate": sampled["format_rate"],
            "worked_rate": sampled["worked_rate"],
            "accuracy_greedy_n": n,
            "accuracy_sampled_n": n,
            "step_accuracy_n": n,
        }


LAB_ARITH_REWARDS = {  # what the lab's GRPO stages are rewarded with
    "outcome": ["tether.lab.rewards:arith_correct", "tether.lab.rewards:arith_format=0.5"],
    "process": ["tether.lab.rewards:arith_steps", "tether.lab.rewards:arith_format=0.5"],
}


def run_lab_grpo(
    folder: Path,
    resume: bool,
    *,
    lab: Path,
    recipe: str,
    rewards: str,
    steps: int,
    prompts_per_step: int,
    group_size: int,
    lr: float,
    eval_every: int,
    eval_problems: int,
    seed: int,
    eval_samples: int = 1,
    extra: dict | None = None,
) -> dict:
    """One GRPO-family run on arith_rl.jsonl from the SFT model; returns accuracy curves and throughput."""
    from tether.stages.grpo import run_grpo
    from tether.stages.grpo_config import GRPOConfig

    world = lab / "world"
    rows = [json.loads(line) for line in (world / "arith_eval.jsonl").read_text().splitlines() if line.strip()]
    accuracy = ArithAccuracyEval(rows[:eval_problems], 1.0, seed, 96, eval_samples)  # the budget `tether eval` uses
    run_dir = folder / "run"
    summary = finished_summary(run_dir, resume)
    if summary is None:
        overrides = {
            "model.path": str(lab / "sft" / "final"),
            "rollout.prompts": str(world / "arith_rl.jsonl"),
            "rollout.eval_prompts": str(world / "arith_eval.jsonl"),
            "rewards.reward": LAB_ARITH_REWARDS[rewards],
            "algo.recipe": recipe,
            "optim.lr": lr,
            "rollout.prompts_per_step": prompts_per_step,
            "rollout.group_size": group_size,
            "rollout.max_new_tokens": 48,
            **train_settings(
                run_dir, resume, steps, eval_every, seed, sample_every=eval_every, best_metric="eval/accuracy_sampled"
            ),
            **(extra or {}),
        }
        summary = run_grpo(build_config(GRPOConfig, overrides=overrides, source="lab"), evaluate_fn=accuracy)
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return lab_grpo_figures(summary, metrics)


def lab_grpo_figures(summary: dict, metrics: list[dict]) -> dict:
    curve = [
        {
            "step": h["step"],
            "accuracy_greedy": h["eval/accuracy_greedy"],
            "accuracy_sampled": h["eval/accuracy_sampled"],
            "accuracy_sampled_se": h.get("eval/accuracy_sampled_se"),  # absent from runs before it was logged
            "step_accuracy": h["eval/step_accuracy"],
            "format_rate": h["eval/format_rate"],
            "worked_rate": h["eval/worked_rate"],
        }
        for h in summary["eval_history"]
    ]
    phases = ("generate_score", "logprobs", "update")
    seconds = {ph: sum(m[f"time/{ph}_s"] for m in metrics) for ph in phases}
    total = sum(seconds.values())
    first, last = curve[0], curve[-1]
    return {
        "curve": curve,
        "recipe": summary["recipe"],
        "start_accuracy_greedy": first["accuracy_greedy"],
        "final_accuracy_greedy": last["accuracy_greedy"],
        "start_accuracy_sampled": first["accuracy_sampled"],
        "final_accuracy_sampled": last["accuracy_sampled"],
        "start_accuracy_sampled_se": first["accuracy_sampled_se"],
        "final_accuracy_sampled_se": last["accuracy_sampled_se"],
        "best_accuracy_sampled": max(c["accuracy_sampled"] for c in curve),
        "train_reward_first5": sum(m.get("score/mean", 0.0) for m in metrics[:5]) / max(len(metrics[:5]), 1),
        "train_reward_last5": sum(m.get("score/mean", 0.0) for m in metrics[-5:]) / max(len(metrics[-5:]), 1),
        "zero_variance_frac": sum(m["groups/zero_variance_frac"] for m in metrics) / len(metrics),
        "steps": len(metrics),
        "minutes": total / 60,
        "steps_per_minute": 60 * len(metrics) / total,
        "time_split": {ph: s / total for ph, s in seconds.items()},
        "alarms": summary.get("alarms", []),
    }


def run_lab_dpo(
    folder: Path,
    resume: bool,
    *,
    lab: Path,
    pairs: Path | None,
    loss: str,
    beta: float,
    steps: int,
    batch: int,
    lr: float,
    eval_every: int,
    eval_samples: int,
    seed: int,
    extra: dict | None = None,
) -> dict:
    """One DPO-family run on the assist world from the SFT model — offline on `pairs`, or online (pairs None: sampled
    from the policy each round and labelled by the annotator panel) — judged by gold on held-out requests.
    ``extra``: further overrides by dotted name (e.g. ``{"dpo.sft_coef": 1.0}``, or an online run's rounds)."""
    from tether.stages.dpo import run_dpo
    from tether.stages.dpo_config import DPOConfig

    world = lab / "world"
    run_dir = folder / "run"
    clear_gold_record(run_dir, resume)
    gold = GoldAssistEval.for_lab(lab, eval_samples, seed, record=run_dir)
    summary = finished_summary(run_dir, resume)
    if summary is None:
        overrides = {
            "model.path": str(lab / "sft" / "final"),
            "data.eval_path": str(world / "prefs_eval.jsonl"),
            "dpo.loss": loss,
            "dpo.beta": beta,
            "optim.lr": lr,
            "optim.warmup_ratio": 0.05,
            **train_settings(
                run_dir, resume, steps, eval_every, seed, batch_size=batch, micro_batch_size=batch, keep_checkpoints=1
            ),
        }
        if pairs is not None:
            overrides["data.path"] = str(pairs)
        else:  # online: the pairs come from the policy; --eval-data still gives held-out pair accuracy
            overrides.update(
                {"online.online": True, "rollout.prompts": str(world / "assist_rl.jsonl"), "rollout.max_new_tokens": 64}
            )
        overrides.update(extra or {})
        summary = run_dpo(build_config(DPOConfig, overrides=overrides, source="lab"), evaluate_fn=gold)
    return lab_dpo_figures(summary)


def lab_dpo_figures(summary: dict) -> dict:
    curve = [
        {
            "step": h["step"],
            "gold": h["eval/gold_reward"],
            "win_rate": h["eval/gold_win_rate"],
            "words": h["eval/mean_words"],
            "accuracy": h.get("eval/rewards/accuracy"),
            "chosen": h.get("eval/rewards/chosen"),
            "rejected": h.get("eval/rewards/rejected"),
            "logps_chosen": h.get("eval/logps/chosen"),
            "logps_rejected": h.get("eval/logps/rejected"),
            "gold_ci": logged_interval(h, "gold_reward"),
            "win_rate_ci": logged_interval(h, "gold_win_rate"),
        }
        for h in summary["eval_history"]
    ]
    return {
        "curve": curve,
        "loss": summary["loss"],
        "beta": summary["beta"],
        **gold_course(curve),
        "final_pair_accuracy": curve[-1]["accuracy"],
        "online_rounds": summary.get("online_rounds", []),
        "train_examples": summary["train_examples"],
        "minutes": summary["wall_s"] / 60,
    }
