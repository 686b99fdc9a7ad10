"""Examples with images for a vision-language model: rendered and masked as text, widened by the processor.

A record is rendered exactly as for a language model (data/sft.py: the chat template, the trained character spans),
its images placed first (data/images.py). The processor then turns the images into pixel tensors and widens each
image's placeholder into the tokens the vision features fill, so the token ids are the processor's, not the
tokenizer's. A trained span's first and last token are found by the processor's tokens of the text before each end
(its images with it): that prefix must be the start of the whole example's tokens, or the record is refused by name.
The loss never covers an image token: the placeholder and every token the processor adds for an image are masked,
even with --train-on-prompt. docs/data.md "Images".
"""

from __future__ import annotations

from difflib import SequenceMatcher

from tether.config import ConfigError
from tether.console import progress
from tether.data.images import (
    IMAGES,
    folder_of,
    has_images,
    image_list,
    load_images,
    place_images,
    place_in_text,
    sample_image_ref,
)
from tether.data.records import DataError, Record
from tether.data.sft import DataReport, Example, _Drop, check_kept, check_messages, detect_format, render
from tether.models.chat import render_chat, template_conversation
from tether.models.vision import VISION_INPUTS, image_token_text


def placed(fields: dict, fmt: str, image_text: str, where: str) -> tuple[dict, list]:
    """The record's fields with each image in its place, and the images' references in order."""
    refs = image_list(fields, where)
    if fmt == "messages":
        # checked here, before the images are placed in them: render() would check them only afterwards
        messages, refs = place_images(check_messages(fields["messages"], where, "messages"), refs, where, "messages")
        return {**fields, "messages": messages}, refs
    if fmt == "text":
        return {**fields, "text": place_in_text(fields["text"], refs, image_text, where, "text")}, refs
    prompt = fields["prompt"]
    if isinstance(prompt, list):
        prompt, refs = place_images(check_messages(prompt, where, "prompt"), refs, where, "prompt")
    else:
        prompt = place_in_text(prompt, refs, image_text, where, "prompt")
    return {**fields, "prompt": prompt}, refs


class Widened:
    """The processor's tokens of a text and its images (each image's placeholder widened)."""

    def __init__(self, processor, add_special: bool):
        self.processor, self.add_special = processor, add_special
        self.placeholder = image_token_text(processor)

    def __call__(self, text: str, images: list) -> dict:
        shown = images[: text.count(self.placeholder)]  # the images whose placeholders this text holds
        return self.processor(
            text=[text], images=[shown] if shown else None, add_special_tokens=self.add_special, return_tensors="pt"
        )

    def encode(self, text: str, refs: list, where: str, max_pixels: int, what: str = "the text"):
        """(the images ``refs`` name, read and checked, and the processor's encoding of ``text`` with them); the
        placeholders ``what`` renders must match the images one for one."""
        if text.count(self.placeholder) != len(refs):
            raise DataError(
                f"{where}: {what} renders {text.count(self.placeholder)} image placeholder(s) ({self.placeholder}) "
                f"for {len(refs)} image(s): does the chat template render image content parts?"
            )
        images = load_images(refs, folder_of(where), where, max_pixels)
        return images, self(text, images)

    def position(self, full_ids: list[int], text: str, images: list, where: str) -> int:
        """How many of the whole example's tokens the text before a span's end makes."""
        ids = self(text, images)["input_ids"][0].tolist()
        if full_ids[: len(ids)] != ids:
            raise DataError(
                f"{where}: the processor's tokens of the text before a trained span are not the start of the whole "
                "example's tokens, so the span cannot be located; use chat messages, or a prompt that ends at a "
                "word boundary"
            )
        return len(ids)


def encode_example(fields, fmt, tokenizer, processor, train_on_prompt, where, report, max_pixels) -> Example:
    """One record as an Example whose ``vision`` holds its pixel tensors (None without images)."""
    widened = Widened(processor, add_special=True)
    fields, refs = placed(fields, fmt, widened.placeholder, where)
    text, spans, add_special = render(fields, fmt, tokenizer, train_on_prompt, where, report)
    widened.add_special = add_special
    images, encoded = widened.encode(text, refs, where, max_pixels, "the chat template")
    ids = encoded["input_ids"][0].tolist()
    mask = [0] * len(ids)
    for start, end in spans:
        first = widened.position(ids, text[:start], images, where)
        last = len(ids) if end >= len(text) else widened.position(ids, text[:end], images, where)
        mask[first:last] = [1] * (last - first)
    placeholder = tokenizer.convert_tokens_to_ids(widened.placeholder)
    image = added_positions(tokenizer(text, add_special_tokens=add_special)["input_ids"], ids, placeholder)
    mask = [0 if i in image else m for i, m in enumerate(mask)]
    mask[0] = 0  # nothing predicts the first token
    vision = vision_of(encoded, processor)
    report.images += len(images)
    report.image_tokens += len(image)
    return Example(ids, mask, where, vision=vision or None)


