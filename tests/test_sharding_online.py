"""--fsdp for the online stages on two CPU processes (FSDP2 over gloo) against one unsharded process: the same samples,
scores, advantages and update figures, the same weights after several updates, and an exact resume."""

import pytest
import torch
from conftest import assert_same_adamw_weights
from safetensors.torch import load_file
from test_online_parallel import (  # noqa: F401 - files and inputs are fixtures
    ASYNC,
    Inputs,
    Together,
    assert_same_run,
    files,
    group_recipe_args,
    inputs,
    killed_and_resumed_on_two,
    lines,
    online_dpo_args,
    ppo_args,
)

from tether.cli import main as tether_main

FOREACH = ["--adamw", "foreach"]  # sharded parameters cannot take the fused kernel: both sides use the same AdamW


def set_flag(args: list[str], flag: str, value: str) -> list[str]:
    args[args.index(flag) + 1] = value
    return args


@pytest.mark.slow
@pytest.mark.parametrize("recipe, offload", [("grpo", False), ("grpo", True), ("dapo", False)])
def test_sharded_group_recipes_equal_one_unsharded_process(together, request, tmp_path, recipe, offload):
    """grpo (the reference sharded too: KL in the loss; and its shards offloaded to CPU memory, --offload-frozen)
    and dapo (dynamic sampling: rounds split unevenly) with a sharded reward model scored beside the rule at weight 0:
    the groups stay as flat as the rule makes them, so later rounds leave a process with nothing to score, which
    still joins the reward model's forwards (score_token_ids's lock step)."""
    one, two = together.pair(request, tmp_path)
    plan = " ".join((two / "config.yaml").read_text().split())  # YAML folds long lines
    assert "FSDP2 over 2 processes: the policy" in plan, plan
    assert ("the policy, the reference" in plan) == (recipe == "grpo"), plan  # dapo has no KL, so no reference
    assert ("the reference (its shards in CPU memory)" in plan) == offload, plan
    assert ("the reward model" in plan) == (recipe == "dapo"), plan
    assert_same_run(one, two)
    assert len(lines(two / "metrics.jsonl")) == 3
    if recipe == "dapo":
        rm_scores = [s["parts"]["reward_model"] for s in lines(one / "samples.jsonl")]
        assert len(set(rm_scores)) > 1  # the random head scores texts apart
        assert [s["parts"]["reward_model"] for s in lines(two / "samples.jsonl")] == pytest.approx(rm_scores, abs=1e-5)
        rounds = [m["sampling/rounds"] for m in lines(two / "metrics.jsonl")]
        assert max(rounds) > 1, rounds


@pytest.mark.slow
def test_sharded_ppo_beside_rollout_workers_equals_one_unsharded_process(together, request, tmp_path):
    """--fsdp with --max-staleness 1 (PPO, its critic sharded too; the group family samples through the same
    backend): each process's rollout worker is pushed the whole policy, gathered from the shards into the process's
    ordinary copy after each update, so two sharded processes train what one unsharded process beside its worker
    trains (the same samples, one update behind from the second step, the same weights)."""
    one, two = together.pair(request, tmp_path)
    assert_same_run(one, two)
    for out in (one, two):
        metrics = lines(out / "metrics.jsonl")
        assert [m["async/staleness_max"] for m in metrics] == [0.0, 1.0, 1.0]
        assert all(m["async/parity_max_diff"] < 1e-6 for m in metrics)


def random_reward_model(llama_dir, out):
    """A reward-model folder on the tiny llama with a random (not zero) head, so its scores differ between texts."""
    from tether.models.lm import load_tokenizer
    from tether.models.reward import load_reward_model, save_reward_model

    tokenizer = load_tokenizer(llama_dir)
    rm = load_reward_model(llama_dir, tokenizer, ["reward"])
    torch.manual_seed(0)
    with torch.no_grad():
        for q in rm.parameters():
            if not q.any():  # the new head
                q.normal_(0.0, 1.0)
    save_reward_model(rm, tokenizer, out, None)
    return out


