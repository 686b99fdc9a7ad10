"""Load local Hugging Face causal LMs and tokenizers; LoRA; tiny models built from configs.

Everything loads from a path: nothing here reaches a hub.
"""

from __future__ import annotations

import logging
import os
import pickle  # noqa: S403 - for the exception type torch.load raises on a .bin it refuses; nothing is unpickled here
from pathlib import Path

import torch
from huggingface_hub.errors import StrictDataclassError
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from tether.config import ConfigError
from tether.models.cpu import refuse_bf16_attention_where_torch_cannot
from tether.models.folders import check_dir, check_model_folder, config_invalid
from tether.models.vision import VISION_TOWER_MODULES, freeze_vision_tower, is_vision_language

log = logging.getLogger(__name__)

DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "float64": torch.float64,  # numerical reference runs (the tests' N processes = 1 checks)
    "fp64": torch.float64,
}


def end_of_turn_id(tokenizer) -> int | None:
    """The special token the chat template closes an assistant turn with (ChatML's <|im_end|>, Llama 3's <|eot_id|>,
    Gemma's <end_of_turn>), found by rendering a turn; None without a template or when none follows the turn."""
    from tether.models.chat import chat_choice, has_template, template_text

    if not has_template(tokenizer):
        return None
    key = (id(tokenizer), template_text(tokenizer), str(chat_choice(tokenizer).kwargs), tokenizer.eos_token)
    if key not in _END_OF_TURN:  # once per tokenizer and template: data preparation asks for every conversation
        _END_OF_TURN[key] = _probe_end_of_turn(tokenizer)
    return _END_OF_TURN[key]


_END_OF_TURN: dict = {}


def _probe_end_of_turn(tokenizer) -> int | None:
    from tether.models.chat import render_chat

    marker = "TETHERENDOFTURNPROBE"
    try:
        text = render_chat(tokenizer, [{"role": "user", "content": "hi"}, {"role": "assistant", "content": marker}])
    except Exception:  # noqa: BLE001 - a template with its own rules (roles, system turns): no probe, no extra stop
        return None
    after = text[text.rfind(marker) + len(marker) :] if marker in text else ""
    ids = tokenizer(after, add_special_tokens=False)["input_ids"] if after else []
    if not ids:
        return None
    special = set(getattr(tokenizer, "all_special_ids", [])) | set(getattr(tokenizer, "added_tokens_decoder", {}) or {})
    return int(ids[0]) if ids[0] in special else None


def load_tokenizer(path: str | Path, trust_remote_code: bool = False):
    """A tokenizer from a local folder, with a pad token.

    A tokenizer without one pads with an existing token (EOS, else UNK, BOS or id 0) rather than a new one: every
    mask tether builds (attention, loss, response) is explicit and never read from ``ids == pad_id``, so a pad that
    equals EOS cannot hide the real EOS, and the vocabulary — hence the embedding matrix and a LoRA adapter's fit to
    its base — stays the model's own. A pad token the tokenizer already has (EOS or not) is kept.
    """
    path = check_dir(path, "tokenizer")
    check_model_folder(path, "tokenizer", weights=False)
    try:
        tok = AutoTokenizer.from_pretrained(str(path), trust_remote_code=trust_remote_code)
    except StrictDataclassError as err:  # the tokenizer reads the model's config.json, and its fault is there
        raise config_invalid(path, err) from None
    except Exception as err:  # noqa: BLE001 - transformers raises many types for unreadable tokenizer files
        raise ConfigError(f"tokenizer {path}: cannot be loaded ({type(err).__name__}: {str(err)[:300]})") from None
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token or tok.unk_token or tok.bos_token or tok.convert_ids_to_tokens(0)
        log.info(
            "tokenizer %s has no pad token; padding with %s (id %d), masked everywhere",
            path,
            tok.pad_token,
            tok.pad_token_id,
        )
    return tok