def added_positions(plain: list[int], widened: list[int], placeholder: int) -> set[int]:
    """The positions of ``widened`` (the processor's tokens of a text, each image placeholder widened) that the
    processor added for the images: every placeholder token, and every token outside the runs it shares with
    ``plain`` (the tokenizer's tokens of the same text), found by aligning the two. Matching by id alone misses
    the text tokens a processor adds around an image (Idefics3's and Gemma 3's newlines), which the text has too.
    Where a widening changes how the text beside it merges, those tokens count as the image's: never trained."""
    shared = SequenceMatcher(None, plain, widened, autojunk=False).get_matching_blocks()
    text = {j + k for _, j, size in shared for k in range(size)}
    return {i for i, t in enumerate(widened) if t == placeholder or i not in text}


def vision_of(encoded, processor) -> dict:
    """The processor's outputs beside the token ids: what the forward takes with them."""
    vision = {k: v for k, v in encoded.items() if k not in ("input_ids", "attention_mask")}
    unknown = sorted(set(vision) - set(VISION_INPUTS))
    if unknown:  # passing on only what tether names: an input it does not know would be lost without a word
        raise ConfigError(
            f"{type(processor).__name__} returns {unknown}, which tether does not pass to the model yet "
            f"(it passes {', '.join(VISION_INPUTS)})"
        )
    return vision


def encode_prompt(fields: dict, tokenizer, processor, where: str, max_pixels: int):
    """A prompt row (data/prompts.py, its image paths absolute) as a vision-language model samples from it: (the
    rendered text, the processor's token ids — each image's placeholder widened, no special tokens added, as a text
    prompt is sampled —, its pixel tensors or None, its images). Errors name ``where`` and the field."""
    widened = Widened(processor, add_special=False)
    fields, refs = placed(fields, "prompt", widened.placeholder, where)
    prompt = fields["prompt"]
    text = (
        render_chat(tokenizer, template_conversation(tokenizer, prompt), generation_prompt=True)
        if isinstance(prompt, list)
        else prompt
    )
    images, encoded = widened.encode(text, refs, where, max_pixels, "the prompt")
    return text, encoded["input_ids"][0].tolist(), vision_of(encoded, processor) or None, images


def prompt_images(fields: dict, where: str, max_pixels: int) -> list:
    """A prompt row's images (PIL, RGB) in order, as reward functions are given them."""
    _, refs = placed(fields, "prompt", "", where)
    return load_images(refs, folder_of(where), where, max_pixels)


def sample_images(fields: dict) -> list[str] | None:
    """A prompt row's images as samples.jsonl names them (data/images.py sample_image_ref); None without images."""
    if not has_images(fields):
        return None
    _, refs = placed(fields, "prompt", "", "a prompt row")
    return [sample_image_ref(ref) for ref in refs]


def tokenize_multimodal(
    records: list[Record],
    tokenizer,
    processor,
    max_length: int,
    train_on_prompt: bool = False,
    strict: bool = False,
    path: str = "data",
    max_pixels: int = 16_777_216,
) -> tuple[list[Example], DataReport]:
    """tokenize_records for a vision-language model: the same formats, drops and report, with images."""
    report = DataReport(path=str(path), records=len(records))
    if not records:
        raise DataError(f"{path}: no records")
    fmt = detect_format(records[0].fields, records[0].where)
    report.format = fmt
    report.unused = sorted(set(records[0].fields) - {"messages", "prompt", "completion", "text", "tools", IMAGES})
    examples = []
    for rec in progress(records, len(records), f"tokenising {path} with its images", min_items=500):
        if detect_format(rec.fields, rec.where) != fmt:
            raise DataError(f"{rec.where}: record is {detect_format(rec.fields, rec.where)}, earlier ones {fmt}")
        try:
            example = encode_example(
                rec.fields, fmt, tokenizer, processor, train_on_prompt, rec.where, report, max_pixels
            )
            check_kept(example.input_ids, example.loss_mask, max_length)
        except _Drop as drop:
            report.drop(drop, rec.where, strict)
            continue
        examples.append(example)
        report.examples_with_images += example.vision is not None
        report.tokens += len(example.input_ids)
        report.trained_tokens += sum(example.loss_mask)
    report.examples = len(examples)
    if not examples:
        raise DataError(f"{path}: every record was dropped ({report.summary()})")
    return examples, report


def refuse_images(records: list[Record], reason: str) -> None:
    """Records with images where they cannot be read (``reason`` says why): an error naming the first, never a
    silent drop of its images."""
    first = next((r for r in records if has_images(r.fields)), None)
    if first is not None:
        raise DataError(f"{first.where}: the record has images, and {reason}; drop the images (docs/data.md 'Images')")


def text_only(model_path: str) -> str:
    """refuse_images' reason for a model that cannot see images."""
    return f"{model_path} is not a vision-language model (its config.json has no vision_config)"


def not_built(stage: str = "") -> str:
    """refuse_images' reason for a stage that does not read images yet."""
    return f"{f'tether {stage}' if stage else 'this stage'} does not read images yet (tether sft does)"
