"""The online loop shared by PPO, the group family and online DPO.

A stage loads its models and hands the loop an ``OnlineStage``: a ``step(step)`` that samples, scores and updates
(returning the step's metrics and its sampled responses), an ``evaluate()`` on held-out data, the models and
optimizers it trains, and its own state. The loop owns the rest, once for every stage: exact resume (optimizers,
schedulers, RNG, the stage's state), the plan and config.yaml, evaluation before the first update and every
eval_every steps, best/, samples.jsonl, the reward-hacking monitors and stop-on-alarm, checkpoints (one layout,
tether/train/checkpoint.py), final/ and summary.json.

Reading order = execution order: for each step, step() → evaluate (when due) → metrics.jsonl → samples.jsonl
→ monitors → checkpoint (when due, at the end, or on an alarm that stops the run).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol

from tether.config import ConfigError
from tether.console import console
from tether.diagnostics.report import reading_place
from tether.diagnostics.watch import RunMonitor, read_jsonl
from tether.models.vision import is_vision_language
from tether.models.work import counting, phase, section
from tether.rewards.functions import RewardFunctionError
from tether.train.checkpoint import load_training_state, rng_state, save_checkpoint, save_final, set_rng_state
from tether.train.logger import MetricsLogger, warn_if_truncated
from tether.train.parallel import DataParallel
from tether.train.run import announce, close_run, closing_line, peak_memory, write_json
from tether.train.sharding import is_dtensor, is_sharded


class RunScorer(Protocol):
    """What the loop asks of a stage's scorer (tether.rewards.score.Scorer, or an AgentSampler for episodes)."""

    def set_progress(self, global_step: int, max_steps: int) -> None: ...

    def error_counts(self) -> dict[str, int]: ...

    def restore_error_counts(self, counts: dict[str, int]) -> None: ...

    def step_figures(self, section: str | None = None) -> dict[str, float]: ...  # a judge's sums (rewards/judge.py)


class OnlineStage(Protocol):
    name: str  # "ppo", "grpo", "dpo": the summary's stage and the logger's run name
    policy: object  # the trained model (a PeftModel when training LoRA; sharded with --fsdp)
    sampling_policy: object  # what samples: the policy, a sharded policy's gathered copy (hf), or the policy (vllm)
    tokenizer: object
    optimizer: object
    scheduler: object
    scorer: "RunScorer | None"  # its reward-function failures are counted and checkpointed
    cfg: object  # the stage's config (train/online.py final_before_alarm reloads a checkpoint with its model section)

    def extra_parts(self) -> dict[str, tuple]:
        """Further trained models {name: (model, optimizer, scheduler or None)}, e.g. PPO's critic."""

    def plan(self) -> dict:
        """The stage's lines of the plan table."""

    def state(self) -> dict:
        """JSON-able state to checkpoint (PPO's β, a data cursor, β-DPO's statistics...)."""

    def load_state(self, state: dict) -> None:
        """Restore what state() returned."""

    def step(self, step: int) -> tuple[dict, list]:
        """One step (0-based): (metrics without "step", SampleRecords of the responses sampled in it)."""

    def evaluate(self) -> dict:
        """eval/* metrics on held-out data (may be empty)."""

    def summary(self) -> dict:
        """The stage's own entries of summary.json."""


