"""--fsdp on two CPU processes (FSDP2 over gloo): sharded SFT and DPO train what one unsharded process trains, their
checkpoints are plain Hugging Face folders, and a sharded run resumes exactly from one."""

import json
import shutil
from pathlib import Path

import pytest
from conftest import FP64, assert_same_adamw_weights, flags, write_jsonl
from safetensors.torch import load_file
from test_online_parallel import Together, launch, lines

from tether.cli import main as tether_main

CONFIGS = Path(__file__).resolve().parent.parent / "configs" / "accelerate"
# Both sides use foreach AdamW: sharded parameters (DTensors) cannot use the fused kernel, and fused and foreach
# round differently (about 1e-7 per update), which is not what these tests compare.


# Weights after a few steps differ by float rounding: the sharded run sums gradients in another order, which AdamW
# can amplify in weights whose gradient is near zero, so every run compared here trains in float64 (conftest's FP64)
# and assert_same_adamw_weights bounds the difference from the arithmetic. Every run here trains at --lr 3e-3 for at
# most 6 updates.
LR, MAX_UPDATES = 3e-3, 6


def assert_same_training(one, two, keys):
    m1, m2 = lines(one / "metrics.jsonl"), lines(two / "metrics.jsonl")
    assert [m["step"] for m in m1] == [m["step"] for m in m2]
    for a, b in zip(m1, m2):
        for key in keys:
            if key in a:
                assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-7), (a["step"], key)
    w1, w2 = load_file(str(one / "final" / "model.safetensors")), load_file(str(two / "final" / "model.safetensors"))
    assert sorted(w1) == sorted(w2)  # the same plain folder: a tied lm_head is not written twice
    assert_same_adamw_weights(w1, w2, LR, MAX_UPDATES, str(two))


def run_args(stage: str, model, data, eval_data=None, **settings) -> list[str]:
    """A run both sides of a comparison make, in float64 with the foreach AdamW (both above): ``settings`` over the
    shared ones (lr 3e-3, no loggers, held-out data = the training data unless named)."""
    shared = dict(lr="3e-3", report_to="none", adamw="foreach")
    return flags(stage, model=model, data=data, eval_data=eval_data or data, **{**shared, **settings}) + FP64


def pair_rows(n: int, chosen: str, rejected: str, more_chosen: int, more_rejected: int) -> list[dict]:
    """n preference rows whose answers differ in length by row (" yes" and " no" repeated by i mod the counts)."""
    return [
        {
            "prompt": f"Q{i}: ",
            "chosen": chosen + " yes" * (i % more_chosen),
            "rejected": rejected + " no" * (i % more_rejected),
        }
        for i in range(n)
    ]


@pytest.mark.slow
def test_sharded_sft_equals_one_process_and_resumes_exactly(llama_dir, addition_files, tmp_path, capsys):
    train_path, eval_path = addition_files
    args = run_args(
        "sft",
        llama_dir,
        train_path,
        eval_path,
        max_length=64,
        batch_size=8,
        micro_batch_size=2,
        max_steps=4,
        eval_every=2,
        save_every=2,
    )
    two = tmp_path / "two"
    proc = launch(args + ["--fsdp", "--output", str(two)], config_file=str(CONFIGS / "cpu.yaml"))  # the shipped file
    assert "sharded over 2 processes (FSDP2)" in (two / "config.yaml").read_text(), proc.stderr[-2000:]
    assert tether_main(args + ["--output", str(tmp_path / "one")]) == 0
    keys = ("train/loss", "train/grad_norm", "train/tokens", "eval/loss")
    assert_same_training(tmp_path / "one", two, keys)

    # what a kill after checkpoint-2 leaves: resume it, sharded, and finish as the uninterrupted run did
    resumed = tmp_path / "resumed"
    shutil.copytree(two, resumed)
    shutil.rmtree(resumed / "checkpoint-4")
    shutil.rmtree(resumed / "final")
    launch(args + ["--fsdp", "--output", str(resumed), "--resume"])
    assert_same_training(two, resumed, keys)
    # a sharded run resumed unsharded: refused, naming the setting (its optimizer state is keyed by parameter name)
    assert tether_main(args + ["--output", str(resumed), "--resume", "--max-steps", "6"]) == 2
    assert "model.fsdp: True -> False" in capsys.readouterr().err
    saved = json.loads((two / "checkpoint-4" / "optimizer.json").read_text())
    assert "model.layers.0.self_attn.q_proj.weight" in json.dumps(saved)  # the full state, keyed by parameter name


@pytest.mark.slow
def test_sharded_dpo_equals_one_process(together, request, tmp_path):
    one, two = together.pair(request, tmp_path)
    keys = ("train/loss", "train/grad_norm", "train/rewards/margins", "eval/loss", "eval/rewards/accuracy")
    assert_same_training(one, two, keys)


@pytest.mark.parametrize("stage", ["grpo", "ppo"])
def test_the_online_stages_refuse_lora_with_fsdp_and_say_why(llama_dir, tmp_path, capsys, stage):
    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "Q: ", "chosen": "a", "rejected": "b"}])
    extra = ["--prompts", str(data), "--reward-model", str(tmp_path), "--lora-r", "4"]
    assert tether_main([stage, "--model", str(llama_dir), *extra, "--fsdp", "--output", str(tmp_path / "o")]) == 2
    assert "--fsdp with LoRA is not built: the adapters and their AdamW states are small" in " ".join(
        capsys.readouterr().err.split()
    )
    assert not (tmp_path / "o").exists()  # refused before the run folder is made


