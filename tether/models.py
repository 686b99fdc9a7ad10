"""Load local Hugging Face causal LMs and tokenizers; LoRA; tiny models built from configs.

Everything loads from a path: nothing here reaches a hub.
"""
from __future__ import annotations

import logging
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from tether.config import ConfigError

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DISTINCT_PAD = "<|pad|>"


def _check_dir(path: str | Path, what: str) -> Path:
    path = Path(path)
    if not path.is_dir():
        raise ConfigError(f"{what} {path}: not a folder. tether loads local Hugging Face folders only "
                          "(config.json, weights, tokenizer files); nothing is downloaded")
    return path


def load_tokenizer(path: str | Path, trust_remote_code: bool = False):
    """A tokenizer from a local folder, with a pad token distinct from EOS.

    If the tokenizer has no pad token, or pads with EOS, a new ``<|pad|>``
    token is added: padding with EOS and masking padding out of the loss also
    masks the real EOS, and the model never learns to stop.
    """
    path = _check_dir(path, "tokenizer")
    tok = AutoTokenizer.from_pretrained(str(path), trust_remote_code=trust_remote_code)
    if tok.pad_token is None or (tok.eos_token is not None and tok.pad_token_id == tok.eos_token_id):
        tok.add_special_tokens({"pad_token": DISTINCT_PAD})
        log.warning("tokenizer %s had no distinct pad token; added %s (id %d)", path, DISTINCT_PAD, tok.pad_token_id)
    return tok


def load_model(path: str | Path, tokenizer=None, dtype: str = "float32", trust_remote_code: bool = False,
               device: str | torch.device | None = None):
    """A causal LM from a local folder. Embeddings grow if the tokenizer gained tokens (a pad token)."""
    path = _check_dir(path, "model")
    if not (path / "config.json").is_file():
        raise ConfigError(f"model {path}: no config.json; expected a folder written by save_pretrained")
    if dtype != "auto" and dtype not in DTYPES:
        raise ConfigError(f"dtype={dtype!r}: choose auto, {', '.join(DTYPES)}")
    torch_dtype = "auto" if dtype == "auto" else DTYPES[dtype]
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch_dtype, trust_remote_code=trust_remote_code)
    if tokenizer is not None:
        if len(tokenizer) > model.get_input_embeddings().weight.shape[0]:
            model.resize_token_embeddings(len(tokenizer))
        model.config.pad_token_id = tokenizer.pad_token_id
        if model.generation_config is not None:
            model.generation_config.pad_token_id = tokenizer.pad_token_id
    if device is not None:
        model.to(device)
    return model


def apply_lora(model, r: int, alpha: float, dropout: float, target_modules: list[str]):
    """Wrap ``model`` with trainable LoRA adapters (peft); the base weights are frozen."""
    from peft import LoraConfig, get_peft_model

    targets = target_modules[0] if target_modules == ["all-linear"] else list(target_modules)
    cfg = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=targets, task_type="CAUSAL_LM")
    try:
        return get_peft_model(model, cfg)
    except ValueError as exc:
        names = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)})
        raise ConfigError(f"--lora-target-modules {target_modules}: {exc}. Linear modules in this model: {names}") from None


def is_peft(model) -> bool:
    return hasattr(model, "peft_config")


def save_merged(model, tokenizer, out_dir: str | Path) -> None:
    """Save a plain Hugging Face model folder; LoRA adapters are merged into the weights first."""
    if is_peft(model):
        import copy

        model = copy.deepcopy(model).merge_and_unload()
    model.save_pretrained(str(out_dir))
    if tokenizer is not None:
        tokenizer.save_pretrained(str(out_dir))


def count_parameters(model) -> tuple[int, int]:
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return total, trainable


TINY_ARCHS = ("llama", "qwen2", "gpt2")


def tiny_config(arch: str, vocab_size: int, hidden: int = 64, layers: int = 2, heads: int = 4,
                max_positions: int = 256, bos_id: int | None = None, eos_id: int | None = None,
                pad_id: int | None = None):
    """A small randomly initialised config of a standard architecture (for the lab, the demo and tests)."""
    common = dict(vocab_size=vocab_size, bos_token_id=bos_id, eos_token_id=eos_id, pad_token_id=pad_id)
    if arch == "gpt2":
        return AutoConfig.for_model("gpt2", n_embd=hidden, n_layer=layers, n_head=heads, n_positions=max_positions,
                                    resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **common)
    if arch in ("llama", "qwen2"):
        return AutoConfig.for_model(arch, hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
                                    num_attention_heads=heads, num_key_value_heads=heads,
                                    max_position_embeddings=max_positions, tie_word_embeddings=True, **common)
    raise ConfigError(f"unknown tiny architecture {arch!r}; choose one of {TINY_ARCHS}")


def build_tiny_model(arch: str, tokenizer, out_dir: str | Path, seed: int = 0, **dims) -> Path:
    """Create, save and return the folder of a random tiny model (plus its tokenizer)."""
    cfg = tiny_config(arch, len(tokenizer), bos_id=tokenizer.bos_token_id, eos_id=tokenizer.eos_token_id,
                      pad_id=tokenizer.pad_token_id, **dims)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg)
    out_dir = Path(out_dir)
    model.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))
    return out_dir