@dataclass(frozen=True)
class Schedule:
    """When the loop evaluates, samples, checks, saves and logs (from the stage's run section)."""

    total_steps: int
    eval_every: int
    save_every: int
    keep_checkpoints: int
    log_every: int
    report_to: list = field(default_factory=list)
    sample_every: int = 1
    best_metric: str = ""
    best_mode: str = "max"
    stop_on_alarm: bool = False
    alarm_final: str = "last"  # what final/ holds after a stop on alarm: last | before | best
    alarm_stops: str = "any"  # which alarms stop: any | trusted
    round_steps: int = 0  # online DPO: steps per round; a round's end is also evaluated (and saved, if saving)

    @classmethod
    def of(cls, run, total_steps: int, **overrides) -> "Schedule":
        """From a RunSection (OnlineRunSection fields when it has them)."""
        fields = {
            k: getattr(run, k)
            for k in ("sample_every", "best_metric", "best_mode", "stop_on_alarm", "alarm_final", "alarm_stops")
            if hasattr(run, k)
        }
        return cls(
            total_steps,
            run.eval_every,
            run.save_every,
            run.keep_checkpoints,
            run.log_every,
            list(run.report_to),
            **{**fields, **overrides},
        )

    def due(self, every: int, done: int) -> bool:
        return bool(every) and done % every == 0

    def evaluate_at(self, done: int) -> bool:
        return self.due(self.eval_every, done) or done == self.total_steps or self.due(self.round_steps, done)

    def save_at(self, done: int) -> bool:
        return (
            self.due(self.save_every, done)
            or done == self.total_steps
            or (bool(self.save_every) and self.due(self.round_steps, done))
        )


def improves(figures: dict, metric: str, mode: str, best) -> bool:
    if metric not in figures:
        raise ConfigError(f"--best-metric {metric}: the evaluation reports {sorted(figures)}")
    value = figures[metric]
    return best is None or (value > best if mode == "max" else value < best)


