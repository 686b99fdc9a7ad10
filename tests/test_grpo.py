"""`tether grpo` on tiny models: every recipe runs, on-policy ratio is 1, dynamic sampling, process rewards,
zero-variance warning, failing rewards, resume."""

import json
import subprocess
import sys

import pytest
from conftest import BF16_REFUSED, assert_resumes_exactly, bf16_refused_here, flags, rules_and_prompts

from tether.config import ConfigError, build_config
from tether.stages.grpo import run_grpo
from tether.stages.grpo_config import GRPOConfig
from tether.stages.grpo_recipes import RECIPES

RULES = """
def count_a(completions):
    return [float(c.count("a")) for c in completions]

def count_a_unless_hi(completions, prompts):
    return [0.0 if "hi" in str(p) else float(c.count("a")) for c, p in zip(completions, prompts)]

def constant(completions):
    return [1.0] * len(completions)

def hi_only(completions, prompts):
    return [1.0 if "hi" in str(p) else 0.0 for p in prompts]

def sentence_steps(completions):
    return [[1.0 if "a" in s else 0.0 for s in c.split(".")[:3]] or [0.0] for c in completions]

def flaky(completions):
    if len(completions) > 2:
        raise RuntimeError("flaky")
    return [0.0] * len(completions)
"""


@pytest.fixture
def setup(tmp_path):
    words = ("hi", "cats", "dogs", "rain")
    return rules_and_prompts(
        tmp_path, RULES, [{"prompt": [{"role": "user", "content": f"Say {w}."}], "answer": w} for w in words] * 4
    )


def grpo_config(policy_dir, prompts, out, rewards, **extra):
    overrides = {
        "model.path": str(policy_dir),
        "rollout.prompts": str(prompts),
        "rollout.eval_prompts": str(prompts),
        "rewards.reward": rewards,
        "rollout.prompts_per_step": 4,
        "rollout.group_size": 4,
        "rollout.max_new_tokens": 8,
        "train.max_steps": 3,
        "optim.lr": 3e-3,
        "train.output": str(out),
        "train.eval_every": 3,
        "train.save_every": 2,
        "train.sample_every": 1,
        "train.report_to": ["none"],
    }
    overrides.update({k.replace("__", "."): v for k, v in extra.items()})
    return build_config(GRPOConfig, overrides=overrides)


