"""Atomic checkpoints that a killed run resumes from exactly.

A checkpoint is written into ``.checkpoint-<step>.partial/`` and renamed to
``checkpoint-<step>/`` only when complete, so a folder with the final name is
always whole: a run killed mid-write leaves a partial folder that is ignored
and cleaned up. It holds the model in Hugging Face format (a LoRA adapter
folder when training LoRA), the tokenizer, and the training state needed to
continue bit-for-bit: optimizer, scheduler, step and every process's RNG.
Every state file is safetensors + JSON (tether/train/state_io.py): resuming
from a checkpoint someone hands you never unpickles, so it cannot run code.
"""

from __future__ import annotations

import json
import random
import re
import shutil
from pathlib import Path

import numpy as np
import torch

from tether.train.sharding import full_optimizer_state, is_sharded, load_optimizer_state, save_full_model
from tether.train.state_io import StateFileError, load_state, save_state

CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")
STATE_FILE = "trainer_state.json"


def list_checkpoints(output: str | Path) -> list[tuple[int, Path]]:
    """Complete checkpoints, oldest first."""
    output = Path(output)
    if not output.is_dir():
        return []
    found = []
    for child in output.iterdir():
        match = CHECKPOINT_RE.match(child.name)
        if match and child.is_dir() and (child / STATE_FILE).is_file():
            found.append((int(match.group(1)), child))
    return sorted(found)


def latest_checkpoint(output: str | Path) -> tuple[int, Path] | None:
    found = list_checkpoints(output)
    return found[-1] if found else None


def checkpoint_problem(folder: Path) -> str | None:
    """Why a checkpoint that looks complete cannot be resumed from (a file named), or None. Reads its trainer state
    and the JSON halves of its state files, and the headers of its tensor files (safetensors checks that the data
    is all there)."""
    from safetensors import safe_open

    try:
        json.loads((folder / STATE_FILE).read_text())
    except (OSError, ValueError) as err:
        return f"{folder / STATE_FILE}: {err}"
    tensor_files = sorted(folder.glob("*.safetensors")) + sorted(folder.glob("*/*.safetensors"))
    if not any(
        f.name in ("model.safetensors", "adapter_model.safetensors") or f.name.startswith("model-")
        for f in tensor_files
    ):
        return f"{folder}: no model weights (model.safetensors)"
    for path in tensor_files:
        try:
            with safe_open(str(path), "pt"):
                pass
        except Exception as err:  # noqa: BLE001 - safetensors raises its own error types for a damaged file
            return f"{path}: not a readable safetensors file ({err})"
    for path in folder.glob("*.json"):
        try:
            json.loads(path.read_text())
        except (OSError, ValueError) as err:
            return f"{path}: {err}"
    return None


def resumable_checkpoint(output: str | Path) -> tuple[tuple[int, Path] | None, list[str]]:
    """The newest checkpoint that can be resumed from, and the problems of the newer ones passed over."""
    skipped = []
    for step, folder in reversed(list_checkpoints(output)):
        problem = checkpoint_problem(folder)
        if problem is None:
            return (step, folder), skipped
        skipped.append(problem)
    return None, skipped


def remove_partials(output: str | Path) -> None:
    for child in Path(output).glob(".*.partial"):
        shutil.rmtree(child, ignore_errors=True)