def load_model(
    path: str | Path,
    tokenizer=None,
    dtype: str = "float32",
    trust_remote_code: bool = False,
    device: str | torch.device | None = None,
):
    """A causal LM from a local folder. Embeddings grow only if the tokenizer has more tokens than the model (a
    tokenizer a user extended); padding adds none (load_tokenizer)."""
    path = check_dir(path, "model")
    check_model_folder(path)
    if dtype != "auto" and dtype not in DTYPES:
        raise ConfigError(f"dtype={dtype!r}: choose auto, {', '.join(DTYPES)}")
    torch_dtype = "auto" if dtype == "auto" else DTYPES[dtype]
    auto = AutoModelForCausalLM
    if is_vision_language(path):  # its images read through its processor (models/vision.py)
        from transformers import AutoModelForImageTextToText as auto
    try:
        model = auto.from_pretrained(str(path), dtype=torch_dtype, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError, RuntimeError, EOFError, pickle.UnpicklingError) as err:
        # what transformers (and torch.load, for .bin weights) raise for folders and files they cannot read
        raise ConfigError(f"model {path}: cannot be loaded ({type(err).__name__}: {str(err)[:300]})") from None
    except StrictDataclassError as err:  # transformers 5 validates a config's fields and their agreement
        raise config_invalid(path, err) from None
    if tokenizer is not None:
        if len(tokenizer) > model.get_input_embeddings().weight.shape[0]:
            model.resize_token_embeddings(len(tokenizer))
        model.config.pad_token_id = tokenizer.pad_token_id
        if model.generation_config is not None:
            model.generation_config.pad_token_id = tokenizer.pad_token_id
    if device is not None:
        model.to(device)
    if next(model.parameters()).dtype == torch.bfloat16:
        refuse_bf16_attention_where_torch_cannot(model, f"dtype={dtype} (model {path}: bf16 weights)")
    return model


def lora_config(r: int, alpha: float, dropout: float, target_modules: list[str], task_type: str, **more):
    """peft's LoraConfig as every tether model takes it (``all-linear`` given alone, as peft names it)."""
    from peft import LoraConfig

    targets = target_modules[0] if target_modules == ["all-linear"] else list(target_modules)
    return LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=targets, task_type=task_type, **more)


def apply_lora(model, r: int, alpha: float, dropout: float, target_modules: list[str], exclude: str | None = None):
    """Wrap ``model`` with trainable LoRA adapters (peft), none in modules matching ``exclude``; the base weights are
    frozen."""
    from peft import get_peft_model

    cfg = lora_config(r, alpha, dropout, target_modules, "CAUSAL_LM", exclude_modules=exclude)
    try:
        wrapped = get_peft_model(model, cfg)
    except ValueError as exc:
        names = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)})
        raise ConfigError(
            f"--lora-target-modules {target_modules}: {exc}. Linear modules in this model: {names}"
        ) from None
    _refuse_lora_on_tied_embeddings(wrapped, target_modules)
    return wrapped


def _refuse_lora_on_tied_embeddings(wrapped, target_modules: list[str]) -> None:
    """An adapter on an embedding that shares its weight with the other end of the model (tie_word_embeddings) is
    merged into the shared weight, so the merged final/ would change both ends: not the model that was trained."""
    from peft.tuners.lora import LoraLayer

    if not getattr(wrapped.config, "tie_word_embeddings", False):
        return
    for end, module in (("output", wrapped.get_output_embeddings()), ("input", wrapped.get_input_embeddings())):
        if isinstance(module, LoraLayer):
            raise ConfigError(
                f"--lora-target-modules {target_modules}: the model's {end} embedding is tied to its "
                f"{'input' if end == 'output' else 'output'} embedding (tie_word_embeddings), so its adapter would be "
                "merged into both in final/, which would not be the trained model; leave it out of the targets"
            )


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


def checkpoint_weights(model) -> dict[str, torch.Tensor]:
    """{name: tensor} under the names a Hugging Face checkpoint of ``model`` uses (what save_merged would write, and
    what a serving engine loads), LoRA adapters merged in: W + ΔW per adapted layer, computed beside the weights (the
    model is not changed: merging in place and back would not give W back bit for bit). Tied weights appear under
    each of their names, as state_dict() gives them."""
    if not is_peft(model):
        return dict(model.state_dict())
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    deltas: dict[str, torch.Tensor] = {}
    for name, module in base.named_modules():
        if isinstance(module, LoraLayer) and not module.merged:
            for adapter in module.active_adapters:
                if adapter in module.lora_A:
                    delta = module.get_delta_weight(adapter)
                    deltas[name] = deltas[name] + delta if name in deltas else delta
    out = {}
    for name, tensor in base.state_dict().items():
        if ".lora_" in name or "lora_magnitude" in name:
            continue
        plain = name.replace(".base_layer.", ".")
        module = plain.rsplit(".", 1)[0]
        if plain.endswith(".weight") and module in deltas:
            tensor = tensor + deltas[module].to(tensor.dtype)
        out[plain] = tensor
    return out


