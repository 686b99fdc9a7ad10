"""The online stages on two processes (accelerate, gloo on CPU) against one process.

With a seed per response (--response-seeds) both runs sample the same responses, so every figure that defines
the update must agree: samples, scores, advantages, losses, gradient norms, KL, clip fractions and the trained
weights after several updates (Adam's later steps depend on the gradients' values, not only on their signs).
Also: a 2-process run killed mid-way resumes exactly on 2 processes, refuses to resume on 1, and only process 0
writes the run files.
"""

import json
import os
import signal
import subprocess
import sys
import time
from functools import cached_property
from pathlib import Path

import pytest
import torch
from conftest import FP64, assert_same_adamw_weights, flags, process_tree, rules_and_prompts, running
from safetensors.torch import load_file

from tether.cli import main as tether_main

RULES = """
def count_a(completions):
    return [float(c.count("a")) for c in completions]

def has_a(completions):
    return [1.0 if "a" in c else 0.0 for c in completions]

def a_steps(completions):
    return [[1.0 if "a" in s else 0.0 for s in c.split(" ")[:3]] or [0.0] for c in completions]

def fails_on_rank_1_at_step_2(completions, trainer_state=None):
    import os
    calls = int(os.environ.get("CALLS", "0")) + 1
    os.environ["CALLS"] = str(calls)
    if os.environ.get("RANK") == "1" and calls == 3:  # call 1 is the check before training
        raise RuntimeError("rank 1 broke")
    return [0.0] * len(completions)
"""

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def free_port() -> int:
    """A port nothing listens on now (a fixed one can still be held by the previous test's rendezvous)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def accelerate_command(
    args: list[str], processes: int = 2, config_file: str | None = None, script: str | None = None
) -> list[str]:
    """The ``accelerate launch`` command line of ``tether ARGS`` (or of a Python ``script`` with ARGS) on
    ``processes`` CPU processes, on a free port."""
    how = ["--config_file", config_file] if config_file else ["--multi_gpu", "--num_processes", str(processes)]
    how += [] if config_file else ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    launcher = [sys.executable, "-m", "accelerate.commands.launch", *how, "--main_process_port", str(free_port())]
    return [*launcher, *([script] if script else ["-m", "tether"]), *args]


def launch(
    args: list[str], processes: int = 2, wait: bool = True, config_file: str | None = None, script: str | None = None
):
    """``accelerate launch`` of ``tether ARGS`` (or of a Python ``script`` with ARGS) on ``processes`` CPU processes:
    waited for and checked, or (wait=False) the running Popen."""
    cmd = accelerate_command(args, processes, config_file, script)
    if not wait:
        return subprocess.Popen(
            cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
    proc = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc


SEQUENCE = str(Path(__file__).with_name("tether_in_sequence.py"))


def launch_together(runs: dict[str, list[str]], root: Path) -> dict[str, Path]:
    """Each of ``runs`` ({name: tether's arguments without --output}) on two CPU processes, all in one launch of
    tests/tether_in_sequence.py, so they share one launcher and one start-up (about 10 s of CPU a launch); returns
    {name: its output folder under ``root``}."""
    outs = {name: root / name for name in runs}
    listing = root / "runs.json"
    listing.write_text(json.dumps([args + ["--output", str(outs[name])] for name, args in runs.items()]))
    launch([str(listing)], script=SEQUENCE)
    return outs


class Together:
    """A test file's two-process runs, made in one launch (launch_together) for those of its tests this session runs
    (-k, node ids and --lf select them; --dist loadfile keeps a file's tests on one xdist worker). ``table`` maps a
    test's name (with its parameters) to (the function of ``inputs`` that gives the run's arguments, the flags only
    the two-process run has: --fsdp, --rollout-workers one). Each test then runs its one-process run: ``pair()``."""

    def __init__(self, request, table: dict, inputs, root: Path):
        self.inputs = inputs
        stale = sorted(name for name in table if name.split("[")[0] not in vars(request.module))
        assert not stale, f"runs for tests this file does not have: {stale}"
        chosen = {item.name for item in request.session.items if item.module is request.module}
        self.args = {name: make(inputs) for name, (make, _) in table.items() if name in chosen}
        self.outs = launch_together({name: args + table[name][1] for name, args in self.args.items()}, root)

    def two(self, request) -> Path:
        """The requesting test's two-process run."""
        return self.outs[request.node.name]

    def pair(self, request, tmp_path, *one_only: str) -> tuple[Path, Path]:
        """(the requesting test's one-process run, made now in this process with the run's arguments and
        ``one_only``; its two-process run)."""
        assert tether_main(self.args[request.node.name] + [*one_only, "--output", str(tmp_path / "one")]) == 0
        return tmp_path / "one", self.two(request)


def kill_tree(pid: int) -> None:
    """SIGKILL a process and all its descendants at once (the launcher and the workers), as a power cut would."""
    # freeze all first, so none writes on while the others die; a process started between listing the tree and
    # freezing it would be missed (and hold what it inherited, the run folder's lock among them), so the tree is
    # listed again until freezing finds no process it has not frozen
    tree: list[int] = []
    while fresh := [p for p in process_tree(pid) if p not in tree]:
        for p in fresh:
            try:
                os.kill(p, signal.SIGSTOP)
            except ProcessLookupError:
                pass
        tree += fresh
    for p in tree:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    # a SIGKILL is delivered, not finished: a process holds its files (the run folder's lock among them) until the
    # kernel has torn it down, which takes longer on a loaded machine. Return once each is gone or a zombie.
    deadline = time.time() + 60
    while time.time() < deadline and any(running(p) for p in tree):
        time.sleep(0.02)


@pytest.fixture
def files(tmp_path):
    words = ("hi", "cats", "dogs", "rain", "a cat", "banana", "sea", "map")
    return rules_and_prompts(tmp_path, RULES, [{"prompt": f"Say {w}."} for w in words])


class Inputs:
    """What the runs made together read, made once for the file under ``root``: the rules and prompts the ``files``
    fixture writes, the tiny llama and (when first asked for) its short-turn copy, a judge and a process reward
    model."""

    def __init__(self, root: Path, llama_dir: Path, tokenizer):
        self.root, self.llama_dir, self.tokenizer = root, llama_dir, tokenizer
        words = ("hi", "cats", "dogs", "rain", "a cat", "banana", "sea", "map")
        self.rules, self.prompts = rules_and_prompts(root, RULES, [{"prompt": f"Say {w}."} for w in words])

    @cached_property
    def short_turn_model(self) -> Path:
        return short_turns(self.llama_dir, self.root / "short-turns")

    @cached_property
    def judge(self) -> Path:
        from tether.models.lm import build_tiny_model

        return build_tiny_model(
            "llama", self.tokenizer, self.root / "judge", seed=2, hidden=32, layers=2, heads=2, max_positions=512
        )

    @cached_property
    def prm(self) -> str:
        from test_prm import tiny_prm

        return tiny_prm(self.llama_dir, self.root)


def lines(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def weights(folder):
    return load_file(str(folder / "model.safetensors"))


UPDATE_FIGURES = (
    "score/mean",
    "advantage/mean",
    "advantage/std",
    "policy/loss",
    "policy/grad_norm",
    "policy/entropy",
    "policy/clip_frac",
    "kl/ref_mean",
    "rollout/length_mean",
    "eval/score_mean",
    "value/loss",
    "value/grad_norm",
    "value/explained_variance",
    "kl/coef",
    "train/loss",
    "train/grad_norm",
    "train/accuracy",
    "eval/loss",
)


# Final weights after at most 12 Adam updates at lr 3e-3 (every run here uses --lr 3e-3): one process and two sum
# the same gradients in another order (and the packed forward reads its rows from one long sequence), so gradients
# differ by rounding, which AdamW can amplify in weights whose gradient is near zero: every run compared here trains
# in float64 (conftest's FP64), and assert_same_adamw_weights says how far they may differ, from the arithmetic.
# Every logged figure agrees to 1e-4 (scores and advantages are float32).
LR, MAX_UPDATES = 3e-3, 12
# What every compared run here has: that learning rate, no checkpoints nor reporting, the samples of every step, and
# a seed per response, so that one process and two draw the same responses.
SEEDED = dict(lr="3e-3", save_every=0, report_to="none", sample_every=1, response_seeds=True)


def assert_same_run(one, two):
    s1, s2 = lines(one / "samples.jsonl"), lines(two / "samples.jsonl")
    assert [(s["prompt"], s["response"]) for s in s1] == [(s["prompt"], s["response"]) for s in s2]
    for a, b in zip(s1, s2):
        assert a["score"] == pytest.approx(b["score"], abs=1e-6)
        if "advantage" in a:
            assert a["advantage"] == pytest.approx(b["advantage"], abs=1e-5)
    m1, m2 = lines(one / "metrics.jsonl"), lines(two / "metrics.jsonl")
    assert [m["step"] for m in m1] == [m["step"] for m in m2]
    compared = 0
    for a, b in zip(m1, m2):
        for key in UPDATE_FIGURES:
            if key in a:
                assert key in b, key
                assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), (a["step"], key)
                compared += 1
    assert compared >= 2 * len(m1)
    assert_same_adamw_weights(weights(one / "final"), weights(two / "final"), LR, MAX_UPDATES, str(two))


def assert_written_once(out, rows_per_step: int, steps: int):
    """Process 0 alone writes the run files: one metrics row per step, each step's samples once."""
    metrics = lines(out / "metrics.jsonl")
    assert [m["step"] for m in metrics] == list(range(1, steps + 1))
    samples = lines(out / "samples.jsonl")
    assert len(samples) == rows_per_step * steps
    assert "processes: 2" in (out / "config.yaml").read_text()


def group_recipe_args(model, rules, prompts, recipe: str) -> list[str]:
    """A group-recipe run of 3 steps, 2 passes of minibatches of 8 in micro-batches of 3 (also the sharded tests')."""
    args = flags("grpo", model=model, prompts=prompts, eval_prompts=prompts, reward=f"{rules}:count_a", recipe=recipe)
    args += flags(prompts_per_step=4, group_size=4, max_new_tokens=8, max_steps=3, eval_every=3, **SEEDED)
    args += flags(minibatch=8, update_epochs=2, micro_batch_size=3)
    if recipe == "dapo":  # dynamic sampling: the kept-group count is global, later rounds split unevenly
        args[args.index(f"{rules}:count_a")] = f"{rules}:has_a"
    return args + FP64


@pytest.mark.slow
# The recipes whose pieces meet the data-parallel contract differently: grpo (token ratio, per-sequence token mean,
# KL in the loss), dr_grpo (token sums over a constant length), dapo (dynamic sampling: uneven later rounds; the
# token mean over the whole minibatch), reinforce_pp (KL in the reward, advantages normalised over the whole batch).
# gspo's sequence ratio and rloo's leave-one-out baseline are computed within a response or on the gathered batch,
# with grpo's aggregation: their pieces have hand tests (test_group_algorithms.py, test_policy_algorithms.py, test_objectives.py), and their runs here were grpo's
# path again at 18-19 s each.
@pytest.mark.parametrize("recipe", ["grpo", "dr_grpo", "dapo", "reinforce_pp"])
def test_group_recipes_on_two_processes_equal_one(together, request, tmp_path, recipe):
    one, two = together.pair(request, tmp_path)
    assert_same_run(one, two)
    assert_written_once(two, 16, 3) if recipe != "dapo" else None


@pytest.mark.slow
def test_one_rollout_process_beside_two_trainer_processes_equals_one(together, request, tmp_path):
    """--max-staleness 1 --rollout-workers one on two processes: process 0 asks the one worker for both processes'
    shares and hands each its rows, so the two processes train what one process with one worker trains (the
    responses drawn by their seeds, one update behind from the second step on). A worker for each process
    (per_process, the default) is tested on two sharded processes (tests/test_sharding_online.py)."""
    one, two = together.pair(request, tmp_path)
    assert_same_run(one, two)
    assert_written_once(two, 16, 3)
    metrics = lines(two / "metrics.jsonl")
    assert [m["async/staleness_max"] for m in metrics] == [0.0, 1.0, 1.0]
    # process 0's worker drew every process's responses: the 16 of each step (and the 8 held-out ones of the
    # evaluation before the first step), not its half
    assert [m["async/worker_rows"] for m in metrics[:2]] == [24.0, 16.0]


@pytest.mark.slow
def test_the_one_rollout_worker_killed_stops_both_training_processes(llama_dir, files, tmp_path):
    """--rollout-workers one: the two training processes have one worker between them; killed mid-run, process 0
    stops naming it and process 1 at the same hand-out, saying why, and no process is left."""
    from pathlib import Path

    rules, prompts = files
    args = group_recipe_args(llama_dir, rules, prompts, "grpo") + ["--max-staleness", "1", "--async-threads", "1"]
    args[args.index("--max-steps") + 1], args[args.index("--eval-every") + 1] = "100000", "0"
    out = tmp_path / "run"
    proc = launch(args + ["--rollout-workers", "one", "--output", str(out)], wait=False)
    deadline = time.time() + 180
    while not ((out / "metrics.jsonl").is_file() and lines(out / "metrics.jsonl")) and time.time() < deadline:
        time.sleep(0.2)
    name = lambda p: Path(f"/proc/{p}/comm").read_text().strip() if Path(f"/proc/{p}/comm").exists() else ""
    tree = process_tree(proc.pid)
    workers = [p for p in tree if name(p) == "tether-rollout"]
    assert len(workers) == 1, [(p, name(p)) for p in tree]
    os.kill(workers[0], signal.SIGKILL)
    said, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert f"the rollout worker (pid {workers[0]}) died with exit code -9" in said, said[-3000:]
    assert "the rollout worker beside process 0 stopped" in said, said[-3000:]
    deadline = time.time() + 30
    while any(running(p) for p in tree) and time.time() < deadline:
        time.sleep(0.1)
    assert not any(running(p) for p in tree)


def test_one_rollout_worker_for_more_processes_than_prompts_a_step_is_refused_at_the_start(llama_dir, files, tmp_path):
    """--rollout-workers one: every process asks the one worker in step, so each must have rows in every step; one
    prompt a step on two processes is a configuration error naming both counts, before any sampling."""
    rules, prompts = files
    args = group_recipe_args(llama_dir, rules, prompts, "grpo") + ["--max-staleness", "1", "--async-threads", "1"]
    args[args.index("--prompts-per-step") + 1] = "1"
    args += ["--rollout-workers", "one"]
    proc = launch(args + ["--output", str(tmp_path / "run")], wait=False)
    said, _ = proc.communicate(timeout=300)
    assert proc.returncode != 0
    said = " ".join(said.split())
    assert "--rollout-workers one on 2 processes: every process must sample in every step and evaluation" in said
    assert "prompts_per_step (1) and the held-out prompts (8) must be at least 2" in said, said[-3000:]
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


@pytest.mark.slow
def test_a_process_reward_on_two_processes_equals_one(together, request, tmp_path):
    """Step scores travel with their responses; token advantages are computed from the gathered groups."""
    one, two = together.pair(request, tmp_path)
    assert_same_run(one, two)
    assert all(s["step_scores"] for s in lines(two / "samples.jsonl"))


@pytest.mark.slow
def test_a_reward_function_failing_on_one_process_stops_both_at_the_same_step(llama_dir, files, tmp_path):
    rules, prompts = files
    out = tmp_path / "run"
    args = flags("grpo", model=llama_dir, prompts=prompts, reward=f"{rules}:fails_on_rank_1_at_step_2")
    args += flags(prompts_per_step=4, group_size=2, max_new_tokens=6, max_steps=4, save_every=0, report_to="none")
    proc = subprocess.run(
        accelerate_command(args + ["--output", str(out)]), env=ENV, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode != 0  # both processes stopped: no hang, no half-finished run
    assert "step 2:" in proc.stderr and "checkpoint-1" in proc.stderr
    assert (out / "checkpoint-1" / "rng-0.json").is_file() and (out / "checkpoint-1" / "rng-1.json").is_file()
    assert [m["step"] for m in lines(out / "metrics.jsonl")] == [1]


def ppo_args(model, rules, prompts, layout: str) -> list[str]:
    """A PPO run of 3 steps of 6 responses, 2 passes of minibatches of 3, with the adaptive KL and whitening."""
    args = flags("ppo", model=model, prompts=prompts, eval_prompts=prompts, reward=f"{rules}:count_a")
    args += flags(prompts_per_step=6, group_size=1, max_new_tokens=8, max_steps=3, critic_layout=layout, minibatch=3)
    args += flags(update_epochs=2, adaptive_kl=True, whiten_advantages=True, eval_every=3, **SEEDED)
    return args + FP64


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["separate", "shared"])
def test_ppo_on_two_processes_equals_one(together, request, tmp_path, layout):
    """Both critic layouts (PPO beside a rollout worker per process: tests/test_sharding_online.py, sharded)."""
    one, two = together.pair(request, tmp_path)
    assert_same_run(one, two)
    assert_written_once(two, 6, 3)


def online_dpo_args(model, rules, prompts) -> list[str]:
    """An online DPO run of 2 rounds of 8 prompts, 2 steps each."""
    args = flags("dpo", online=True, model=model, prompts=prompts, reward=f"{rules}:count_a", prompts_per_step=8)
    args += flags(max_new_tokens=8, rounds=2, steps_per_round=2, batch_size=4, micro_batch_size=1, lr="3e-3")
    args += flags(save_every=0, report_to="none", response_seeds=True, keep_truncated=True, temperature="1.3")
    return args + FP64


@pytest.mark.slow
def test_online_dpo_on_two_processes_equals_one(together, request, tmp_path):
    one, two = together.pair(request, tmp_path)
    assert_same_run(one, two)
    r1, r2 = (lines(d / "rounds" / "round-0.jsonl") for d in (one, two))
    assert r1 == r2 and len(r1) > 0


def short_turns(llama_dir: Path, folder: Path) -> Path:
    """The tiny llama with a wide stop set (EOS and 48 frequent token ids in its generation config): a random model
    then ends its turns within a few tokens, so episodes really go several turns."""
    import shutil

    shutil.copytree(llama_dir, folder)
    config = json.loads((folder / "generation_config.json").read_text())
    eos = config.get("eos_token_id")
    config["eos_token_id"] = ([eos] if isinstance(eos, int) else list(eos or [])) + list(range(60, 108))
    (folder / "generation_config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["grpo", "ppo"])
def test_multi_turn_episodes_on_two_processes_equal_one(together, request, tmp_path, stage):
    """Episodes are sharded like prompts: each process runs its share turn by turn, the transcripts (with their
    environment tokens and action masks) are gathered, and the update is the one-process update."""
    one, two = together.pair(request, tmp_path)
    assert_same_run(one, two)
    samples = lines(two / "samples.jsonl")
    assert max(s["agent"]["turns"] for s in samples) >= 2 and any("tool: obs 1" in s["response"] for s in samples)


@pytest.mark.slow
def test_episodes_from_one_rollout_worker_beside_two_processes_equal_one(together, request, tmp_path):
    """--env --max-staleness 1 --rollout-workers one on two processes: process 0's worker runs both processes'
    episodes whole, with environments of its own, and hands each process its share as JSON values; the two train
    what one process beside its own worker trains (transcripts, environment tokens, outcomes, weights)."""
    one, two = together.pair(request, tmp_path)
    assert_same_run(one, two)
    samples = lines(two / "samples.jsonl")
    assert max(s["agent"]["turns"] for s in samples) >= 2 and any("tool: obs 1" in s["response"] for s in samples)
    metrics = lines(two / "metrics.jsonl")
    assert [m["async/staleness_max"] for m in metrics] == [0.0, 1.0]
    # process 0's worker drew every process's episodes, as the one process's worker did (per process: half)
    assert [m["async/worker_rows"] for m in metrics] == [
        row["async/worker_rows"] for row in lines(one / "metrics.jsonl")
    ]


@pytest.mark.slow
def test_a_killed_two_process_run_resumes_exactly_and_only_on_two(llama_dir, files, tmp_path, capsys):
    """Sampling from each process's own RNG (no --response-seeds): the checkpoint's rng-0 and rng-1 carry it."""
    rules, prompts = files
    args = flags("grpo", model=llama_dir, prompts=prompts, reward=f"{rules}:count_a", prompts_per_step=4, group_size=2)
    args += flags(max_new_tokens=8, max_steps=6, lr="3e-3", report_to="none", sample_every=1)
    w1, w2 = killed_and_resumed_on_two(args, tmp_path, capsys)
    for name in w1:
        torch.testing.assert_close(w2[name], w1[name], rtol=1e-5, atol=1e-6, msg=name)


def killed_and_resumed_on_two(args: list[str], tmp_path, capsys, refused=lambda killed: None) -> tuple[dict, dict]:
    """``args`` run whole on two processes, and again killed after checkpoint-2; one process refuses the checkpoint
    (two processes' RNG states and shares of the prompts are in it), as ``refused(killed)`` checks any other
    refusal; resumed on two, the samples after step 2 are the whole run's. Returns (whole, resumed) final weights."""
    launch(args + ["--output", str(tmp_path / "whole")])
    killed = kill_after_checkpoint(args, tmp_path / "killed", 2)
    assert (killed / "checkpoint-2" / "rng-0.json").is_file() and (killed / "checkpoint-2" / "rng-1.json").is_file()
    assert not (killed / "final").exists()
    assert tether_main(args + ["--output", str(killed), "--save-every", "2", "--resume"]) == 2
    assert "written by 2 process(es); resume it on 2" in capsys.readouterr().err
    refused(killed)
    launch(args + ["--output", str(killed), "--save-every", "2", "--resume"])
    whole, resumed = lines(tmp_path / "whole" / "samples.jsonl"), lines(killed / "samples.jsonl")
    assert [s["response"] for s in resumed if s["step"] > 2] == [s["response"] for s in whole if s["step"] > 2]
    return weights(tmp_path / "whole" / "final"), weights(killed / "final")


def kill_after_checkpoint(args: list[str], out, step: int):
    """Launch ``args`` on 2 processes saving every ``step`` steps into ``out``, SIGKILL them all once
    checkpoint-<step> exists; returns ``out``."""
    proc = launch(args + ["--output", str(out), "--save-every", str(step)], wait=False)
    deadline = time.time() + 300
    while not (out / f"checkpoint-{step}").is_dir() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    kill_tree(proc.pid)
    proc.wait()
    return out


def test_shares_are_contiguous_and_cover_every_item_once():
    from tether.train.parallel import shard_bounds

    assert [shard_bounds(10, 3, r) for r in range(3)] == [(0, 4), (4, 7), (7, 10)]
    assert [shard_bounds(2, 4, r) for r in range(4)] == [(0, 1), (1, 2), (2, 2), (2, 2)]  # more processes than items
    for count in range(0, 13):
        for world in range(1, 5):
            covered = [i for r in range(world) for i in range(*shard_bounds(count, world, r))]
            assert covered == list(range(count))


@pytest.mark.slow
def test_a_process_reward_model_on_two_processes_equals_one(together, request, tmp_path):
    """The PRM's step probabilities travel with their responses, as a reward function's step scores do."""
    one, two = together.pair(request, tmp_path)
    assert_same_run(one, two)
    assert any(s["step_scores"] for s in lines(two / "samples.jsonl"))


@pytest.mark.slow
def test_a_judge_on_two_processes_equals_one(together, request, tmp_path):
    """GRPO rewarded by a judge's round robin (every ordered pair of each group, both orders): each process judges
    its own groups, the judge's figures are summed over processes, and everything equals one process."""
    one, two = together.pair(request, tmp_path)
    assert_same_run(one, two)
    for a, b in zip(lines(one / "metrics.jsonl"), lines(two / "metrics.jsonl")):
        assert a["judge/prompts"] == b["judge/prompts"] == 4 * 4 * 3  # 4 groups × 12 ordered pairs
        for key in ("judge/order_inconsistency", "judge/first_slot_bias", "reward/judge/mean"):
            assert b[key] == pytest.approx(a[key], rel=1e-6, abs=1e-9), key


# The runs this file's tests compare on one process and two, made on two processes in one launch (Together), by the
# test that compares them: (their arguments from the file's Inputs, the flags only the two-process run has).
ASYNC = ["--max-staleness", "1", "--async-threads", "1"]
COUNTING = f"{os.path.dirname(os.path.abspath(__file__))}/agent_helpers.py:Counting(turns=3)"


def process_reward_args(i: Inputs) -> list[str]:
    args = flags("grpo", model=i.llama_dir, prompts=i.prompts, reward=[f"{i.rules}:a_steps", f"{i.rules}:count_a=0.5"])
    return (
        args + flags(step_pattern=" ", prompts_per_step=4, group_size=3, max_new_tokens=8, max_steps=2, **SEEDED) + FP64
    )


def episodes_args(i: Inputs, stage: str) -> list[str]:
    args = flags(stage, model=i.short_turn_model, prompts=i.prompts, eval_prompts=i.prompts, env=COUNTING)
    args += flags(max_total_tokens=48, prompts_per_step=4, group_size=2, max_new_tokens=8, max_steps=2, eval_every=2)
    return args + flags(**SEEDED) + (["--minibatch", "4"] if stage == "ppo" else []) + FP64


def process_reward_model_args(i: Inputs) -> list[str]:
    args = ["grpo", "--model", str(i.llama_dir), "--prompts", str(i.prompts), "--process-reward-model", i.prm]
    return (
        args + flags(step_pattern=" ", prompts_per_step=4, group_size=3, max_new_tokens=8, max_steps=2, **SEEDED) + FP64
    )


def judge_args(i: Inputs) -> list[str]:
    args = group_recipe_args(i.llama_dir, i.rules, i.prompts, "grpo")
    at = args.index("--reward")
    return args[:at] + args[at + 2 :] + flags(judge_model=i.judge, judge_template="pairwise", judge_baseline="group")


TOGETHER = {
    **{
        f"test_group_recipes_on_two_processes_equal_one[{recipe}]": (
            lambda i, recipe=recipe: group_recipe_args(i.llama_dir, i.rules, i.prompts, recipe),
            [],
        )
        for recipe in ("grpo", "dr_grpo", "dapo", "reinforce_pp")
    },
    "test_one_rollout_process_beside_two_trainer_processes_equals_one": (
        lambda i: group_recipe_args(i.llama_dir, i.rules, i.prompts, "grpo") + ASYNC,
        ["--rollout-workers", "one"],
    ),
    "test_a_process_reward_on_two_processes_equals_one": (process_reward_args, []),
    **{
        f"test_ppo_on_two_processes_equals_one[{layout}]": (
            lambda i, layout=layout: ppo_args(i.llama_dir, i.rules, i.prompts, layout),
            [],
        )
        for layout in ("separate", "shared")
    },
    "test_online_dpo_on_two_processes_equals_one": (lambda i: online_dpo_args(i.llama_dir, i.rules, i.prompts), []),
    **{
        f"test_multi_turn_episodes_on_two_processes_equal_one[{stage}]": (
            lambda i, stage=stage: episodes_args(i, stage),
            [],
        )
        for stage in ("grpo", "ppo")
    },
    "test_episodes_from_one_rollout_worker_beside_two_processes_equal_one": (
        lambda i: episodes_args(i, "grpo") + ASYNC,
        ["--rollout-workers", "one"],
    ),
    "test_a_process_reward_model_on_two_processes_equals_one": (process_reward_model_args, []),
    "test_a_judge_on_two_processes_equals_one": (judge_args, []),
}


@pytest.fixture(scope="module")
def inputs(llama_dir, tokenizer, tmp_path_factory) -> Inputs:
    return Inputs(tmp_path_factory.mktemp("inputs"), llama_dir, tokenizer)


@pytest.fixture(scope="module")
def together(request, inputs, tmp_path_factory) -> Together:
    return Together(request, TOGETHER, inputs, tmp_path_factory.mktemp("two-processes"))