@pytest.mark.slow
def test_a_killed_sharded_run_resumes_exactly_and_only_sharded_on_as_many(llama_dir, files, tmp_path, capsys):  # noqa: F811
    """kill -9 between checkpoints; the resumed run's samples and final weights equal the uninterrupted run's. Each
    process samples from its own RNG (no --response-seeds): its rng-<rank> file carries it."""
    rules, prompts = files
    args = set_flag(group_recipe_args(llama_dir, rules, prompts, "grpo"), "--max-steps", "6") + FOREACH + ["--fsdp"]
    args.remove("--response-seeds")  # sampled from each process's RNG

    def refused_unsharded(killed):
        # unsharded: the run's settings differ (its optimizer state is also keyed by parameter name). The settings
        # are compared before any process count is, so one process shows the refusal two would give, without a launch
        unsharded = [a for a in args if a != "--fsdp"]
        assert tether_main(unsharded + ["--output", str(killed), "--save-every", "2", "--resume"]) == 2
        assert "model.fsdp: True -> False" in capsys.readouterr().err

    w1, w2 = killed_and_resumed_on_two(args, tmp_path, capsys, refused_unsharded)
    assert sorted(w1) == sorted(w2)
    for name in w1:  # the same operations in the same order on the same process count: equal to the bit
        torch.testing.assert_close(w2[name], w1[name], rtol=0, atol=0, msg=name)


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["separate", "shared"])
def test_sharded_ppo_equals_one_unsharded_process(together, request, tmp_path, layout):
    """separate: policy, reference and critic sharded; shared: policy and reference sharded, the value head (one
    vector) whole on every process, its gradient summed by the data-parallel all-reduce."""
    one, two = together.pair(request, tmp_path)
    plan = " ".join((two / "config.yaml").read_text().split())  # YAML folds long lines
    assert "FSDP2 over 2 processes" in plan and ("the critic" in plan) == (layout == "separate"), plan
    assert_same_run(one, two)
    critic_file = "model.safetensors" if layout == "separate" else "value_head.safetensors"
    critic_one = load_file(str(one / "checkpoint-2" / "critic" / critic_file))
    critic_two = load_file(str(two / "checkpoint-2" / "critic" / critic_file))
    assert sorted(critic_one) == sorted(critic_two)
    assert_same_adamw_weights(
        critic_one, critic_two, 1e-4, 12, "critic"
    )  # --critic-lr 1e-4 (the default), 2 x 2 x 3 updates


@pytest.mark.slow
def test_sharded_online_dpo_equals_one_unsharded_process(together, request, tmp_path):
    """Each round's pairs sampled from the gathered copy; the update is the offline sharded DPO step."""
    one, two = together.pair(request, tmp_path)
    plan = " ".join((two / "config.yaml").read_text().split())  # YAML folds long lines
    assert "sharded over 2 processes (FSDP2)" in plan and "a gathered copy of the sharded policy" in plan, plan
    assert_same_run(one, two)
    r1, r2 = (lines(d / "rounds" / "round-1.jsonl") for d in (one, two))
    assert r1 == r2 and len(r1) > 0  # the second round was sampled from the updated weights alike


# The runs this file's tests compare unsharded on one process and sharded on two, made in one launch (Together):
# (their arguments from test_online_parallel's Inputs, the flags only the sharded run has).
def group_args(i: Inputs, recipe: str) -> list[str]:
    # 8 rows a minibatch over 2 processes in micro-batches of 3: 2 per process, the second short (lock step holds)
    args = group_recipe_args(i.llama_dir, i.rules, i.prompts, recipe) + FOREACH
    if recipe == "dapo":
        args += ["--reward-model", str(random_reward_model(i.llama_dir, i.root / "rm"))]
        args += ["--no-normalize-reward", "--reward-model-weight", "0"]
    return args


def short_ppo_args(i: Inputs, layout: str) -> list[str]:
    # 7 responses in minibatches of 3: the last minibatch has one row, so process 1 runs a lock-step filler
    args = set_flag(ppo_args(i.llama_dir, i.rules, i.prompts, layout), "--prompts-per-step", "7") + FOREACH
    return set_flag(set_flag(args, "--max-steps", "2"), "--eval-every", "2")


TOGETHER = {
    **{
        f"test_sharded_group_recipes_equal_one_unsharded_process[{recipe}-{offload}]": (
            lambda i, recipe=recipe: group_args(i, recipe),
            ["--fsdp"] + (["--offload-frozen"] if offload else []),
        )
        for recipe, offload in (("grpo", False), ("grpo", True), ("dapo", False))
    },
    "test_sharded_ppo_beside_rollout_workers_equals_one_unsharded_process": (
        lambda i: ppo_args(i.llama_dir, i.rules, i.prompts, "separate") + FOREACH + ASYNC,
        ["--fsdp"],
    ),
    **{
        f"test_sharded_ppo_equals_one_unsharded_process[{layout}]": (
            lambda i, layout=layout: short_ppo_args(i, layout),
            ["--fsdp"],
        )
        for layout in ("separate", "shared")
    },
    "test_sharded_online_dpo_equals_one_unsharded_process": (
        lambda i: online_dpo_args(i.llama_dir, i.rules, i.prompts) + FOREACH,
        ["--fsdp"],
    ),
}


@pytest.fixture(scope="module")
def together(request, inputs, tmp_path_factory) -> Together:  # noqa: F811 - inputs is test_online_parallel's fixture
    return Together(request, TOGETHER, inputs, tmp_path_factory.mktemp("sharded"))
