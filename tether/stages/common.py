"""Set-up shared by training stages: run folder, accelerator, model (+LoRA, +resume), optimizer and plan."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch

from tether.config import ConfigError, config_diff
from tether.models import apply_lora, count_parameters, load_model, load_tokenizer
from tether.train.checkpoint import latest_checkpoint, remove_partials
from tether.train.logger import console
from tether.train.schedule import warmup_cosine

# Fields that may change between a run and its resumption: they alter length, logging or bookkeeping, not the
# trajectory of the steps already taken.
RESUMABLE_CHANGES = {"train.resume", "train.overwrite", "train.max_steps", "train.epochs", "train.eval_every",
                     "train.save_every", "train.keep_checkpoints", "train.log_every", "train.report_to"}
RUN_FILES = ("metrics.jsonl", "summary.json", "config.yaml", "tensorboard", "final", "samples.jsonl", "alarms.jsonl")
STEP_FILES = ("samples.jsonl", "alarms.jsonl")  # one JSON row per record with its step: cut back on resume


def make_accelerator(device: str):
    from accelerate import Accelerator

    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: no CUDA device is visible; use --device cpu or auto")
    if os.environ.get("MASTER_ADDR") and os.environ.get("ACCELERATE_MIXED_PRECISION") and not os.environ.get("WORLD_SIZE"):
        # accelerate's simple launcher sets MASTER_ADDR for --num_processes > 1 but starts a single process
        # when there is no GPU; say so instead of training alone while the user expects several processes.
        console.print("[yellow]accelerate launch started one process: without GPUs add --multi_gpu "
                      "(it then starts --num_processes CPU processes over gloo), or use torchrun --nproc_per_node N[/]")
    # Without a GPU, multi-process runs need cpu=True: only then does accelerate set up gloo (MULTI_CPU).
    return Accelerator(cpu=device == "cpu" or (device == "auto" and not torch.cuda.is_available()))


def _cut_step_files(out: Path, step: int) -> None:
    """Rows written after the checkpoint (a kill between checkpoints) would otherwise appear twice on resume."""
    from tether.train.logger import truncate_metrics

    for name in STEP_FILES:
        truncate_metrics(out / name, step)


def prepare_output(accelerator, output: str, resume: bool, overwrite: bool, config: dict) -> tuple[int, Path | None]:
    """Check the run folder against --resume/--overwrite; return (start_step, checkpoint to resume or None)."""
    if not output:
        raise ConfigError("--output is required: the run folder for config.yaml, metrics.jsonl and checkpoints")
    out = Path(output)
    has_run = out.is_dir() and any((out / name).exists() for name in RUN_FILES + ("trainer_state.json",)) \
        or bool(latest_checkpoint(out))
    if resume:
        found = latest_checkpoint(out)
        if found is None:
            raise ConfigError(f"--resume: no complete checkpoint-<step>/ in {out}; nothing to resume from "
                              "(drop --resume to start a new run)")
        step, ckpt = found
        saved = out / "config.yaml"
        if saved.is_file():
            import yaml

            old = {k: v for k, v in (yaml.safe_load(saved.read_text()) or {}).items() if k != "plan"}
            diffs = [d for d in config_diff(old, config) if d.split(":")[0] not in RESUMABLE_CHANGES]
            if diffs:
                raise ConfigError(f"--resume: this run's settings differ from {saved}, so resuming would not continue "
                                  "the same run: " + "; ".join(diffs))
        if accelerator.is_main_process:
            _cut_step_files(out, step)
        return step, ckpt
    if has_run and not overwrite:
        raise ConfigError(f"--output {out} already holds a run; pass --resume to continue it or --overwrite to start afresh")
    if accelerator.is_main_process:
        if has_run:
            for child in out.iterdir():
                if child.name in RUN_FILES or child.name.startswith("checkpoint-"):
                    shutil.rmtree(child) if child.is_dir() else child.unlink()
        out.mkdir(parents=True, exist_ok=True)
        remove_partials(out)
    accelerator.wait_for_everyone()
    return 0, None


def load_trainable_model(model_cfg, tokenizer, checkpoint: Path | None):
    """The model to train: from --model, or from a checkpoint when resuming (LoRA: base + saved adapter)."""
    if model_cfg.lora_r > 0:
        model = load_model(model_cfg.path, tokenizer, model_cfg.dtype, model_cfg.trust_remote_code)
        if checkpoint is not None:
            from peft import PeftModel

            return PeftModel.from_pretrained(model, str(checkpoint), is_trainable=True)
        return apply_lora(model, model_cfg.lora_r, model_cfg.lora_alpha, model_cfg.lora_dropout,
                          list(model_cfg.lora_target_modules))
    return load_model(checkpoint or model_cfg.path, tokenizer, model_cfg.dtype, model_cfg.trust_remote_code)


def load_stage_tokenizer(model_cfg):
    if not model_cfg.path:
        raise ConfigError("--model is required: a local Hugging Face model folder")
    return load_tokenizer(model_cfg.tokenizer or model_cfg.path, model_cfg.trust_remote_code)


def build_optimizer(model, optim_cfg, total_steps: int):
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ConfigError("the model has no trainable parameters")
    optimizer = torch.optim.AdamW(params, lr=optim_cfg.lr, weight_decay=optim_cfg.weight_decay,
                                  betas=(optim_cfg.adam_beta1, optim_cfg.adam_beta2))
    warmup = int(optim_cfg.warmup_ratio * total_steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: warmup_cosine(s, total_steps, warmup, optim_cfg.min_lr_ratio))
    return optimizer, scheduler


def show_plan(plan: dict, title: str) -> None:
    from rich.table import Table

    table = Table(title=title, show_header=False, box=None)
    for k, v in plan.items():
        table.add_row(k, str(v))
    console.print(table)


def announce(title: str, plan: dict, config: dict, out: Path, reports=(), checkpoint: Path | None = None) -> None:
    """Print the data reports and the plan, and write the resolved config (with the plan) to config.yaml."""
    import yaml

    for report in reports:
        console.print(report.summary())
    show_plan(plan, title + (f" — resuming from {checkpoint.name}" if checkpoint else ""))
    (Path(out) / "config.yaml").write_text(yaml.safe_dump({**config, "plan": plan}, sort_keys=False))


def write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(path)


def parameter_summary(model) -> str:
    total, trainable = count_parameters(model)
    return f"{total / 1e6:.2f} M parameters, {trainable / 1e6:.2f} M trainable"


def open_online_run(stage: str, output: str, resume: bool, overwrite: bool, steps: int, device: str, seed: int,
                    required: dict[str, str], has_reward: bool):
    """Checks and set-up shared by the online stages: required flags ({flag: value}), a reward, one process, the
    output folder, the checkpoint to resume from, the device and the seeds.
    Returns (output folder, (step, checkpoint folder) or None, torch device)."""
    import os
    import random

    import numpy as np
    import torch

    from tether.config import ConfigError
    from tether.train.checkpoint import latest_checkpoint

    for flag, value in required.items():
        if not value:
            raise ConfigError(f"{flag} is required")
    if not has_reward:
        raise ConfigError("a reward is required: --reward-model DIR and/or --reward module:function")
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # N copies would each train alone and write the same folder
        raise ConfigError(f"tether {stage} runs on one process for now; launch it without accelerate's --num_processes")
    out = Path(output)
    found = latest_checkpoint(out) if resume else None
    if resume and found is None:
        raise ConfigError(f"--resume: no complete checkpoint-<step>/ in {out}")
    if not resume and out.is_dir() and any((out / n).exists() for n in RUN_FILES) and not overwrite:
        raise ConfigError(f"--output {out} already holds a run; pass --resume or --overwrite")
    if found and found[0] >= steps:
        raise ConfigError(f"--resume: {found[1].name} is already at step {found[0]} of {steps}; nothing left to train")
    if overwrite and not resume and out.is_dir():
        import shutil

        for child in out.iterdir():
            if child.name in RUN_FILES or child.name.startswith("checkpoint-") or child.name == "best":
                shutil.rmtree(child) if child.is_dir() else child.unlink()
    if found:
        _cut_step_files(out, found[0])
    out.mkdir(parents=True, exist_ok=True)
    torch_device = torch.device("cuda" if device == "cuda" or (device == "auto" and torch.cuda.is_available()) else "cpu")
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)
    return out, found, torch_device
