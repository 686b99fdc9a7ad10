"""The run folder, shared by every stage: open it (new, --overwrite or --resume) and hold it against a second
writer, print the plan and write config.yaml, write JSON atomically, and the accelerator and seeds a run starts
with (a process of a multi-process launch set to die with its launcher)."""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import torch

from tether.config import ConfigError, config_diff
from tether.console import console
from tether.processes import die_with_parent
from tether.train.checkpoint import latest_checkpoint, remove_partials, resumable_checkpoint
from tether.train.logger import truncate_metrics

# Fields that may change between a run and its resumption: they alter length, logging or bookkeeping, not the
# trajectory of the steps already taken (the output folder too: a run folder that was moved or copied resumes).
RESUMABLE_CHANGES = {
    "train.output",
    "train.resume",
    "train.overwrite",
    "train.max_steps",
    "train.epochs",
    "train.eval_every",
    "train.save_every",
    "train.keep_checkpoints",
    "train.log_every",
    "train.report_to",
    "train.sample_every",
    "train.stop_on_alarm",
    "online.stop_on_alarm",
    "train.alarm_stops",
    "online.alarm_stops",
    "model.gradient_checkpointing",  # recomputing activations changes memory, not one number
    # what to do about a failing reward function or environment (the stop's own advice)
    "rewards.reward_on_error",
    "rewards.reward_timeout",
    "agent.env_on_error",
    "agent.env_timeout",
}
RUN_FILES = (
    "metrics.jsonl",
    "summary.json",
    "config.yaml",
    "tensorboard",
    "final",
    "best",
    "samples.jsonl",
    "alarms.jsonl",
)
STEP_FILES = ("samples.jsonl", "alarms.jsonl")  # one JSON row per record with its step: cut back on resume


def _on_cpu(device: str) -> bool:
    # Without a GPU, multi-process runs need cpu=True: only then does accelerate set up gloo (MULTI_CPU).
    return device == "cpu" or (device == "auto" and not torch.cuda.is_available())


def _die_with_the_launcher() -> None:
    if "WORLD_SIZE" in os.environ:  # started by a launcher (accelerate launch, torchrun), which set it
        die_with_parent()


def wait_for_everyone(device: str) -> None:
    """A barrier across a launch's processes before the stage's Accelerator exists (the Python API writing its
    inputs). accelerate's process state is made once per process, with the arguments of the first call: made here
    without ``cpu``, a CPU launch of N processes would become N runs of one process each, so it is made as
    make_accelerator makes it."""
    from accelerate import PartialState

    _die_with_the_launcher()
    PartialState(cpu=_on_cpu(device)).wait_for_everyone()


def make_accelerator(device: str):
    from accelerate import Accelerator

    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: no CUDA device is visible; use --device cpu or auto")
    _die_with_the_launcher()
    if (
        os.environ.get("MASTER_ADDR")
        and os.environ.get("ACCELERATE_MIXED_PRECISION")
        and not os.environ.get("WORLD_SIZE")
    ):
        # accelerate's simple launcher sets MASTER_ADDR for --num_processes > 1 but starts a single process
        # when there is no GPU; say so instead of training alone while the user expects several processes.
        console.print(
            "accelerate launch started one process: without GPUs add --multi_gpu "
            "(it then starts --num_processes CPU processes over gloo), or use torchrun --nproc_per_node N",
            style="yellow",
        )
    accelerator = Accelerator(cpu=_on_cpu(device))
    if not accelerator.is_main_process:  # one copy of the plan, progress and warnings, not N
        console.quiet = True
    return accelerator


def seed_everything(seed: int) -> None:
    import numpy as np

    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)