def disable_dropout(model) -> None:
    """Set every dropout of ``model`` to 0 (nn.Dropout modules and the float rates attention layers read while
    training), so training and scoring see the same function (docs: model.keep_dropout)."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        for name, value in vars(module).items():
            if name.endswith("dropout") and isinstance(value, float):
                setattr(module, name, 0.0)


def check_lora_reference(model_cfg) -> None:
    """With LoRA and no separate reference, the reference is the model with its adapter disabled — which is only
    the SFT model if the --model folder is a full model, not itself an adapter."""
    if (
        model_cfg.lora_r > 0
        and not getattr(model_cfg, "reference", "")
        and model_cfg.path
        and (Path(model_cfg.path) / "adapter_config.json").is_file()
    ):
        raise ConfigError(
            f"--model {model_cfg.path} is a LoRA adapter folder: with --lora-r the reference would be the "
            "model with adapters disabled, i.e. the adapter's base model, not your SFT model. Merge the "
            "adapter first (tether writes merged final/ folders) or pass --reference"
        )


def load_stage_tokenizer(model_cfg):
    if not model_cfg.path:
        raise ConfigError("--model is required: a local Hugging Face model folder")
    from tether.models.chat import use_chat

    tokenizer = load_tokenizer(model_cfg.tokenizer or model_cfg.path, model_cfg.trust_remote_code)
    return use_chat(tokenizer, model_cfg.chat_template, model_cfg.chat_template_kwargs)


def load_trainable_model(model_cfg, tokenizer, checkpoint: Path | None):
    """The model to train (a ModelSection): from --model, or from a checkpoint when resuming (LoRA: base + saved
    adapter); dropout disabled unless keep_dropout; only parameters matching trainable_params trainable."""
    from tether.console import loading

    source = model_cfg.path if model_cfg.lora_r > 0 else checkpoint or model_cfg.path
    loading(f"the model to train from {source}" + _lora_note(model_cfg, checkpoint))
    if model_cfg.lora_r > 0:
        model = load_model(model_cfg.path, tokenizer, model_cfg.dtype, model_cfg.trust_remote_code)
        if checkpoint is not None:
            from peft import PeftModel

            model = PeftModel.from_pretrained(model, str(checkpoint), is_trainable=True)
        else:
            frozen_vision = is_vision_language(model_cfg.path) and not model_cfg.train_vision
            lora = (model_cfg.lora_r, model_cfg.lora_alpha, model_cfg.lora_dropout, list(model_cfg.lora_target_modules))
            model = apply_lora(model, *lora, exclude=VISION_TOWER_MODULES if frozen_vision else None)
    else:
        model = load_model(checkpoint or model_cfg.path, tokenizer, model_cfg.dtype, model_cfg.trust_remote_code)
        if is_vision_language(model_cfg.path) and not model_cfg.train_vision:
            freeze_vision_tower(model)
    if not model_cfg.keep_dropout:
        disable_dropout(model)
    apply_precision(model, model_cfg)
    pattern = getattr(model_cfg, "trainable_params", "")
    if pattern:
        import re

        chosen = [n for n, q in model.named_parameters() if q.requires_grad_(bool(re.search(pattern, n))).requires_grad]
        if not chosen:
            raise ConfigError(
                f"trainable_params={pattern!r} matches no parameter; names look like "
                f"{[n for n, _ in model.named_parameters()][:4]}"
            )
    return model


def _lora_note(model_cfg, checkpoint) -> str:
    if model_cfg.lora_r <= 0:
        return ""
    return f" (LoRA r = {model_cfg.lora_r}" + (f", its adapter from {checkpoint})" if checkpoint else ")")


def frozen_dtype(model_cfg) -> str:
    """The dtype of the frozen models (reference, reward model): frozen_dtype, else the trained model's."""
    return model_cfg.frozen_dtype or model_cfg.dtype


