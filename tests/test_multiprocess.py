"""Two processes under accelerate give the same loss curve as one process with the same global batch."""

import json
import os

import pytest
from conftest import descendants, flags, running, write_addition_files, write_jsonl
from test_online_parallel import Together, launch
from test_sft import read_metrics, sft_config

from tether.stages.sft import run_sft

# One run's settings, as flags (the 2-process launch) and as the config one process builds.
SETTINGS = dict(max_length=64, lr=3e-3, batch_size=8, micro_batch_size=2, save_every=0, report_to="none")


@pytest.mark.slow
@pytest.mark.parametrize("packing", [False, True], ids=["examples", "packed-rows"])
def test_two_processes_match_one_process(together, request, llama_dir, tmp_path, packing):
    """--packing: the examples packed into 64-token rows before the split, so each process gets whole rows."""
    two = together.two(request)
    config = (two / "config.yaml").read_text()
    assert "2 x 2 x 2" in config  # processes x micro-batch x accumulation
    assert f"packing: {str(packing).lower()}" in config
    one = tmp_path / "one"
    addition_files = together.inputs["addition"]
    run_sft(sft_config(llama_dir, addition_files, one, train__micro_batch_size=2, data__packing=packing))
    m1, m2 = read_metrics(one), read_metrics(two)
    assert len(m1) == len(m2) == 6
    for a, b in zip(m1, m2):
        assert a["train/tokens"] == b["train/tokens"]
        assert a["train/loss"] == pytest.approx(b["train/loss"], rel=1e-5)
        assert a["train/grad_norm"] == pytest.approx(b["train/grad_norm"], rel=1e-4)
        assert ("eval/loss" in a) == ("eval/loss" in b)
        if "eval/loss" in a:
            assert a["eval/loss"] == pytest.approx(b["eval/loss"], rel=1e-5)


def one_process_overrides(llama_dir, data, out) -> dict:
    """The config of SETTINGS with 4 steps, an evaluation every 2, for one process."""
    return {
        "model.path": str(llama_dir),
        "data.path": str(data),
        "data.eval_path": str(data),
        "data.max_length": 64,
        "optim.lr": 3e-3,
        "train.output": str(out),
        "train.batch_size": 8,
        "train.micro_batch_size": 2,
        "train.max_steps": 4,
        "train.eval_every": 2,
        "train.save_every": 0,
        "train.report_to": ["none"],
    }


def two_process_flags(stage: str, llama_dir, data, **settings) -> list[str]:
    """The run one_process_overrides describes (SETTINGS, 4 steps, an evaluation every 2), for two processes."""
    return flags(
        stage, model=llama_dir, data=data, eval_data=data, max_steps=4, eval_every=2, **{**SETTINGS, **settings}
    )


@pytest.mark.slow
def test_reward_model_two_processes_match_one_process(together, request, llama_dir, tmp_path):
    from tether.config import build_config
    from tether.stages.rm import RMConfig, run_rm

    run_rm(
        build_config(RMConfig, overrides=one_process_overrides(llama_dir, together.inputs["pairs"], tmp_path / "one"))
    )
    m1, m2 = read_metrics(tmp_path / "one"), read_metrics(together.two(request))
    for a, b in zip(m1, m2):
        assert a["train/pairs"] == b["train/pairs"] == 8
        assert a["train/loss"] == pytest.approx(b["train/loss"], rel=1e-5)
        if "eval/accuracy" in a:
            assert a["eval/accuracy"] == pytest.approx(b["eval/accuracy"])


def test_process_reward_model_two_processes_match_one_process(together, request, llama_dir, tmp_path):
    from tether.config import build_config
    from tether.stages.prm import PRMConfig, run_prm

    run_prm(
        build_config(PRMConfig, overrides=one_process_overrides(llama_dir, together.inputs["steps"], tmp_path / "one"))
    )
    m1, m2 = read_metrics(tmp_path / "one"), read_metrics(together.two(request))
    assert len(m1) == len(m2) == 4
    for a, b in zip(m1, m2):
        assert a["train/steps"] == b["train/steps"] > 0  # the same global batch: the same labelled steps
        # float32 sums of a few dozen O(1) terms in another order: relative differences ~1e-6
        assert a["train/loss"] == pytest.approx(b["train/loss"], rel=1e-5)
        if "eval/step_accuracy" in a:
            assert a["eval/step_accuracy"] == pytest.approx(b["eval/step_accuracy"])