class _Run:
    """The loop's own state: evaluation history, best/, reward-function error counts — checkpointed with the stage's."""

    def __init__(self, stage: OnlineStage, schedule: Schedule, out: Path, evaluate_fn: Callable | None, accelerator):
        self.stage, self.schedule, self.out, self.evaluate_fn = stage, schedule, out, evaluate_fn
        self.accelerator, self.dp = accelerator, DataParallel(accelerator)
        self.history, self.best = [], {"value": None, "step": None}  # evaluations so far, and best/'s
        self.audit_since = [0.0, 0.0]  # the audit's responses since the last evaluation, and their sum (--audit)
        self.stopped = False  # resumed from a stop on alarm's checkpoint (restore)
        if evaluate_fn is not None and is_sharded(stage.sampling_policy):
            raise ConfigError(
                "--fsdp with rollout.backend=vllm: a task evaluation (the lab's) runs on process 0 alone, on an "
                "ordinary model, and a policy whose weights go to the engine keeps no gathered copy; run it with "
                "rollout.backend=hf (each process samples from a gathered copy) or without the task evaluation"
            )

    def restore(self, checkpoint: Path) -> int:
        extra = {
            name: (opt, sched, part if is_sharded(part) else None)
            for name, (part, opt, sched) in self.stage.extra_parts().items()
        }
        written_by = json.loads((checkpoint / "trainer_state.json").read_text()).get("num_processes", 1)
        if written_by != self.dp.world:  # each process's RNG and share of the prompts belong to its rank
            raise ConfigError(
                f"{checkpoint} was written by {written_by} process(es); resume it on {written_by} "
                f"(accelerate launch --num_processes {written_by}), not {self.dp.world}"
            )
        policy = self.stage.policy
        saved = load_training_state(
            checkpoint,
            self.stage.optimizer,
            self.stage.scheduler,
            self.accelerator.process_index,
            extra,
            sharded_model=policy if is_sharded(policy) else None,
        )
        self.history = [h for h in saved.get("eval_history", []) if h["step"] <= saved["step"]]
        self.best.update(saved.get("best", {}))
        self.audit_since = saved.get("audit_since", [0.0, 0.0])
        self.stage.load_state(saved.get("stage", {}))
        if self.scorer is not None:  # the saved counts are the sums over processes: process 0 carries them on
            self.scorer.restore_error_counts(saved.get("reward_errors", {}) if self.dp.rank == 0 else {})
        # a stop whose tail (final/, summary.json) was cut short ends the resumed run there; a finished one resumed
        # continues (docs/monitors.md: the alarm judged false)
        self.stopped = saved.get("stopped_on_alarm", False) and not (self.out / "summary.json").exists()
        return saved["step"]

    @property
    def scorer(self):
        """The stage's reward scorer, whose reward-function failures the run counts (None: no scorer)."""
        return getattr(self.stage, "scorer", None)

    def error_counts(self) -> dict:
        """Reward-function failures (and "no opinion" answers) so far, summed over processes."""
        counts = self.scorer.error_counts() if self.scorer is not None else {}
        if self.dp.active:  # a count one process has and another not yet: every process sums the same names
            names = sorted({n for names in self.dp.gather_json([sorted(counts)]) for n in names})
            counts = {n: counts.get(n, 0) for n in names}
        return {name: int(n) for name, n in self.dp.sum_dict(counts).items()}

    def scorer_metrics(self, section: str | None = None) -> dict:
        """A judge's and the audit's figures of the step (or of the evaluation: "eval"), summed over processes."""
        from tether.rewards.score import scorer_rates

        sums = self.scorer.step_figures(section) if self.scorer is not None else {}
        if self.dp.active:  # every process sums the same names
            names = sorted({n for names in self.dp.gather_json([sorted(sums)]) for n in names})
            sums = self.dp.sum_dict({n: sums.get(n, 0.0) for n in names})
        return scorer_rates(sums)

    def step_scored(self) -> dict:
        """The judge's and the audit's figures of the step's sampling; the audit's pooled until the next evaluation."""
        scored = self.scorer_metrics()
        n = scored.get("audit/n", 0.0)
        self.audit_since = [self.audit_since[0] + n, self.audit_since[1] + n * scored.get("audit/score_mean", 0.0)]
        return scored

    def error_metrics(self) -> dict:
        return {
            f"reward/{name}" if name.endswith("/none") else f"reward/{name}/errors": n
            for name, n in self.error_counts().items()
        }

    def evaluate(self, step: int) -> dict:
        with section("eval"):
            res = self.stage.evaluate()
            res.update(self.scorer_metrics("eval"))
            if self.evaluate_fn is not None and self.accelerator.is_main_process:
                with phase("task"):  # the lab's gold evaluation (process 0 alone)
                    figures = self.evaluate_fn(self.stage.sampling_policy, self.stage.tokenizer, step)
                res.update({f"eval/{k}": v for k, v in figures.items()})
        res = self.dp.gather_json([res])[0]  # process 0's figures (with the task metrics only it computes) everywhere
        (n, total), self.audit_since = self.audit_since, [0.0, 0.0]
        if n:  # the audit's mean over the responses it scored since the last evaluation
            res.update({"eval/audit_score_mean": total / n, "eval/audit_n": n})
        self.history.append({"step": step, **res})
        s = self.schedule
        unaudited = s.best_metric == "eval/audit_score_mean" and s.best_metric not in res  # step 0, or none picked
        if s.best_metric and not unaudited and improves(res, s.best_metric, s.best_mode, self.best["value"]):
            self.best.update(value=res[s.best_metric], step=step)  # step 0: nothing trained has beaten the start yet

            def best_json(tmp: Path) -> None:
                (tmp / "best.json").write_text(json.dumps({"metric": s.best_metric, **self.best}))

            # every process: a sharded policy (vllm keeps no gathered copy) is gathered to process 0
            save_final(
                self.accelerator, self.stage.sampling_policy, saved_with(self.stage), self.out / "best", best_json
            )
        return res

    def save(self, done: int, keep_before: bool = False, stopped: bool = False) -> None:
        """checkpoint-<done>; ``keep_before``: rotated keeping one more, the one before it (alarm_final=before)."""
        keep = self.schedule.keep_checkpoints
        state = {
            "stage": self.stage.state(),
            "best": self.best,
            "audit_since": self.audit_since,
            "eval_history": self.history,
            "reward_errors": self.error_counts(),
            "stopped_on_alarm": stopped,  # resumed from it, the run trains no further: it ends as the stop did
        }
        save_checkpoint(
            self.accelerator,
            self.stage.policy,
            saved_with(self.stage),
            self.stage.optimizer,
            self.stage.scheduler,
            done,
            self.out,
            state,
            keep + 1 if keep_before and keep > 0 else keep,
            extra=self.stage.extra_parts(),
        )

    def evaluate_or_stop(self, step: int, keep_the_step: Callable | None = None) -> dict:
        """evaluate(step); a reward function failing in it stops the run, after ``keep_the_step()`` (which logs the
        step and checkpoints it), with the error."""
        try:
            return self.evaluate(step)
        except RewardFunctionError as err:
            if keep_the_step is None:
                raise ConfigError(f"evaluation before the first step: {err}") from err
            keep_the_step()
            raise ConfigError(
                f"evaluation after step {step}: {err}. The {step} steps done are in checkpoint-{step} "
                "(without this evaluation): fix the reward function and run again with --resume"
            ) from err

    def snapshot(self) -> dict:
        """What a step changes before it updates anything (the RNG, the stage's state): restored by a failed step."""
        return {"rng": rng_state(), "stage": json.loads(json.dumps(self.stage.state()))}

    def save_before_failure(self, step: int, snapshot: dict, error: Exception) -> None:
        """A reward function failed inside step ``step`` (0-based), before its update: checkpoint the ``step`` steps
        done, as they stood when the failed step began, and stop with the error."""
        if step == 0:
            raise ConfigError(f"step 1: {error}. No step was done, so there is nothing to checkpoint") from error
        set_rng_state(snapshot["rng"])
        self.stage.load_state(snapshot["stage"])
        self.save(step)
        what, option = (
            ("environment", "--env-on-error score")
            if getattr(error, "is_environment", False)
            else ("reward function", "--reward-on-error score")
        )
        raise ConfigError(
            f"step {step + 1}: {error}. The {step} steps done are in checkpoint-{step}: fix the {what} "
            f"and run again with --resume (or, to score failures and count them instead, resume with "
            f"{option})"
        ) from error

    def write_samples(self, samples: list) -> None:
        if not self.accelerator.is_main_process:  # every process holds the step's whole experience
            return
        with (self.out / "samples.jsonl").open("a") as handle:
            handle.write("".join(json.dumps(s.as_dict()) + "\n" for s in samples))