def rng_state() -> dict:
    return {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(
    accelerator,
    model,
    tokenizer,
    optimizer,
    scheduler,
    step: int,
    output: str | Path,
    state: dict,
    keep: int,
    extra: dict | None = None,
) -> Path:
    """Write checkpoint-<step>/ atomically (every process calls this).

    One layout for every stage: the trained model in Hugging Face format (a LoRA adapter folder when training
    LoRA) with the tokenizer at the top, optimizer and scheduler, rng-<rank> per process (each .safetensors + .json) and
    trainer_state.json; ``extra`` {name: (model, optimizer, scheduler or None)} adds a second trained model
    (PPO's critic) as <name>/ with optimizer-<name> and scheduler-<name>.
    """
    output = Path(output)
    partial = output / f".checkpoint-{step}.partial"
    final = output / f"checkpoint-{step}"
    if accelerator.is_main_process:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
    accelerator.wait_for_everyone()
    save_state(partial / f"rng-{accelerator.process_index}", rng_state())
    sharded = is_sharded(model)
    if sharded:  # gathered by every process, written by process 0: the checkpoint is a plain, unsharded one
        save_full_model(model, tokenizer, partial, accelerator)
        optimizer_state = full_optimizer_state(model, optimizer)
    sharded_parts = {}  # a sharded extra part (PPO's separate critic): gathered by all, written by process 0
    for name, (part, part_optimizer, _) in (extra or {}).items():
        if is_sharded(part):
            save_full_model(part, None, partial / name, accelerator)
            sharded_parts[name] = full_optimizer_state(part, part_optimizer)
    if accelerator.is_main_process:
        if not sharded:
            accelerator.unwrap_model(model).save_pretrained(str(partial))
            if tokenizer is not None:
                tokenizer.save_pretrained(str(partial))
        save_state(partial / "optimizer", optimizer_state if sharded else optimizer.state_dict())
        save_state(partial / "scheduler", scheduler.state_dict())
        for name, (part, part_optimizer, part_scheduler) in (extra or {}).items():
            if name in sharded_parts:
                save_state(partial / f"optimizer-{name}", sharded_parts[name])
            else:
                part.save_pretrained(str(partial / name))
                save_state(partial / f"optimizer-{name}", part_optimizer.state_dict())
            if part_scheduler is not None:
                save_state(partial / f"scheduler-{name}", part_scheduler.state_dict())
        (partial / STATE_FILE).write_text(
            json.dumps({**state, "step": step, "num_processes": accelerator.num_processes}, indent=2)
        )
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        with_umask_modes(partial)
        if final.exists():
            shutil.rmtree(final)
        partial.rename(final)  # the atomic moment: before it no checkpoint-<step>, after it a complete one
        if keep > 0:
            for _, old in list_checkpoints(output)[:-keep]:
                shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


def saved_state(checkpoint: Path) -> dict:
    """The trainer state a checkpoint holds (its step, the stage's state; ``stopped_early`` when the run stopped
    there: resumed from it, the run trains no further)."""
    return json.loads((checkpoint / STATE_FILE).read_text())


def load_training_state(
    checkpoint: Path, optimizer, scheduler, process_index: int, extra: dict | None = None, sharded_model=None
) -> dict:
    """Restore optimizer, scheduler (and ``extra`` {name: (optimizer, scheduler or None[, the part if sharded])}) and
    this process's RNG;
    return the saved trainer state. Nothing is unpickled: a checkpoint with pickle files only (written by tether
    0.1) is refused with a message, never loaded."""
    if (checkpoint / "optimizer.pt").is_file() and not (checkpoint / "optimizer.json").is_file():
        raise StateFileError(
            f"{checkpoint}: its state files are pickles (optimizer.pt, written by tether 0.1); tether "
            "reads tensors and JSON only, so it cannot resume from it. Start afresh (--overwrite), or "
            "from its weights: --model " + str(checkpoint)
        )
    state = saved_state(checkpoint)
    if sharded_model is not None:  # a sharded run's optimizer state is keyed by parameter name (train/sharding.py)
        load_optimizer_state(sharded_model, optimizer, load_state(checkpoint / "optimizer"))
    else:
        saved = load_state(checkpoint / "optimizer")
        if any(isinstance(k, str) for k in saved.get("state", {})):
            raise StateFileError(
                f"{checkpoint}: its optimizer state was written by a sharded run (--fsdp), keyed by "
                "parameter name; resume it with --fsdp (on any number of processes)"
            )
        optimizer.load_state_dict(saved)
    scheduler.load_state_dict(load_state(checkpoint / "scheduler"))
    for name, (part_optimizer, part_scheduler, *part) in (extra or {}).items():
        if part and part[0] is not None:  # (optimizer, scheduler, the part when sharded): keyed by parameter name
            load_optimizer_state(part[0], part_optimizer, load_state(checkpoint / f"optimizer-{name}"))
        else:
            part_optimizer.load_state_dict(load_state(checkpoint / f"optimizer-{name}"))
        if part_scheduler is not None:
            part_scheduler.load_state_dict(load_state(checkpoint / f"scheduler-{name}"))
    rng = checkpoint / f"rng-{process_index}"
    if rng.with_name(rng.name + ".json").is_file():
        set_rng_state(load_state(rng))
    return state


def save_final(accelerator, model, tokenizer, out: Path, more=None) -> None:
    """final/ or best/ (every process calls it): LoRA merged; a sharded model gathered first; ``more(folder)`` adds
    files (process 0)."""
    from tether.models.lm import save_merged

    main = accelerator.is_main_process

    def save(tmp: Path) -> None:
        if is_sharded(model):
            save_full_model(model, tokenizer, tmp, accelerator)
        else:
            save_merged(accelerator.unwrap_model(model), tokenizer, tmp)
        if more is not None and main:
            more(tmp)

    if is_sharded(model):
        write_atomically(save, out, accelerator)
    elif main:
        write_atomically(save, out)
    accelerator.wait_for_everyone()


def with_umask_modes(folder: Path) -> None:
    """Give the files under ``folder`` the mode the user's umask gives a new file: safetensors' writer creates
    model.safetensors as 0600 (a temporary file renamed), which another user of a shared model folder cannot read."""
    import os

    mask = os.umask(0)
    os.umask(mask)
    for path in folder.rglob("*"):
        if path.is_file():
            path.chmod(0o666 & ~mask)


def write_atomically(save_fn, target: str | Path, accelerator=None) -> Path:
    """Run save_fn(tmp_dir) and rename tmp_dir to target: a folder named target is always complete. With an
    ``accelerator``, every process calls save_fn (a collective save) and process 0 alone touches the folders."""
    target = Path(target)
    partial = target.parent / f".{target.name}.partial"
    main = accelerator is None or accelerator.is_main_process
    if main:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
    if accelerator is not None:
        accelerator.wait_for_everyone()
    save_fn(partial)
    if accelerator is not None:
        accelerator.wait_for_everyone()
    if main:
        with_umask_modes(partial)
        if target.exists():
            shutil.rmtree(target)
        partial.rename(target)
    return target