@pytest.mark.slow
def test_killing_the_launchers_process_group_ends_its_processes(llama_dir, addition_files, tmp_path):
    """kill -9 of `accelerate launch`'s process group: the two processes, which torch.distributed's agent starts
    in sessions of their own, die with it (before, both went on training into the folder a --resume would write
    too), and the lock process 0 took names it."""
    import signal
    import time

    out = tmp_path / "two"
    args = ["sft", "--model", str(llama_dir), "--data", str(addition_files[0]), "--batch-size", "2"]
    args += ["--micro-batch-size", "1", "--report-to", "none", "--eval-every", "0", "--save-every", "0", "--output"]
    args += [str(out)]
    proc = launch(args + ["--max-steps", "100000"], wait=False)
    deadline = time.time() + 120
    while not (out / "config.yaml").is_file() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)  # the plan is written once both processes have opened the run folder
    ranks = descendants(proc.pid)
    assert len(ranks) >= 2 and proc.poll() is None, proc.stdout.read()[-3000:] if proc.poll() is not None else ranks
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.time() + 10
    while any(running(p) for p in ranks) and time.time() < deadline:
        time.sleep(0.05)
    survivors = [p for p in ranks if running(p)]
    for p in survivors:
        os.kill(p, signal.SIGKILL)
    assert not survivors, "the launch's processes outlived their launcher"
    # the folder's lock names process 0, dead: the next run takes it over (tests/test_checkpoint_safety.py)
    assert json.loads((out / ".tether.lock").read_text())["pid"] in ranks


COMPACT_JUDGE = """---
mode: pairwise
verdicts: ["A", "B"]
answer_prefix: "Better:\\n"
chat: false
---
{{prompt}}
A: {{response_a}}
B: {{response_b}}
"""


@pytest.mark.slow
def test_judge_two_processes_match_one_process(together, request, llama_dir, tmp_path):
    """`tether judge` on two processes: the same verdicts a step (8 of each global batch), the same loss curve and
    the same held-out figures (every process evaluates the whole held-out set) as one process."""
    from tether.config import build_config
    from tether.stages.judge import JudgeConfig, run_judge

    overrides = {
        **one_process_overrides(llama_dir, together.inputs["verdicts"], tmp_path / "one"),
        "data.max_length": 128,
        "judge.template": str(together.inputs["template"]),
    }
    run_judge(build_config(JudgeConfig, overrides=overrides))
    m1, m2 = read_metrics(tmp_path / "one"), read_metrics(together.two(request))
    assert len(m1) == len(m2) == 4
    for a, b in zip(m1, m2):
        assert a["train/tokens"] == b["train/tokens"] == 8  # eight verdicts, one trained token each
        # float32 sums of eight O(1) terms in another order: relative differences ~1e-6
        assert a["train/loss"] == pytest.approx(b["train/loss"], rel=1e-5)
        for key in ("eval/loss", "eval/accuracy", "eval/order_inconsistency", "eval/brier"):
            if key in a:
                assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-6), key


# The two-process runs of this file's tests, made in one launch (Together), by test: (their flags from the llama and
# the file's data, none that the two-process run alone has); each test makes its one-process run from a config.
@pytest.fixture(scope="module")
def together(request, llama_dir, tmp_path_factory) -> Together:
    from test_prm import step_rows

    root = tmp_path_factory.mktemp("data")
    pairs = [
        {
            "prompt": f"Q{i}: ",
            "chosen": "Cats sleep a lot." + " yes" * (i % 5),
            "rejected": "Cats are dogs." + " no" * (i % 3),
        }
        for i in range(40)
    ]
    verdicts = [
        {"prompt": f"Q{i}:", "chosen": "Cats sleep a lot.", "rejected": "no" + " no" * (i % 3)} for i in range(20)
    ]
    (root / "judge.txt").write_text(COMPACT_JUDGE)
    data = {
        "addition": write_addition_files(root),
        "pairs": write_jsonl(root / "pairs.jsonl", pairs),
        "steps": write_jsonl(root / "steps.jsonl", step_rows(40)),
        "verdicts": write_jsonl(root / "verdicts.jsonl", verdicts),
        "template": root / "judge.txt",
    }

    def sft(packing: bool) -> list[str]:
        train, held_out = data["addition"]
        run = dict(model=llama_dir, data=train, eval_data=held_out, warmup_ratio=0.1, max_steps=6, eval_every=3)
        return flags("sft", **run, **SETTINGS, packing=packing)

    table = {
        "test_two_processes_match_one_process[examples]": (lambda _: sft(False), []),
        "test_two_processes_match_one_process[packed-rows]": (lambda _: sft(True), []),
        "test_reward_model_two_processes_match_one_process": (
            lambda _: two_process_flags("rm", llama_dir, data["pairs"]),
            [],
        ),
        "test_process_reward_model_two_processes_match_one_process": (
            lambda _: two_process_flags("prm", llama_dir, data["steps"]),
            [],
        ),
        "test_judge_two_processes_match_one_process": (
            lambda _: two_process_flags(
                "judge", llama_dir, data["verdicts"], max_length=128, judge_template=data["template"]
            ),
            [],
        ),
    }
    return Together(request, table, data, tmp_path_factory.mktemp("two-processes"))