def saved_with(stage):
    """What a stage's model folders are saved with: a vision-language model's processor (its tokenizer, image
    processor and template, train/sampling.py), else the tokenizer."""
    return getattr(getattr(stage, "sampler", None), "processor", None) or stage.tokenizer


def _same_start(run: "_Run", stage: OnlineStage) -> None:
    """On N processes the trained models start equal on every process, and each process samples its own noise."""
    if not run.dp.active:
        return
    import torch

    for model in [stage.policy] + [part for part, _, _ in stage.extra_parts().values()]:
        # a sharded model's shards were cut from the same loaded weights on every process
        run.dp.broadcast_parameters([q for q in model.parameters() if q.requires_grad and not is_dtensor(q)])
    torch.manual_seed(torch.initial_seed() + 7919 * run.dp.rank)


def _summary(run: "_Run", stage, schedule, out: Path, start_step: int, stopped_at, t_start: float, accelerator) -> dict:
    summary = {
        "stage": stage.name,
        "steps": schedule.total_steps,
        "resumed_from": start_step or None,
        **stage.summary(),
        "alarms": read_jsonl(out / "alarms.jsonl"),
        "stopped_at": stopped_at,
        "eval_history": run.history,
        "wall_s": round(time.perf_counter() - t_start, 2),
        "peak_memory": peak_memory(accelerator),
    }
    if schedule.best_metric:
        summary["best"] = {"metric": schedule.best_metric, **run.best}
    return summary


