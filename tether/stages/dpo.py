"""`tether dpo`: the direct-preference family, offline and online (docs/algorithms.md §6, docs/dpo.md).

Offline: preference pairs (or ranked lists) → reference log-probs in one cached no-grad pass → the shared offline
loop (tether/train/offline.py) with DPOObjective (all responses of a batch in one forward). Online: the shared
online loop (tether/train/online.py) with rounds — every steps_per_round steps, two answers per prompt are sampled
from the current policy, labelled (a judge function, or the shared scorer: a reward model and/or reward
functions), and the next steps train on those pairs against the fixed reference.
"""

from __future__ import annotations

import time

from tether.config import ConfigError
from tether.models.lm import check_lora_reference
from tether.stages.dpo_config import DPOConfig
from tether.stages.dpo_online import run_online_dpo
from tether.stages.dpo_setup import dpo_plan, dpo_summary, evaluate_pairs, load_dpo_data, pair_collate, setup_dpo
from tether.train.checkpoint import load_training_state
from tether.train.offline_run import OfflineRun, run_offline
from tether.train.run import start_run
from tether.train.sharding import is_sharded


def run_dpo(cfg: DPOConfig, evaluate_fn=None, backend=None) -> dict:
    """Train; ``evaluate_fn(policy, tokenizer, step) -> dict`` adds task metrics (on the lab: gold win rate) to every
    evaluation, including one before the first step."""
    return run_online_dpo(cfg, evaluate_fn, backend) if cfg.online.online else _run_offline(cfg, evaluate_fn)


def _run_offline(cfg: DPOConfig, evaluate_fn) -> dict:
    t_start = time.perf_counter()
    check_lora_reference(cfg.model)  # before anything is written
    if not cfg.data.path:
        raise ConfigError("--data is required")
    data = load_dpo_data(cfg)
    opened = start_run(cfg, {"--output": cfg.train.output})
    accelerator, config, _, start_step, checkpoint = opened
    s = setup_dpo(cfg, data, accelerator, config, start_step, checkpoint)
    if checkpoint is not None:
        load_training_state(
            checkpoint,
            s.optimizer,
            s.scheduler,
            accelerator.process_index,
            sharded_model=s.model if is_sharded(s.model) else None,
        )
    if is_sharded(s.model) and evaluate_fn is not None:
        raise ConfigError(
            "--fsdp: a task evaluation (the lab's) runs on process 0 alone, which a sharded model "
            "cannot; run it without --fsdp"
        )
    history: list[dict] = list(s.state.get("eval_history", []))

    def evaluate(step: int) -> dict:
        metrics = evaluate_pairs(s, cfg)
        if evaluate_fn is not None and accelerator.is_main_process:
            metrics.update({f"eval/{k}": v for k, v in evaluate_fn(s.unwrapped, s.tokenizer, step).items()})
        return metrics

    def before(logger) -> None:  # the evaluation before the first step (eval0/* in step 0's row)
        if start_step == 0 and (s.evals or evaluate_fn is not None):
            baseline = evaluate(0)
            history.append({"step": 0, **baseline})
            logger.log({"step": 0, **{k.replace("eval/", "eval0/", 1): v for k, v in baseline.items()}})

    saved = s.processor or s.tokenizer  # a vision model's processor is saved beside its weights
    run = OfflineRun("dpo", cfg, opened, s.total_steps, (s.model, s.optimizer, s.scheduler), saved, t_start)
    return run_offline(
        run,
        {**dpo_plan(cfg, s), "start step": start_step},
        s.reports,
        lambda last_eval, steps: {
            **dpo_summary(cfg, s, last_eval, []),
            "eval_history": history,
            "alarms": [],
            "stopped_at": None,
        },
        before=before,
        train_examples=s.train,
        # with no held-out pairs but a task evaluation, a stand-in list makes the loop call evaluate()
        eval_examples=s.evals or ([None] if evaluate_fn is not None else []),
        collate_fn=pair_collate(s, cfg),
        objective=s.objective,
        on_eval=lambda step, m: history.append({"step": step, **m}) and False,
        checkpoint_state=lambda: {"beta_dpo": s.objective.state, "eval_history": history},
        evaluate_fn=evaluate,
    )
