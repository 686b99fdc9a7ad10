"""The offline training loop shared by SFT (and later the reward model and the DPO family).

A stage hands it examples, a collate function and an objective; the loop owns
data order, gradient accumulation across micro-batches and processes, the
loss normalisation, clipping, evaluation, checkpoints and logging.

Normalisation: the objective returns a *sum* over its units (trained tokens
for SFT) and how many units a batch holds. Each micro-batch loss is
sum / N_step, with N_step the units of the whole optimizer step summed over
all micro-batches and processes, times the number of processes because DDP
averages gradients across them. The gradient is then exactly that of
(Σ over the global batch) / N_step, however the batch is split.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass
from typing import Callable, Protocol

import torch

from tether.models.packing import example_tokens
from tether.train.checkpoint import save_checkpoint
from tether.train.sharding import grad_norm_value, is_sharded, reshard


class Objective(Protocol):
    unit: str  # what count() counts, used in metric names: train/<unit>, perf/<unit>_per_s

    def count(self, batch: dict) -> int:
        """Units that normalise the loss in this batch (e.g. trained tokens)."""

    def loss_sum(self, model, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """(Σ loss over units, {name: Σ statistic over units}) for one micro-batch."""

    # Optional: begin_step(model, micro_batches, reduce) runs before a step's micro-batches, for objectives
    # whose loss depends on statistics of the whole step's batch; reduce(tensor) sums it over processes.


class EpochOrder:
    """Global batch for step s = positions [s·B, (s+1)·B) of the concatenated per-epoch permutations.

    It depends only on (seed, step), so a resumed run needs no sampler state.
    """

    def __init__(self, num_examples: int, seed: int):
        self.n, self.seed, self._perms = num_examples, seed, {}

    def _perm(self, epoch: int) -> torch.Tensor:
        if epoch not in self._perms:
            gen = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._perms = {epoch: torch.randperm(self.n, generator=gen)}  # keep one epoch in memory
        return self._perms[epoch]

    def batch(self, step: int, batch_size: int) -> list[int]:
        return self.slice(step * batch_size, batch_size)

    def slice(self, start: int, count: int) -> list[int]:
        """Examples at stream positions [start, start + count): for consumers that draw a varying number per step."""
        return [int(self._perm(p // self.n)[p % self.n]) for p in range(start, start + count)]

    def epoch_at(self, step: int, batch_size: int) -> float:
        return step * batch_size / self.n


@dataclass
class LoopSettings:
    batch_size: int
    micro_batch_size: int
    total_steps: int
    max_grad_norm: float
    eval_every: int
    save_every: int
    keep_checkpoints: int
    seed: int
    micro_batch_tokens: int = 0  # > 0: micro-batches by tokens (split_micro_batches)


def loop_settings(train, total_steps: int, max_grad_norm: float) -> LoopSettings:
    """LoopSettings from a stage's TrainSection (tether/sections.py)."""
    return LoopSettings(
        train.batch_size,
        train.micro_batch_size,
        total_steps,
        max_grad_norm,
        train.eval_every,
        train.save_every,
        train.keep_checkpoints,
        train.seed,
        train.micro_batch_tokens,
    )


def split_micro_batches(examples: list, micro_batch_size: int, micro_batch_tokens: int = 0) -> list[list]:
    """A process's share of a step as micro-batches: ``micro_batch_size`` examples each or, with
    ``micro_batch_tokens``, as many consecutive examples as fit that many tokens (tether.packing.example_tokens; an
    example longer than the budget goes alone). The loss is normalised by the whole step's units, so how the step
    is split does not change the gradient."""
    if not micro_batch_tokens:
        return [examples[k : k + micro_batch_size] for k in range(0, len(examples), micro_batch_size)]
    parts: list[list] = [[]]
    used = 0
    for ex in examples:
        n = example_tokens(ex)
        if parts[-1] and used + n > micro_batch_tokens:
            parts.append([])
            used = 0
        parts[-1].append(ex)
        used += n
    return parts


