"""Preference data for the policy (DPO family): every response tokenised with its prompt and a response mask.

A pair (prompt, chosen, rejected) becomes two SFT-style examples whose loss mask
covers the response tokens (and EOS) only — the same rendering and offset-mapped
masking as SFT (tether/data/sft.py), so a chat template or a BPE merge across the
prompt/response boundary cannot shift it. A ranked list (prompt, responses,
ranking) becomes K examples, best first. A pair of whole conversations without a prompt (TRL's implicit
prompt) has the messages both open with as its prompt. Unpaired labels (prompt, completion, label: true/false —
KTO's data) become two responses per example: the completion, then another row's completion under this prompt
(the mismatched pair KTO's reference point is estimated from, docs/algorithms.md §6.5); with ``unpaired=True`` a
pair becomes two such examples, chosen desirable and rejected not.

Policy (docs/data.md): pairs whose chosen equals rejected and examples longer
than max_length are dropped and counted (errors with strict); malformed records
are errors naming the file, line and field. Nothing is truncated.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from tether.console import progress
from tether.data.images import collate_vision, image_list
from tether.data.multimodal import encode_example
from tether.data.preferences import (
    PreferenceReport,
    ordered_responses,
    preference_format,
    split_implicit_prompt,
    unused_columns,
)
from tether.data.records import DataError, Record
from tether.data.sft import DataReport, Example, _Drop, render
from tether.models.packing import pack_sequences, pack_shared_prompts, pad_sequences


@dataclass
class PolicyPreference:
    """One prompt's responses, best first: two for a pair (chosen, rejected), K for a ranked list."""

    responses: list[Example]
    where: str
    reference_logps: list[float] | None = None  # Σ log π_ref over each response's tokens, filled in before training
    desirable: bool | None = None  # unpaired (KTO) examples: the completion's label; responses[1] is the mismatched one


@dataclass
class Images:
    """A vision-language model's side of a record: its processor, the record's images, the pixel limit, and the
    counts the report adds up."""

    processor: object
    refs: list
    max_pixels: int
    counts: DataReport


def _response_example(
    tokenizer, prompt, response, where: str, field_name: str, max_length: int, images: Images | None = None
) -> Example:
    """One response with its prompt, masked on the response; with ``images``, the prompt shows the record's images
    and the processor widens them (data/multimodal.py), so every response of a record carries the same pixels."""
    if isinstance(response, str) and not response.strip() or isinstance(response, list) and not response:
        raise DataError(f"{where}: field {field_name!r} is empty")
    fields = {
        "prompt": prompt if prompt is not None else ([] if isinstance(response, list) else ""),
        "completion": response,
    }
    if isinstance(response, list) and not fields["prompt"]:
        raise DataError(f"{where}: field 'prompt' is missing; chat responses need the prompt messages")
    try:
        if images is not None:
            fields["images"] = images.refs
            example = encode_example(
                fields, "prompt/completion", tokenizer, images.processor, False, where, images.counts, images.max_pixels
            )
            ids, mask = example.input_ids, example.loss_mask
        else:
            text, spans, add_special = render(fields, "prompt/completion", tokenizer, False, where, DataReport(where))
    except DataError as err:  # name the response field, not SFT's 'completion'
        raise DataError(
            str(err).replace("'completion'", repr(field_name)).replace("completion[", f"{field_name}[")
        ) from None
    if images is None:
        enc = tokenizer(text, add_special_tokens=add_special, return_offsets_mapping=True)
        ids, offsets = enc["input_ids"], enc["offset_mapping"]
        mask = [int(any(s < e_span and e > s_span for s_span, e_span in spans)) for s, e in offsets]
        mask[0] = 0
    if not any(mask):
        raise _Drop("with an empty response")
    if len(ids) > max_length:
        raise _Drop(f"longer than max_length={max_length} tokens")
    return Example(ids, mask, where, vision=example.vision if images is not None else None)


KTO_FORMATS = (
    "KTO reads unpaired rows — prompt, completion and a true/false label (TRL's shape; prompt and completion "
    "strings or chat messages), messages with a label, or LLaMA-Factory's kto_tag rows (alpaca or sharegpt) — "
    "or pairs (prompt, chosen, rejected), each split into a desirable and an undesirable row"
)


