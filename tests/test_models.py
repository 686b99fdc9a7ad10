"""Loading local models of several architectures, pad tokens, LoRA and merge-and-save."""

import json

import pytest
import torch
from conftest import BF16_REFUSED, bf16_refused_here
from transformers import AutoModelForCausalLM

from tether.config import ConfigError
from tether.lab.tokenizer import train_bpe_tokenizer
from tether.models.lm import apply_lora, load_model, load_tokenizer, save_merged


@pytest.mark.parametrize(
    "arch,cls", [("gpt2", "GPT2LMHeadModel"), ("llama", "LlamaForCausalLM"), ("qwen2", "Qwen2ForCausalLM")]
)
def test_load_each_architecture_by_path(arch, cls, model_dirs):
    tok = load_tokenizer(model_dirs[arch])
    model = load_model(model_dirs[arch], tok)
    assert type(model).__name__ == cls
    assert tok.pad_token_id is not None and tok.pad_token_id != tok.eos_token_id
    out = model(input_ids=torch.tensor([[1, 2, 3]])).logits
    assert out.shape[-1] >= len(tok) - 1


def test_bf16_dtype_option(llama_dir):
    if bf16_refused_here():
        with pytest.raises(ConfigError, match=BF16_REFUSED):
            load_model(llama_dir, dtype="bfloat16")
    else:
        assert load_model(llama_dir, dtype="bfloat16").dtype == torch.bfloat16
    with pytest.raises(ConfigError, match="dtype='fp8'"):
        load_model(llama_dir, dtype="fp8")


def test_missing_folder_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="not a folder.*nothing is downloaded"):
        load_model(tmp_path / "gpt2-from-the-hub")
    with pytest.raises(ConfigError, match="no config.json"):
        load_model(tmp_path)


def test_padding_adds_no_token_and_the_embedding_keeps_its_size(tmp_path):
    """No pad token (or pad == EOS): padding borrows EOS, so a LoRA adapter still fits the untouched base."""
    from tether.models.lm import build_tiny_model

    tok = train_bpe_tokenizer(["hello world, the answer is 42."] * 10, vocab_size=280, with_pad=False)
    assert tok.pad_token is None
    folder = build_tiny_model("llama", tok, tmp_path / "nopad", hidden=32, layers=1, heads=2)
    vocab = len(tok)
    loaded = load_tokenizer(folder)
    assert len(loaded) == vocab and loaded.pad_token == loaded.eos_token
    model = load_model(folder, loaded)
    assert model.get_input_embeddings().weight.shape[0] == vocab
    assert model.config.pad_token_id == loaded.eos_token_id


def test_lora_trains_only_adapters_and_merge_and_save_matches(llama_dir, tmp_path):
    tok = load_tokenizer(llama_dir)
    model = apply_lora(load_model(llama_dir, tok), r=4, alpha=8, dropout=0.0, target_modules=["q_proj", "v_proj"])
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    with torch.no_grad():  # make the adapter non-trivial so merging matters
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)
    ids = torch.tensor([[5, 6, 7, 8]])
    expected = model(input_ids=ids).logits
    save_merged(model, tok, tmp_path / "merged")
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    assert not any("lora" in n for n, _ in merged.named_parameters())
    torch.testing.assert_close(merged(input_ids=ids).logits, expected, atol=1e-4, rtol=1e-4)


def test_lora_on_an_embedding_tied_to_the_other_end_is_refused(llama_dir):
    """The tiny llama ties lm_head to embed_tokens: an adapter on either would be merged into the shared weight,
    changing both ends of final/ (its logits moved by 0.4 against the trained adapter's in a 3-step SFT)."""
    assert load_model(llama_dir).config.tie_word_embeddings
    for target in ("lm_head", "embed_tokens"):
        with pytest.raises(ConfigError, match="tied to its .* embedding .*leave it out"):
            apply_lora(load_model(llama_dir), r=4, alpha=8, dropout=0.0, target_modules=["q_proj", target])
    apply_lora(load_model(llama_dir), r=4, alpha=8, dropout=0.0, target_modules=["q_proj"])  # the rest is as before