def headline(out: Path, summary: dict) -> dict:
    """The online loop's closing figures: the score (online DPO's: its loss) at the first and the last step logged,
    the last evaluation's figures (in the report's reading order), best/ when kept, and the alarms raised."""
    rows = read_jsonl(out / "metrics.jsonl")
    figures: dict = {}
    for key in ("score/mean", "train/loss"):
        logged = [r for r in rows if isinstance(r.get(key), (int, float))]
        if logged:
            first, last = logged[0], logged[-1]
            figures[key] = f"{first[key]:.4g} (step {first['step']}) → {last[key]:.4g} (step {last['step']})"
            break
    last_eval = summary["eval_history"][-1] if summary["eval_history"] else {}
    shown = [k for k, v in last_eval.items() if k.startswith("eval/") and isinstance(v, (int, float))]
    figures.update({k: last_eval[k] for k in sorted(shown, key=reading_place)})  # the report's order
    best = summary.get("best") or {}
    if best.get("step") is not None:
        figures["best/"] = f"step {best['step']} ({best['metric']} {best['value']:.4g})"
    stopped = f" (stopped at step {summary['stopped_at']})" if summary["stopped_at"] else ""
    figures["alarms"] = f"{len(summary['alarms'])}{stopped}"
    return figures


def run_online(
    stage: OnlineStage, schedule: Schedule, start: "OnlineStart", title: str, evaluate_fn: Callable | None = None
) -> dict:
    """Train ``stage`` from the run ``start`` opened (its checkpoint, or step 0) to schedule.total_steps; returns the
    summary. ``evaluate_fn(policy, tokenizer, step) -> dict`` adds task metrics (the lab's gold figures) to every
    evaluation."""
    t_start = time.perf_counter()
    with counting() as counter:  # every model forward, by phase: forwards/* and positions/* in each metrics row
        return _train(stage, schedule, start, title, evaluate_fn, t_start, counter)


def _train(stage, schedule, start: "OnlineStart", title, evaluate_fn, t_start, counter) -> dict:
    config, accelerator, out, checkpoint = start.config, start.accelerator, start.out, start.checkpoint
    run = _Run(stage, schedule, out, evaluate_fn, accelerator)
    _same_start(run, stage)
    start_step = run.restore(checkpoint) if checkpoint is not None else 0  # RNG last: nothing below draws from it
    if accelerator.is_main_process:
        plan = {**stage.plan(), "processes": run.dp.world, "steps": schedule.total_steps, "start step": start_step}
        announce(title, plan, config, out, checkpoint=checkpoint)
    logger = MetricsLogger(
        out,
        schedule.report_to,
        config,
        start_step,
        schedule.total_steps,
        enabled=accelerator.is_main_process,
        log_every=schedule.log_every,
        run_name=stage.name,
    )
    baseline = run.evaluate_or_stop(0) if start_step == 0 else {}
    monitor = RunMonitor(out, schedule.stop_on_alarm, stops=schedule.alarm_stops)
    stopped_at, warned_truncation = (start_step if run.stopped else None), -10
    trained_peak = None
    try:
        for step in range(start_step, start_step if run.stopped else schedule.total_steps):
            before = run.snapshot()
            try:
                if run.scorer is not None:  # the reward functions' trainer_state
                    run.scorer.set_progress(step, schedule.total_steps)
                step_metrics, samples = stage.step(step)
            except RewardFunctionError as err:
                run.save_before_failure(step, before, err)
            done = step + 1
            metrics = {"step": done, **step_metrics, **run.error_metrics()}
            if step == start_step and baseline:
                metrics.update({k.replace("eval/", "eval0/", 1): v for k, v in baseline.items()})
            keep_samples = bool(samples) and schedule.due(schedule.sample_every, done)
            scored = run.step_scored()
            if schedule.evaluate_at(done):
                metrics.update(
                    run.evaluate_or_stop(
                        done, lambda: (logger.log(metrics), keep_samples and run.write_samples(samples), run.save(done))
                    )
                )
            metrics.update(counter.take(), **scored)  # the step's forwards (and the evaluation's), its scorers'
            logger.log(metrics)
            warned_truncation = warn_if_truncated(metrics, warned_truncation)
            if keep_samples:
                run.write_samples(samples)
            # reward-hacking alarms on everything written so far (by process 0, which tells the others)
            stop = run.dp.broadcast_flag(accelerator.is_main_process and monitor.check(done == schedule.total_steps))
            if done == schedule.total_steps or stop:  # the training's peak, before the last checkpoint's gathers
                trained_peak = peak_memory(accelerator)
            if schedule.save_at(done) or stop:
                run.save(done, keep_before=stop and schedule.alarm_final == "before", stopped=stop)
            if stop:
                console.print(f"stopping at step {done}: --stop-on-alarm", style="bold red")
                stopped_at = done
                break
    finally:
        logger.close()
        if run.scorer is not None:
            run.scorer.close()
    summary = _summary(run, stage, schedule, out, start_step, stopped_at, t_start, accelerator)
    if trained_peak is not None:
        summary["peak_memory"]["before_final_save"] = trained_peak
    if stopped_at is not None and schedule.alarm_final != "last":
        summary["final_from"] = final_before_alarm(accelerator, stage, out, stopped_at, schedule.alarm_final)
    else:
        # LoRA merged; with --fsdp the gathered copy that samples (hf), or the sharded policy gathered (vllm)
        save_final(accelerator, stage.sampling_policy, saved_with(stage), out / "final")
    if accelerator.is_main_process:
        console.print(closing_line(out, headline(out, summary)))
        write_json(out / "summary.json", summary)
    close_run(accelerator)
    return summary


