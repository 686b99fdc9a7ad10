"""Metrics sinks: metrics.jsonl (always), TensorBoard, wandb, mlflow, trackio; console lines and a progress bar.

Only the main process logs. On resume, lines past the checkpoint's step are
dropped from metrics.jsonl (they came from the killed run after its last
checkpoint) and TensorBoard purges them, so the file reads as one run.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import sys
import time
from pathlib import Path

from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

from tether.config import ConfigError
from tether.console import console


def truncate_metrics(path: Path, last_step: int) -> None:
    """Keep the lines up to ``last_step``; a line cut short by a kill (not valid JSON) is dropped too."""
    if not path.is_file():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            if line.strip() and json.loads(line)["step"] <= last_step:
                kept.append(line)
        except json.JSONDecodeError:
            continue
    path.write_text("".join(line + "\n" for line in kept))


# the figures worth a glance on the console line; everything else is in metrics.jsonl
CONSOLE_KEYS = (
    "train/loss",
    "eval/loss",
    "score/mean",
    "kl/ref_mean",
    "kl/coef",
    "eval/score_mean",
    "eval/gold_reward",
    "train/rewards/margins",
    "train/rewards/accuracy",
    "eval/rewards/accuracy",
    "eval/gold_win_rate",
    "perf/tokens_per_s",
)


def flat_params(config: dict, prefix: str = "") -> dict[str, str]:
    """{"section.field": value as text} of a nested config (mlflow parameters are flat strings of at most 500
    characters)."""
    out = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flat_params(value, name + "."))
        else:
            out[name] = str(value)[:500]
    return out


class MetricsLogger:
    def __init__(
        self,
        output: str | Path,
        report_to: list[str],
        config: dict,
        start_step: int,
        total_steps: int,
        enabled: bool = True,
        log_every: int = 10,
        run_name: str = "tether",
    ):
        self.enabled = enabled
        self.output = Path(output)
        self.total_steps = total_steps
        self.log_every = max(1, log_every)
        self.tb = self.wandb = self.mlflow = self.trackio = None
        self._progress = None
        if not enabled:
            return
        self.path = self.output / "metrics.jsonl"
        truncate_metrics(self.path, start_step)
        self._file = self.path.open("a")
        if "tensorboard" in report_to:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(log_dir=str(self.output / "tensorboard"), purge_step=start_step + 1)
        if "wandb" in report_to:
            try:
                import wandb
            except ImportError:
                raise ConfigError("report_to includes wandb but wandb is not installed (pip install wandb)") from None
            # wandb's own variables win, as everywhere else wandb is used: WANDB_PROJECT, WANDB_NAME, WANDB_ENTITY...
            self.wandb = wandb.init(
                project=os.environ.get("WANDB_PROJECT") or "tether",
                name=os.environ.get("WANDB_NAME") or run_name,
                config=config,
                resume="allow",
            )
        if "mlflow" in report_to:
            try:
                import mlflow
            except ImportError:
                raise ConfigError(
                    "report_to includes mlflow but mlflow is not installed (pip install mlflow)"
                ) from None
            self.mlflow = mlflow
            mlflow.start_run(run_name=os.environ.get("MLFLOW_RUN_NAME") or run_name)
            mlflow.log_params(flat_params(config))  # the resolved settings, as `section.field`
        if "trackio" in report_to:
            try:
                import trackio
            except ImportError:
                raise ConfigError(
                    "report_to includes trackio but trackio is not installed (pip install trackio)"
                ) from None
            # local by default (TRACKIO_DIR); trackio's own TRACKIO_SPACE_ID sends it to a Space. Its set-up notes
            # (six lines on stdout, between tether's) become one line; its warnings go through `warnings`.
            project = os.environ.get("TRACKIO_PROJECT") or "tether"
            with contextlib.redirect_stdout(io.StringIO()):
                trackio.init(project=project, name=run_name, config=config, resume="allow")
            space = os.environ.get("TRACKIO_SPACE_ID")
            where = f"on the Space {space}" if space else f"`trackio show --project {project}` shows it"
            console.print(f"trackio: project {project}, run {run_name} ({where})")
            self.trackio = trackio
        if sys.stderr.isatty():
            self._progress = Progress(
                TextColumn("{task.description}", style="bold", markup=False),
                BarColumn(),
                TextColumn("{task.completed}/{task.total}"),
                TextColumn("{task.fields[info]}", markup=False),
                TimeRemainingColumn(),
                console=console,
                transient=False,
            )
            self._task = self._progress.add_task(run_name, total=total_steps, completed=start_step, info="")
            self._progress.start()
        self._t0 = time.perf_counter()
        self._start_step = start_step

    def log(self, metrics: dict) -> None:
        if not self.enabled:
            return
        step = metrics["step"]
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in metrics.items()}
        self._file.write(json.dumps(clean) + "\n")
        self._file.flush()
        scalars = {k: v for k, v in metrics.items() if k != "step" and isinstance(v, (int, float))}
        if self.tb:
            for k, v in scalars.items():
                self.tb.add_scalar(k, v, step)
        if self.wandb:
            self.wandb.log(scalars, step=step)
        if self.mlflow:
            self.mlflow.log_metrics({k.replace("/", "_"): v for k, v in scalars.items()}, step=step)
        if self.trackio:
            self.trackio.log(scalars, step=step)
        info = "  ".join(_short(k, v) for k, v in scalars.items() if k.replace("eval0/", "eval/", 1) in CONSOLE_KEYS)
        if self._progress:
            self._progress.update(self._task, completed=step, info=info)
        # the line is printed with a bar too: in a terminal it stays on screen above the bar
        if (
            step % self.log_every == 0
            or step == self.total_steps
            or any(k.startswith(("eval/", "eval0/")) for k in metrics)
        ):
            elapsed = time.perf_counter() - self._t0
            done = step - self._start_step
            eta = f"  eta {elapsed / done * (self.total_steps - step):.0f}s" if done > 0 else "  (before training)"
            console.print(f"step {step}/{self.total_steps}  {info}{eta}")

    def close(self) -> None:
        if not self.enabled:
            return
        if self._progress:
            self._progress.stop()
        self._file.close()
        if self.tb:
            self.tb.close()
        if self.wandb:
            self.wandb.finish()
        if self.mlflow:
            self.mlflow.end_run()
        if self.trackio:
            with contextlib.redirect_stdout(io.StringIO()):  # "Run finished. Uploading logs…"
                self.trackio.finish()


def _short(key: str, value: float) -> str:
    name = key.split("/", 1)[-1] if key.startswith("train/") else key
    return f"{name} {value:.4g}" if isinstance(value, float) else f"{name} {value}"


def warn_if_truncated(metrics: dict, warned_at: int, share: float = 0.9) -> int:
    """Say so loudly when most of a step's responses ran out of tokens (at most once every 10 steps); returns the
    step of the last warning. A run whose every response is cut off trains on text the model never ends."""
    frac = metrics.get("rollout/truncated_frac")
    step = metrics["step"]
    if frac is None or frac < share or step - warned_at < 10:
        return warned_at
    console.print(
        f"step {step}: {frac:.0%} of the responses hit max_new_tokens without a stop token. "
        "Raise max_new_tokens, or check the stop set in the plan: a model that ends its turns with a token "
        "outside it never stops (its EOS and the chat template's end-of-turn token are in it).",
        style="bold yellow",
    )
    return step
