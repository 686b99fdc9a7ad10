"""What tether prints to the terminal: one rich console (on stderr), log records routed through it, quiet
third-party libraries, and progress for long loops. Every floor of the package may import it; it imports nothing
of tether's.

Rich markup is off on the console: whatever is printed (a plan's template note holding Mistral's ``[/INST]``, a
file name, an error, a model's text) appears as written, never read as ``[style]`` tags. A line in colour says so
with ``style=`` (``console.print(text, style="yellow")``)."""

from __future__ import annotations

import logging
import os
import sys
import time
import warnings
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

# Not a terminal (CI, a log file): wide enough that the lab's tables are not folded into 80 columns.
console = Console(
    stderr=True,
    markup=False,
    highlight=False,
    soft_wrap=True,
    width=None if sys.stderr.isatty() else int(os.environ.get("COLUMNS", 160)),
)


class ConsoleLogHandler(logging.Handler):
    """Log records printed through the console: with a live progress bar they land above it, never through it."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            console.print(self.format(record), highlight=False)
        except Exception:  # noqa: BLE001 - logging must not raise
            self.handleError(record)


# Libraries whose INFO and WARNING lines would land between tether's: vLLM's (that a CPU build has no Triton, on every
# CPU run), trackio's, accelerate's, datasets'. Their errors still print.
QUIET_LOGGERS = ("accelerate", "vllm", "trackio", "datasets", "httpx")


def quiet_libraries() -> None:
    """transformers' warnings and progress bars off, the libraries in QUIET_LOGGERS down to their errors, and
    Python's warnings through the console: what every tether process (the command, the lab's workers) sets before it
    loads a model."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    # peft asks every LoRA model the deprecated question (transformers 5): a warning the user can do nothing about
    warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
    root = logging.getLogger()
    if not root.handlers:  # as logging.basicConfig, through the console (above a progress bar)
        handler = ConsoleLogHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        root.addHandler(handler)
        root.setLevel(logging.WARNING)


@contextmanager
def output_to(log: str | os.PathLike):
    """Everything this process prints (Python, rich, C++ warnings) goes to ``log`` meanwhile, and so does everything
    a process started meanwhile prints, for as long as it runs (it inherits the two descriptors)."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(log, "a") as f:
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            for fd, copy in zip((1, 2), saved):
                os.dup2(copy, fd)
                os.close(copy)


def progress(items, total: int, description: str, min_items: int = 2000, every_s: float = 10.0):
    """``items``, with progress shown when there are at least ``min_items``: a bar in a terminal, else a line
    every ``every_s`` seconds (a log file). Tokenising 20,000 conversations or scoring a reference takes a while."""
    if total < min_items:
        yield from items
        return
    if sys.stderr.isatty():
        with Progress(
            TextColumn("{task.description}", markup=False),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TimeRemainingColumn(),
            console=console,
            transient=True,
        ) as bar:
            task = bar.add_task(description, total=total)
            for item in items:
                yield item
                bar.advance(task)
        return
    start = last = time.perf_counter()
    for done, item in enumerate(items, 1):
        yield item
        now = time.perf_counter()
        if now - last >= every_s and done < total:
            console.print(f"{description}: {done}/{total} ({now - start:.0f} s)")
            last = now


def loading(what: str) -> None:
    """One line before a slow start-up phase (a model read from disk, an inference engine started), so that the
    seconds before a run's plan say what they are spent on."""
    console.print(f"loading {what} …", style="dim")
