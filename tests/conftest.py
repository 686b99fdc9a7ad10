"""Shared fixtures: a BPE tokenizer trained here and tiny random models built from configs. Nothing is downloaded."""

from __future__ import annotations

import atexit
import getpass
import json
import os
import random
import shutil
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# `make test` runs the files on pytest-xdist workers, one per core: each worker (and every process a test starts,
# which inherits the variable) gets its share of the cores as threads, since two workers of two threads each on two
# cores would spin against each other.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    _CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    os.environ["OMP_NUM_THREADS"] = str(max(1, _CORES // _WORKERS))

# What the processes the tests start leave in the temporary folder (torch's elastic agent's torchelastic_* folders,
# vLLM's vllm_dist_* folders, tether's vLLM logs) goes to a folder of this process's own, removed when
# it ends; pytest's tmp_path folders stay where they were (PYTEST_DEBUG_TEMPROOT), kept for a failed test's reading,
# and so does torch.compile's cache (its default place, kept between runs).
os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", tempfile.gettempdir())
os.environ.setdefault(
    "TORCHINDUCTOR_CACHE_DIR", os.path.join(tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}")
)
_TESTS_TMP = tempfile.mkdtemp(prefix="tether-tests-")
os.environ["TMPDIR"] = tempfile.tempdir = _TESTS_TMP
# ignore_errors: a process a test started may still be closing its files there as this one exits
atexit.register(shutil.rmtree, _TESTS_TMP, ignore_errors=True)

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


