"""Precision and memory options of every stage: gradient checkpointing changes no gradient, bf16 autocast keeps
fp32 weights and fp32 log-probs, --dtype bf16 trains bf16 weights, and every stage runs with each of them."""

import json
import math

import pytest
import torch
from conftest import BF16_REFUSED, bf16_refused_here, rules_and_prompts, write_jsonl
from safetensors.torch import load_file

from tether.cli import main as tether_main
from tether.config import ConfigError
from tether.models.lm import load_tokenizer, load_trainable_model
from tether.rollout.backends import generate_rollout
from tether.rollout.forward import response_logprobs
from tether.sections import ModelSection


def _model(path, **options):
    section = ModelSection(path=str(path), **options)
    tok = load_tokenizer(path)
    torch.manual_seed(0)  # the same LoRA initialisation
    return load_trainable_model(section, tok, None), tok


def _grads(model, tok, texts):
    batch = tok(texts, return_tensors="pt", padding=True)
    model.train()
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["input_ids"])
    model.zero_grad(set_to_none=True)
    out.loss.backward()
    return {n: q.grad.clone() for n, q in model.named_parameters() if q.requires_grad}


@pytest.mark.parametrize("arch", ["llama", "gpt2", "qwen2"])
@pytest.mark.parametrize("lora_r", [0, 4])
def test_gradient_checkpointing_gives_the_same_gradients(model_dirs, arch, lora_r):
    texts = ["What is 12 + 7?\n12 + 7 = 19.", "Tell me about cats. Cats sleep a lot."]
    plain, tok = _model(model_dirs[arch], lora_r=lora_r)
    checkpointed, _ = _model(model_dirs[arch], lora_r=lora_r, gradient_checkpointing=True)
    base = checkpointed.get_base_model() if lora_r else checkpointed
    assert any(getattr(m, "gradient_checkpointing", False) for m in base.modules())
    g1, g2 = _grads(plain, tok, texts), _grads(checkpointed, tok, texts)
    assert g1.keys() == g2.keys() and len(g1) > 0
    for name in g1:
        torch.testing.assert_close(g2[name], g1[name], rtol=1e-5, atol=1e-7, msg=name)


def test_bf16_autocast_keeps_fp32_weights_and_fp32_logprobs(llama_dir):
    if bf16_refused_here():
        with pytest.raises(ConfigError, match=BF16_REFUSED):
            _model(llama_dir, mixed_precision="bf16")
        return
    model, tok = _model(llama_dir, mixed_precision="bf16")
    assert all(q.dtype == torch.float32 for q in model.parameters())
    torch.manual_seed(0)
    rollout = generate_rollout(model, tok, ["Tell me about cats.", "hi"], 8, 1.0)
    with torch.no_grad():
        old = response_logprobs(model, rollout, 1.0)
    new = response_logprobs(model, rollout, 1.0)
    assert old.dtype == new.dtype == torch.float32
    torch.testing.assert_close(new.detach(), old)  # sampled, scored and trained in the same precision: ratio 1
    plain, _ = _model(llama_dir)
    with torch.no_grad():
        full = response_logprobs(plain, rollout, 1.0)
    mask = rollout.response_mask.bool()
    gap = (full - old)[mask].abs().max().item()
    assert 0 < gap < 0.1  # bf16 arithmetic is visible, and small
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert model(input_ids=rollout.prompt_ids).logits.dtype == torch.bfloat16  # the forwards really autocast


RULES = (
    "def count_a(completions):\n    return [float(c.count('a')) for c in completions]\n"
    # online DPO's labeller: two different answers score apart whatever the sampler drew (count_a ties often, and
    # a round with every pair tied has nothing to train on)
    "def text_code(completions):\n    return [float(sum((i + 1) * ord(ch) for i, ch in enumerate(c))) for c in completions]\n"
)


@pytest.fixture(scope="module")
def stage_inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("precision")
    rules, prompts = rules_and_prompts(root, RULES, [{"prompt": f"Say {w}."} for w in ("hi", "cats", "dogs", "rain")])
    pairs = write_jsonl(
        root / "pairs.jsonl",
        [{"prompt": f"Q{i}: ", "chosen": "Cats sleep a lot.", "rejected": "Cats bark."} for i in range(8)],
    )
    sft = write_jsonl(
        root / "sft.jsonl", [{"prompt": f"What is {i} + 1?\n", "completion": f"{i + 1}"} for i in range(8)]
    )
    return rules, prompts, pairs, sft


def stage_args(stage, model, files):
    rules, prompts, pairs, sft = files
    common = ["--model", str(model), "--max-steps", "2", "--save-every", "0", "--report-to", "none", "--lr", "1e-3"]
    online = [
        "--prompts",
        str(prompts),
        "--reward",
        f"{rules}:count_a",
        "--prompts-per-step",
        "2",
        "--max-new-tokens",
        "6",
    ]
    return {
        "sft": ["sft", "--data", str(sft), "--batch-size", "4", "--micro-batch-size", "2", "--max-length", "32"],
        "rm": ["rm", "--data", str(pairs), "--batch-size", "4", "--micro-batch-size", "2", "--max-length", "32"],
        "dpo": ["dpo", "--data", str(pairs), "--batch-size", "4", "--micro-batch-size", "2", "--max-length", "32"],
        "grpo": ["grpo", *online, "--group-size", "2"],
        "ppo": ["ppo", *online, "--critic-layout", "separate"],
        "dpo-online": [
            "dpo",
            "--online",
            *online[:2],
            "--reward",
            f"{rules}:text_code",
            "--prompts-per-step",
            "4",
            *online[6:],
            "--rounds",
            "1",
            "--steps-per-round",
            "2",
            "--batch-size",
            "2",
            "--micro-batch-size",
            "1",
            "--keep-truncated",
            "--temperature",
            "1.5",
        ],
    }[stage] + common


STAGES = ["sft", "rm", "dpo", "grpo", "ppo", "dpo-online"]


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize(
    "setting",
    [["--dtype", "bf16"], ["--mixed-precision", "bf16", "--frozen-dtype", "bf16"], ["--gradient-checkpointing"]],
    ids=["bf16-weights", "bf16-autocast", "checkpointing"],
)
def test_every_stage_runs_with_each_precision_setting(llama_dir, stage_inputs, tmp_path, stage, setting, capsys):
    out = tmp_path / "run"
    if "bf16" in setting and bf16_refused_here():  # refused in one line naming the setting, before any forward
        assert tether_main(stage_args(stage, llama_dir, stage_inputs) + setting + ["--output", str(out)]) == 2
        assert BF16_REFUSED in capsys.readouterr().err
        return
    assert tether_main(stage_args(stage, llama_dir, stage_inputs) + setting + ["--output", str(out)]) == 0
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    losses = [v for r in rows for k, v in r.items() if k in ("train/loss", "policy/loss", "value/loss")]
    assert losses and all(math.isfinite(v) for v in losses)
    weights = load_file(str(out / "final" / "model.safetensors"))
    dtypes = {w.dtype for w in weights.values()}
    assert dtypes == ({torch.bfloat16} if setting[:2] == ["--dtype", "bf16"] else {torch.float32})