def step_micro_batches(accelerator, examples: list, collate_fn: Callable, settings: "LoopSettings") -> tuple[list, int]:
    """(collated micro-batches of this process, filler passes): by tokens, processes may need different counts, and
    every process runs as many forward/backward passes as the largest count (a sharded model gathers its layers
    collectively in each), the extra ones weighted 0."""
    parts = split_micro_batches(examples, settings.micro_batch_size, settings.micro_batch_tokens)
    filler = 0
    if settings.micro_batch_tokens and accelerator.num_processes > 1:
        largest = accelerator.reduce(torch.tensor([len(parts)], device=accelerator.device), reduction="max")
        filler = int(largest.item()) - len(parts)
    return [collate_fn(part) for part in parts], filler


def _all_reduce_sum(accelerator, value: torch.Tensor) -> torch.Tensor:
    value = value.detach().to(accelerator.device, torch.float64)
    return accelerator.reduce(value, reduction="sum") if accelerator.num_processes > 1 else value


def _to_device(batch: dict, device) -> dict:
    return {k: v.to(device) for k, v in batch.items()}


@torch.no_grad()
def evaluate(
    accelerator,
    model,
    examples,
    collate_fn: Callable,
    objective: Objective,
    micro_batch_size: int,
    prefix: str = "eval",
) -> dict[str, float]:
    """Unit-weighted mean loss (and statistics) over all held-out examples, sharded across processes."""
    model.eval()
    shard = examples[accelerator.process_index :: accelerator.num_processes]
    total = torch.zeros((), dtype=torch.float64)
    units = torch.zeros((), dtype=torch.float64)
    stats: dict[str, torch.Tensor] = {}
    batches = range(0, len(shard), micro_batch_size)
    if is_sharded(model):  # every process runs as many forwards as the largest share: each gathers layers collectively
        largest = -(-len(examples) // accelerator.num_processes)
        for _ in range(len(batches), -(-largest // micro_batch_size)):
            objective.loss_sum(model, _to_device(collate_fn(examples[:1]), accelerator.device))  # counted nowhere
    for start in batches:
        batch = _to_device(collate_fn(shard[start : start + micro_batch_size]), accelerator.device)
        loss_sum, batch_stats = objective.loss_sum(model, batch)
        total += loss_sum.double().cpu()
        units += objective.count(batch)
        for k, v in batch_stats.items():
            stats[k] = stats.get(k, torch.zeros((), dtype=torch.float64)) + v.double().cpu()
    total, units = _all_reduce_sum(accelerator, total), _all_reduce_sum(accelerator, units)
    loss = (total / units.clamp(min=1)).item()
    out = {f"{prefix}/loss": loss}
    if getattr(objective, "reports_perplexity", False):
        out[f"{prefix}/ppl"] = math.exp(min(loss, 50.0))
    for k in sorted(stats):
        out[f"{prefix}/{k}"] = (_all_reduce_sum(accelerator, stats[k]) / units.clamp(min=1)).item()
    if is_sharded(model):
        reshard(model)
    model.train()
    return out


def train_step(
    accelerator,
    model,
    optimizer,
    scheduler,
    micro_batches: list[dict],
    objective: Objective,
    params,
    max_grad_norm: float,
    filler: int = 0,
) -> dict[str, float]:
    """One optimizer step over this process's micro-batches; returns the step's train/* metrics (global means).

    Each micro-batch loss is its sum / N_step, N_step the units of the whole step over every micro-batch and process
    (times the process count, since DDP averages gradients): the gradient does not depend on the split. ``filler``
    passes (step_micro_batches) repeat the first micro-batch with weight 0, so every process runs as many.
    """
    world = accelerator.num_processes
    accum = len(micro_batches) + filler
    unit = getattr(objective, "unit", "units")
    local_units = torch.tensor(float(sum(objective.count(b) for b in micro_batches)))
    step_units = _all_reduce_sum(accelerator, local_units).clamp(min=1).float()
    if hasattr(objective, "begin_step"):  # statistics of the whole step's batch (β-DPO's batch margin)
        objective.begin_step(
            model,
            [_to_device(b, accelerator.device) for b in micro_batches],
            lambda value: _all_reduce_sum(accelerator, value),
        )
    loss_total = torch.zeros((), dtype=torch.float64)
    stat_totals: dict[str, torch.Tensor] = {}
    for k in range(accum):
        batch = micro_batches[k] if k < len(micro_batches) else micro_batches[0]
        weight = world if k < len(micro_batches) else 0.0  # a filler pass adds nothing
        sync = k == accum - 1  # all-reduce gradients once, on the last micro-batch
        with contextlib.nullcontext() if sync else accelerator.no_sync(model):
            loss_sum, stats = objective.loss_sum(model, _to_device(batch, accelerator.device))
            accelerator.backward(loss_sum * (weight / step_units.to(loss_sum.device)))
        if k >= len(micro_batches):
            continue
        loss_total += loss_sum.detach().double().cpu()
        for name, v in stats.items():
            stat_totals[name] = stat_totals.get(name, torch.zeros((), dtype=torch.float64)) + v.detach().double().cpu()
    clip_at = max_grad_norm if max_grad_norm > 0 else float("inf")
    grad_norm = grad_norm_value(accelerator.clip_grad_norm_(params, clip_at))
    lr = optimizer.param_groups[0]["lr"]
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    step_units_f = float(step_units)
    metrics = {
        "train/loss": (_all_reduce_sum(accelerator, loss_total) / step_units_f).item(),
        "train/lr": lr,
        "train/grad_norm": float(grad_norm),
        f"train/{unit}": step_units_f,
    }
    for name in sorted(stat_totals):
        metrics[f"train/{name}"] = (_all_reduce_sum(accelerator, stat_totals[name]) / step_units_f).item()
    return metrics


def train_offline(
    *,
    accelerator,
    model,
    optimizer,
    scheduler,
    train_examples,
    eval_examples,
    collate_fn: Callable,
    objective: Objective,
    settings: LoopSettings,
    start_step: int,
    output,
    tokenizer,
    logger,
    checkpoint_state: Callable[[], dict] = dict,
    evaluate_fn: Callable[[int], dict] | None = None,
    on_eval: Callable[[int, dict], bool] | None = None,
    resumed_eval: dict | None = None,
) -> tuple[dict[str, float], int]:
    """Run optimizer steps start_step..total_steps-1; return (last eval metrics, steps done). ``resumed_eval``: the
    last evaluation the resumed checkpoint kept (what a run with no step left reports).

    ``evaluate_fn(step)`` replaces the default held-out loss evaluation; ``on_eval(step, metrics)`` sees every
    evaluation and returns True to stop early (a checkpoint is written at that step).
    """
    world, rank = accelerator.num_processes, accelerator.process_index
    per_process = settings.batch_size // world
    order = EpochOrder(len(train_examples), settings.seed)
    unit = getattr(objective, "unit", "units")
    params = [p for p in model.parameters() if p.requires_grad]
    last_eval: dict[str, float] = dict(resumed_eval or {})
    model.train()
    for step in range(start_step, settings.total_steps):
        t0 = time.perf_counter()
        indices = order.batch(step, settings.batch_size)[rank * per_process : (rank + 1) * per_process]
        micro_batches, filler = step_micro_batches(
            accelerator, [train_examples[i] for i in indices], collate_fn, settings
        )
        step_metrics = train_step(
            accelerator, model, optimizer, scheduler, micro_batches, objective, params, settings.max_grad_norm, filler
        )
        done = step + 1
        elapsed = time.perf_counter() - t0
        metrics = {
            "step": done,
            **step_metrics,
            "train/epoch": order.epoch_at(done, settings.batch_size),
            "time/step_s": elapsed,
            f"perf/{unit}_per_s": step_metrics[f"train/{unit}"] / max(elapsed, 1e-9),
        }
        is_last = done == settings.total_steps
        stop = False
        if eval_examples and ((settings.eval_every and done % settings.eval_every == 0) or is_last):
            if evaluate_fn is not None:
                last_eval = evaluate_fn(done)
            else:
                last_eval = evaluate(
                    accelerator, model, eval_examples, collate_fn, objective, settings.micro_batch_size
                )
            stop = bool(on_eval(done, last_eval)) if on_eval else False  # may add keys (best, alarms) to last_eval
            metrics.update(last_eval)
        logger.log(metrics)
        if settings.save_every and (done % settings.save_every == 0 or is_last or stop):
            # the last evaluation and a stop are kept with the checkpoint: resumed from it with no step left, the run
            # ends there and reports them, as the uninterrupted one did
            figures = {k: v for k, v in last_eval.items() if isinstance(v, (int, float))}
            state = {**checkpoint_state(), "last_eval": figures, **({"stopped_early": True} if stop else {})}
            save_checkpoint(
                accelerator, model, tokenizer, optimizer, scheduler, done, output, state, settings.keep_checkpoints
            )
        if stop:
            return last_eval, done
    return last_eval, settings.total_steps
