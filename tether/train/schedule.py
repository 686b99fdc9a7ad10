"""The optimizer (AdamW) and its learning-rate schedule, built from an OptimSection."""

from __future__ import annotations

import math

import torch


def warmup_cosine(step: int, total_steps: int, warmup_steps: int, min_ratio: float) -> float:
    """LR multiplier at optimizer step ``step`` (0-based).

    Linear warm-up (step+1)/warmup over the first ``warmup_steps``; then cosine
    from 1 to ``min_ratio``: min + (1 - min) * ½ (1 + cos(π p)), p the fraction
    of the decay phase done, reaching min_ratio at the last step.
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    decay_steps = max(1, total_steps - warmup_steps - 1)
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def warmup_constant(step: int, warmup_steps: int) -> float:
    """LR multiplier: the same linear warm-up, then 1."""
    return (step + 1) / warmup_steps if step < warmup_steps else 1.0


def adamw_kwargs(implementation: str, params) -> dict:
    """torch.optim.AdamW's switches for ``implementation`` (fused, foreach, for-loop). Fused needs plain tensors
    of one floating dtype on a device with the kernel; sharded (DTensor) or mixed parameters get foreach."""
    if implementation == "for-loop":
        return {"foreach": False}
    if implementation == "fused":
        plain = all(type(p) is torch.nn.Parameter or type(p) is torch.Tensor for p in params)
        dtypes = {p.dtype for p in params}
        devices = {p.device.type for p in params}
        if (
            plain
            and len(dtypes) == 1
            and dtypes <= {torch.float32, torch.bfloat16, torch.float16}
            and devices <= {"cpu", "cuda"}
        ):
            return {"fused": True}
    return {"foreach": True}


def build_optimizer(params, optim, total_updates: int, lr: float | None = None):
    """(AdamW, LambdaLR) over ``params`` from an OptimSection; ``lr`` overrides optim.lr (PPO's critic).
    ``total_updates`` is the number of optimizer updates of the run (the cosine's length)."""
    params = [p for p in params if p.requires_grad]
    if not params:
        from tether.config import ConfigError

        raise ConfigError("the model has no trainable parameters")
    optimizer = torch.optim.AdamW(
        params,
        lr=lr or optim.lr,
        weight_decay=optim.weight_decay,
        betas=(optim.adam_beta1, optim.adam_beta2),
        **adamw_kwargs(optim.adamw, params),
    )
    warmup = optim.warmup(total_updates)
    if optim.lr_schedule == "constant":
        multiplier = lambda s: warmup_constant(s, warmup)
    else:
        multiplier = lambda s: warmup_cosine(s, total_updates, warmup, optim.min_lr_ratio)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, multiplier)


def advance_schedule(scheduler, planned_updates: int) -> None:
    """Move ``scheduler`` (build_optimizer's LambdaLR) on to the run's ``planned_updates``-th update when fewer
    updates were taken: an online step that skips some (PPO's KL early stop, a GRPO step short of varied groups)
    moves the schedule on all the same, so it follows the run's steps and reaches lr · min_lr_ratio at the last
    planned update as documented, instead of stretching. The learning rate set is what LambdaLR.step sets."""
    if scheduler.last_epoch >= planned_updates:
        return
    scheduler.last_epoch = planned_updates
    lrs = [base * multiplier(planned_updates) for base, multiplier in zip(scheduler.base_lrs, scheduler.lr_lambdas)]
    for group, lr in zip(scheduler.optimizer.param_groups, lrs):
        group["lr"] = lr
    scheduler._last_lr = lrs  # what get_last_lr() returns: LambdaLR.step keeps it the same way
