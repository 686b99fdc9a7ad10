"""kill -9 at random moments: every stage, run as a process and killed (SIGKILL) at random times — while starting,
training, or writing a checkpoint — then restarted the way tether's messages say (--resume when a checkpoint
exists, else --overwrite), ends with final weights identical to an uninterrupted run's."""

import json
import random
import subprocess
import sys
import time

import pytest
import torch
from conftest import write_jsonl
from safetensors.torch import load_file

from tether.cli import main as tether_main

RULES = "def count_a(completions):\n    return [float(c.count('a')) for c in completions]\n"
JUDGE = (
    "def more_a(prompts, first, second, **_):\n    return [1.0 if a.count('a') > b.count('a') else 0.0 if "
    "a.count('a') < b.count('a') else 0.5 for a, b in zip(first, second)]\n"
)


@pytest.fixture
def inputs(tmp_path, addition_files):
    words = ["cats", "dogs", "rain", "sun", "tea", "maps", "bats", "hats"]
    prefs = write_jsonl(
        tmp_path / "prefs.jsonl",
        [{"prompt": f"Tell me about {w}.", "chosen": f"{w} are a fine topic.", "rejected": "no"} for w in words * 4],
    )
    prompts = write_jsonl(
        tmp_path / "prompts.jsonl", [{"prompt": [{"role": "user", "content": f"Say {w}."}]} for w in words * 2]
    )
    (tmp_path / "rules.py").write_text(RULES)
    (tmp_path / "judge.py").write_text(JUDGE)
    return {
        "sft": addition_files[0],
        "prefs": prefs,
        "prompts": prompts,
        "rules": tmp_path / "rules.py",
        "judge": tmp_path / "judge.py",
    }


def stage_command(stage: str, model, inputs: dict, out) -> list[str]:
    common = ["--model", str(model), "--output", str(out), "--report-to", "none", "--seed", "0"]
    offline = [
        "--max-steps",
        "12",
        "--save-every",
        "2",
        "--batch-size",
        "8",
        "--micro-batch-size",
        "4",
        "--eval-every",
        "0",
        "--lr",
        "1e-3",
    ]
    online = [
        "--max-steps",
        "10",
        "--save-every",
        "2",
        "--eval-every",
        "0",
        "--max-new-tokens",
        "8",
        "--prompts",
        str(inputs["prompts"]),
        "--lr",
        "1e-3",
    ]
    return [
        sys.executable,
        "-m",
        "tether",
        *{
            "sft": ["sft", "--data", str(inputs["sft"]), "--eval-fraction", "0", *offline],
            "rm": ["rm", "--data", str(inputs["prefs"]), "--eval-fraction", "0", *offline],
            "dpo": ["dpo", "--data", str(inputs["prefs"]), "--eval-fraction", "0", *offline],
            "ppo": [
                "ppo",
                "--reward",
                f"{inputs['rules']}:count_a",
                "--prompts-per-step",
                "8",
                "--minibatch",
                "4",
                *online,
            ],
            "grpo": [
                "grpo",
                "--reward",
                f"{inputs['rules']}:count_a",
                "--prompts-per-step",
                "2",
                "--group-size",
                "4",
                *online,
            ],
            "dpo-online": [
                "dpo",
                "--online",
                "--judge",
                f"{inputs['judge']}:more_a",
                "--rounds",
                "5",
                "--steps-per-round",
                "2",
                "--prompts-per-step",
                "8",
                "--keep-truncated",
                "--batch-size",
                "4",
                "--micro-batch-size",
                "4",
                "--prompts",
                str(inputs["prompts"]),
                "--max-new-tokens",
                "8",
                "--save-every",
                "2",
                "--lr",
                "1e-3",
            ],
        }[stage],
        *common,
    ]


def weights(folder) -> dict:
    return load_file(str(folder / "model.safetensors"))


def logged_steps(out) -> int:
    path = out / "metrics.jsonl"
    return path.read_text().count("\n") if path.is_file() else 0


def run_with_kills(command: list[str], out, rng: random.Random, kills: int, total_steps: int) -> list[str]:
    """Run ``command`` to the end, SIGKILLing it ``kills`` times: the first while it starts up, the others a random
    0–80 ms after a random step is logged (between steps, or inside the checkpoint written after it); returns what
    each try did."""
    log = []
    while True:
        has_checkpoint = out.is_dir() and any(out.glob("checkpoint-*/trainer_state.json"))
        flag = ["--resume"] if has_checkpoint else (["--overwrite"] if out.is_dir() and any(out.iterdir()) else [])
        proc = subprocess.Popen(command + flag, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if len(log) < kills:
            if log:
                target = rng.randint(1, total_steps - 1)
                while proc.poll() is None and logged_steps(out) < target:
                    time.sleep(0.005)
                time.sleep(rng.uniform(0.0, 0.08))
            else:
                time.sleep(rng.uniform(0.5, 2.0))
            proc.kill()
        _, err = proc.communicate()
        log.append(
            f"{' '.join(flag) or 'fresh'}: {proc.returncode}"
            + (f" {err.strip()[-300:]}" if proc.returncode not in (0, -9) else "")
        )
        if proc.returncode == 0 or "nothing left to train" in err:
            return log
        assert proc.returncode == -9, f"{log}: {err[-2000:]}"  # only our kills may end a try
        assert len(log) < kills + 3, log


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["sft", "rm", "dpo", "ppo", "grpo", "dpo-online"])
def test_kill_9_at_random_moments_then_resume_gives_the_uninterrupted_weights(stage, llama_dir, inputs, tmp_path):
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    # the uninterrupted run in this process (its imports already paid); the killed ones as processes of their own
    assert tether_main(stage_command(stage, llama_dir, inputs, whole)[3:]) == 0
    total = logged_steps(whole)
    log = run_with_kills(stage_command(stage, llama_dir, inputs, killed), killed, random.Random(stage), 4, total)
    assert any(entry.startswith("--resume") for entry in log), log  # at least one kill came after a checkpoint
    a, b = weights(whole / "final"), weights(killed / "final")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), log
    rows = [json.loads(line)["step"] for line in (killed / "metrics.jsonl").read_text().splitlines()]
    assert rows == sorted(set(rows)), (log, rows)  # every step logged once
