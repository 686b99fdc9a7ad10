"""Counting the work (tether/models/work.py): every backbone forward and the positions it computed, by phase, and
how many each online stage's step runs. A forward computed twice — the padding-free retry that ran every log-prob
pass twice on transformers 5.19, unseen by the step time — fails the pins below."""

import json

import pytest
import torch
from conftest import write_jsonl
from test_grpo import grpo_config
from test_ppo import count_reward, ppo_config
from transformers import AutoModelForCausalLM

from tether.models.work import counting, phase, section
from tether.rollout.forward import response_logprobs
from tether.stages.grpo import run_grpo
from tether.stages.ppo import run_ppo

RULE = "def count_a(completions):\n    return [float(c.count('a')) for c in completions]\n"


def test_each_forward_is_counted_under_its_innermost_phase_with_rows_times_columns(llama_dir):
    model = AutoModelForCausalLM.from_pretrained(llama_dir).eval()
    ids = torch.randint(3, 300, (2, 5))
    with torch.no_grad(), counting() as counter:
        model(input_ids=ids)  # no phase: "other", 2 x 5 = 10 positions
        with phase("outer"):
            model(input_ids=ids[:1])  # 1 x 5 = 5
            with phase("inner"):
                model(input_ids=ids[:, :3])  # 2 x 3 = 6
        with section("eval"), phase("sample"):  # generate: a prefill of 2 x 5, then 2 steps of 2 x 1
            model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=3,
                min_new_tokens=3,
                do_sample=False,
                pad_token_id=0,
            )
        assert counter.take() == {
            "forwards/eval_sample": 3,
            "positions/eval_sample": 14,
            "forwards/inner": 1,
            "positions/inner": 6,
            "forwards/other": 1,
            "positions/other": 10,
            "forwards/outer": 1,
            "positions/outer": 5,
        }
        assert counter.take() == {}  # take() starts the count again
    model(input_ids=ids)  # outside counting(): nothing listens
    assert counter.take() == {}


@pytest.mark.parametrize("padding_free", [False, True])
def test_one_forward_per_log_prob_pass_and_the_head_sees_only_scored_positions(llama_dir, tokenizer, padding_free):
    from tether.rollout.batch import Rollout
    from tether.rollout.prompts import response_mask_from_stops

    model = AutoModelForCausalLM.from_pretrained(llama_dir).eval()
    eos = tokenizer.eos_token_id
    prompts = tokenizer(["What is 1 + 2?", "Hi"], return_tensors="pt", padding=True, padding_side="left")
    response = torch.tensor([[5, 6, 7, eos], [8, eos, eos, eos]])  # 4 + 2 scored tokens (EOS included)
    mask, truncated = response_mask_from_stops(response, [eos])
    rollout = Rollout(prompts["input_ids"], prompts["attention_mask"], response, mask, truncated, ["a", "b"], ["", ""])
    head_rows = []
    handle = model.get_output_embeddings().register_forward_hook(  # the logits the head computed
        lambda module, args, logits: head_rows.append(logits.shape[:-1].numel())
    )
    with torch.no_grad(), counting() as counter:
        logprobs = response_logprobs(model, rollout, 1.0, padding_free=padding_free)
    handle.remove()
    counts = counter.take()
    assert counts["forwards/other"] == 1 and logprobs.shape == (2, 4)
    # padded: the B x T positions that predict a response token; padding-free: the 6 scored tokens alone
    assert head_rows == ([6] if padding_free else [2 * 4])
    padded = 2 * (prompts["input_ids"].shape[1] + 4)  # B x (P + T)
    real = int(prompts["attention_mask"].sum()) + 6  # the prompts' tokens and the attended response tokens
    if padding_free:  # the two sequences laid end to end: at least their tokens, never more than the padded rows
        assert real <= counts["positions/other"] <= padded
    else:
        assert counts["positions/other"] == padded