def enable_gradient_checkpointing(model) -> None:
    """Activations recomputed layer by layer in the backward pass (non-reentrant: works with frozen inputs, LoRA
    and no_grad forwards alike); the KV cache stays on for generation, which runs in eval mode."""
    base = transformers_model(model)
    if not getattr(base, "supports_gradient_checkpointing", False):
        raise ConfigError(f"gradient_checkpointing: {type(base).__name__} does not support it")
    kwargs = {"use_reentrant": False}
    if hasattr(base, "activation_checkpointing_enable"):  # transformers >= 5.2x; the older name warns there
        base.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def transformers_model(model):
    """The Hugging Face model inside tether's and peft's wrappers (a reward or value model, a LoRA model)."""
    from transformers import PreTrainedModel

    while not isinstance(model, PreTrainedModel):
        if hasattr(model, "get_base_model"):
            model = model.get_base_model()
        elif isinstance(getattr(model, "rm", None), torch.nn.Module):
            model = model.rm
        elif isinstance(getattr(model, "model", None), torch.nn.Module):
            model = model.model
        else:
            raise ConfigError(f"{type(model).__name__}: no Hugging Face model inside")
    return model


AUTOCAST = {"bf16": torch.bfloat16}


def autocast_forwards(model, mixed_precision: str) -> None:
    """Every forward of ``model`` — sampling, old and current log-probs, values — under torch.autocast to the
    mixed-precision dtype, weights untouched. The Hugging Face model itself is wrapped (under a LoRA wrapper too),
    so generate() and training forwards run in the same precision: the ratio is 1 on-policy (refused where
    bf16_attention_runs_here says no)."""
    if mixed_precision == "no":
        return
    refuse_bf16_attention_where_torch_cannot(model, f"mixed_precision={mixed_precision}")
    # a LoRA causal LM: its base model, which generate() calls too; tether's reward and value models: the whole
    # module, so their fp32 score head reads the autocast backbone's output inside the same autocast region
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    forward, dtype = base.forward, AUTOCAST[mixed_precision]

    def autocast_forward(*args, **kwargs):
        with torch.autocast(next(base.parameters()).device.type, dtype=dtype):
            return forward(*args, **kwargs)

    base.forward = autocast_forward
    model.tether_compute_dtype = dtype  # what compute_dtype() reports: the weights stay in their own dtype


def compute_dtype(model) -> torch.dtype:
    """The dtype the model's matmuls run in: the autocast dtype under --mixed-precision, else its weights' dtype."""
    return getattr(model, "tether_compute_dtype", None) or next(model.parameters()).dtype


def apply_precision(model, model_cfg, trained: bool = True):
    """The ModelSection's memory and precision settings on a loaded model: gradient checkpointing (trained models)
    and bf16 autocast. Returns the model."""
    if trained and model_cfg.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    autocast_forwards(model, model_cfg.mixed_precision)
    return model


def load_reference(model_cfg, tokenizer, device=None):
    """The frozen reference of a PolicySection, or None when it is the adapter-disabled policy (LoRA, no
    --reference). In eval mode, without gradients, dropout disabled."""
    check_lora_reference(model_cfg)
    if model_cfg.lora_r > 0 and not model_cfg.reference:
        return None
    from tether.console import loading

    loading(f"the reference from {model_cfg.reference or model_cfg.path}")
    reference = load_model(
        model_cfg.reference or model_cfg.path, tokenizer, frozen_dtype(model_cfg), model_cfg.trust_remote_code, device
    )
    disable_dropout(reference)
    autocast_forwards(reference, model_cfg.mixed_precision)  # the policy's precision: KL 0 on-policy
    reference.eval()
    for q in reference.parameters():
        q.requires_grad_(False)
    return reference


CONTEXT_FIELDS = ("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len", "seq_length")


def model_context(model_or_path) -> int | None:
    """Positions the model can attend over: its config's max_position_embeddings (n_positions for GPT-2, …), read from
    a loaded model or a model folder's config.json; None when the config does not say."""
    import json

    if isinstance(model_or_path, (str, Path)):
        path = Path(model_or_path) / "config.json"
        config = json.loads(path.read_text()) if path.is_file() else {}
    else:
        config = getattr(model_or_path, "config", model_or_path)
        config = config.to_dict() if hasattr(config, "to_dict") else {}
    for holder in (config, config.get("text_config") or {}):
        for name in CONTEXT_FIELDS:
            value = holder.get(name)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return None