# The longest files first: `make test` hands whole files to the workers in collection order (--dist loadfile
# --no-loadscope-reorder), and the suite's wall time is the busier worker's, so a long file started late decides it.
# Each file's seconds summed from --durations=0 (2 cores, AMD EPYC, 2026-12-07, with each file's two-process runs
# made in one launch: test_online_parallel.Together).
LONGEST_FIRST = (
    "test_vllm.py",  # 329
    "test_lab_pipeline.py",  # 301 (the quick lab's fixture alone about 100-110)
    "test_online_parallel.py",  # 157
    "test_async_rollouts.py",  # 133
    "test_kill_anywhere.py",  # 94
    "test_sharding_online.py",  # 90
    "test_lab_visual.py",  # 51
    "test_sharding.py",  # 49
    "test_vllm_vision.py",  # 34
    "test_multiprocess.py",  # 33
    "test_multimodal_rl.py",  # 32
    "test_trl_users.py",  # 28
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


@pytest.fixture(scope="session")
def vlm_dirs(tmp_path_factory, tokenizer):
    """{family: folder} for tiny random vision-language models (LLaVA, Idefics3, Gemma 3) with their processors."""
    from tether.models.vision import TINY_VISION_FAMILIES, build_tiny_vlm

    root = tmp_path_factory.mktemp("vlms")
    return {family: build_tiny_vlm(family, tokenizer, root / family) for family in TINY_VISION_FAMILIES}


def process_tree(pid: int) -> list[int]:
    """The process and all its descendants (torch.distributed's agent starts the workers in sessions of their own,
    still its children)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(stat.parent.name))
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        todo += children.get(p, [])
    return tree


def descendants(pid: int) -> list[int]:
    """The processes a process started, theirs, and so on: what must die with it."""
    return process_tree(pid)[1:]


def running(pid: int) -> bool:
    """The process exists and one of its threads has not exited. A zombie thread has closed its files, but the
    process's files are closed only when its last thread has exited: a killed process's first thread may be a zombie
    while the others still hold the files they share (the run folder's lock among them)."""
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return False
    for task in tasks:
        try:
            state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):  # the thread exited meanwhile
            continue
        if state != "Z":
            return True
    return False


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def rules_and_prompts(folder, rules: str, prompt_rows: list[dict]) -> tuple:
    """(rules.py, prompts.jsonl) written in ``folder``: the reward functions' source and the prompts of an online run."""
    (folder / "rules.py").write_text(rules)
    return folder / "rules.py", write_jsonl(folder / "prompts.jsonl", prompt_rows)


@pytest.fixture
def addition_files(tmp_path):
    return write_addition_files(tmp_path)


def write_addition_files(folder):
    """(train.jsonl, eval.jsonl) in ``folder``: 200 and 40 addition prompts with their completions."""
    rng = random.Random(0)
    rows = [addition_example(rng, 40) for _ in range(240)]
    for r in rows:
        del r["answer"]
    return write_jsonl(folder / "train.jsonl", rows[:200]), write_jsonl(folder / "eval.jsonl", rows[200:])


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


def metrics_but_timings(run_folder) -> list[dict]:
    """A run's metrics rows without its wall-clock figures (time/, perf/): what a resumed run must log again exactly."""
    rows = [json.loads(line) for line in (run_folder / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if not k.startswith(("time/", "perf/"))} for row in rows]


def assert_resumes_exactly(run, config, tmp_path, monkeypatch, kill_after: int, resumed_from: int) -> None:
    """``run(config(out, **overrides))`` killed after step ``kill_after`` resumes from checkpoint-``resumed_from``
    (tmp_path/killed) and logs what the uninterrupted run (tmp_path/whole) logged, wall-clock figures aside."""
    run(config(tmp_path / "whole"))
    with killed_after_step(monkeypatch, kill_after), pytest.raises(KeyboardInterrupt):
        run(config(tmp_path / "killed"))
    summary = run(config(tmp_path / "killed", train__resume=True))
    assert summary["resumed_from"] == resumed_from
    assert metrics_but_timings(tmp_path / "killed") == metrics_but_timings(tmp_path / "whole")


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


# Every run compared with another that sums its gradients in another order (N processes against one, sharded against
# not) trains in float64 (--dtype float64): float32's rounding, amplified by AdamW where a gradient sits near ε,
# moved a share of weights by more than 1e-6 in a way that depended on the CPU's kernels (an AMD EPYC failed what an
# Intel passed), while float64 keeps the two runs within the bound below on any CPU.
FP64 = ["--dtype", "float64"]

U64 = 2.0**-53  # float64's unit roundoff
ADAM_EPS = 1e-8  # AdamW's ε (torch's default, which tether uses)


def assert_same_adamw_weights(
    reference: dict, other: dict, lr: float, updates: int, what: str = "", terms: int = 4096
) -> None:
    """Weights of two float64 runs that should train alike, after ``updates`` AdamW updates at learning rate ``lr``;
    the bound comes from the arithmetic, not from one CPU.

    The two runs sum each weight's gradient over the same ``terms`` (at most; one per token of the update's
    minibatch) in another order. Two float64 orders of n terms differ by at most 2·n·u·Σ|t| (u = 2⁻⁵³, Higham 2002
    §4.2), and Σ|t| ≤ 1 here: each term is one token's share of a token-mean loss under max_grad_norm 1. AdamW's step
    lr·m̂/(√v̂ + ε) changes by at most lr·|δg|/ε when g changes by δg (its steepest point is g → 0), so each update adds
    at most lr·2·n·u/ε to a weight's difference, and ``updates`` of them, one run each way, at most twice that sum:
    2 · updates · lr · 2·n·u / ε (1.6e-6 for 12 updates at lr 3e-3). The bound leaves out a difference's feedback into
    later gradients; the runs here end about 1e-15 apart, nine orders of magnitude inside it, while a real
    difference in training (another batch, a process training alone) moves weights by ~lr an update."""
    assert sorted(reference) == sorted(other), what
    bound = 2 * updates * lr * 2 * terms * U64 / ADAM_EPS
    for name, a in reference.items():
        assert a.dtype == torch.float64 and other[name].dtype == torch.float64, f"{what} {name}: not a float64 run"
        diff = float((other[name] - a).abs().max())
        assert diff <= bound, f"{what} {name}: {diff:.3g} > {bound:.3g}"


def flags(*words, **values) -> list[str]:
    """A command line from keywords, as the multi-process tests launch it: flags("grpo", model=m, max_steps=3,
    response_seeds=True, reward=[a, b]) -> ["grpo", "--model", m, "--max-steps", "3", "--response-seeds",
    "--reward", a, "--reward", b]; a list repeats the flag, True is the bare flag, False and None leave it out."""
    out = [str(w) for w in words]
    for key, value in values.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            out.append(flag)
        elif value is not False and value is not None:
            for item in value if isinstance(value, list) else [value]:
                out += [flag, str(item)]
    return out


# ATEN_CPU_CAPABILITY=default or =avx2 on a CPU with AMX: tether refuses bf16 attention on CPU before the first
# forward (models/cpu.refuse_bf16_attention_where_torch_cannot), and each bf16 test asserts that refusal there instead
BF16_REFUSED = "torch's bf16 attention picks the AMX kernel, which needs AVX-512"


def bf16_refused_here() -> bool:
    from tether.models.cpu import bf16_attention_runs_here

    return not bf16_attention_runs_here()