def _rows(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _step_work(row: dict) -> dict:
    """{phase: (forwards, positions)} of the step itself (an evaluation's eval_* phases left out)."""
    phases = [k.split("/", 1)[1] for k in row if k.startswith("forwards/")]
    return {p: (row[f"forwards/{p}"], row[f"positions/{p}"]) for p in phases if not p.startswith("eval_")}


@pytest.fixture
def prompts(tmp_path):
    return write_jsonl(
        tmp_path / "prompts.jsonl",
        [{"prompt": [{"role": "user", "content": f"Say {w}."}]} for w in ("hi", "cats", "dogs", "rain")] * 4,
    )


@pytest.mark.parametrize(
    "extra,expected",
    [
        # on policy (one pass of one minibatch): no old log-probs; the reference once; one grad forward
        ({}, {"reference": 1, "update": 1}),
        # two passes of two minibatches, two micro-batches each: old log-probs once, 2 x 2 x 2 grad forwards
        (
            {"algo__update_epochs": 2, "algo__minibatch": 8, "algo__micro_batch_size": 4},
            {"logprobs": 1, "reference": 1, "update": 8},
        ),
        # no KL anywhere: no reference forward
        ({"algo__kl_coef": 0.0}, {"update": 1}),
    ],
)
def test_a_group_step_runs_the_forwards_its_recipe_needs(llama_dir, prompts, tmp_path, extra, expected):
    rules = tmp_path / "rules.py"
    rules.write_text(RULE)
    out = tmp_path / "run"
    cfg = grpo_config(
        llama_dir,
        prompts,
        out,
        [f"{rules}:count_a"],
        train__max_steps=2,
        train__eval_every=0,
        train__save_every=0,
        model__padding_free=True,
        **extra,
    )
    run_grpo(cfg)
    for row in _rows(out):
        work = _step_work(row)
        sample = work.pop("sample")
        assert 1 <= sample[0] <= cfg.rollout.max_new_tokens  # a prefill, then one forward per new token
        assert {k: n for k, (n, _) in work.items()} == expected, row["step"]
        # a pass over the whole rollout in one forward costs the same positions whichever model runs it
        whole = [work[k][1] for k in ("reference", "logprobs") if k in work] + (
            [work["update"][1]] if expected["update"] == 1 else []
        )
        assert len(set(whole)) == 1, work


def test_a_group_step_forwards_each_prompt_once_for_its_group(llama_dir, prompts, tmp_path):
    """GRPO's 4 prompts x G 4 (the fixture's prompts): with --share-prompt (the default) the reference and update
    forwards lay each group after one copy of its prompt, so they compute fewer positions than one copy per
    response, with the same forwards; the step's figures agree to float32 rounding; the plan says which layout."""
    import yaml

    rules = tmp_path / "rules.py"
    rules.write_text(RULE)
    runs = {}
    for share in (True, False):
        out = tmp_path / f"share-{share}"
        cfg = grpo_config(
            llama_dir,
            prompts,
            out,
            [f"{rules}:count_a"],
            train__max_steps=1,
            train__eval_every=0,
            train__save_every=0,
            model__padding_free=True,
            model__share_prompt=share,
        )
        run_grpo(cfg)
        row = _rows(out)[-1]
        plan = yaml.safe_load((out / "config.yaml").read_text())["plan"]["log-prob rows"]
        runs[share] = (_step_work(row), row, plan)
    (shared, row, plan), (alone, alone_row, alone_plan) = runs[True], runs[False]
    assert {k: n for k, (n, _) in shared.items() if k != "sample"} == {"reference": 1, "update": 1}
    for name in ("reference", "update"):
        assert shared[name][0] == alone[name][0] and shared[name][1] < alone[name][1], name
    assert "after one copy of it" in plan and ";" not in alone_plan
    for key in ("score/mean", "policy/entropy", "policy/grad_norm"):
        assert row[key] == pytest.approx(alone_row[key], rel=1e-4, abs=1e-6), key


@pytest.mark.parametrize("layout", ["separate", "shared"])
def test_a_ppo_step_runs_one_forward_per_role_and_minibatch(llama_dir, prompts, tmp_path, layout):
    out = tmp_path / layout
    cfg = ppo_config(
        llama_dir,
        prompts,
        out,
        train__max_steps=2,
        train__eval_every=0,
        train__save_every=0,
        train__sample_every=0,
        critic__layout=layout,
        model__padding_free=True,
    )
    run_ppo(cfg, scorer=count_reward("a"))
    minibatches = cfg.rollout.rollout_size // cfg.algo.minibatch * cfg.algo.update_epochs  # 16 / 8 x 4 = 8
    expected = {"logprobs": 1, "reference": 1, "update": minibatches}
    if layout == "separate":  # the critic's own backbone: its values once, then once per minibatch
        expected["critic"] = 1 + minibatches
    for row in _rows(out):
        work = _step_work(row)
        work.pop("sample")
        assert {k: n for k, (n, _) in work.items()} == expected, row["step"]
        assert work["reference"][1] == work["logprobs"][1]  # the same rollout, laid out the same way


def test_an_online_dpo_step_runs_one_grad_forward_per_micro_batch(llama_dir, prompts, tmp_path):
    from test_dpo import JUDGE, _cfg

    from tether.stages.dpo import run_dpo

    judge = tmp_path / "judge.py"
    judge.write_text(JUDGE)
    over = {
        "data.path": "",
        "online.online": True,
        "rollout.prompts": str(prompts),
        "online.judge": f"{judge}:more_a",
        "online.rounds": 2,
        "rollout.prompts_per_step": 8,
        "online.steps_per_round": 2,
        "rollout.max_new_tokens": 8,
        "online.keep_truncated": True,
        "train.batch_size": 4,
        "train.micro_batch_size": 2,
        "train.save_every": 0,
    }
    out = tmp_path / "online"
    run_dpo(_cfg(llama_dir, "", out, **over))
    for row in _rows(out):
        work = _step_work(row)
        starts_a_round = row["step"] % 2 == 1  # a round is sampled, labelled and given reference log-probs then
        assert set(work) == ({"sample", "reference", "update"} if starts_a_round else {"update"}), row["step"]
        # a micro-batch's chosen and rejected answers in one forward: batch_size / micro_batch_size = 2
        assert work["update"][0] == 2
        if starts_a_round:  # the round's 8 pairs (16 answers) in one reference forward
            assert work["reference"][0] == 1 and 1 <= work["sample"][0] <= 8
