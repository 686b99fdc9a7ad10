"""Vision-language models: telling one from a causal LM, its processor, its vision tower, and tiny random ones.

A vision-language model (LLaVA, Idefics3/SmolVLM, Gemma 3, Qwen2-VL...) loads through ``AutoModelForImageTextToText``
and reads its images through the ``AutoProcessor`` saved beside it: the processor turns each image into pixel tensors
and widens the image's one placeholder in the text into the tokens the vision features fill. tether renders and masks
text as it does for any model (data/sft.py) and hands the processor the rendered text and the images
(data/multimodal.py). Everything loads from a path.
"""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

import torch

from tether.config import ConfigError

# Where a family keeps its image encoder: LLaVA and Gemma 3 ``vision_tower``, Idefics3/SmolVLM ``vision_model``,
# Qwen2-VL ``visual``. The projector that maps its features into the language model (multi_modal_projector,
# connector, merger) is not part of it: it is trained whenever the language model is.
VISION_TOWER = re.compile(r"(^|\.)(vision_tower|vision_model|visual|vision_encoder)(\.|$)")
VISION_TOWER_MODULES = r"(.*\.)?(vision_tower|vision_model|visual|vision_encoder)(\..*)?"  # peft's full match


# The processor outputs a vision-language model's forward takes beside input_ids and attention_mask (pixel tensors,
# image grids and sizes, Gemma 3's per-token image markers); an output not named here is an error, never dropped.
VISION_INPUTS = (
    "pixel_values",
    "pixel_attention_mask",
    "image_grid_thw",
    "image_sizes",
    "token_type_ids",
    "mm_token_type_ids",
)
PER_TOKEN = ("token_type_ids", "mm_token_type_ids")  # laid out like input_ids: padded and sliced by row


def is_vision_language(path: str | Path) -> bool:
    """Whether the model folder holds a vision-language model: its config has a vision tower's config."""
    config = Path(path) / "config.json"
    if not config.is_file():
        return False
    return "vision_config" in json.loads(config.read_text())


def load_processor(path: str | Path, tokenizer, trust_remote_code: bool = False):
    """The folder's processor, its tokenizer replaced by the run's (its pad token and chat options): the processor
    only widens placeholders and tokenises, so the two stay one vocabulary."""
    from transformers import AutoProcessor

    try:
        processor = AutoProcessor.from_pretrained(str(path), trust_remote_code=trust_remote_code)
    except ImportError as err:
        raise ConfigError(
            f"model {path}: its processor needs a package that is not installed ({err}); Qwen2-VL, Qwen2.5-VL and "
            "SmolVLM processors carry a video processor that needs torchvision, which the CPU set-up leaves out "
            "(vLLM's CPU build breaks with the index's torchvision; docs/data.md 'Images')"
        ) from None
    except (OSError, ValueError, KeyError, AttributeError) as err:
        # what transformers raises for a folder without a processor, or with one of a class it cannot build
        raise ConfigError(
            f"model {path}: a vision-language model needs its processor (preprocessor_config.json or "
            f"processor_config.json beside the weights): {type(err).__name__}: {str(err)[:300]}"
        ) from None
    if not hasattr(processor, "image_processor"):
        raise ConfigError(f"model {path}: its processor ({type(processor).__name__}) has no image processor")
    processor.tokenizer = tokenizer
    return processor


def image_token_text(processor) -> str:
    """What stands for one image in a plain (not chat) prompt: the processor's own image placeholder."""
    for name in ("boi_token", "image_token"):  # Gemma 3 widens its begin-of-image token; the others, image_token
        value = getattr(processor, name, None)
        if isinstance(value, str) and value:
            return value
    raise ConfigError(f"{type(processor).__name__} names no image token (image_token); use chat messages")


def freeze_vision_tower(model) -> int:
    """Freeze the image encoder's parameters (the projector stays trainable); returns how many were frozen."""
    frozen = 0
    for name, parameter in model.named_parameters():
        if VISION_TOWER.search(name):
            parameter.requires_grad_(False)
            frozen += parameter.numel()
    if not frozen:
        raise ConfigError(
            f"{type(model).__name__}: no vision tower found to freeze (parameters named vision_tower, vision_model "
            "or visual); train it with --train-vision"
        )
    return frozen


# ---- tiny random vision-language models (tests and the multimodal lab), built from configs, never downloaded

