"""Loading local models of several architectures, pad tokens, LoRA and merge-and-save."""
import pytest
import torch
from transformers import AutoModelForCausalLM

from tether.config import ConfigError
from tether.models import apply_lora, load_model, load_tokenizer, save_merged
from tether.tokenizer import train_bpe_tokenizer


@pytest.mark.parametrize("arch,cls", [("gpt2", "GPT2LMHeadModel"), ("llama", "LlamaForCausalLM"), ("qwen2", "Qwen2ForCausalLM")])
def test_load_each_architecture_by_path(arch, cls, model_dirs):
    tok = load_tokenizer(model_dirs[arch])
    model = load_model(model_dirs[arch], tok)
    assert type(model).__name__ == cls
    assert tok.pad_token_id is not None and tok.pad_token_id != tok.eos_token_id
    out = model(input_ids=torch.tensor([[1, 2, 3]])).logits
    assert out.shape[-1] >= len(tok) - 1


def test_bf16_dtype_option(llama_dir):
    assert load_model(llama_dir, dtype="bfloat16").dtype == torch.bfloat16
    with pytest.raises(ConfigError, match="dtype='fp8'"):
        load_model(llama_dir, dtype="fp8")


def test_missing_folder_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="not a folder.*nothing is downloaded"):
        load_model(tmp_path / "gpt2-from-the-hub")
    with pytest.raises(ConfigError, match="no config.json"):
        load_model(tmp_path)


def test_tokenizer_without_pad_gets_a_distinct_pad_and_the_model_grows(tmp_path):
    from tether.models import build_tiny_model

    tok = train_bpe_tokenizer(["hello world, the answer is 42."] * 10, vocab_size=280, with_pad=False)
    assert tok.pad_token is None
    folder = build_tiny_model("llama", tok, tmp_path / "nopad", hidden=32, layers=1, heads=2)
    loaded = load_tokenizer(folder)
    assert loaded.pad_token == "<|pad|>" and loaded.pad_token_id != loaded.eos_token_id
    model = load_model(folder, loaded)
    assert model.get_input_embeddings().weight.shape[0] >= len(loaded)
    assert model.config.pad_token_id == loaded.pad_token_id


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


def test_lora_bad_target_lists_the_linear_modules(llama_dir):
    with pytest.raises(ConfigError, match="Linear modules in this model: .*q_proj"):
        apply_lora(load_model(llama_dir), r=4, alpha=8, dropout=0.0, target_modules=["attn_qkv"])


def test_damaged_model_folders_are_named_before_transformers_reads_them(llama_dir, tokenizer, tmp_path):
    import shutil

    from tether.config import ConfigError
    from tether.models import load_model, load_tokenizer

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
