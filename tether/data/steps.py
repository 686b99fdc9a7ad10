"""Step-labelled solutions for process reward models (docs/reward-models.md, "Process reward models").

Two shapes, the common ones:

    {"prompt": ..., "completions": ["step", "step", ...], "labels": [true, false, ...]}   TRL's stepwise supervision,
                                                                                        Math-Shepherd's data
    {"prompt": ..., "completion": "step\\nstep\\n", "labels": [...]}                      one string, cut at
                                                                                        data.step_separator

``prompt`` is a string or chat messages (rendered with the generation prompt); labels are booleans or numbers in
[0, 1] (a Math-Shepherd soft label). The text is the prompt followed by each step and the separator after it;
step k is scored at the token holding its last character (tether/algorithms/reward.py step_bce_loss), as
``--process-reward-model`` reads it where a step matched by ``--step-pattern`` ends (trained_step_end: less the
separator the match consumed; `tether prm` records the separator in the model's config.json). A solution longer
than max_length keeps the steps that fit (counted); one with none that fits is dropped (counted; --strict: an
error naming the record).

With a vision-language model's processor, a prompt may show images (an ``images`` column, image content parts, or
placeholders in a text prompt: docs/data.md "Images"); the processor widens them, and each step is read at the same
token, counted after the widened prompt.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tether.data.records import DataError, Record
from tether.data.sft import DataReport, check_messages
from tether.models.chat import has_template, render_chat

STEP_FORMATS = ("stepwise (prompt, completions: list of steps, labels)", "separated (prompt, completion, labels)")


@dataclass
class StepExample:
    input_ids: list[int]
    step_ends: list[int]  # index of the token holding each step's last character
    labels: list[float]  # 1: the step is right, 0: wrong; a fraction: a soft label
    where: str
    vision: dict | None = None  # a vision-language model's pixel tensors (models/vision.py VISION_INPUTS)


def _label(value, where: str, k: int) -> float:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)) and 0 <= value <= 1:
        return float(value)
    raise DataError(f"{where}: labels[{k}] is {value!r}; a step's label is true/false or a number in [0, 1]")


def step_texts(fields: dict, where: str, separator: str) -> tuple[list[str], str]:
    """(the steps, the format) of a record; errors name the record and the field. An empty step is an error: it has
    no character of its own, so it would be scored at the token before it (the prompt's or the previous step's)."""
    if "completions" in fields:
        steps = fields["completions"]
        if not isinstance(steps, list) or not all(isinstance(s, str) for s in steps):
            raise DataError(f"{where}: field 'completions' must be a list of step strings")
        empty = [k for k, step in enumerate(steps) if not step]
        if empty:
            raise DataError(f"{where}: field 'completions': step {empty[0]} is an empty string; a step needs text")
        return steps, "stepwise"
    if "completion" in fields:
        text = fields["completion"]
        if not isinstance(text, str):
            raise DataError(f"{where}: field 'completion' must be a string (steps cut at {separator!r})")
        steps = [s for s in text.split(separator)]
        if steps and steps[-1] == "":  # a completion ending in the separator
            steps.pop()
        empty = [k for k, step in enumerate(steps) if not step]
        if empty:
            raise DataError(
                f"{where}: field 'completion': step {empty[0]} is empty (the separator {separator!r} at the start "
                "or twice in a row); a step needs text"
            )
        return steps, "separated"
    raise DataError(
        f"{where}: a step-labelled record needs 'prompt', 'labels' and 'completions' (a list of steps) or "
        f"'completion' (steps cut at {separator!r}); it has {sorted(fields)}"
    )


def trained_step_end(text: str, end: int, separator: str) -> int:
    """Where the step that a --step-pattern match ends at ``end`` has its own text end, as `tether prm` trained it:
    ``end`` moved back over any separator the match consumed (an occurrence starting at p with p < end ≤ p +
    len(separator), repeated while one more ends there). Training reads step k at the token holding its last
    character, before the separator that follows it; a pattern that consumes the separator (``\n``, ``[^\n]*\n``)
    or part of it (``\\.`` with the separator ". ") would be read one token late (docs/reward-models.md)."""
    while end > 0:
        straddling = [p for p in range(max(0, end - len(separator)), end) if text.startswith(separator, p)]
        if not straddling:
            return end
        end = straddling[0]
    return end


def _widened(fields, steps_text: str, tokenizer, processor, text_ids, steps_from: int, where, max_pixels, specials):
    """(the processor's ids of the solution, its pixel tensors, how many tokens the widened images add, how many
    images): the prompt rendered again with the images in their places, then ``steps_text``; the steps' tokens
    (the tokenizer's ``text_ids`` from ``steps_from``) must be the processor's, shifted."""
    from tether.data.multimodal import Widened, placed, vision_of
    from tether.models.chat import template_conversation

    widened = Widened(processor, add_special=specials)
    placed_fields, refs = placed(fields, "prompt", widened.placeholder, where)
    prompt = placed_fields["prompt"]
    if isinstance(prompt, list):
        prompt = render_chat(tokenizer, template_conversation(tokenizer, prompt), generation_prompt=True)
    images, encoded = widened.encode(prompt + steps_text, refs, where, max_pixels, "the prompt")
    ids = encoded["input_ids"][0].tolist()
    shift = len(ids) - len(text_ids)
    if shift < 0 or ids[steps_from + shift :] != text_ids[steps_from:]:
        raise DataError(
            f"{where}: the processor's tokens of the steps are not the tokenizer's, so the steps cannot be located; "
            "end the prompt at a word boundary (a chat prompt does)"
        )
    return ids, vision_of(encoded, processor) or None, shift, len(images)


def tokenize_steps(
    records: list[Record],
    tokenizer,
    max_length: int,
    separator: str,
    strict: bool = False,
    label: str = "",
    processor=None,
    max_pixels: int = 16_777_216,
) -> tuple[list[StepExample], DataReport]:
    """Step-labelled records -> StepExamples (the module docstring); with a vision-language model's ``processor``,
    each prompt's images widened in place and their pixel tensors kept (``max_pixels``: an image's largest size)."""
    from tether.models.vision import PER_TOKEN, image_token_text

    report = DataReport(label or (records[0].where.split(":")[0] if records else "?"))
    out = []
    for rec in records:
        report.records += 1
        fields, where = rec.fields, rec.where
        if "prompt" not in fields or "labels" not in fields:
            step_texts({}, where, separator)  # raises naming the fields it needs
        steps, report.format = step_texts(fields, where, separator)
        labels = fields["labels"]
        if not isinstance(labels, list) or len(labels) != len(steps):
            raise DataError(
                f"{where}: {len(steps)} steps and {len(labels) if isinstance(labels, list) else labels!r} labels; "
                "give one label per step"
            )
        labels = [_label(v, where, k) for k, v in enumerate(labels)]
        prompt = fields["prompt"]
        if isinstance(prompt, list):
            if not has_template(tokenizer):
                raise DataError(f"{where}: 'prompt' is chat messages and the tokenizer has no chat template")
            prompt, specials = render_chat(tokenizer, check_messages(prompt, where, "prompt"), True), False
        elif isinstance(prompt, str):
            specials = True
        else:
            raise DataError(f"{where}: field 'prompt' must be a string or chat messages")
        if not steps:
            report.dropped["no steps"] += 1
            continue
        text, ends = prompt, []
        for step in steps:
            text += step
            ends.append(len(text))  # the step's own end: its score is read at the token holding its last character
            text += separator
        enc = tokenizer(text, add_special_tokens=specials, return_offsets_mapping=True)
        ids, offsets = enc["input_ids"], enc["offset_mapping"]
        # a special token the tokenizer adds (an EOS appended by its post-processor) holds no character: (0, 0)
        step_ends = [max(t for t, (start, stop) in enumerate(offsets) if start < end and stop > start) for end in ends]
        vision = None
        if processor is not None:  # the same text with its images widened: every step end moves by their tokens
            first = min(t for t, (_, stop) in enumerate(offsets) if stop > len(prompt))
            ids, vision, shift, shown = _widened(
                fields, text[len(prompt) :], tokenizer, processor, ids, first, where, max_pixels, specials
            )
            step_ends = [e + shift for e in step_ends]
            report.images += shown
            report.examples_with_images += bool(shown)
            # the widened images' tokens: the shift, plus each placeholder the text held already as one token
            report.image_tokens += shift + prompt.count(image_token_text(processor))
        kept = sum(e < max_length for e in step_ends)
        if kept == 0:
            if strict:
                raise DataError(f"{where}: no step fits in max_length {max_length} (--strict)")
            report.dropped["no step within max_length"] += 1
            continue
        if kept < len(steps):
            report.warnings["solutions cut to the steps within max_length"] += 1
        ids = ids[: step_ends[kept - 1] + 1]
        if vision is not None:  # per-token tensors are cut with the ids; the images sit in the prompt, before any step
            vision = {k: v[:, : len(ids)] if k in PER_TOKEN else v for k, v in vision.items()}
        out.append(StepExample(ids, step_ends[:kept], labels[:kept], where, vision))
        report.examples += 1
        report.tokens += len(ids)
        report.trained_tokens += kept
    return out, report


def collate_steps(examples: list[StepExample], pad_id: int) -> dict:
    """Right-padded rows and each row's step positions and labels, padded to the batch's most steps (step_mask)."""
    width = max(len(e.input_ids) for e in examples)
    steps = max(len(e.step_ends) for e in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(examples), width), dtype=torch.long)
    index = torch.zeros((len(examples), steps), dtype=torch.long)
    labels = torch.zeros((len(examples), steps))
    mask = torch.zeros((len(examples), steps), dtype=torch.long)
    for i, e in enumerate(examples):
        ids[i, : len(e.input_ids)] = torch.tensor(e.input_ids)
        attention[i, : len(e.input_ids)] = 1
        index[i, : len(e.step_ends)] = torch.tensor(e.step_ends)
        labels[i, : len(e.labels)] = torch.tensor(e.labels)
        mask[i, : len(e.labels)] = 1
    batch = {
        "input_ids": ids,
        "attention_mask": attention,
        "step_index": index,
        "step_labels": labels,
        "step_mask": mask,
    }
    if any(e.vision for e in examples):  # a vision-language model's rows: their pixels, joined (models/vision.py)
        from tether.models.vision import join_vision

        batch.update(join_vision([e.vision for e in examples], width))
    return batch