def final_before_alarm(accelerator, stage, out: Path, stopped_at: int, keep: str) -> str:
    """final/ after a stop on alarm (train.alarm_final): ``best`` copies best/; ``before`` writes the model of the
    last checkpoint written before the alarm's step (LoRA merged), or the starting model when none was. Returns
    what final/ holds, for summary.json."""
    import shutil

    from tether.models.lm import load_trainable_model, save_merged
    from tether.train.checkpoint import list_checkpoints, write_atomically

    if keep == "best":
        source, what = out / "best", "best/"
        if accelerator.is_main_process:
            write_atomically(lambda tmp: shutil.copytree(source, tmp, dirs_exist_ok=True), out / "final")
    else:
        earlier = [(step, folder) for step, folder in list_checkpoints(out) if step < stopped_at]
        checkpoint = earlier[-1][1] if earlier else None
        what = checkpoint.name if checkpoint is not None else f"the starting model ({stage.cfg.model.path})"
        if accelerator.is_main_process:
            model = load_trainable_model(stage.cfg.model, stage.tokenizer, checkpoint)
            write_atomically(lambda tmp: save_merged(model, saved_with(stage), tmp), out / "final")
    accelerator.wait_for_everyone()
    console.print(f"final/ holds {what}: the alarm at step {stopped_at} kept it (--alarm-final {keep})", style="red")
    return what


# ------------------------------------------------------------------------------------------ shared by the stages


@dataclass
class OnlineStart:
    """What every online stage opens before it loads a model: the run folder, the prompts and the reward functions
    (checked by a dry call before any model is loaded)."""

    accelerator: object
    config: dict
    out: Path
    start_step: int
    checkpoint: Path | None
    prompt_rows: list[dict]
    eval_rows: list[dict]
    reward_set: object
    audit_set: object = None  # the RewardSection's --audit, a RewardSet of one function (rewards/functions.py)