def _check_resumable(out: Path, config: dict, defaults: dict | None = None, renamed: dict | None = None) -> None:
    """Refuse to resume under settings that change the run. A field the saved config lacks (added by a later tether)
    is no change while it holds its default (``defaults``: the stage's default config as a dict); a field a later
    tether renamed (``renamed``: the stage config's RENAMED, dotted old -> new) is read under its new name."""
    saved = out / "config.yaml"
    if not saved.is_file():
        return
    import yaml

    old = {k: v for k, v in (yaml.safe_load(saved.read_text()) or {}).items() if k != "plan"}
    for dotted, new in (renamed or {}).items():
        section, _, key = dotted.partition(".")
        if key != "*" and isinstance(old.get(section), dict) and key in old[section]:
            new_section, _, new_key = new.partition(".")
            old.setdefault(new_section, {})[new_key] = old[section].pop(key)
    for section, fields in (defaults or {}).items():
        if section not in old and isinstance(fields, dict):  # a whole section added by a later tether
            old[section] = {}
        for key, value in fields.items():
            if isinstance(old.get(section), dict) and key not in old[section]:
                old[section][key] = value
    diffs = [d for d in config_diff(old, config) if d.split(":")[0] not in RESUMABLE_CHANGES]
    if diffs:
        raise ConfigError(
            f"--resume: this run's settings differ from {saved}, so resuming would not continue "
            "the same run: " + "; ".join(diffs)
        )


def _written_by_tether(out: Path) -> bool:
    """A run folder's config.yaml is tether's when it holds the plan tether writes beside the settings."""
    saved = out / "config.yaml"
    if not saved.is_file():
        return True
    import yaml

    try:
        return "plan" in (yaml.safe_load(saved.read_text()) or {})
    except (yaml.YAMLError, UnicodeDecodeError, AttributeError, TypeError):
        return False


LOCK_FILE = ".tether.lock"  # in the run folder: who writes it (pid, host, since when); empty when no run does
_HELD: dict = {}  # {"folder": the run folder this process writes, "file": its open, locked LOCK_FILE}