def test_lora_bad_target_lists_the_linear_modules(llama_dir):
    with pytest.raises(ConfigError, match="Linear modules in this model: .*q_proj"):
        apply_lora(load_model(llama_dir), r=4, alpha=8, dropout=0.0, target_modules=["attn_qkv"])


def test_damaged_model_folders_are_named_before_transformers_reads_them(llama_dir, tokenizer, tmp_path):
    import shutil

    from tether.config import ConfigError
    from tether.models.lm import load_model, load_tokenizer

    def copy(name):
        folder = tmp_path / name
        shutil.copytree(llama_dir, folder)
        return folder

    no_tokenizer = copy("no-tokenizer")
    for f in no_tokenizer.glob("tokenizer*"):
        f.unlink()
    with pytest.raises(ConfigError, match=r"tokenizer .*no-tokenizer: no tokenizer files"):
        load_tokenizer(no_tokenizer)
    truncated = copy("truncated")
    weights = truncated / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(ConfigError, match=r"truncated: model.safetensors is not a readable safetensors file"):
        load_model(truncated, tokenizer)
    garbage = copy("garbage-config")
    (garbage / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match=r"garbage-config: config.json is not valid JSON"):
        load_model(garbage, tokenizer)
    no_weights = copy("no-weights")
    (no_weights / "model.safetensors").unlink()
    with pytest.raises(ConfigError, match=r"no-weights: no weights"):
        load_model(no_weights, tokenizer)
    # JSON that transformers' validation refuses: the error names config.json, from the model's loader and from the
    # tokenizer's (which reads the model's config too), not a traceback nor "tokenizer cannot be loaded"
    for name, field, value in (("heads", "num_attention_heads", 3), ("text-size", "hidden_size", "32")):
        folder = copy(name)
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, field: value}))
        for load in (lambda: load_model(folder, tokenizer), lambda: load_tokenizer(folder)):
            with pytest.raises(ConfigError, match=rf"{name}/config.json: StrictDataclass"):
                load()


def test_examples_past_the_models_context_are_dropped_and_counted_not_a_crash(model_dirs, tmp_path, capsys):
    """GPT-2 with 128 positions and the default --max-length 1024: a long example used to die in the position
    table; now the context is the limit, said once, and the example is counted as too long."""
    from conftest import write_jsonl

    import tether.models.lm
    from tether.config import build_config
    from tether.models.lm import model_context
    from tether.stages.sft import SFTConfig, load_sft_data

    tether.models.lm._TOLD.clear()  # said once per process: an earlier test may have had it said
    assert {arch: model_context(path) for arch, path in model_dirs.items()} == {"gpt2": 128, "llama": 128, "qwen2": 128}
    rows = [{"prompt": "Say a lot.", "completion": " ".join(["cats"] * 200)}] + [
        {"prompt": "Say hi.", "completion": "hi"}
    ] * 4
    data = write_jsonl(tmp_path / "d.jsonl", rows)
    cfg = build_config(
        SFTConfig,
        overrides={
            "model.path": str(model_dirs["gpt2"]),
            "data.path": str(data),
            "data.eval_fraction": 0.0,
            "train.output": str(tmp_path / "o"),
        },
    )
    from tether.models.lm import load_tokenizer

    train, _, (report,) = load_sft_data(cfg, load_tokenizer(model_dirs["gpt2"]))
    assert len(train) == 4 and report.dropped == {"longer than max_length=128 tokens": 1}
    # 1024 is the default, not the user's choice: said as a fact, not a warning about a flag they never passed
    assert "max_length: the model's context, 128 tokens (the default 1024 is longer)" in capsys.readouterr().err


def test_a_prompt_that_leaves_no_room_for_its_response_is_named(model_dirs, tmp_path):
    import pytest
    from conftest import write_jsonl

    from tether.config import ConfigError, build_config
    from tether.stages.grpo import run_grpo
    from tether.stages.grpo_config import GRPOConfig

    (tmp_path / "r.py").write_text("def f(completions):\n    return [0.0] * len(completions)\n")
    prompts = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "Say hi."}, {"prompt": "cats " * 100}])
    cfg = build_config(
        GRPOConfig,
        overrides={
            "model.path": str(model_dirs["gpt2"]),
            "rollout.prompts": str(prompts),
            "rewards.reward": [f"{tmp_path}/r.py:f"],
            "rollout.max_new_tokens": 32,
            "rollout.prompts_per_step": 2,
            "rollout.group_size": 2,
            "train.output": str(tmp_path / "o"),
            "train.report_to": ["none"],
        },
    )
    with pytest.raises(
        ConfigError,
        match=r"p.jsonl row 2: \d+ prompt tokens \+ max_new_tokens 32 = \d+ is more than "
        r"the model's context \(128 positions\)",
    ):
        run_grpo(cfg)


