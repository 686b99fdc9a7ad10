"""Shared fixtures: a BPE tokenizer trained here and tiny random models built from configs. Nothing is downloaded."""

from __future__ import annotations

import json
import os
import random

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# `make test` runs the files on pytest-xdist workers, one per core: each worker (and every process a test starts,
# which inherits the variable) gets its share of the cores as threads, since two workers of two threads each on two
# cores would spin against each other.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    _CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    os.environ["OMP_NUM_THREADS"] = str(max(1, _CORES // _WORKERS))

import torch  # noqa: E402
import transformers  # noqa: E402

transformers.utils.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()
torch.set_num_threads(min(2, torch.get_num_threads()))

from tether.lab.demo import addition_example  # noqa: E402
from tether.lab.tokenizer import train_bpe_tokenizer  # noqa: E402
from tether.models.lm import build_tiny_model  # noqa: E402

CORPUS = [
    "What is 12 + 7?\n12 + 7 = 19. The answer is 19.",
    "Tell me about cats. Cats are mammals. Cats sleep a lot.",
    "user assistant system hello there, how are you? I am fine, thanks!",
] * 20 + [f"{i} + {j} = {i + j}" for i in range(30) for j in range(0, 30, 7)]


# The longest files first (measured with --durations: the quick lab's file alone is about 12 minutes of one worker):
# `make test` hands whole files to the workers in collection order (--dist loadfile --no-loadscope-reorder), and
# the suite's wall time is the busier worker's, so a long file started late decides it.
LONGEST_FIRST = (
    "test_lab_pipeline.py",
    "test_vllm.py",
    "test_kill_anywhere.py",
    "test_online_parallel.py",
    "test_sharding_online.py",
    "test_sharding.py",
    "test_multiprocess.py",
)


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: each file keeps its own order


@pytest.fixture(scope="session")
def tokenizer():
    return train_bpe_tokenizer(CORPUS, vocab_size=320)


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory, tokenizer):
    """{arch: folder} for tiny gpt2, llama and qwen2 models saved with the tokenizer."""
    root = tmp_path_factory.mktemp("models")
    return {
        arch: build_tiny_model(arch, tokenizer, root / arch, seed=0, hidden=32, layers=2, heads=2, max_positions=128)
        for arch in ("gpt2", "llama", "qwen2")
    }


@pytest.fixture(scope="session")
def llama_dir(model_dirs):
    return model_dirs["llama"]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def addition_files(tmp_path):
    rng = random.Random(0)
    rows = [addition_example(rng, 40) for _ in range(240)]
    for r in rows:
        del r["answer"]
    return write_jsonl(tmp_path / "train.jsonl", rows[:200]), write_jsonl(tmp_path / "eval.jsonl", rows[200:])


class killed_after_step:
    """Context manager: the next training run dies (KeyboardInterrupt) right after logging step ``step``,
    as a kill between two checkpoints would leave it."""

    def __init__(self, monkeypatch, step: int):
        from tether.train import logger as logger_module

        self.monkeypatch, self.step, self.module = monkeypatch, step, logger_module
        self.original = logger_module.MetricsLogger.log

    def __enter__(self):
        original, step = self.original, self.step

        def log_then_die(logger, metrics):
            original(logger, metrics)
            if metrics["step"] == step:
                raise KeyboardInterrupt(f"killed after step {step}")

        self.monkeypatch.setattr(self.module.MetricsLogger, "log", log_then_die)
        return self

    def __exit__(self, *exc):
        self.monkeypatch.setattr(self.module.MetricsLogger, "log", self.original)
        return False


def kill_before_final(monkeypatch, module) -> None:
    """The next run of a stage dies (KeyboardInterrupt) right before writing final/ — after its last checkpoint —
    whether its module writes final/ with its own ``write_atomically`` or through checkpoint.save_final. Undo
    with monkeypatch.undo()."""
    from tether.train import checkpoint

    for owner in {module, checkpoint}:
        if not hasattr(owner, "write_atomically"):
            continue
        original = owner.write_atomically

        def die_before_final(save_fn, target, *args, original=original, **kwargs):
            if str(target).endswith("final"):
                raise KeyboardInterrupt("killed before final/")
            return original(save_fn, target, *args, **kwargs)

        monkeypatch.setattr(owner, "write_atomically", die_before_final)


def assert_same_adamw_weights(reference: dict, other: dict, lr: float, updates: int, what: str = "") -> None:
    """Weights of two fp32 runs that should train alike (N processes against one, sharded against not), after
    ``updates`` AdamW updates at learning rate ``lr``; the bounds come from the arithmetic, not from one CPU.

    Two runs that sum a gradient in another order differ in its last bits (u = 6e-8). For a weight whose gradient
    is large against AdamW's ε the update lr·m̂/(√v̂ + ε) does not depend on the gradient's scale, so it moves by
    ~u relative: after a few updates such weights agree to far below 1e-6 (BULK_ATOL). A weight whose gradient sits
    near ε is the exception: there a rounding-level change of g changes the update by up to ~lr, and which weights
    those are, and by how much, depends on the CPU's kernels. So: every weight within the most AdamW can move in
    ``updates`` steps (|Δθ| ≤ lr·(1 − β1)/√(1 − β2) ≈ 3.2·lr a step, Kingma & Ba 2015 §2.1, twice: one run each
    way), and at most 1 % of them beyond BULK_ATOL. A real difference in training (another batch, another
    normalisation, a process training alone) moves nearly every weight by far more than BULK_ATOL."""
    assert sorted(reference) == sorted(other), what
    worst = 2 * 3.2 * lr * updates
    beyond = total = 0
    for name, a in reference.items():
        diff = (other[name].double() - a.double()).abs()
        assert float(diff.max()) <= worst, f"{what} {name}: {float(diff.max()):.3g} > {worst:.3g}"
        beyond += int((diff > BULK_ATOL).sum())
        total += diff.numel()
    assert beyond <= 0.01 * total, f"{what}: {beyond} of {total} weights differ by more than {BULK_ATOL}"


BULK_ATOL = 1e-6
