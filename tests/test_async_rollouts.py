"""Rollouts beside the trainer (rollout.max_staleness; tether/rollout/async_worker.py): a rollout worker process
samples the next steps while the trainer updates, each response from weights at most K updates old."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import rules_and_prompts, running, write_jsonl
from safetensors.torch import load_file

from tether.cli import main

RULES = (
    "def count_a(completions):\n    return [float(c.count('a')) for c in completions]\n"
    "def has_a(completions):\n    return [float('a' in c) for c in completions]\n"
)


@pytest.fixture
def files(tmp_path):
    words = ("hi", "cats", "dogs", "rain")
    return rules_and_prompts(
        tmp_path, RULES, [{"prompt": [{"role": "user", "content": f"Say {w}."}]} for w in words] * 4
    )


@pytest.fixture(autouse=True)
def one_thread():
    """Every side on one thread: the trainer gives the worker its share of the cores (async_worker.py), so a
    synchronous run compared with an asynchronous one must reduce on as many threads as each side does there."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    assert torch.get_num_threads() == 1, "the run did not give the trainer its threads back"
    torch.set_num_threads(before)


def grpo_args(model, files, out, *more) -> list[str]:
    rules, prompts = files
    args = ["grpo", "--model", str(model), "--prompts", str(prompts), "--reward", f"{rules}:count_a"]
    args += ["--prompts-per-step", "2", "--group-size", "4", "--max-new-tokens", "8", "--response-seeds"]
    args += ["--lr", "3e-3", "--eval-every", "0", "--report-to", "none", "--sample-every", "1"]
    # the worker on one thread as the trainer (the fixture): the same reductions, so the same weights draw the same
    # tokens
    args += ["--async-threads", "1", "--output", str(out)]
    return args + list(more)


