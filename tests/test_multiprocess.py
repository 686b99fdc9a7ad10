"""Two processes under accelerate give the same loss curve as one process with the same global batch."""

import json
import os
import subprocess
import sys

import pytest
from test_online_parallel import free_port
from test_sft import read_metrics, sft_config

from tether.stages.sft import run_sft


@pytest.mark.slow
@pytest.mark.parametrize("packing", [False, True], ids=["examples", "packed-rows"])
def test_two_processes_match_one_process(llama_dir, addition_files, tmp_path, packing):
    """--packing: the examples packed into 64-token rows before the split, so each process gets whole rows."""
    train_path, eval_path = addition_files
    common = [
        "--model",
        str(llama_dir),
        "--data",
        str(train_path),
        "--eval-data",
        str(eval_path),
        "--max-length",
        "64",
        "--lr",
        "3e-3",
        "--warmup-ratio",
        "0.1",
        "--batch-size",
        "8",
        "--micro-batch-size",
        "2",
        "--max-steps",
        "6",
        "--eval-every",
        "3",
        "--save-every",
        "0",
        "--report-to",
        "none",
        *(["--packing"] if packing else []),
    ]
    two = tmp_path / "two"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    # On a machine without GPUs, --multi_gpu makes accelerate start N processes; tether then uses gloo on CPU.
    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "--main_process_port",
        str(free_port()),
        "-m",
        "tether",
        "sft",
        *common,
        "--output",
        str(two),
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    config = (two / "config.yaml").read_text()
    assert "2 x 2 x 2" in config  # processes x micro-batch x accumulation
    assert f"packing: {str(packing).lower()}" in config

    one = tmp_path / "one"
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


@pytest.mark.slow
def test_reward_model_two_processes_match_one_process(llama_dir, tmp_path):
    from tether.config import build_config
    from tether.stages.rm import RMConfig, run_rm

    rows = [
        {
            "prompt": f"Q{i}: ",
            "chosen": "Cats sleep a lot." + " yes" * (i % 5),
            "rejected": "Cats are dogs." + " no" * (i % 3),
        }
        for i in range(40)
    ]
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    common = [
        "--model",
        str(llama_dir),
        "--data",
        str(data),
        "--eval-data",
        str(data),
        "--max-length",
        "64",
        "--lr",
        "3e-3",
        "--batch-size",
        "8",
        "--micro-batch-size",
        "2",
        "--max-steps",
        "4",
        "--eval-every",
        "2",
        "--save-every",
        "0",
        "--report-to",
        "none",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "--main_process_port",
        str(free_port()),
        "-m",
        "tether",
        "rm",
        *common,
        "--output",
        str(tmp_path / "two"),
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    overrides = {
        "model.path": str(llama_dir),
        "data.path": str(data),
        "data.eval_path": str(data),
        "data.max_length": 64,
        "optim.lr": 3e-3,
        "train.output": str(tmp_path / "one"),
        "train.batch_size": 8,
        "train.micro_batch_size": 2,
        "train.max_steps": 4,
        "train.eval_every": 2,
        "train.save_every": 0,
        "train.report_to": ["none"],
    }
    run_rm(build_config(RMConfig, overrides=overrides))
    m1, m2 = read_metrics(tmp_path / "one"), read_metrics(tmp_path / "two")
    for a, b in zip(m1, m2):
        assert a["train/pairs"] == b["train/pairs"] == 8
        assert a["train/loss"] == pytest.approx(b["train/loss"], rel=1e-5)
        if "eval/accuracy" in a:
            assert a["eval/accuracy"] == pytest.approx(b["eval/accuracy"])


def test_process_reward_model_two_processes_match_one_process(llama_dir, tmp_path):
    from test_prm import step_rows

    from tether.config import build_config
    from tether.stages.prm import PRMConfig, run_prm

    data = tmp_path / "steps.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in step_rows(40)))
    flags = {"--max-length": "64", "--lr": "3e-3", "--batch-size": "8", "--micro-batch-size": "2"}
    flags.update({"--max-steps": "4", "--eval-every": "2", "--save-every": "0", "--report-to": "none"})
    common = ["--model", str(llama_dir), "--data", str(data), "--eval-data", str(data)]
    common += [x for kv in flags.items() for x in kv]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2"]
    launch += ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    launch += [
        "--main_process_port",
        str(free_port()),
        "-m",
        "tether",
        "prm",
        *common,
        "--output",
        str(tmp_path / "two"),
    ]
    proc = subprocess.run(launch, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    overrides = {"model.path": str(llama_dir), "data.path": str(data), "data.eval_path": str(data)}
    overrides.update({"data.max_length": 64, "optim.lr": 3e-3, "train.output": str(tmp_path / "one")})
    overrides.update({"train.batch_size": 8, "train.micro_batch_size": 2, "train.max_steps": 4})
    overrides.update({"train.eval_every": 2, "train.save_every": 0, "train.report_to": ["none"]})
    run_prm(build_config(PRMConfig, overrides=overrides))
    m1, m2 = read_metrics(tmp_path / "one"), read_metrics(tmp_path / "two")
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

    from test_online_parallel import launch
    from test_vllm import alive, descendants

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
    while any(alive(p) for p in ranks) and time.time() < deadline:
        time.sleep(0.05)
    survivors = [p for p in ranks if alive(p)]
    for p in survivors:
        os.kill(p, signal.SIGKILL)
    assert not survivors, "the launch's processes outlived their launcher"
    # the folder's lock names process 0, dead: the next run takes it over (tests/test_checkpoint_safety.py)
    assert json.loads((out / ".tether.lock").read_text())["pid"] in ranks