@pytest.mark.parametrize(
    "stage, extra, message",
    [
        ("grpo", [], "offload_frozen offloads the shards of a sharded reference: it needs fsdp"),
        ("dpo", ["--fsdp"], "model.offload_frozen: tether dpo holds no sharded frozen model to offload"),
    ],
)
def test_offloading_the_reference_is_refused_where_nothing_sharded_holds_it(
    llama_dir, tmp_path, capsys, stage, extra, message
):
    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "Q: ", "chosen": "a", "rejected": "b"}])
    args = [stage, "--model", str(llama_dir), "--offload-frozen", *extra, "--output", str(tmp_path / "o")]
    args += ["--prompts", str(data), "--reward-model", str(tmp_path)] if stage == "grpo" else ["--data", str(data)]
    assert tether_main(args) == 2
    assert message in " ".join(capsys.readouterr().err.split())


@pytest.mark.parametrize("name", ["cpu.yaml", "multi-gpu.yaml", "multi-node.yaml"])
def test_shipped_accelerate_configs_are_valid_accelerate_configs(name):
    from accelerate.commands.config.config_args import load_config_from_file

    config = load_config_from_file(str(CONFIGS / name))
    assert config.distributed_type == "MULTI_GPU" and config.mixed_precision == "no"
    assert config.num_processes >= 2


@pytest.mark.slow
def test_sharded_reward_model_equals_one_process(together, request, tmp_path):
    """Including best/ (gathered at each new best) and final/ with its probes (on process 0, from a gathered copy)."""
    one, two = together.pair(request, tmp_path)
    assert_same_training(one, two, ("train/loss", "train/grad_norm", "eval/loss", "eval/accuracy"))
    for folder in ("best", "checkpoint-4"):
        w1 = load_file(str(one / folder / "model.safetensors"))
        w2 = load_file(str(two / folder / "model.safetensors"))
        assert sorted(w1) == sorted(w2)
        assert_same_adamw_weights(w1, w2, LR, MAX_UPDATES, folder)
    s1, s2 = (json.loads((d / "summary.json").read_text()) for d in (one, two))
    assert s2["probes"]["length_correlation"] == pytest.approx(s1["probes"]["length_correlation"], abs=1e-5)
    for head, stats in s1["normalization"].items():
        assert s2["normalization"][head]["mean"] == pytest.approx(stats["mean"], abs=1e-5)


@pytest.mark.slow
def test_token_budget_micro_batches_sharded_equal_one_process_by_examples(together, request, tmp_path):
    """Micro-batches by tokens: each process splits its share its own way (at 60 tokens, 4 and 3 micro-batches in
    step 1; the short process runs a weight-0 pass so the sharded forwards pair up), and the steps equal one
    process's by examples."""
    one, two = together.pair(request, tmp_path, "--micro-batch-size", "2")
    assert "up to 60 tokens" in (two / "config.yaml").read_text()
    assert_same_training(one, two, ("train/loss", "train/grad_norm", "eval/loss"))


# The runs this file's tests compare unsharded on one process and sharded on two, made in one launch (Together):
# (their arguments from the llama and the file's data folder, the flags only the sharded run has).
def dpo_args(llama_dir, root: Path) -> list[str]:
    data = write_jsonl(root / "dpo-pairs.jsonl", pair_rows(24, "Cats sleep a lot.", "Cats bark.", 3, 4))
    settings = dict(max_length=48, batch_size=4, micro_batch_size=1, max_steps=3, eval_every=3, save_every=0)
    return run_args("dpo", llama_dir, data, **settings)


def rm_args(llama_dir, root: Path) -> list[str]:
    data = write_jsonl(root / "rm-pairs.jsonl", pair_rows(32, "Cats sleep a lot.", "Cats are dogs.", 5, 3))
    settings = dict(max_length=48, batch_size=8, micro_batch_size=2, max_steps=4, eval_every=2, save_every=2)
    return run_args("rm", llama_dir, data, **settings)


def token_budget_args(llama_dir, root: Path) -> list[str]:
    data = write_jsonl(root / "short-pairs.jsonl", pair_rows(32, "Cats sleep a lot.", "No.", 7, 2))
    return run_args("rm", llama_dir, data, max_length=48, batch_size=8, max_steps=4, eval_every=4, save_every=0)


TOGETHER = {
    "test_sharded_dpo_equals_one_process": (lambda i: dpo_args(*i), ["--fsdp"]),
    "test_sharded_reward_model_equals_one_process": (lambda i: rm_args(*i), ["--fsdp"]),
    "test_token_budget_micro_batches_sharded_equal_one_process_by_examples": (
        lambda i: token_budget_args(*i),
        ["--micro-batch-tokens", "60", "--fsdp"],
    ),
}


@pytest.fixture(scope="module")
def together(request, llama_dir, tmp_path_factory) -> Together:
    data = tmp_path_factory.mktemp("data")
    return Together(request, TOGETHER, (llama_dir, data), tmp_path_factory.mktemp("sharded"))