def _unpaired_items(records: list[Record], fmt: str, path, report, strict: bool) -> list[tuple]:
    """(prompt, completion, desirable, where, the record's images, the record's index) of unpaired rows, or of pairs
    split in two; a pair whose answers are equal is dropped and counted in ``report`` as the pairwise losses do (an
    error naming it with --strict)."""
    items = []
    for k, rec in enumerate(records):
        f, where = rec.fields, rec.where
        if fmt == "unpaired":
            if "completion" not in f or not isinstance(f.get("label"), bool):
                raise DataError(
                    f"{where}: unpaired rows need 'completion' and a true/false 'label'; the row has "
                    f"{sorted(f)}" + (f" (label {f.get('label')!r})" if "label" in f else "") + f". {KTO_FORMATS}"
                )
            items.append((f.get("prompt"), f["completion"], f["label"], where, image_list(f, where), k))
        elif fmt == "pairs":
            f = split_implicit_prompt(f, where)
            try:
                ordered = ordered_responses(f, fmt, where)
            except _Drop as drop:
                if strict:
                    raise DataError(f"{where}: example {drop.args[0]} (--strict)") from None
                report.dropped[str(drop.args[0])] += 1
                continue
            for name, response in ordered:
                items.append(
                    (f.get("prompt"), response, name == "chosen", f"{where} ({name})", image_list(f, where), k)
                )
        else:
            raise DataError(f"{path}: ranked lists need --loss listwise. {KTO_FORMATS}")
    if len({item[5] for item in items}) < 2:
        raise DataError(f"{path}: KTO needs at least 2 records (each is compared with another record's completion)")
    return items


def _other_completion(items: list[tuple], i: int):
    """The completion KTO's reference point compares item ``i`` with: the next item (wrapping round) of another
    record. A pair's two halves are adjacent, and the pair's own other answer would not be a mismatched one."""
    n = len(items)
    return next(items[(i + j) % n][1] for j in range(1, n) if items[(i + j) % n][5] != items[i][5])


def tokenize_unpaired(
    records: list[Record],
    tokenizer,
    max_length: int,
    strict: bool = False,
    path: str = "data",
    processor=None,
    max_pixels: int = 16_777_216,
) -> tuple[list[PolicyPreference], PreferenceReport]:
    """Unpaired labels (or pairs split in two) -> PolicyPreference list with two responses: the labelled completion
    and the next record's completion under this row's prompt (wrapping round). With a vision-language model's
    ``processor`` both are shown this row's images: the mismatched pair is this prompt, its pictures, another
    row's answer."""
    _check_fast(tokenizer)
    try:
        fmt = preference_format(records, path)
    except DataError as err:
        raise DataError(f"{err} {KTO_FORMATS}") from None
    report = PreferenceReport(
        path=str(path),
        records=len(records),
        format="unpaired" if fmt == "unpaired" else f"{fmt} split into unpaired labels",
        unused=unused_columns(records, fmt, ("images",) if processor is not None else ()),
    )
    items = _unpaired_items(records, fmt, path, report, strict)
    examples: list[PolicyPreference] = []
    for i, (prompt, completion, desirable, where, refs, _) in progress(
        enumerate(items), len(items), f"tokenising {path}"
    ):
        other = _other_completion(items, i)
        report.count_plain(tokenizer, prompt, [completion])
        images = Images(processor, refs, max_pixels, DataReport(path=where)) if processor is not None else None
        try:
            responses = [
                _response_example(tokenizer, prompt, completion, where, "completion", max_length, images),
                _response_example(tokenizer, prompt, other, where, "completion (of the next row)", max_length, images),
            ]
            if images is not None:  # both responses widened the same images: count them once
                report.images += len(images.refs)
                report.image_tokens += images.counts.image_tokens // len(responses)
        except _Drop as drop:
            if strict:
                raise DataError(f"{where}: example {drop.args[0]} (--strict)") from None
            report.dropped[str(drop.args[0])] += 1
            continue
        examples.append(PolicyPreference(responses, where, desirable=desirable))
    report.examples = len(examples)
    if not examples:
        raise DataError(f"{path}: every record was dropped ({report.summary()})")
    if all(e.desirable for e in examples) or not any(e.desirable for e in examples):
        raise DataError(
            f"{path}: every kept row has label {examples[0].desirable}; KTO needs both desirable and "
            "undesirable completions"
            + (" (held out: pass --eval-data, or --eval-fraction 0)" if "held out" in str(path) else "")
        )
    return examples, report


def _check_fast(tokenizer) -> None:
    if not getattr(tokenizer, "is_fast", False):
        raise DataError(
            f"tokenizer {getattr(tokenizer, 'name_or_path', '')!r} is not a fast tokenizer; tether needs "
            "offset mappings (a tokenizer.json) to locate response tokens"
        )