def test_a_corrupt_pytorch_bin_is_named_before_transformers_unpickles_it(llama_dir, tmp_path):
    """Only a pytorch_model.bin, and it is damaged: an error naming the file, not an UnpicklingError traceback."""
    import shutil

    folder = tmp_path / "bin-model"
    shutil.copytree(llama_dir, folder)
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(b"\x80\x04garbage, not torch.save's archive")
    with pytest.raises(ConfigError, match=r"pytorch_model.bin is not a readable PyTorch weights file"):
        load_model(folder)
    # a good .bin (torch.save's zip archive) loads, through torch.load(weights_only=True)
    model = AutoModelForCausalLM.from_pretrained(llama_dir)
    torch.save(model.state_dict(), folder / "pytorch_model.bin")
    loaded = load_model(folder)
    assert torch.equal(loaded.get_input_embeddings().weight, model.get_input_embeddings().weight)


@pytest.mark.parametrize("flag", ["rm --model", "grpo --reward-model", "grpo --process-reward-model"])
def test_a_pytorch_bin_the_weights_only_loader_refuses_is_one_line_for_every_model_folder(
    flag, llama_dir, tmp_path, capsys
):
    """A pytorch_model.bin that holds an object (here an argparse.Namespace) beside its tensors: transformers'
    weights-only load refuses it, and every folder tether opens says so in one line naming the file — not only
    --model (whose load was guarded) but `tether rm --model`, --reward-model and --process-reward-model."""
    import argparse
    import shutil

    from conftest import write_jsonl

    from tether.cli import main

    folder = tmp_path / "pickled"
    shutil.copytree(llama_dir, folder)
    (folder / "model.safetensors").unlink()
    state = dict(AutoModelForCausalLM.from_pretrained(llama_dir).state_dict())
    torch.save({**state, "args": argparse.Namespace(lr=1.0)}, folder / "pytorch_model.bin")
    stage, option = flag.split()
    if stage == "rm":
        data = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "hi", "chosen": "a b", "rejected": "c"}] * 4)
        args = ["rm", "--model", str(folder), "--data", str(data)]
    else:
        (tmp_path / "r.py").write_text("def f(completions):\n    return [0.0] * len(completions)\n")
        prompts = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "hi"}] * 4)
        args = ["grpo", "--model", str(llama_dir), "--prompts", str(prompts), option, str(folder)]
        args += [] if option == "--reward-model" else ["--reward", f"{tmp_path}/r.py:f"]
    assert main(args + ["--output", str(tmp_path / "o"), "--report-to", "none"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "UnpicklingError" not in err
    assert (
        f"model {folder}: pytorch_model.bin holds more than tensors, and the weights-only loader refuses it "
        "(Unsupported global: GLOBAL argparse.Namespace" in err
    ), err


def test_checkpoint_weights_are_the_merged_models_and_leave_the_adapters_alone(llama_dir):
    """What a serving engine is sent (rollout/vllm_backend.py): the weights save_merged would write, under the same
    names and bit for bit equal (W + ΔW computed the way peft merges), with the LoRA model itself unchanged."""
    import copy

    from tether.models.lm import checkpoint_weights

    model = apply_lora(load_model(llama_dir), 4, 8.0, 0.0, ["q_proj", "v_proj"])
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    sent = checkpoint_weights(model)
    merged = copy.deepcopy(model).merge_and_unload().state_dict()
    assert sorted(sent) == sorted(merged)
    assert all(torch.equal(sent[k], merged[k]) for k in merged)
    assert any(not torch.equal(sent[k], load_model(llama_dir).state_dict()[k]) for k in sent)  # the adapters count
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    plain = load_model(llama_dir)
    assert checkpoint_weights(plain).keys() == plain.state_dict().keys()
