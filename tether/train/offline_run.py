"""The offline stages' scaffolding, written once: SFT, reward models, process reward models and offline DPO each
bring their data, model and objective, and take from here the step count, the trained model's optimizer (sharded
with --fsdp, restored on resume, wrapped for data parallelism), and the run itself (``run_offline``, as the online
stages have run_online): their data read and split once (``read_split``), the plan, the metrics logger, the loop
(tether/train/offline.py), final/, summary.json, the closing line and the run folder's release."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tether.console import console
from tether.data.records import read_records, tokenize_split
from tether.models.lm import length_limit
from tether.train.checkpoint import load_training_state, save_final, saved_state
from tether.train.logger import MetricsLogger
from tether.train.offline import loop_settings, train_offline
from tether.train.run import announce, check_steps_left, close_run, closing_line, peak_memory, write_json
from tether.train.schedule import build_optimizer
from tether.train.sharding import is_sharded, shard_model


def read_split(cfg, tokenize: Callable, group: Callable | None = None, images_read: bool = False):
    """An offline stage's data: the records of ``cfg.data.path`` (at most max_records) and of --eval-data, or a
    seeded eval_fraction held out (tokenize_split), each side tokenised by ``tokenize(records, label, limit)``
    with the run's length limit (--max-length, or the model's own). Records with images are refused by name unless
    ``images_read`` (the stage's tokenize reads them). Returns tokenize_split's five."""
    from tether.data.multimodal import not_built, refuse_images

    d = cfg.data
    records = read_records(d.path, d.columns, d.split, d.max_records)
    eval_records = read_eval_records(d)
    if not images_read:
        refuse_images(records + (eval_records or []), not_built())
    limit = length_limit(d.max_length, cfg.model.path)
    return tokenize_split(
        records,
        eval_records,
        d.eval_fraction,
        cfg.train.seed,
        d.path,
        lambda recs, label: tokenize(recs, label, limit),
        d.eval_path,
        group,
    )


def read_eval_records(d) -> list | None:
    """The records of --eval-data (None without it): its own split (eval_split), so the held-out split of the
    training folder is read, not the training rows again (DataSection refuses the same path and split)."""
    return read_records(d.eval_path, d.columns, d.eval_split) if d.eval_path else None


def plan_steps(cfg, accelerator, examples: int, start_step: int, checkpoint: Path | None) -> int:
    """The run's optimizer steps, once the global batch is known to split over the processes and a resumed run is
    known to have steps left."""
    cfg.train.grad_accum(accelerator.num_processes)
    total_steps = cfg.train.total_steps(examples)
    check_steps_left(start_step, total_steps, checkpoint)
    return total_steps


def prepare_trained(model, cfg, accelerator, total_steps: int, checkpoint: Path | None):
    """(model, optimizer, scheduler, the checkpoint's saved state or {}): the model sharded with --fsdp before the
    optimizer is built on its (sharded) parameters, the optimizer and schedule restored from ``checkpoint``, then —
    unsharded — wrapped by accelerate for data parallelism."""
    if cfg.model.fsdp:
        # a model still in CPU memory is sharded from there: fully_shard moves each process's shards to the device, so
        # no device holds the whole model (DPO's arrives on the device: its reference log-probs come first). On one
        # process nothing is sharded and accelerate's prepare below moves it.
        model = shard_model(model, accelerator)
    optimizer, scheduler = build_optimizer(model.parameters(), cfg.optim, total_steps)
    state = {}
    if checkpoint is not None:
        state = load_training_state(
            checkpoint,
            optimizer,
            scheduler,
            accelerator.process_index,
            sharded_model=model if is_sharded(model) else None,
        )
    if not is_sharded(model):
        model, optimizer = accelerator.prepare(model, optimizer)
    return model, optimizer, scheduler, state


def offline_logger(
    cfg, accelerator, out: Path, config: dict, start_step: int, total_steps: int, run_name: str
) -> MetricsLogger:
    return MetricsLogger(
        out,
        cfg.train.report_to,
        config,
        start_step,
        total_steps,
        enabled=accelerator.is_main_process,
        log_every=cfg.train.log_every,
        run_name=run_name,
    )


def run_offline_loop(cfg, accelerator, logger: MetricsLogger, total_steps: int, **loop) -> tuple[dict, int]:
    """train_offline with the run's loop settings; the logger is closed however the loop ends."""
    try:
        return train_offline(
            accelerator=accelerator,
            logger=logger,
            settings=loop_settings(cfg.train, total_steps, cfg.optim.max_grad_norm),
            **loop,
        )
    finally:
        logger.close()


@dataclass
class OfflineRun:
    """An offline stage's run once opened and loaded: what ``run_offline`` needs of it. ``name``: the stage (the
    plan's title, the logger's run name, summary.json's stage); ``opened``: what start_run returned (accelerator,
    resolved config, run folder, start step, checkpoint); ``trained``: what prepare_trained returned (model,
    optimizer, scheduler)."""

    name: str
    cfg: object
    opened: tuple
    total_steps: int
    trained: tuple
    tokenizer: object
    t_start: float

    def __post_init__(self):
        self.accelerator, self.config, self.out, self.start_step, self.checkpoint = self.opened
        self.model, self.optimizer, self.scheduler = self.trained[:3]


def run_offline(
    run: OfflineRun,
    plan: dict,
    reports: list,
    summary: Callable[[dict, int], dict],
    save: Callable[[dict], None] | None = None,
    before: Callable[[MetricsLogger], None] | None = None,
    closing: Callable[[dict, dict], str] | None = None,
    **loop,
) -> dict:
    """Announce the plan, run the offline loop (``loop``: its train/eval examples, objective, collate_fn and hooks),
    then the tail every offline stage shares: final/ (``save(summary)`` on every process, which may add to the
    summary; default: the trained model, gathered when sharded), summary.json ({stage, steps, resumed_from, then
    ``summary(last_eval, steps_done)``, wall_s, peak_memory}) and the closing line on process 0, the run folder's
    lock released. ``before(logger)`` runs ahead of the first step (an evaluation before training); ``closing(summary,
    last_eval)`` writes the closing line (default: where final/ is and the last evaluation's figures)."""
    acc = run.accelerator
    if acc.is_main_process:
        announce(f"tether {run.name}", plan, run.config, run.out, reports, run.checkpoint)
    logger = offline_logger(run.cfg, acc, run.out, run.config, run.start_step, run.total_steps, run.name)
    if before is not None:
        before(logger)
    saved = saved_state(run.checkpoint) if run.checkpoint is not None else {}
    # a stop whose tail (final/, summary.json) was cut short ends the resumed run there; a finished one continues
    stopped = saved.get("stopped_early", False) and not (run.out / "summary.json").exists()
    last_eval, steps_done = run_offline_loop(
        run.cfg,
        acc,
        logger,
        run.start_step if stopped else run.total_steps,
        resumed_eval=saved.get("last_eval"),
        model=run.model,
        optimizer=run.optimizer,
        scheduler=run.scheduler,
        start_step=run.start_step,
        output=run.out,
        tokenizer=run.tokenizer,
        **loop,
    )
    result = {"stage": run.name, "steps": steps_done, "resumed_from": run.start_step or None}
    result.update(summary(last_eval, steps_done))
    result["peak_memory"] = peak_memory(acc)  # the training's, before a save that may gather or probe
    if save is not None:
        save(result)
    else:
        save_final(acc, run.model, run.tokenizer, run.out / "final")
    result["wall_s"] = round(time.perf_counter() - run.t_start, 2)
    if acc.is_main_process:
        write_json(run.out / "summary.json", result)
        figures = {k: v for k, v in last_eval.items() if isinstance(v, float)}  # the last evaluation's numbers
        console.print(closing(result, last_eval) if closing is not None else closing_line(run.out, figures))
    close_run(acc)
    return result