def start_online(
    cfg, total_steps: int, rewards_cfg, prompts: str, eval_prompts: str, stand_in_reward: bool = False
) -> OnlineStart:
    """Checks and set-up shared by the online stages: required inputs, a reward, the run folder (new, --overwrite
    or --resume), the seeds, the prompt files and the reward functions."""
    from tether.data.prompts import prompt_rows as prompt_rows_of
    from tether.models.lm import check_lora_reference
    from tether.models.reward import process_reward_separator
    from tether.rewards.functions import load_audit_set, load_reward_set
    from tether.train.run import check_steps_left, start_run

    if rewards_cfg is not None and not (stand_in_reward or cfg.judge.model or rewards_cfg.has_reward()):
        raise ConfigError("a reward is required: --reward-model DIR, --judge-model DIR and/or --reward module:function")
    check_lora_reference(cfg.model)  # before anything is written
    if rewards_cfg is not None and rewards_cfg.process_reward_model:  # a `tether prm` folder, not any model's
        process_reward_separator(rewards_cfg.process_reward_model)
    if cfg.model.fsdp and cfg.model.lora_r > 0:
        raise ConfigError(
            "--fsdp with LoRA is not built: the adapters and their AdamW states are small (162 M parameters, 2.4 GiB "
            "for a 7 B model at r = 64), and the frozen bf16 base fits each process whole up to about 32 B (61 GiB); "
            "train LoRA data-parallel, without --fsdp (docs/scaling.md)"
        )
    for flag, value in (("--model", cfg.model.path), ("--prompts", prompts)):
        if not value:
            raise ConfigError(f"{flag} is required")
    columns, images = cfg.rollout.columns, is_vision_language(cfg.model.path)
    if images:
        refuse_vision_online(cfg, rewards_cfg)
    pixels = cfg.model.max_image_pixels if images else 0  # a vision-language model's rows: images read, given
    prompt_rows = prompt_rows_of(prompts, columns, pixels)  # inputs are checked before the run folder is touched
    eval_rows = prompt_rows_of(eval_prompts, columns, pixels) if eval_prompts else []
    if cfg.judge.model:  # the columns its template and baseline read, in every row
        from tether.rewards.judge_template import check_judge_rows

        check_judge_rows(cfg.judge, prompt_rows, prompts, columns)
        check_judge_rows(cfg.judge, eval_rows, eval_prompts, columns)
    reward_set = load_reward_set(rewards_cfg, prompt_rows, total_steps, pixels) if rewards_cfg is not None else None
    # the audit is an option of its own: loaded beside --env too, where the reward functions may be none
    audit_set = load_audit_set(cfg.rewards, prompt_rows, total_steps, pixels)
    accelerator, config, out, start_step, checkpoint = start_run(cfg, {"--output": cfg.train.output})
    check_steps_left(start_step, total_steps, checkpoint)
    return OnlineStart(accelerator, config, out, start_step, checkpoint, prompt_rows, eval_rows, reward_set, audit_set)


def refuse_vision_online(cfg, rewards_cfg) -> None:
    """What a vision-language policy cannot do online yet, refused by name before anything is written: it samples
    with the hf backend or a vLLM engine (the architectures vLLM's build serves: a start that fails names why), in the
    trainer or in a rollout worker beside each process, and is scored by reward functions (given the images) and a
    vision-language reward model (which scores the prompt's images with the response)."""
    refused = [
        (bool(getattr(getattr(cfg, "agent", None), "env", "")), "--env (agent episodes with images are not built)"),
        (
            bool(rewards_cfg is not None and rewards_cfg.reward_model)
            and not is_vision_language(rewards_cfg.reward_model),
            "a text --reward-model (it would score the text alone: train one on the images, `tether rm`)",
        ),
        (
            bool(rewards_cfg is not None and rewards_cfg.process_reward_model)
            and not is_vision_language(rewards_cfg.process_reward_model),
            "a text --process-reward-model (it would score the text alone: train one on the images, `tether prm`)",
        ),
        (bool(cfg.judge.model), "--judge-model (it would judge the text alone)"),
    ]
    named = [why for hit, why in refused if hit]
    if named:
        raise ConfigError(
            f"{cfg.model.path} is a vision-language model; online it samples (hf or vllm, or a rollout worker) and "
            f"is scored by reward functions, which are given each prompt's images. Not built yet: {'; '.join(named)}"
        )


def start_rollout_stage(cfg, scorer=None) -> OnlineStart:
    """start_online for the stages that train on rollouts (GRPO, PPO): their prompt files, their step count, and
    the reward functions — beside --env only when --reward names some, which then score the episode's answer; a
    ``scorer`` standing in for --reward-model counts as a reward."""
    with_env_functions = not cfg.agent.env or cfg.rewards.reward
    return start_online(
        cfg,
        cfg.train.max_steps,
        cfg.rewards if with_env_functions else None,
        cfg.rollout.prompts,
        cfg.rollout.eval_prompts,
        stand_in_reward=scorer is not None,
    )