def read_metrics(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def train(policy_dir, prompts, out, rewards, **extra) -> list[dict]:
    """Train grpo_config's run into ``out`` and return its metrics rows, which most tests here read."""
    run_grpo(grpo_config(policy_dir, prompts, out, rewards, **extra))
    return read_metrics(out)


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_every_recipe_runs_and_logs_its_pieces(llama_dir, setup, tmp_path, recipe):
    rules, prompts = setup
    out = tmp_path / recipe
    cfg = grpo_config(llama_dir, prompts, out, [f"{rules}:count_a"], algo__recipe=recipe)
    for key, value in RECIPES[recipe].settings.items():
        section, field = key.split(".")
        assert getattr(getattr(cfg, section), field) == value, key
    summary = run_grpo(cfg)
    metrics = read_metrics(out)
    assert len(metrics) == 3 and summary["recipe"] == recipe
    for key in (
        "score/mean",
        "reward/count_a/mean",
        "groups/zero_variance_frac",
        "policy/clip_frac_low",
        "policy/clip_frac_high",
        "policy/entropy",
        "rollout/terminated_length_mean",
        "rollout/truncated_frac",
        "time/generate_score_s",
        "time/update_s",
        "advantage/mean",
    ):
        assert key in metrics[-1], key
    assert ("kl/ref_mean" in metrics[-1]) == (recipe in ("grpo", "reinforce_pp"))
    if recipe == "dapo":
        assert "reward/overlong/mean" in metrics[-1]
    sample = json.loads((out / "samples.jsonl").read_text().splitlines()[0])
    assert {"group", "advantage", "parts", "truncated"} <= set(sample)
    assert (out / "final" / "config.json").is_file()


def test_flags_override_the_recipe_and_bad_names_fail(tmp_path):
    cfg = build_config(GRPOConfig, overrides={"algo.recipe": "dapo", "algo.clip_high": 0.3})
    assert cfg.algo.clip_high == 0.3 and cfg.algo.clip_low == 0.2 and cfg.algo.dynamic_sampling
    assert build_config(GRPOConfig, file_values={"algo": {"recipe": "gspo"}}).algo.ratio == "sequence"
    with pytest.raises(ConfigError, match="recipe"):
        build_config(GRPOConfig, overrides={"algo.recipe": "ppo2"})
    with pytest.raises(ConfigError, match="unknown field algo.clip"):
        build_config(GRPOConfig, file_values={"algo": {"clip": 0.1}})


def test_on_policy_ratio_is_exactly_one_and_inner_iterations_move_it(llama_dir, setup, tmp_path):
    rules, prompts = setup
    metrics = train(llama_dir, prompts, tmp_path / "mu1", [f"{rules}:count_a"], algo__kl_coef=0.0)
    assert all(m["policy/ratio_mean"] == 1.0 for m in metrics)
    metrics = train(
        llama_dir, prompts, tmp_path / "mu2", [f"{rules}:count_a"], algo__update_epochs=2, algo__kl_coef=0.0
    )
    assert any(m["policy/ratio_mean"] != 1.0 for m in metrics)


def test_equal_scores_warn_and_give_zero_loss_not_nan(llama_dir, setup, tmp_path, capsys):
    rules, prompts = setup
    out = tmp_path / "flat"
    metrics = train(llama_dir, prompts, out, [f"{rules}:constant"], algo__kl_coef=0.0)
    assert all(m["groups/zero_variance_frac"] == 1.0 for m in metrics)
    assert all(m["advantage/mean"] == 0.0 and m["advantage/std"] == 0.0 and m["policy/loss"] == 0.0 for m in metrics)
    assert "scored all their responses equally" in capsys.readouterr().err


def test_groups_scored_equally_teach_reinforce_pp_and_are_not_dropped(llama_dir, setup, tmp_path):
    """Every group scores its responses equally, but the "hi" prompts 1 and the others 0: GRPO's group baseline
    gives every token advantage 0 (every group flat), REINFORCE++'s batch baseline does not, so dynamic sampling
    keeps its groups in one round and the step trains (it once dropped them all: "no update")."""
    rules, prompts = setup
    grpo = train(llama_dir, prompts, tmp_path / "grpo", [f"{rules}:hi_only"], train__max_steps=1)
    assert grpo[0]["groups/zero_variance_frac"] == 1.0 and grpo[0]["advantage/std"] == 0.0
    dynamic = dict(algo__dynamic_sampling=True, algo__max_sampling_rounds=3)
    rpp = train(llama_dir, prompts, tmp_path / "rpp", [f"{rules}:hi_only"], algo__recipe="reinforce_pp", **dynamic)
    assert all(m["groups/zero_variance_frac"] == 0.0 and m["sampling/rounds"] == 1 for m in rpp)
    assert all(m["sampling/groups_kept"] == 4 and m["advantage/std"] > 0 for m in rpp)


def test_dynamic_sampling_drops_flat_groups_and_fills_the_batch(llama_dir, setup, tmp_path):
    rules, prompts = setup
    out = tmp_path / "dyn"
    dapo = dict(algo__recipe="dapo", algo__max_sampling_rounds=4, rollout__temperature=1.5)
    # dapo's overlong part varies with each response's length: off, "hi" scores 0
    metrics = train(llama_dir, prompts, out, [f"{rules}:count_a_unless_hi"], rewards__overlong_cache=0, **dapo)
    assert any(m["sampling/rounds"] > 1 for m in metrics)  # the "hi" groups are always flat
    assert all(m["sampling/groups_kept"] <= 4 for m in metrics)
    assert all(m["sampling/groups_sampled"] >= m["sampling/groups_kept"] for m in metrics)
    rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert not any("Say hi." in r["prompt"] for r in rows)


def test_process_reward_step_scores_reach_the_samples(llama_dir, setup, tmp_path):
    rules, prompts = setup
    out = tmp_path / "proc"
    run_grpo(
        grpo_config(llama_dir, prompts, out, [f"{rules}:sentence_steps"], algo__kl_coef=0.0, rollout__temperature=1.5)
    )
    rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert all(
        isinstance(r["step_scores"], list) and r["parts"]["sentence_steps"] == sum(r["step_scores"]) for r in rows
    )


def test_a_failing_reward_is_scored_and_counted_or_stops_the_run(llama_dir, setup, tmp_path):
    rules, prompts = setup
    out = tmp_path / "flaky"
    on_error = dict(rewards__reward_on_error="score", rewards__reward_error_score=-1.0)
    metrics = train(llama_dir, prompts, out, [f"{rules}:flaky", f"{rules}:count_a"], algo__kl_coef=0.0, **on_error)
    assert metrics[-1]["reward/flaky/errors"] >= 3 and metrics[0]["reward/flaky/mean"] == -1.0
    with pytest.raises(
        ConfigError, match="evaluation before the first step: reward function flaky raised RuntimeError"
    ):
        run_grpo(grpo_config(llama_dir, prompts, tmp_path / "strict", [f"{rules}:flaky"], algo__kl_coef=0.0))


SCORE = "def score(completions):\n    return [float(c.count('a')) for c in completions]\n"
FAILS_AT_CALL_4 = (
    "calls = []\ndef score(completions):\n    calls.append(1)\n    if len(calls) == 4:\n"
    "        raise RuntimeError('broken on call 4')\n    return [float(c.count('a')) for c in completions]\n"
)


def test_a_reward_failing_late_checkpoints_the_steps_done_and_resumes_exactly(llama_dir, setup, tmp_path):
    """Calls: the dry run, steps 1 and 2, then step 3 fails before its update. checkpoint-2 holds the state as step 3
    began (RNG and data cursor too), so the resumed run, with the function fixed, equals an uninterrupted one."""
    _, prompts = setup
    (tmp_path / "good").mkdir()
    (tmp_path / "good" / "fn.py").write_text(SCORE)
    (tmp_path / "fn.py").write_text(FAILS_AT_CALL_4)
    cfg = lambda rules, out, **kw: grpo_config(
        llama_dir,
        prompts,
        out,
        [f"{rules}:score"],
        train__max_steps=4,
        train__save_every=0,
        rollout__eval_prompts="",
        algo__kl_coef=0.0,
        **kw,
    )
    run_grpo(cfg(tmp_path / "good" / "fn.py", tmp_path / "whole"))
    with pytest.raises(
        ConfigError,
        match=r"step 3: reward function score raised RuntimeError: broken on call 4.*"
        r"The 2 steps done are in checkpoint-2",
    ):
        run_grpo(cfg(tmp_path / "fn.py", tmp_path / "broken"))
    assert [p.name for p in (tmp_path / "broken").glob("checkpoint-*")] == ["checkpoint-2"]
    (tmp_path / "fn.py").write_text(SCORE)  # fixed
    summary = run_grpo(cfg(tmp_path / "fn.py", tmp_path / "broken", train__resume=True))
    assert summary["resumed_from"] == 2
    strip = lambda rows: [{k: v for k, v in r.items() if not k.startswith(("time/", "perf/"))} for r in rows]
    assert strip(read_metrics(tmp_path / "broken")) == strip(read_metrics(tmp_path / "whole"))


@pytest.mark.slow
def test_grpo_resume_matches_the_uninterrupted_run(llama_dir, setup, tmp_path, monkeypatch):
    rules, prompts = setup
    cfg = lambda out, **kw: grpo_config(
        llama_dir, prompts, out, [f"{rules}:count_a_unless_hi"], algo__recipe="dapo", train__max_steps=4, **kw
    )
    assert_resumes_exactly(run_grpo, cfg, tmp_path, monkeypatch, kill_after=3, resumed_from=2)


@pytest.mark.slow
def test_grpo_raises_a_rule_reward(llama_dir, setup, tmp_path):
    rules, prompts = setup
    out = tmp_path / "learn"
    long_run = dict(train__max_steps=25, train__eval_every=0, rollout__prompts_per_step=4, rollout__group_size=8)
    metrics = train(llama_dir, prompts, out, [f"{rules}:count_a"], algo__kl_coef=0.0, **long_run)
    first = sum(m["score/mean"] for m in metrics[:5]) / 5
    last = sum(m["score/mean"] for m in metrics[-5:]) / 5
    assert last > first + 0.5, (first, last)


def test_cli_grpo_and_recipes(llama_dir, setup, tmp_path):
    rules, prompts = setup
    listing = subprocess.run([sys.executable, "-m", "tether", "recipes"], capture_output=True, text=True, timeout=120)
    assert listing.returncode == 0 and all(name in listing.stdout for name in RECIPES)
    tether_grpo = [sys.executable, "-m", "tether", "grpo", "--policy", str(llama_dir), "--prompts", str(prompts)]
    quick = flags(recipe="dr_grpo", max_steps=1, group_size=2, prompts_per_step=2, max_new_tokens=4)
    proc = subprocess.run(
        tether_grpo + flags(reward=f"{rules}:count_a", output=tmp_path / "cli", report_to="none") + quick,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "dr_grpo" in proc.stdout + proc.stderr
    bad = subprocess.run(
        tether_grpo + flags(reward=f"{rules}:nope", output=tmp_path / "bad"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and "has no function 'nope'" in bad.stderr and "Traceback" not in bad.stderr


def test_lora_grpo_uses_the_adapter_disabled_reference(llama_dir, setup, tmp_path):
    from transformers import AutoModelForCausalLM

    rules, prompts = setup
    out = tmp_path / "lora"
    lora = dict(model__lora_r=4, model__lora_alpha=8.0)
    metrics = train(llama_dir, prompts, out, [f"{rules}:count_a"], algo__kl_coef=0.04, **lora)
    assert metrics[0]["kl/ref_mean"] == pytest.approx(0.0, abs=1e-6)  # LoRA starts as the identity
    assert metrics[-1]["kl/ref_mean"] > 0
    assert not any("lora" in n for n, _ in AutoModelForCausalLM.from_pretrained(out / "final").named_parameters())


def test_trainable_params_freezes_everything_else(llama_dir, setup, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    rules, prompts = setup
    out = tmp_path / "norm"
    norm_only = dict(model__trainable_params=r"model\.norm\.weight", optim__lr=1e-2)
    train(llama_dir, prompts, out, [f"{rules}:count_a"], algo__kl_coef=0.0, **norm_only)
    before = AutoModelForCausalLM.from_pretrained(llama_dir).state_dict()
    after = AutoModelForCausalLM.from_pretrained(out / "final").state_dict()
    changed = [n for n in before if not torch.equal(before[n], after[n])]
    assert changed == ["model.norm.weight"]
    with pytest.raises(ConfigError, match="matches no parameter"):
        run_grpo(
            grpo_config(
                llama_dir, prompts, tmp_path / "none", [f"{rules}:count_a"], model__trainable_params="nothing_here"
            )
        )


def test_a_run_whose_responses_are_all_truncated_says_so_loudly(capsys):
    from tether.train.logger import warn_if_truncated

    assert warn_if_truncated({"step": 1, "rollout/truncated_frac": 1.0}, -10) == 1
    assert "100% of the responses hit max_new_tokens without a stop token" in capsys.readouterr().err
    assert warn_if_truncated({"step": 5, "rollout/truncated_frac": 1.0}, 1) == 1  # at most once every 10 steps
    assert warn_if_truncated({"step": 12, "rollout/truncated_frac": 0.5}, 1) == 1  # a healthy share: quiet
    assert capsys.readouterr().err == ""


def test_bf16_sampling_under_an_fp32_policy_logs_the_gap_and_corrects_it(llama_dir, setup, tmp_path, capsys):
    """--sampling-dtype bf16 with a correction through the command line: the plan names the bfloat16 copy and the
    rule, every step logs the sampler gap (nonzero: bf16 is not fp32) and the weights — token_truncate's each
    min(ρ, 2), so their mean ≤ 2; token_mask with the band [0.999, 1.001] drops the tokens bf16 moved by more than
    0.1 % (some, not all) — and the ratio's percentiles in order; without --sampling-dtype the correction on the hf
    backend is refused, and the old --tis-cap reads as --is-ratio-max and asks for the rule by name."""
    from tether.cli import main

    rules, prompts = setup
    out = tmp_path / "bf16"
    args = ["grpo", "--model", str(llama_dir), "--prompts", str(prompts), "--reward", f"{rules}:count_a"]
    args += ["--prompts-per-step", "4", "--group-size", "4", "--max-new-tokens", "8", "--max-steps", "2"]
    args += ["--save-every", "0", "--report-to", "none"]
    truncate = ["--off-policy-correction", "token_truncate", "--is-ratio-max", "2"]
    if bf16_refused_here():
        assert main([*args, *truncate, "--sampling-dtype", "bf16", "--output", str(out)]) == 2
        assert BF16_REFUSED in capsys.readouterr().err
        return
    assert main([*args, *truncate, "--sampling-dtype", "bf16", "--output", str(out)]) == 0
    printed = "".join("".join(capsys.readouterr()).split())  # the plan table may fold a line anywhere
    assert (
        "abfloat16copyofthetrainedpolicy" in printed
        and "off-policycorrectiontoken_truncate,ratiobounds[0,2]" in printed
    )
    rows = read_metrics(out)
    assert len(rows) == 2
    for row in rows:
        assert row["rollout/sampler_logprob_diff_max"] > 0 and row["rollout/sampler_kl"] >= 0
        assert 0 < row["rollout/is_weight_mean"] <= 2 and row["rollout/is_masked_share"] == 0.0
        assert row["rollout/is_ratio_p1"] <= row["rollout/is_ratio_p50"] <= row["rollout/is_ratio_p99"]
        assert row["rollout/is_ratio_p99"] <= row["rollout/is_ratio_max"]
    band = ["--off-policy-correction", "token_mask", "--is-ratio-min", "0.999", "--is-ratio-max", "1.001"]
    assert main([*args, *band, "--sampling-dtype", "bf16", "--output", str(tmp_path / "mask")]) == 0
    for row in read_metrics(tmp_path / "mask"):
        assert (
            0 < row["rollout/is_masked_share"] < 1 and row["rollout/is_changed_share"] == row["rollout/is_masked_share"]
        )
    assert main([*args, *truncate, "--output", str(tmp_path / "refused")]) == 2
    assert "off_policy_correction and the vllm_* options are for --rollout-backend vllm" in capsys.readouterr().err
    assert main([*args, "--tis-cap", "2", "--sampling-dtype", "bf16", "--output", str(tmp_path / "old")]) == 2
    err = capsys.readouterr().err
    assert "is_ratio_max=2 without off_policy_correction" in err and "token_truncate is what --tis-cap did" in err
