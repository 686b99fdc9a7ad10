"""The rows of an RL prompt file (what PPO, the group family and online DPO sample from), checked before any model
is loaded: errors name the file, line and field. With a vision-language model a row may show images (docs/data.md
"Images"); their paths are made absolute here, so a row read later (by the sampler, by a reward function) finds them
wherever the run was started.
"""

from __future__ import annotations

from pathlib import Path

from tether.data.images import IMAGES, has_images, is_image_part, resolve_image_refs
from tether.data.multimodal import prompt_images
from tether.data.records import ROLES, DataError, Record, read_records


def _prompt_of_conversation(record: Record) -> Record:
    """A conversation row with no 'prompt' (an SFT file: messages, alpaca, sharegpt — what LLaMA-Factory's PPO
    reads) as a prompt row: the turns before the last assistant turn are the prompt, and that answer is kept as
    the 'completion' column, which a reward function may read."""
    fields = record.fields
    messages = fields.get("messages")
    if "prompt" in fields or not isinstance(messages, list) or len(messages) < 2:
        return record
    last = messages[-1]
    if not isinstance(last, dict) or last.get("role") != "assistant":
        return record
    rest = {k: v for k, v in fields.items() if k != "messages"}
    return Record({**rest, "prompt": messages[:-1], "completion": last.get("content", "")}, record.where)


def _content_ok(content, images: bool) -> bool:
    """A message's content: text, or (a vision-language model's rows) a list of text and image parts."""
    if isinstance(content, str):
        return True
    return (
        images
        and isinstance(content, list)
        and all(is_image_part(p) or (isinstance(p, dict) and p.get("type") == "text") for p in content)
    )


def prompt_rows(path: str | Path, columns: str | dict | None = None, images: int = 0) -> list[dict]:
    """The rows of an RL prompt file, checked: at least one row; every row a non-empty 'prompt' — a string, or a
    list of chat messages each with a known 'role' and a string 'content'; and every row with the same columns
    (a reward function reading a column must find it in every row). Errors name the file, line and field.
    ``columns`` renames as --columns does (a GSM8K file: prompt=question). ``images`` > 0 (a vision-language model,
    its largest image in pixels): a row may show images (an 'images' column, image content parts), each read once
    here (a missing, unreadable or oversized image, or placeholders that do not match, is an error naming the row)
    and its path made absolute; 0: a row with images is an error naming it."""
    records = [_prompt_of_conversation(r) for r in read_records(path, columns)]
    if not records:
        raise DataError(f"{path}: no prompts (the file is empty)")
    columns = set(records[0].fields)
    rows = []
    for rec in records:
        prompt = rec.fields.get("prompt")
        if isinstance(prompt, str):
            if not prompt.strip():
                raise DataError(f"{rec.where}: 'prompt' is empty")
        elif isinstance(prompt, list) and prompt:
            for i, message in enumerate(prompt):
                if (
                    not isinstance(message, dict)
                    or message.get("role") not in ROLES
                    or not _content_ok(message.get("content"), images)
                ):
                    raise DataError(
                        f"{rec.where}: prompt message {i} must be {{'role': one of {', '.join(ROLES)}, "
                        f"'content': text{' or text and image parts' if images else ''}}}, got {str(message)[:80]!r}"
                    )
        else:
            raise DataError(
                f"{rec.where}: 'prompt' must be a non-empty string or a non-empty list of chat messages"
                + ("" if "prompt" in rec.fields else f" (the row has {sorted(rec.fields)})")
            )
        if has_images(rec.fields) and not images:
            raise DataError(
                f"{rec.where}: the row has images ('{IMAGES}' or image parts); only a vision-language model (a --model "
                "whose config.json has a vision_config) reads them, in tether sft, dpo and grpo"
            )
        if set(rec.fields) != columns:
            missing, extra = sorted(columns - set(rec.fields)), sorted(set(rec.fields) - columns)
            raise DataError(
                f"{rec.where}: the columns differ from the first row's ({sorted(columns)}): "
                + (f"missing {missing}" if missing else f"extra {extra}")
            )
        if images:
            prompt_images(rec.fields, rec.where, images)
        rows.append(resolve_image_refs(rec.fields, rec.where) if images else rec.fields)
    return rows