TINY_VISION_FAMILIES = ("llava", "idefics3", "gemma3")

# Each family's chat template is the ChatML one the lab's tokenizer has, with content parts: text as it is, an
# image part as the placeholder the family's processor widens.
_PLACEHOLDER = {"llava": "<image>", "idefics3": "<image>", "gemma3": "<start_of_image>"}
_CHAT = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}PLACEHOLDER{% else %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _text_config(family: str, vocab: int, hidden: int, layers: int, heads: int, max_positions: int) -> dict:
    config = dict(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=max_positions,
    )
    if family == "gemma3":
        return {**config, "head_dim": hidden // heads, "sliding_window": max_positions}
    return {**config, "model_type": "llama"}


def _tiny_parts(family: str, tokenizer, image_size: int, hidden: int, heads: int):
    """(processor, the config's vision-side settings) of a tiny ``family`` model whose images are image_size²."""
    from transformers import AutoConfig  # noqa: F401 - the families below register through it

    vision = dict(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=1, num_attention_heads=heads)
    chat = _CHAT.replace("PLACEHOLDER", _PLACEHOLDER[family])
    if family == "llava":
        from transformers import CLIPImageProcessorPil, LlavaProcessor

        images = CLIPImageProcessorPil(
            size={"shortest_edge": image_size}, crop_size={"height": image_size, "width": image_size}
        )
        processor = LlavaProcessor(
            image_processor=images,
            tokenizer=tokenizer,
            patch_size=image_size // 4,
            vision_feature_select_strategy="default",
            num_additional_image_tokens=1,  # CLIP's class token, which "default" drops
            chat_template=chat,
        )
        vision = {**vision, "model_type": "clip_vision_model", "image_size": image_size, "patch_size": image_size // 4}
        return processor, dict(
            vision_config=vision,
            image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
            vision_feature_layer=-1,
            vision_feature_select_strategy="default",
        )
    if family == "idefics3":
        from transformers import Idefics3ImageProcessorPil, Idefics3Processor

        images = Idefics3ImageProcessorPil(
            size={"longest_edge": 2 * image_size}, max_image_size={"longest_edge": image_size}, do_image_splitting=True
        )
        processor = Idefics3Processor(image_processor=images, tokenizer=tokenizer, image_seq_len=1, chat_template=chat)
        vision = {**vision, "image_size": image_size, "patch_size": image_size // 2}
        return processor, dict(
            vision_config=vision, image_token_id=tokenizer.convert_tokens_to_ids("<image>"), scale_factor=2
        )
    from transformers import Gemma3ImageProcessorPil, Gemma3Processor

    images = Gemma3ImageProcessorPil(size={"height": image_size, "width": image_size}, do_pan_and_scan=False)
    processor = Gemma3Processor(image_processor=images, tokenizer=tokenizer, chat_template=chat, image_seq_length=4)
    vision = {**vision, "image_size": image_size, "patch_size": image_size // 4}
    return processor, dict(
        vision_config=vision,
        mm_tokens_per_image=4,
        image_token_index=tokenizer.convert_tokens_to_ids("<image_soft_token>"),
        boi_token_index=tokenizer.convert_tokens_to_ids("<start_of_image>"),
        eoi_token_index=tokenizer.convert_tokens_to_ids("<end_of_image>"),
    )


# The tokens each family's processor and model expect, added to a copy of the tokenizer; named ones (Gemma 3's
# processor reads tokenizer.boi_token_id...) go in as the tokenizer's extra special tokens.
_SPECIAL = {
    "llava": ([], {"image_token": "<image>"}),
    "idefics3": (
        ["<fake_token_around_image>", "<global-img>"]
        + [f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)],
        {"image_token": "<image>"},
    ),
    "gemma3": (
        [],
        {"boi_token": "<start_of_image>", "image_token": "<image_soft_token>", "eoi_token": "<end_of_image>"},
    ),
}


def build_tiny_vlm(
    family: str,
    tokenizer,
    out_dir: str | Path,
    seed: int = 0,
    hidden: int = 32,
    layers: int = 2,
    heads: int = 2,
    max_positions: int = 512,
    image_size: int = 28,
) -> Path:
    """Create, save and return the folder of a random tiny vision-language model of ``family`` (llava, idefics3,
    gemma3), with a copy of ``tokenizer`` given the family's image tokens, its processor and a chat template that
    renders image parts."""
    from transformers import AutoConfig, AutoModelForImageTextToText, AutoTokenizer

    if family not in TINY_VISION_FAMILIES:
        raise ConfigError(f"unknown tiny vision family {family!r}; choose one of {TINY_VISION_FAMILIES}")
    out_dir = Path(out_dir)
    plain, named = _SPECIAL[family]
    with tempfile.TemporaryDirectory() as copy:
        tokenizer.save_pretrained(copy)
        tok = AutoTokenizer.from_pretrained(copy, extra_special_tokens=named)
    tok.add_tokens([*named.values(), *plain], special_tokens=True)
    processor, vision_side = _tiny_parts(family, tok, image_size, hidden, heads)
    text = _text_config(family, len(tok), hidden, layers, heads, max_positions)
    ids = dict(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    config = AutoConfig.for_model(family, text_config={**text, **ids}, **vision_side, **ids)
    torch.manual_seed(seed)
    model = AutoModelForImageTextToText.from_config(config)
    if family == "gemma3":  # its projection starts at zero, which would map every image to the same soft tokens
        weight = model.model.multi_modal_projector.mm_input_projection_weight
        torch.nn.init.normal_(weight, std=hidden**-0.5)
    model.save_pretrained(str(out_dir))
    processor.save_pretrained(str(out_dir))
    return out_dir


def join_vision(visions: list, width: int, offsets: list[int] | None = None) -> dict[str, torch.Tensor]:
    """One batch's pixel tensors from each row's (a dict, or None for a row without images): per-token ones (Gemma 3's
    token_type_ids) placed at the row's ``offsets`` column (0: right-padded rows; a left-padded prompt's first
    column) in a (rows, ``width``) zero tensor; the others joined along their first dimension (images, or image
    patches), their other dimensions zero-padded to the largest (Idefics3's images per example: an all-zero image is
    padding to it). Rows without images add nothing, except to a batch-leading tensor (Idefics3's, one row per
    example), where they add one all-zero image."""
    offsets = offsets or [0] * len(visions)
    keys = sorted({k for v in visions if v for k in v})
    out = {}
    for key in keys:
        if key in PER_TOKEN:
            column = torch.zeros((len(visions), width), dtype=torch.long)
            for i, (v, at) in enumerate(zip(visions, offsets)):
                if v and key in v:
                    column[i, at : at + v[key].shape[1]] = v[key][0]
            out[key] = column
            continue
        parts = [v[key] for v in visions if v and key in v]
        batch_leading = parts[0].dim() == 5 or key == "pixel_attention_mask"  # (examples, images, ...)
        if batch_leading:
            like = parts[0]
            parts = [
                v[key] if v and key in v else torch.zeros((1, 1, *like.shape[2:]), dtype=like.dtype) for v in visions
            ]
        shape = [max(p.shape[d] for p in parts) for d in range(1, parts[0].dim())]
        padded = []
        for p in parts:
            if list(p.shape[1:]) != shape:
                grown = torch.zeros((p.shape[0], *shape), dtype=p.dtype)
                grown[tuple(slice(0, n) for n in p.shape)] = p
                p = grown
            padded.append(p)
        out[key] = torch.cat(padded)
    return out


def on_model(model, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``tensors`` on ``model``'s device, the floating ones in its dtype (pixels in bf16 for a bf16 tower)."""
    weight = next(model.parameters())
    return {k: v.to(weight.device, weight.dtype if v.is_floating_point() else v.dtype) for k, v in tensors.items()}


def placeholder_ids(config) -> list[int]:
    """The token ids a vision-language model fills with image (or video) features: its config's placeholders."""
    names = ("image_token_id", "image_token_index", "video_token_id")
    return sorted({v for v in (getattr(config, n, None) for n in names) if isinstance(v, int)})


def never_sample_placeholders(model) -> None:
    """Give ``model``'s image placeholders a logit of -inf in every forward (a hook on its LM head): a response that
    held one would ask the model for an image that is not there (transformers raises on the count). The online stages
    sample and score with the hook on alike, so the sampler's and the trainer's distributions stay one."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    ids = torch.tensor(placeholder_ids(base.config), dtype=torch.long)
    if not len(ids):
        return

    def hook(module, args, logits):
        return logits.index_fill(-1, ids.to(logits.device), float("-inf"))

    base.get_output_embeddings().register_forward_hook(hook)
