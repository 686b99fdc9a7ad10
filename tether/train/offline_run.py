"""The offline stages' scaffolding, written once: SFT, reward models and offline DPO each bring their data, model
and objective, and take from here the step count, the trained model's optimizer (sharded with --fsdp, restored on
resume, wrapped for data parallelism), the metrics logger and the loop (tether/train/offline.py)."""

from __future__ import annotations

from pathlib import Path

from tether.train.checkpoint import load_training_state
from tether.train.logger import MetricsLogger
from tether.train.offline import loop_settings, train_offline
from tether.train.run import check_steps_left
from tether.train.schedule import build_optimizer
from tether.train.sharding import is_sharded, shard_model


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
