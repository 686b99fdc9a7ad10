"""Preference data for reward models: pairs (prompt/chosen/rejected) and ranked lists (prompt/responses/ranking).

Each (prompt, response) is rendered to one text — the chat template for
conversational rows, prompt + response + EOS for strings — and tokenised once.
Pairs whose chosen equals rejected, over-long texts and rows without a
label are dropped and counted (errors with strict), like SFT data.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch

from tether.console import progress
from tether.data.images import IMAGES, image_list
from tether.data.multimodal import Widened, placed, vision_of
from tether.data.records import DataError, Record
from tether.data.sft import _Drop, check_messages, check_str, render_record
from tether.models.packing import SharedPrompts, pack_sequences, pad_sequences
from tether.models.vision import join_vision

HEAD_LABELS = {"chosen": 1, "rejected": -1, None: 0}


@dataclass
class PairExample:
    chosen_ids: list[int]
    rejected_ids: list[int]
    margin: float
    head_labels: list[int]  # per head: +1 chosen better, -1 rejected better, 0 no label
    where: str
    vision: dict | None = None  # a vision-language model's pixel tensors of the prompt's images (both responses')


@dataclass
class RankedExample:
    ranked_ids: list[list[int]]  # best first
    where: str
    vision: dict | None = None


@dataclass
class PreferenceReport:
    path: str
    format: str = "?"
    records: int = 0
    examples: int = 0
    dropped: Counter = field(default_factory=Counter)
    unused: list = field(default_factory=list)  # columns of the file nothing reads, with a hint where one applies
    plain_text: int = 0  # records of plain strings rendered without the tokenizer's chat template (it has one)
    images: int = 0  # a vision-language model's: the records' images, and the tokens they were widened into
    image_tokens: int = 0

    def count_plain(self, tokenizer, prompt, responses) -> None:
        """Count a record whose prompt and responses are plain strings while the tokenizer has a chat template:
        rendered as prompt + response + EOS (as TRL's standard format is), not in the chat format."""
        if getattr(tokenizer, "chat_template", None) and not any(isinstance(x, list) for x in (prompt, *responses)):
            self.plain_text += 1

    def summary(self) -> str:
        text = f"{self.path}: {self.records} records ({self.format}) -> {self.examples} examples"
        if self.plain_text:
            text += (
                f"; {self.plain_text} of plain strings, rendered as prompt + response + EOS without the "
                "tokenizer's chat template (chat messages, or instruction/output rows, are rendered with it)"
            )
        if self.images:
            text += f"; {self.images} images, {self.image_tokens} image tokens in each response's prompt"
        if self.unused:
            text += f"; columns not used: {', '.join(self.unused)}"
        if self.dropped:
            text += (
                "; dropped: "
                + ", ".join(f"{n} {why}" for why, n in sorted(self.dropped.items()))
                + " (use --strict to make these errors)"
            )
        return text


def render_response(tokenizer, prompt, response, where: str, field_name: str) -> str:
    """One text for (prompt, response): chat template for message lists, else prompt + response + EOS."""
    if isinstance(response, list) or isinstance(prompt, list):
        messages = (check_messages(prompt, where, "prompt") if prompt else []) + check_messages(
            response, where, field_name
        )
        text = render_record(tokenizer, messages, where).rstrip()  # the score is read at the final EOS, not a newline
        return text
    prompt = check_str(prompt or "", where, "prompt")
    response = check_str(response, where, field_name)
    eos = tokenizer.eos_token or ""
    return prompt + response + ("" if response.endswith(eos) else eos)


def _content(response) -> str:
    """The text of a response for the chosen == rejected check; a malformed value is left for the field checks
    that follow to name (so it never fails here with a bare TypeError)."""
    if isinstance(response, str):
        return response
    if isinstance(response, list):
        return " ".join(str(m.get("content", "")) if isinstance(m, dict) else repr(m) for m in response)
    return repr(response)


def preference_format(records: list[Record], path) -> str:
    """'pairs', 'ranked lists' or 'unpaired' (KTO's: a completion with a true/false 'label'), from the first
    record's fields."""
    if not records:
        raise DataError(f"{path}: no records")
    first = records[0].fields
    if "chosen" in first and "rejected" in first:
        return "pairs"
    if "responses" in first and "ranking" in first:
        return "ranked lists"
    if "completion" in first and isinstance(first.get("label"), bool):
        return "unpaired"
    raise DataError(
        f"{records[0].where}: preference data needs 'chosen' and 'rejected' (pairs) or 'responses' and "
        f"'ranking' (ranked lists), each with an optional 'prompt'; the record has {sorted(first)}. "
        "Map other names with --columns"
    )


FORMAT_COLUMNS = {
    "pairs": ("prompt", "chosen", "rejected"),
    "ranked lists": ("prompt", "responses", "ranking"),
    "unpaired": ("prompt", "completion", "label"),
}
UNUSED_HINTS = {
    "margin": "margin (`tether rm --margin-column margin` uses it as m in -log σ(r_w - r_l - m), as TRL's "
    "RewardTrainer does when the column is present)"
}


def unused_columns(records: list[Record], fmt: str, read: tuple[str, ...] = ()) -> list[str]:
    """The first record's columns that the format and ``read`` (further columns a stage reads) leave unread, each
    with its hint (UNUSED_HINTS) — so a column that means something elsewhere is never dropped without a word."""
    taken = set(FORMAT_COLUMNS.get(fmt, ())) | set(read)
    return [UNUSED_HINTS.get(c, c) for c in sorted(set(records[0].fields) - taken)] if records else []


def split_implicit_prompt(fields: dict, where: str) -> dict:
    """A pair given as two whole conversations without a 'prompt' (TRL's implicit prompt): the messages both open
    with are the prompt, the rest of each is its response. Other records are returned as they are."""
    chosen, rejected = fields.get("chosen"), fields.get("rejected")
    if fields.get("prompt") is not None or not isinstance(chosen, list) or not isinstance(rejected, list):
        return fields
    shared = 0
    while shared < min(len(chosen), len(rejected)) and chosen[shared] == rejected[shared]:
        shared += 1
    if shared == len(chosen) and shared == len(rejected):
        return fields  # the same conversation twice: the chosen == rejected check drops it
    if shared == 0:
        raise DataError(
            f"{where}: 'chosen' and 'rejected' are conversations without a 'prompt', and they share no "
            "opening message to read the prompt from; add a 'prompt' field"
        )
    if shared in (len(chosen), len(rejected)):
        raise DataError(
            f"{where}: one of 'chosen' and 'rejected' is the start of the other ({shared} shared "
            "messages), so one response would be empty"
        )
    return {**fields, "prompt": chosen[:shared], "chosen": chosen[shared:], "rejected": rejected[shared:]}


def ordered_responses(fields: dict, fmt: str, where: str) -> list[tuple[str, object]]:
    """[(field name, response)], best first, after the checks every preference row gets; a pair whose chosen
    equals its rejected is dropped (_Drop)."""
    if fmt == "pairs":
        if "chosen" not in fields or "rejected" not in fields:
            raise DataError(f"{where}: missing 'chosen' or 'rejected'; the record has {sorted(fields)}")
        if _content(fields["chosen"]).strip() == _content(fields["rejected"]).strip():
            raise _Drop("with chosen equal to rejected")
        return [("chosen", fields["chosen"]), ("rejected", fields["rejected"])]
    responses, ranking = fields.get("responses"), fields.get("ranking")
    if not isinstance(responses, list) or len(responses) < 2:
        raise DataError(f"{where}: field 'responses' must be a list of at least 2 responses")
    if (
        not isinstance(ranking, list)
        or not all(isinstance(i, int) and not isinstance(i, bool) for i in ranking)
        or sorted(ranking) != list(range(len(responses)))
    ):
        raise DataError(
            f"{where}: field 'ranking' must list every index of 'responses' once, best first; "
            f"got {ranking!r} for {len(responses)} responses"
        )
    return [(f"responses[{i}]", responses[i]) for i in ranking]


def refuse_pair_columns(path, heads: list[str], margin_column: str) -> None:
    """Ranked lists are scored by the first head alone, with no margin (the list losses, --ranking-loss, have no
    per-pair terms): a margin column or further heads would be silently unread, so each is an error by its flag."""
    if margin_column:
        raise DataError(
            f"{path}: ranked lists with --margin-column {margin_column}: a margin m belongs to a pair's "
            "-log σ(r_w - r_l - m), and the list losses have none; leave --margin-column out, or give pairs"
        )
    if len(heads) > 1:
        raise DataError(
            f"{path}: ranked lists with --heads {','.join(heads)}: a list trains the first head only (the other "
            "heads learn from per-pair 'chosen'/'rejected' labels); give one head, or give pairs"
        )


def tokenize_preferences(
    records: list[Record],
    tokenizer,
    max_length: int,
    heads: list[str],
    margin_column: str = "",
    strict: bool = False,
    path: str = "data",
    images: tuple | None = None,
):
    """PairExample or RankedExample list and a report. ``images``: (processor, max pixels) of a vision-language
    model: each response is scored with the record's images in its prompt (data/multimodal.py encode_scored)."""
    report = PreferenceReport(path=str(path), records=len(records), format=preference_format(records, path))
    if report.format == "unpaired":
        raise DataError(
            f"{records[0].where}: unpaired labels (a completion with a true/false 'label', as for KTO): a "
            "reward model needs pairs or ranked lists; `tether dpo --loss kto` trains on unpaired labels"
        )
    if report.format == "ranked lists":
        refuse_pair_columns(path, heads, margin_column)
    pair_read = (*heads[1:], margin_column) if report.format == "pairs" else ()  # a list reads neither
    report.unused = unused_columns(records, report.format, (*pair_read, *(["images"] if images is not None else [])))
    examples = []

    def ids_of(fields, response, where, name, counted):
        vision = None
        if images is not None:
            counts = report if counted else None  # a record's images once, not once per response
            ids, vision = encode_scored(fields, response, tokenizer, images[0], where, name, images[1], counts)
        else:
            ids = tokenizer(
                render_response(tokenizer, fields.get("prompt"), response, where, name), add_special_tokens=False
            )["input_ids"]
        if len(ids) > max_length:
            raise _Drop(f"longer than max_length={max_length} tokens")
        return ids, vision

    for rec in progress(records, len(records), f"tokenising {path}"):
        f, where = rec.fields, rec.where
        try:
            responses = ordered_responses(f, report.format, where)
            report.count_plain(tokenizer, f.get("prompt"), [value for _, value in responses])
            if report.format == "pairs":
                margin = 0.0
                if margin_column:
                    if margin_column not in f:
                        raise DataError(
                            f"{where}: margin column {margin_column!r} is missing; the record has {sorted(f)}"
                        )
                    if not isinstance(f[margin_column], (int, float)) or isinstance(f[margin_column], bool):
                        raise DataError(f"{where}: field {margin_column!r} must be a number, got {f[margin_column]!r}")
                    margin = float(f[margin_column])
                    if not margin >= 0 or margin == float("inf"):  # NaN fails >= too
                        raise DataError(
                            f"{where}: field {margin_column!r} must be a finite number >= 0 (a margin "
                            f"m in -log σ(r_w - r_l - m)), got {f[margin_column]!r}"
                        )
                labels = [1]
                for head in heads[1:]:
                    value = f.get(head)
                    if value not in HEAD_LABELS:
                        raise DataError(
                            f"{where}: field {head!r} (label of head {head}) must be 'chosen', 'rejected' "
                            f"or null, got {value!r}"
                        )
                    labels.append(HEAD_LABELS[value])
            encoded = [ids_of(f, value, where, name, i == 0) for i, (name, value) in enumerate(responses)]
            ids, vision = [i for i, _ in encoded], encoded[0][1]  # every response shows the record's images
            if report.format == "pairs":
                examples.append(PairExample(ids[0], ids[1], margin, labels, where, vision))
            else:
                examples.append(RankedExample(ids, where, vision))
        except _Drop as drop:
            if strict:
                raise DataError(f"{where}: example {drop.args[0]} (--strict)") from None
            report.dropped[str(drop.args[0])] += 1
    report.examples = len(examples)
    if not examples:
        raise DataError(f"{path}: every record was dropped ({report.summary()})")
    return examples, report


def _layout(
    sequences: list[list[int]], pad_id: int, padding_free: bool, owners: list[tuple[int, int]] | None = None
) -> dict[str, torch.Tensor]:
    """One right-padded row per sequence, or (padding_free) sequences end to end with each one's last position; with
    ``owners`` too (sequence i is response j of example b), each example's responses after one copy of the prompt
    they share (packing.SharedPrompts), with a tree_mask for the forward."""
    if padding_free and owners is not None:
        members: dict[int, list[list[int]]] = {}
        for seq, (b, j) in zip(sequences, owners):
            if j == len(members.setdefault(b, [])):  # a list's filler (its last response again) is laid once
                members[b].append(seq)
        layout = SharedPrompts([members[b] for b in sorted(members)], pad_id)
        last = [layout.flat(b, j, torch.tensor(len(seq) - 1)) for seq, (b, j) in zip(sequences, owners)]
        return {
            "input_ids": layout.input_ids,
            "position_ids": layout.position_ids,
            "last_index": torch.stack(last),
            "tree_mask": layout.tree_mask,
        }
    if padding_free:
        packed = pack_sequences(sequences, pad_id)
        return {k: packed[k] for k in ("input_ids", "position_ids", "last_index")}
    return pad_sequences(sequences, pad_id)


def collate_preferences(
    examples: list, pad_id: int, padding_free: bool = False, share_prompt: bool = False
) -> dict[str, torch.Tensor]:
    """Pairs: 2B sequences, chosen first then rejected, so both are scored in one forward. Lists: B·K sequences
    and a (B, K) mask. ``padding_free`` lays them end to end in fewer rows (tether/models/packing.py);
    ``share_prompt`` too: each example's responses after one copy of their prompt (text rows only)."""
    share = share_prompt and not any(e.vision is not None for e in examples)
    if isinstance(examples[0], PairExample):
        owners = [(b, j) for j in range(2) for b in range(len(examples))] if share else None
        sequences = [e.chosen_ids for e in examples] + [e.rejected_ids for e in examples]
        batch = _layout(sequences, pad_id, padding_free, owners)
        if any(e.vision is not None for e in examples):  # padded rows: chosen rows, then rejected rows
            batch.update(join_vision([e.vision for e in examples] * 2, batch["input_ids"].shape[1]))
        return {
            **batch,  # 2B sequences
            "margin": torch.tensor([e.margin for e in examples]),  # (B,)
            "head_labels": torch.tensor([e.head_labels for e in examples]),
        }  # (B, heads)
    k = max(len(e.ranked_ids) for e in examples)
    rows, list_mask = [], torch.zeros((len(examples), k), dtype=torch.bool)
    for i, e in enumerate(examples):
        for j in range(k):
            rows.append(e.ranked_ids[j] if j < len(e.ranked_ids) else e.ranked_ids[-1])  # filler rows are masked out
            list_mask[i, j] = j < len(e.ranked_ids)
    owners = [(i, min(j, len(e.ranked_ids) - 1)) for i, e in enumerate(examples) for j in range(k)] if share else None
    batch = _layout(rows, pad_id, padding_free, owners)
    if any(e.vision is not None for e in examples):  # each row's record's images, row by row
        batch.update(join_vision([e.vision for e in examples for _ in range(k)], batch["input_ids"].shape[1]))
    return {**batch, "list_mask": list_mask}  # B·K sequences, (B, K)


def encode_scored(fields: dict, response, tokenizer, processor, where: str, field_name: str, max_pixels: int, report):
    """A (prompt, response) as a vision-language reward model scores it: data/preferences.py render_response's text
    (read at its last token), the record's images in their places in the prompt and widened by the processor.
    Returns (token ids, pixel tensors or None); ``report`` (if any) adds up the images and their tokens."""
    widened = Widened(processor, add_special=False)
    prompt = fields.get("prompt")
    refs = image_list(fields, where)
    if prompt is None and refs:
        raise DataError(f"{where}: the record has images and no 'prompt' field to show them in")
    if prompt is not None:
        prompt, refs = placed({"prompt": prompt, IMAGES: fields.get(IMAGES)}, "prompt", widened.placeholder, where)
        prompt = prompt["prompt"]
    text = render_response(tokenizer, prompt, response, where, field_name)
    images, encoded = widened.encode(text, refs, where, max_pixels)
    ids = encoded["input_ids"][0].tolist()
    if report is not None:
        report.images += len(images)
        report.image_tokens += len(ids) - len(tokenizer(text, add_special_tokens=False)["input_ids"]) + len(images)
    return ids, vision_of(encoded, processor) or None