_TOLD: set = set()


def inductor_compiles_here() -> bool:
    """Whether torch inductor can compile C++ in this process: on a GPU, or on a CPU unless ATEN_CPU_CAPABILITY=default
    asks for torch's scalar kernels — there torch 2.13's inductor still writes vectorised C++ (at::vec::VectorizedN)
    that the scalar build of its headers does not declare (measured: every compiled kernel fails). vLLM's CPU engine
    then runs eagerly (rollout/vllm_backend.py: its worker starts with TORCH_COMPILE_DISABLE=1) and
    `tether bench --compile` refuses."""
    return torch.cuda.is_available() or os.environ.get("ATEN_CPU_CAPABILITY") != "default"


def length_limit(max_length: int, model_path, flag: str = "--max-length") -> int:
    """The longest example a stage may keep: max_length, or the model's context when that is shorter (said once).
    Longer examples are then dropped and counted like any over-long one, instead of failing deep in the model
    (GPT-2's position table) or training past the context a RoPE model was trained for."""
    context = model_context(model_path) if model_path else None
    if context is None or max_length <= context:
        return max_length
    if (flag, max_length, context) not in _TOLD and os.environ.get("RANK", "0") == "0":  # once, from process 0
        _TOLD.add((flag, max_length, context))
        from tether.console import console
        from tether.sections import DataSection

        if max_length == DataSection.max_length and flag == "--max-length":  # the default: not the user's choice
            console.print(f"max_length: the model's context, {context} tokens (the default {max_length} is longer)")
        else:
            console.print(
                f"{flag} {max_length} is more than the model's context ({context} positions in its "
                f"config.json): examples longer than {context} tokens are dropped and counted",
                style="yellow",
            )
    return context


def check_prompt_context(
    lengths: list[int], budget: int, context: int | None, where: str, what: str = "max_new_tokens"
) -> None:
    """Every prompt (``lengths``: its tokens, as sampled) plus the response budget fits the model's context, or a
    ConfigError names the first that does not (the prompt file's row, its tokens, the budget)."""
    if context is None:
        return
    for i, n in enumerate(lengths):
        if n + budget > context:
            raise ConfigError(
                f"{where} row {i + 1}: {n} prompt tokens + {what} {budget} = {n + budget} is more than "
                f"the model's context ({context} positions); shorten the prompt or lower {what}"
            )


def parameter_summary(model) -> str:
    total, trainable = count_parameters(model)
    return f"{total / 1e6:.2f} M parameters, {trainable / 1e6:.2f} M trainable"


def count_parameters(model) -> tuple[int, int]:
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return total, trainable


TINY_ARCHS = ("llama", "qwen2", "gpt2", "mistral")


def tiny_config(
    arch: str,
    vocab_size: int,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    max_positions: int = 256,
    bos_id: int | None = None,
    eos_id: int | None = None,
    pad_id: int | None = None,
):
    """A small randomly initialised config of a standard architecture (for the lab, the demo and tests)."""
    common = dict(vocab_size=vocab_size, bos_token_id=bos_id, eos_token_id=eos_id, pad_token_id=pad_id)
    if arch == "gpt2":
        return AutoConfig.for_model(
            "gpt2",
            n_embd=hidden,
            n_layer=layers,
            n_head=heads,
            n_positions=max_positions,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            **common,
        )
    if arch in ("llama", "qwen2", "mistral"):
        extra = {"sliding_window": None} if arch == "mistral" else {}
        return AutoConfig.for_model(
            arch,
            hidden_size=hidden,
            intermediate_size=4 * hidden,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=heads,
            max_position_embeddings=max_positions,
            tie_word_embeddings=True,
            **common,
            **extra,
        )
    raise ConfigError(f"unknown tiny architecture {arch!r}; choose one of {TINY_ARCHS}")


def build_tiny_model(arch: str, tokenizer, out_dir: str | Path, seed: int = 0, **dims) -> Path:
    """Create, save and return the folder of a random tiny model (plus its tokenizer)."""
    cfg = tiny_config(
        arch,
        len(tokenizer),
        bos_id=tokenizer.bos_token_id,
        eos_id=tokenizer.eos_token_id,
        pad_id=tokenizer.pad_token_id,
        **dims,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg)
    out_dir = Path(out_dir)
    model.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))
    return out_dir