def tokenize_policy_preferences(
    records: list[Record],
    tokenizer,
    max_length: int,
    strict: bool = False,
    path: str = "data",
    processor=None,
    max_pixels: int = 16_777_216,
) -> tuple[list[PolicyPreference], PreferenceReport]:
    """Pairs (prompt/chosen/rejected) or ranked lists (prompt/responses/ranking) -> PolicyPreference list; with a
    vision-language model's ``processor``, each record's images shown in its prompt (docs/data.md "Images")."""
    _check_fast(tokenizer)
    report = PreferenceReport(path=str(path), records=len(records), format=preference_format(records, path))
    report.unused = unused_columns(records, report.format, ("images",) if processor is not None else ())
    if report.format == "unpaired":
        raise DataError(
            f"{records[0].where}: unpaired labels (a completion with a true/false 'label', as for KTO); "
            "this loss compares pairs — use --loss kto, or pairs data"
        )
    examples: list[PolicyPreference] = []
    for rec in progress(records, len(records), f"tokenising {path}"):
        where = rec.where
        f = split_implicit_prompt(rec.fields, where) if report.format == "pairs" else rec.fields
        try:
            ordered = ordered_responses(f, report.format, where)  # a pair whose answers are equal is a _Drop
            report.count_plain(tokenizer, f.get("prompt"), [value for _, value in ordered])
            images = None
            if processor is not None:
                images = Images(processor, image_list(f, where), max_pixels, DataReport(path=where))
            responses = [
                _response_example(tokenizer, f.get("prompt"), value, where, name, max_length, images)
                for name, value in ordered
            ]
            if images is not None:  # each response widened the same images: count them once
                report.images += len(images.refs)
                report.image_tokens += images.counts.image_tokens // len(responses)
        except _Drop as drop:
            if strict:
                raise DataError(f"{where}: example {drop.args[0]} (--strict)") from None
            report.dropped[str(drop.args[0])] += 1
            continue
        examples.append(PolicyPreference(responses, where))
    report.examples = len(examples)
    if not examples:
        raise DataError(f"{path}: every record was dropped ({report.summary()})")
    return examples, report


def data_fingerprint(examples: list[PolicyPreference]) -> str:
    """Hash of every response's token ids and response mask, in order: what the reference log-probs depend on."""
    digest = hashlib.sha256()
    for ex in examples:
        digest.update(b"|")
        for r in ex.responses:
            digest.update(torch.tensor(r.input_ids, dtype=torch.int64).numpy().tobytes())
            digest.update(bytes(r.loss_mask))
            for key in sorted(r.vision or {}):  # a vision model's reference log-probs depend on the pixels too
                digest.update(key.encode() + r.vision[key].contiguous().view(-1).to(torch.float64).numpy().tobytes())
            digest.update(b";")
    return digest.hexdigest()


def collate_policy_preferences(
    examples: list[PolicyPreference], pad_id: int, padding_free: bool = False, share_prompt: bool = False
) -> dict[str, torch.Tensor]:
    """Response-major sequences: sequences [k·B, (k+1)·B) are every example's k-th response (chosen block, then
    rejected block for pairs), so one forward scores all of them. Padded: one right-padded row per sequence.
    ``padding_free``: each block's sequences laid end to end in fewer rows (tether/models/packing.py; ``group_rows``
    gives each block's rows); with ``share_prompt`` too, each example's responses after one copy of the tokens they
    begin with (``pack_shared_prompts``: no blocks, so not for KTO's block forwards). ``list_mask`` (B, K) marks real
    responses (a shorter list repeats its last response in the filler sequences); ``reference_logps`` (B, K) when
    known."""
    k = max(len(e.responses) for e in examples)
    rows = [e.responses[min(j, len(e.responses) - 1)] for j in range(k) for e in examples]
    vision = any(r.vision for r in rows)  # padded rows: each row's image features fill its own image tokens
    if padding_free and share_prompt and not vision:
        batch = pack_shared_prompts(
            [[r.input_ids for r in e.responses] for e in examples],
            [[r.loss_mask for r in e.responses] for e in examples],
            pad_id,
            k,
        )
    elif padding_free and not vision:
        b = len(examples)
        batch = pack_sequences(
            [r.input_ids for r in rows],
            pad_id,
            [r.loss_mask for r in rows],
            groups=[list(range(j * b, (j + 1) * b)) for j in range(k)],
        )
        del batch["last_index"]
    else:
        batch = pad_sequences([r.input_ids for r in rows], pad_id, [r.loss_mask for r in rows])
    if vision:  # response-major like the rows: every block shows the same images (group_rows takes one block's)
        batch.update(collate_vision(rows, batch["input_ids"].shape[1]))
    list_mask = torch.tensor([[j < len(e.responses) for j in range(k)] for e in examples], dtype=torch.bool)
    batch["list_mask"] = list_mask
    if examples[0].desirable is not None:
        batch["desirable"] = torch.tensor([bool(e.desirable) for e in examples])
    if examples[0].reference_logps is not None:
        batch["reference_logps"] = torch.tensor(
            [[e.reference_logps[min(j, len(e.responses) - 1)] for j in range(k)] for e in examples], dtype=torch.float32
        )
    return batch