def _take_lock(out: Path) -> tuple[dict | None, dict | None]:
    """Lock ``out`` for this process: (None, the holder's record when one ended without releasing it, else None),
    or (the live holder's record, None) when another process holds it. An flock: the kernel frees it when its
    process ends however it ends, so a kill never leaves a lock that refuses the next run."""
    import fcntl
    import socket
    import time

    folder = out.resolve()
    if _HELD.get("folder") == folder:
        return None, None
    release_run_folder()  # this process's previous run is over: runs in one process follow each other
    folder.mkdir(parents=True, exist_ok=True)
    (folder / LOCK_FILE).touch()
    handle = open(folder / LOCK_FILE, "r+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _record(handle.read())
        handle.close()
        return holder or {"pid": "?", "host": "?", "started": "?"}, None
    except OSError as err:  # a filesystem without locks
        handle.close()
        console.print(
            f"--output {out}: no lock on this filesystem ({err}), so a second run writing it is not refused",
            markup=False,
        )
        return None, None
    previous = _record(handle.read())
    handle.seek(0)
    handle.truncate()
    started = time.strftime("%Y-%m-%d %H:%M:%S %z")
    handle.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": started}) + "\n")
    handle.flush()
    _HELD.update(folder=folder, file=handle)
    return None, previous


def _record(text: str) -> dict | None:
    try:
        record = json.loads(text)
    except ValueError:
        return {"pid": "?", "host": "?", "started": "?"} if text.strip() else None
    return record if isinstance(record, dict) else None


def _holder(record: dict) -> str:
    return f"pid {record.get('pid')} on host {record.get('host')}, started {record.get('started')}"


def hold_run_folder(accelerator, out: Path) -> None:
    """Take the run folder for this run (process 0 holds it for all): a folder another live run writes is refused,
    naming that run; a lock left by a run that was killed is taken over with a note. Every process calls this."""
    from tether.train.parallel import DataParallel

    held, previous = _take_lock(out) if accelerator.is_main_process else (None, None)
    held = DataParallel(accelerator).gather_json([held])[0]
    if held:
        raise ConfigError(
            f"--output {out} is being written by another run ({_holder(held)}; its lock: {LOCK_FILE}); two runs "
            "writing one folder would overwrite each other's checkpoints. Wait for it to end or stop it, or give "
            "this run a folder of its own"
        )
    if previous:
        console.print(
            f"--output {out}: taking over the lock of a run that ended without releasing it ({_holder(previous)}; "
            "killed, most likely)",
            style="yellow",
            markup=False,
        )


def release_run_folder() -> None:
    """The run is over: its folder's lock is emptied (a lock left with a holder means a run that was killed) and
    freed for the next run."""
    handle = _HELD.pop("file", None)
    _HELD.clear()
    if handle is not None:
        handle.seek(0)
        handle.truncate()
        handle.close()


def close_run(accelerator) -> None:
    """A stage's last act: every process done with the run folder (a barrier), then its lock released."""
    accelerator.wait_for_everyone()
    release_run_folder()


def open_run(
    accelerator, run, config: dict, defaults: dict | None = None, renamed: dict | None = None
) -> tuple[int, Path | None]:
    """Check the run folder (``run``: a RunSection) against resume/overwrite and take it for this run (no other live
    run writes it: hold_run_folder); return (start step, checkpoint to resume from or None). On resume, rows written
    after the checkpoint are cut from the step files."""
    if not run.output:
        raise ConfigError("--output is required: the run folder for config.yaml, metrics.jsonl and checkpoints")
    out = Path(run.output)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--output {out} is a file; the run folder must be a folder (new, or one tether wrote)")
    if run.resume:
        found, skipped = resumable_checkpoint(out)
        for problem in skipped:
            console.print(f"--resume: passing over a damaged checkpoint: {problem}", style="yellow")
        if found is None:
            raise ConfigError(
                f"--resume: no complete, readable checkpoint-<step>/ in {out}; nothing to resume from"
                + (f" ({'; '.join(skipped)})" if skipped else "")
                + ". Start the run afresh with "
                "--overwrite (without --resume)"
            )
        hold_run_folder(accelerator, out)
        _check_resumable(out, config, defaults, renamed)
        if accelerator.is_main_process:
            for name in STEP_FILES:  # a kill between checkpoints would otherwise show those rows twice
                truncate_metrics(out / name, found[0])
        return found
    hold_run_folder(accelerator, out)  # (making the folder)
    has_run = out.is_dir() and (any((out / name).exists() for name in RUN_FILES) or bool(latest_checkpoint(out)))
    if has_run and not run.overwrite:
        if latest_checkpoint(out) is None:  # killed before its first checkpoint: nothing --resume could continue
            raise ConfigError(
                f"--output {out} holds a run that has no checkpoint to resume from; pass --overwrite to start it afresh"
            )
        raise ConfigError(
            f"--output {out} already holds a run; pass --resume to continue it or --overwrite to start afresh"
        )
    if has_run and not _written_by_tether(out):
        raise ConfigError(
            f"--output {out}: its config.yaml was not written by tether (it has no plan), so --overwrite "
            "will not delete anything there; give the run a folder of its own"
        )
    if accelerator.is_main_process:
        if has_run:
            for child in out.iterdir():
                if child.name in RUN_FILES or child.name.startswith("checkpoint-"):
                    shutil.rmtree(child) if child.is_dir() else child.unlink()
        out.mkdir(parents=True, exist_ok=True)
        remove_partials(out)
    accelerator.wait_for_everyone()
    return 0, None


def start_run(cfg, required: dict[str, str]):
    """What every stage does first: the required inputs ({flag: value}), the accelerator, the run folder (new,
    --overwrite or --resume) and the seeds. Returns (accelerator, resolved config dict, output folder, start step,
    checkpoint to resume from or None)."""
    from tether.config import config_to_dict

    for flag, value in required.items():
        if not value:
            raise ConfigError(f"{flag} is required")
    accelerator = make_accelerator(cfg.model.device)
    config = config_to_dict(cfg)
    start_step, checkpoint = open_run(
        accelerator, cfg.train, config, config_to_dict(_defaults(type(cfg))), getattr(type(cfg), "RENAMED", {})
    )
    seed_everything(cfg.train.seed)
    return accelerator, config, Path(cfg.train.output), start_step, checkpoint


def _defaults(config_cls):
    from tether.config import build_config

    return build_config(config_cls, source="defaults")


def check_steps_left(start_step: int, total_steps: int, checkpoint: Path | None) -> None:
    """A resumed run must have steps left — or, killed after its last checkpoint and before its summary, only final/
    (written again whole) and the summary to write (the loops then run no step and finish)."""
    if checkpoint is None or start_step < total_steps:
        return
    if start_step == total_steps and not (checkpoint.parent / "summary.json").exists():
        console.print(f"resuming from {checkpoint.name}, the last step: no step left, writing final/ and the summary")
        return
    raise ConfigError(
        f"--resume: {checkpoint.name} is already at step {start_step} and this run has {total_steps} "
        "steps, so there is nothing left to train; raise --max-steps (or --epochs) to continue, or "
        "use final/ as it is"
    )


def show_plan(plan: dict, title: str) -> None:
    from rich.table import Table

    table = Table(title=title, show_header=False, box=None)
    # a value longer than its column is folded onto the next lines, every character kept: rich's default cuts it
    # with "…", and a plan line is often the user's own text (a path, an environment's spec)
    table.add_column(overflow="fold")
    table.add_column(overflow="fold")
    for k, v in plan.items():
        table.add_row(k, str(v))
    console.print(table)


def learning_rate_line(config: dict) -> dict:
    """The plan's learning rate, its schedule and warm-up, from the resolved config (every stage prints it: a
    migrant's config may carry another default than the one they expect)."""
    optim = config.get("optim")
    if not optim:
        return {}
    warmup = (
        f"{optim['warmup_steps']} warm-up updates" if optim["warmup_steps"] else f"warm-up {optim['warmup_ratio']:g}"
    )
    decay = f" to {optim['min_lr_ratio']:g} x" if optim["lr_schedule"] == "cosine" else ""
    return {"learning rate": f"{optim['lr']:g} ({warmup}, then {optim['lr_schedule']}{decay})"}


def announce(title: str, plan: dict, config: dict, out: Path, reports=(), checkpoint: Path | None = None) -> None:
    """Print the data reports and the plan, and write the resolved config (with the plan) to config.yaml."""
    import yaml

    for report in reports:
        console.print(report.summary())
    plan = {**plan, **({} if "learning rate" in plan else learning_rate_line(config))}
    show_plan(plan, title + (f" — resuming from {checkpoint.name}" if checkpoint else ""))
    (Path(out) / "config.yaml").write_text(yaml.safe_dump({**config, "plan": plan}, sort_keys=False))


def closing_line(out: Path, figures: dict) -> str:
    """A run's last line, in the offline stages' form: where its final model is (``out``/final), then its headline
    figures ({name: a number, printed to 4 significant digits, or a text})."""
    shown = [f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in figures.items()]
    return "  ".join([f"final model: {Path(out) / 'final'}", *shown])


def write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(path)


def peak_memory(accelerator) -> dict:
    """Each process's peak resident memory (MiB), and on a GPU its peak allocated tensor memory: summary.json's
    peak_memory (every process calls it)."""
    import resource

    from tether.train.parallel import DataParallel

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB
    out = {"rss_mib": [round(x, 1) for x in DataParallel(accelerator).gather_json([rss])]}
    if torch.cuda.is_available():
        gpu = torch.cuda.max_memory_allocated() / 2**20
        out["gpu_allocated_mib"] = [round(x, 1) for x in DataParallel(accelerator).gather_json([gpu])]
    return out