def rows(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_one_step_off_draws_what_the_trainer_would_and_then_trains_one_update_behind(llama_dir, files, tmp_path):
    """K = 1: the first rollout comes from the starting weights either way, so the worker's samples and the first
    update equal the synchronous run's exactly (the worker reproduces the trainer's own sampling); from the second
    step each rollout was drawn one update back, and the step says so (async/staleness_*)."""
    sync, ahead = tmp_path / "sync", tmp_path / "ahead"
    assert (
        main(grpo_args(llama_dir, files, sync, "--max-steps", "3", "--save-every", "1", "--keep-checkpoints", "5")) == 0
    )
    assert (
        main(
            grpo_args(
                llama_dir,
                files,
                ahead,
                "--max-steps",
                "3",
                "--save-every",
                "1",
                "--keep-checkpoints",
                "5",
                "--max-staleness",
                "1",
            )
        )
        == 0
    )
    first = [s for s in rows(sync / "samples.jsonl") if s["step"] == 1]
    assert [s["response"] for s in first] == [s["response"] for s in rows(ahead / "samples.jsonl") if s["step"] == 1]
    one, other = (
        load_file(sync / "checkpoint-1" / "model.safetensors"),
        load_file(ahead / "checkpoint-1" / "model.safetensors"),
    )
    assert all(torch.equal(one[k], other[k]) for k in one)
    metrics = rows(ahead / "metrics.jsonl")
    assert [m["async/staleness_max"] for m in metrics] == [0.0, 1.0, 1.0]
    # the parity probe after each push: the same weights on the same threads give the same log-probs
    assert all(m["async/parity_max_diff"] <= 1e-6 for m in metrics)
    assert all(m["async/dropped"] == 0 and m["async/rollout_busy_s"] > 0 for m in metrics)
    # the worker's log-probs came back: on the first step the same weights, so the gap is float32 rounding of two
    # orders of one forward (the worker's KV-cached decode against the trainer's full pass: a few ulps of logits
    # below 16 in size, far under 1e-4); measured after; the synchronous run samples with the trainer and logs none
    assert metrics[0]["rollout/sampler_logprob_diff_max"] < 1e-4 and metrics[1]["rollout/sampler_kl"] >= 0
    assert "async/staleness_max" not in rows(sync / "metrics.jsonl")[0]


def test_a_run_without_response_seeds_draws_the_same_responses_each_time(llama_dir, files, tmp_path):
    """The worker's RNG is seeded from the run's seed, and the pipe's order fixes which weights draw which request:
    an asynchronous run sampled from the worker's own RNG is reproducible."""
    runs = []
    for name in ("a", "b"):
        args = grpo_args(llama_dir, files, tmp_path / name, "--max-steps", "1", "--save-every", "0")
        args.remove("--response-seeds")
        assert main(args + ["--max-staleness", "1"]) == 0
        runs.append([s["response"] for s in rows(tmp_path / name / "samples.jsonl")])
    assert runs[0] == runs[1] and len(set(runs[0])) > 1


def test_evaluations_through_the_worker_are_drawn_alike_without_response_seeds(llama_dir, files, tmp_path):
    """Held-out prompts are sampled with a fixed seed (docs/metrics.md). The worker's own RNG is out of the trainer's
    reseed's reach, so its evaluations are seeded per response: with the weights unmoved (lr 1e-30: every update is
    below half an ulp of its weight) three evaluations give the same figures."""
    args = grpo_args(llama_dir, files, tmp_path / "run", "--max-steps", "3", "--save-every", "0", "--lr", "1e-30")
    args.remove("--response-seeds")
    assert main(args + ["--max-staleness", "1", "--eval-every", "1", "--eval-prompts", str(files[1])]) == 0
    evaluations = [
        {k: v for k, v in m.items() if k.startswith("eval/") and not k.endswith("_s")}
        for m in rows(tmp_path / "run" / "metrics.jsonl")
    ]
    assert len(evaluations) == 3 and evaluations[0] and evaluations[0] == evaluations[1] == evaluations[2]


def test_updates_counted_before_the_worker_starts_are_not_waited_for(llama_dir):
    """A resumed online DPO run counts its updates before its next round's first request starts the worker: the
    first push goes to a fresh slot at once (it waited for an answer about a version never sent, until the
    timeout), and a slot is reused only once the worker has loaded the version that last used it."""
    from tether.models.lm import load_model, load_tokenizer
    from tether.online_sections import SamplingSection
    from tether.rollout.async_worker import AsyncRolloutBackend

    tokenizer = load_tokenizer(llama_dir)
    policy = load_model(llama_dir, tokenizer, "float32")
    settings = SamplingSection(max_new_tokens=4, max_staleness=1, async_threads=1, worker_timeout_s=60)
    worker = AsyncRolloutBackend(policy, tokenizer, settings)
    try:
        worker.weights_updated(policy)
        worker.weights_updated(policy)  # versions 1 and 2, no worker yet
        began = time.perf_counter()
        rollout = worker.generate(["Say hi.", "Say rain."], settings, [tokenizer.eos_token_id], [1, 2])
        assert len(rollout.responses) == 2 and time.perf_counter() - began < 60
        assert worker.slot_versions == [2, -1] and worker.acked == 2
        worker.weights_updated(policy)  # version 3: slot 1, never used
        worker.weights_updated(policy)  # version 4: slot 0, once version 2 is loaded
        assert worker.slot_versions == [4, 3] and worker.acked >= 2
    finally:
        worker.close()


def test_the_parity_probe_reads_a_policy_in_train_mode_without_its_dropout(model_dirs):
    """--keep-dropout trains online DPO's policy in train mode; the worker's copy samples in eval mode. The probe
    compares weights, so it runs without dropout (twice alike, equal to eval mode) and leaves the mode as it was."""
    from transformers import AutoModelForCausalLM

    from tether.rollout.worker_wire import probe_logprobs

    model = AutoModelForCausalLM.from_pretrained(model_dirs["gpt2"], resid_pdrop=0.5, embd_pdrop=0.5, attn_pdrop=0.5)
    ids = list(range(3, 20))
    model.eval()
    plain = probe_logprobs(model, ids)
    model.train()
    assert torch.equal(probe_logprobs(model, ids), plain) and model.training


def ppo_args(model, files, out, *more) -> list[str]:
    """PPO on the group tests' prompts and reward: 4 prompts a step, 2 epochs of 2 minibatches."""
    args = grpo_args(model, files, out, "--prompts-per-step", "4", "--group-size", "1", "--minibatch", "2", *more)
    return ["ppo", *args[1:]]


@pytest.mark.parametrize("critic", ["shared", "separate"])
def test_ppo_one_step_off_draws_what_the_trainer_would_and_then_trains_one_update_behind(
    llama_dir, files, tmp_path, critic
):
    """PPO beside a rollout worker at K = 1: the first step's responses and update equal the synchronous run's (the
    worker draws what the trainer would, the update computes its old log-probs, values and reference itself), the
    next steps train on responses one update old, and the step says so; either critic."""
    sync, ahead = tmp_path / "sync", tmp_path / "ahead"
    more = ["--max-steps", "3", "--save-every", "1", "--keep-checkpoints", "5", "--critic-layout", critic]
    assert main(ppo_args(llama_dir, files, sync, *more)) == 0
    assert main(ppo_args(llama_dir, files, ahead, *more, "--max-staleness", "1")) == 0
    first = [s["response"] for s in rows(sync / "samples.jsonl") if s["step"] == 1]
    assert first == [s["response"] for s in rows(ahead / "samples.jsonl") if s["step"] == 1]
    one, other = (load_file(run / "checkpoint-1" / "model.safetensors") for run in (sync, ahead))
    assert all(torch.equal(one[k], other[k]) for k in one)
    metrics = rows(ahead / "metrics.jsonl")
    assert [m["async/staleness_max"] for m in metrics] == [0.0, 1.0, 1.0]
    assert all(m["async/parity_max_diff"] <= 1e-6 and m["async/dropped"] == 0 for m in metrics)
    # the worker's log-probs against the trainer's old log-probs: the same weights at step 1 (float32 rounding of
    # a cached decode against a full pass), an update apart later
    assert metrics[0]["rollout/sampler_logprob_diff_max"] < 1e-4 and metrics[1]["rollout/sampler_kl"] >= 0


@pytest.mark.parametrize("stage_args", [grpo_args, ppo_args], ids=["grpo", "ppo"])
def test_two_steps_off_with_a_correction_keeps_every_sample_within_two_updates(llama_dir, files, tmp_path, stage_args):
    out = tmp_path / "k2"
    more = ["--max-steps", "4", "--save-every", "0", "--max-staleness", "2"]
    more += ["--off-policy-correction", "token_truncate", "--is-ratio-max", "2"]
    assert main(stage_args(llama_dir, files, out, *more)) == 0
    metrics = rows(out / "metrics.jsonl")
    # rollouts 0, 1, 2 queued before the first update (version 0); rollout t ≥ 3 queued after update t − 2
    assert [m["async/staleness_max"] for m in metrics] == [0.0, 1.0, 2.0, 2.0]
    assert all(0 < m["rollout/is_weight_mean"] <= 2 for m in metrics)


@pytest.fixture
def ending_llama(llama_dir, tmp_path):
    """The tiny llama with one token in eight of its vocabulary in the generation config's EOS list (the stop set),
    so that a random model ends its turns and episodes run several turns, as a trained one's would."""
    import shutil

    model = tmp_path / "ending-llama"
    shutil.copytree(llama_dir, model)
    config = json.loads((model / "config.json").read_text())
    eos = sorted({*range(8, config["vocab_size"], 8), config["eos_token_id"]})
    (model / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    return model


def test_episodes_are_drawn_whole_by_the_worker_one_update_behind(ending_llama, files, tmp_path):
    """agent.env beside a rollout worker at K = 1: the worker runs each step's episodes with environments of its
    own; the first step's transcripts, outcomes and update equal the synchronous run's (the same weights, seeds and
    environment), later steps train on episodes one update old, and the held-out episodes are drawn there too."""
    env = f"{Path(__file__).parent / 'agent_helpers.py'}:Counting(turns=3)"
    words = ("hi", "cats", "dogs", "rain")
    files = (files[0], write_jsonl(tmp_path / "plain.jsonl", [{"prompt": f"Say {w}."} for w in words] * 4))
    more = ["--max-steps", "3", "--save-every", "1", "--keep-checkpoints", "5", "--env", env]
    more += ["--max-total-tokens", "48", "--eval-prompts", str(files[1]), "--eval-every", "3"]
    sync, ahead = tmp_path / "sync", tmp_path / "ahead"
    assert main(grpo_args(ending_llama, files, sync, *more)) == 0
    assert main(grpo_args(ending_llama, files, ahead, *more, "--max-staleness", "1")) == 0
    first = [s for s in rows(sync / "samples.jsonl") if s["step"] == 1]
    assert [(s["response"], s["agent"]) for s in first] == [
        (s["response"], s["agent"]) for s in rows(ahead / "samples.jsonl") if s["step"] == 1
    ]
    assert max(s["agent"]["turns"] for s in first) > 1  # multi-turn: the stop set ends turns
    one, other = (load_file(run / "checkpoint-1" / "model.safetensors") for run in (sync, ahead))
    assert all(torch.equal(one[k], other[k]) for k in one)
    metrics = rows(ahead / "metrics.jsonl")
    assert [m["async/staleness_max"] for m in metrics] == [0.0, 1.0, 1.0]
    assert all(m["async/parity_max_diff"] <= 1e-6 and m["async/dropped"] == 0 for m in metrics)
    # the environment's outcome and per-turn rewards reach the trainer, and the reward function beside it scores
    # the final answers there
    assert all("reward/final/mean" in m and "reward/count_a/mean" in m for m in metrics)
    assert metrics[0]["rollout/sampler_logprob_diff_max"] < 1e-4
    assert "eval/agent/success_rate" in metrics[-1]


def test_an_environment_failing_in_the_worker_stops_the_run_as_it_would_in_the_trainer(ending_llama, tmp_path, capsys):
    """env_on_error = raise: an environment that raises in the worker's process stops the run with the
    environment's own message (an EnvironmentFault, as in the trainer), not as a worker failure. PPO, whose queue of
    episodes (steps 0 and 1 at the first step) is its own."""
    env = f"{Path(__file__).parent / 'agent_helpers.py'}:Counting(turns=3, fail_at=2)"
    prompts = write_jsonl(tmp_path / "plain.jsonl", [{"prompt": f"Say {w}."} for w in ("hi", "cats")] * 4)
    argv = ["ppo", "--model", str(ending_llama), "--prompts", str(prompts), "--env", env, "--max-steps", "2"]
    argv += ["--prompts-per-step", "4", "--minibatch", "2", "--max-new-tokens", "8", "--max-total-tokens", "48"]
    argv += ["--max-staleness", "1", "--async-threads", "1", "--report-to", "none", "--output", str(tmp_path / "o")]
    assert main(argv) != 0
    err = capsys.readouterr().err
    assert "environment Counting.step raised RuntimeError: the environment broke" in err
    assert "rollout worker (pid" not in err


def test_an_environment_the_worker_cannot_be_sent_is_refused_naming_the_fix(llama_dir, tmp_path):
    """The worker builds the environment in its own process: one handed to the Python API that does not pickle (a
    closure) is refused before the worker starts, saying what to pass instead."""
    from agent_helpers import Counting

    import tether
    from tether.config import ConfigError

    prompts = [{"prompt": f"Say {w}."} for w in ("hi", "cats")]
    with pytest.raises(ConfigError, match="name a class by module:Class"):
        tether.grpo(
            model=str(llama_dir),
            prompts=prompts,
            env=lambda prompt=None: Counting(turns=2),
            max_staleness=1,
            num_generations=2,
            prompts_per_step=2,
            max_steps=1,
            output=str(tmp_path / "o"),
            report_to=["none"],
        )
    assert not (tmp_path / "o" / "checkpoint-1").exists()


def test_a_resumed_ppo_run_draws_its_first_step_afresh(llama_dir, files, tmp_path):
    """PPO resumes as the group family does: the worker's queue is not in the checkpoint, so the first step after a
    resume is drawn by the checkpoint's own weights (staleness 0), the next one update behind again."""
    out = tmp_path / "run"
    keep = ["--save-every", "2", "--keep-checkpoints", "0", "--max-staleness", "1"]
    assert main(ppo_args(llama_dir, files, out, "--max-steps", "2", *keep)) == 0
    assert main(ppo_args(llama_dir, files, out, "--max-steps", "4", *keep, "--resume")) == 0
    assert [m["async/staleness_max"] for m in rows(out / "metrics.jsonl")] == [0.0, 1.0, 0.0, 1.0]


@pytest.mark.parametrize("stage", ["grpo", "ppo"])
def test_a_lora_policy_is_sampled_by_the_worker_with_its_adapters_merged(llama_dir, files, tmp_path, stage):
    """A LoRA policy beside a rollout worker: the worker holds the base model and is pushed W + ΔW after each update,
    so its probe log-probs equal the trainer's adapter forward within float32 rounding (the parity probe passes
    every push, far under its 1e-3 limit) and the step-1 sampler gap is rounding; the adapters move, one update
    behind from the second step."""
    out = tmp_path / "lora"
    more = ["--max-steps", "3", "--save-every", "0", "--max-staleness", "1", "--lora-r", "4", "--lr", "3e-2"]
    args = (ppo_args if stage == "ppo" else grpo_args)(llama_dir, files, out, *more)
    assert main(args) == 0
    metrics = rows(out / "metrics.jsonl")
    assert [m["async/staleness_max"] for m in metrics] == [0.0, 1.0, 1.0]
    # the trainer's x·W + s·(x·A)·B against the worker's x·(W + s·B·A): a few float32 ulps of logits
    assert all(m["async/parity_max_diff"] < 1e-4 for m in metrics)
    assert metrics[0]["rollout/sampler_logprob_diff_max"] < 1e-4
    # the pushed weights changed with the adapters: the sampler is an update behind, not frozen at the base model
    assert metrics[2]["rollout/sampler_kl"] > 0


def online_dpo_args(model, files, out, *more) -> list[str]:
    """Online DPO on the group tests' prompts, labelled by the same rule: rounds of 4 prompts × 2 answers."""
    rules, prompts = files
    args = ["dpo", "--online", "--model", str(model), "--prompts", str(prompts), "--reward", f"{rules}:count_a"]
    args += ["--prompts-per-step", "4", "--max-new-tokens", "8", "--response-seeds", "--keep-truncated"]
    args += [
        "--temperature",
        "1.3",
        "--batch-size",
        "2",
        "--micro-batch-size",
        "1",
        "--lr",
        "3e-3",
        "--report-to",
        "none",
    ]
    return args + ["--async-threads", "1", "--output", str(out), *more]


def test_online_dpo_samples_the_next_round_beside_the_trainer(llama_dir, files, tmp_path):
    """Online DPO at K = 2 with two steps a round: round r + 1 is queued when round r starts (its answers are then
    two updates old at its first step), so the first round's pairs and training equal the synchronous run's and
    each later round is drawn by the weights of its previous round's start."""
    sync, ahead = tmp_path / "sync", tmp_path / "ahead"
    more = ["--rounds", "3", "--steps-per-round", "2", "--save-every", "2", "--keep-checkpoints", "5"]
    assert main(online_dpo_args(llama_dir, files, sync, *more)) == 0
    assert main(online_dpo_args(llama_dir, files, ahead, *more, "--max-staleness", "2")) == 0
    assert (sync / "rounds" / "round-0.jsonl").read_text() == (ahead / "rounds" / "round-0.jsonl").read_text()
    one, other = (load_file(run / "checkpoint-2" / "model.safetensors") for run in (sync, ahead))
    assert all(torch.equal(one[k], other[k]) for k in one)
    metrics = rows(ahead / "metrics.jsonl")
    assert [m.get("async/staleness_max") for m in metrics] == [0.0, None, 2.0, None, 2.0, None]
    assert all(m.get("async/parity_max_diff", 0.0) <= 1e-6 for m in metrics)
    # later rounds differ from the synchronous run's: drawn two updates back
    assert (sync / "rounds" / "round-1.jsonl").read_text() != (ahead / "rounds" / "round-1.jsonl").read_text()


def test_dynamic_sampling_beside_the_worker_queues_each_steps_first_round_ahead(llama_dir, files, tmp_path):
    """DAPO's dynamic sampling at K = 1 (a binary reward, so many groups score alike and steps need more rounds): a
    step's first round is its own prompts, queued with the worker a step ahead and trained one update later; later
    rounds draw only the groups still needed, from the top-up stream, when asked (never queued, so never dropped).
    Every response trained on is within one update."""
    args = grpo_args(llama_dir, files, tmp_path / "run", "--recipe", "dapo", "--max-staleness", "1")
    rules = str(files[0])
    args[args.index(f"{rules}:count_a")] = f"{rules}:has_a"
    args[args.index("--prompts-per-step") + 1] = "4"
    assert main(args + ["--max-steps", "5", "--max-sampling-rounds", "3", "--save-every", "5"]) == 0
    metrics = rows(tmp_path / "run" / "metrics.jsonl")
    assert len(metrics) == 5 and all(m["async/staleness_max"] <= 1.0 for m in metrics)
    assert [m["async/staleness_max"] for m in metrics][1:] == [1.0] * 4  # each first round drawn a step ahead
    assert any(m["sampling/rounds"] > 1 for m in metrics), [m["sampling/rounds"] for m in metrics]
    assert metrics[-1]["async/dropped"] == 0
    # the main stream moved one step's prompts a step, the top-up stream the later rounds' groups
    state = json.loads((tmp_path / "run" / "checkpoint-5" / "trainer_state.json").read_text())["stage"]
    later = sum(m["sampling/groups_sampled"] for m in metrics) - 5 * 4
    assert state["cursor"] == 5 * 4 and state["topup_cursor"] == later > 0


def test_an_episode_crosses_as_json_values_and_reads_back_equal():
    """What the worker sends back, and what process 0 hands the others under --rollout-workers one: a detached
    episode as JSON text and back, every field equal — float32 log-probs and reward parts exactly (a float's shortest
    repr reads back as the same float), the tool-call counter, the outcome and the transcript's prompt ids."""
    import json
    from collections import Counter

    from tether.agents.environment import Outcome
    from tether.agents.episodes import Episode
    from tether.agents.worker import SentTranscript, episode_from_json, episode_json

    logprobs = torch.randn(5, generator=torch.Generator().manual_seed(0)).tolist()  # float32 values as Python floats
    episode = Episode(
        row={"prompt": "Order tea.", "meta": {"id": 3}},
        transcript=SentTranscript([5, 6, 7], "Order tea.", [{"name": "buy", "parameters": {}}]),
        ids=[1, 2, 3, 4, 5],
        actions=[1, 1, 0, 0, 1],
        sampler_logprobs=logprobs,
        turn_ends=[1, 4],
        turn_rewards=[{"format": 0.1}, {"format": 1 / 3}],
        lines=["assistant: buy()", "tool: ok"],
        final="done",
        final_tokens=1,
        final_ids=[5],
        calls=Counter(buy=2, look=1),
        failed_calls=1,
        calls_made=3,
        info={"cost": 2.5},
        end="done",
        outcome=Outcome(rewards={"state": 0.7}, success=True, claimed=None),
        policy_version=4,
    )
    back = episode_from_json(json.loads(json.dumps(episode_json(episode))))
    assert back == episode and back.sampler_logprobs == logprobs and isinstance(back.calls, Counter)
    bare = Episode(row={"prompt": "x"}, end="error", error="reset failed")  # no transcript, no outcome
    assert episode_from_json(json.loads(json.dumps(episode_json(bare)))) == bare


def test_the_settings_that_the_worker_does_not_serve_are_refused(llama_dir, files, tmp_path, capsys):
    for more, said in (
        (["--rollout-backend", "vllm", "--vllm-sleep"], "so it never sleeps"),
        (["--max-staleness", "-1"], "must be >= 0"),
        (["--no-drop-finished-rows"], "drop --no-drop-finished-rows, or use --rollout-backend vllm"),
    ):
        flags = more if "--max-staleness" in more else ["--max-staleness", "1", *more]
        assert main(grpo_args(llama_dir, files, tmp_path / "x", *flags)) == 2
        assert said in capsys.readouterr().err


def _children(pid: int) -> list[int]:
    found = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as handle:
            found += [int(c) for c in handle.read().split()]
    return found


def _name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as handle:
            return handle.read().strip()
    except FileNotFoundError:
        return ""


def _start(llama_dir, files, out, *more):
    args = grpo_args(llama_dir, files, out, "--max-staleness", "1", *more)
    err = open(out.parent / f"{out.name}.err", "w")
    return subprocess.Popen([sys.executable, "-m", "tether", *args[0:]], stderr=err, start_new_session=True), err


def _wait_for(proc, what, deadline_s=180):
    deadline = time.time() + deadline_s
    while not what() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.1)
    assert what(), "did not happen in time"


def test_a_killed_worker_stops_the_run_naming_it_and_leaves_no_process(llama_dir, files, tmp_path):
    out = tmp_path / "run"
    proc, err = _start(llama_dir, files, out, "--max-steps", "100000", "--save-every", "0")
    metrics = out / "metrics.jsonl"
    _wait_for(proc, lambda: metrics.is_file() and len(rows(metrics)) >= 1)
    workers = [c for c in _children(proc.pid) if _name(c) == "tether-rollout"]
    children = _children(proc.pid)
    assert len(workers) == 1, [(c, _name(c)) for c in children]
    os.kill(workers[0], signal.SIGKILL)
    assert proc.wait(60) == 1
    err.close()
    said = (out.parent / "run.err").read_text()
    assert f"stopped: the rollout worker (pid {workers[0]}) died with exit code -9" in said, said[-2000:]
    assert "Traceback" not in said
    deadline = time.time() + 10
    while any(running(c) for c in children) and time.time() < deadline:
        time.sleep(0.1)
    assert not any(running(c) for c in children)


def test_a_killed_trainer_takes_its_worker_with_it_and_the_run_resumes_drawing_afresh(llama_dir, files, tmp_path):
    """kill -9 of the trainer: the worker goes too (PR_SET_PDEATHSIG), removing the trainer's weight slots from
    shared memory on its way out (nobody else can); --resume starts a new worker from the
    checkpoint's weights, so the responses queued before the kill are drawn again: the first step after the resume
    trains on responses of the restored weights (staleness 0), the next one update behind again."""
    out = tmp_path / "run"
    # a run that cannot end before the kill (a fast machine once finished 4 steps between two looks for checkpoint-2),
    # every checkpoint kept; it resumes from whichever is the newest when the kill lands
    keep = ["--save-every", "2", "--keep-checkpoints", "0"]
    proc, err = _start(llama_dir, files, out, "--max-steps", "100000", *keep)
    _wait_for(proc, lambda: (out / "checkpoint-2").is_dir())
    workers = [c for c in _children(proc.pid) if _name(c) == "tether-rollout"]
    assert len(workers) == 1
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    err.close()
    deadline = time.time() + 10
    slots = lambda: list(Path("/dev/shm").glob(f"tether-weights-{proc.pid}-*"))  # noqa: E731 - the trainer's
    while (running(workers[0]) or slots()) and time.time() < deadline:
        time.sleep(0.1)
    assert not running(workers[0])
    assert not slots(), "the killed trainer's weight slots were left in shared memory"
    last = max(int(p.name.removeprefix("checkpoint-")) for p in out.glob("checkpoint-*") if p.name[11:].isdigit())
    end = str(last + 2)
    assert main(grpo_args(llama_dir, files, out, "--max-staleness", "1", "--max-steps", end, *keep, "--resume")) == 0
    metrics = {m["step"]: m for m in rows(out / "metrics.jsonl")}
    assert metrics[last + 1]["async/staleness_max"] == 0.0 and metrics[last + 2]["async/staleness_max"] == 1.0
    assert (out / "final" / "model.safetensors").is_file()


def test_a_trainer_sent_sigterm_removes_its_weight_slots_and_still_dies_of_it(llama_dir, files, tmp_path):
    """A launcher's agent sends SIGTERM to a failed rank's whole session, its rollout worker included, which may die
    of it before its own handler is installed (its first seconds, importing): then only the trainer can remove its
    weight slots from shared memory, and a default SIGTERM death runs no exit function. Here the worker is stopped
    (SIGSTOP: it can remove nothing) once the first weights are pushed, then the trainer is sent SIGTERM: the slots
    are gone and the trainer died of the signal, as it would have without the clean-up."""
    out = tmp_path / "run"
    proc, err = _start(llama_dir, files, out, "--max-steps", "100000", "--save-every", "0")
    slots = lambda: list(Path("/dev/shm").glob(f"tether-weights-{proc.pid}-*"))  # noqa: E731 - the trainer's
    _wait_for(proc, lambda: any(list(folder.glob("slot0.*")) for folder in slots()))
    workers = _children(proc.pid)
    assert workers
    for worker in workers:
        os.kill(worker, signal.SIGSTOP)
    try:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == -signal.SIGTERM
        assert not slots(), "the trainer sent SIGTERM left its weight slots in shared memory"
    finally:
        for worker in workers:
            if running(worker):
                os.kill(worker, signal.SIGKILL)
        err.close()


def test_a_worker_that_does_not_hold_the_pushed_weights_stops_the_run(llama_dir, files, tmp_path, monkeypatch, capsys):
    """The parity probe: the weights file the worker reads is not the trainer's (here each weight 0.01 off, as a
    transfer that lost or mixed up a version would be), so the worker's log-probs of the probe disagree with the
    trainer's and the run stops at the first push, at start-up, naming the worker and the gap."""
    import safetensors.torch

    real = safetensors.torch.save_file

    def off(state, path, *args, **kwargs):
        real({k: v + 0.01 if v.is_floating_point() else v for k, v in state.items()}, path, *args, **kwargs)

    monkeypatch.setattr(safetensors.torch, "save_file", off)
    code = main(grpo_args(llama_dir, files, tmp_path / "run", "--max-steps", "2", "--max-staleness", "1"))
    out = capsys.readouterr()
    assert code == 1
    assert "does not hold the weights of version 0" in out.out + out.err
    assert "parity probe" in out.out + out.err


def test_an_exception_in_the_worker_stops_the_run_with_the_workers_traceback(
    llama_dir, files, tmp_path, monkeypatch, capsys
):
    """The worker's own failure (here the weights file it loads has one tensor of the wrong shape, so its
    load_state_dict raises): the worker reports its traceback and ends, and the run stops at the first push with
    the worker named and the cause in its words, never sampling on without it."""
    import safetensors.torch

    real = safetensors.torch.save_file

    def misshapen(state, path, *args, **kwargs):
        name = next(k for k, v in state.items() if v.dim() == 2)
        real({**state, name: state[name][:-1]}, path, *args, **kwargs)

    monkeypatch.setattr(safetensors.torch, "save_file", misshapen)
    code = main(grpo_args(llama_dir, files, tmp_path / "run", "--max-steps", "2", "--max-staleness", "1"))
    said = "".join(capsys.readouterr())
    assert code == 1
    assert "the rollout worker (pid " in said and ") failed:" in said, said[-2000:]
    assert "size mismatch" in said and "load_state_dict" in said
    assert not (tmp_path / "run" / "metrics.jsonl").is_file() or not rows(tmp_path / "run" / "metrics.jsonl")
