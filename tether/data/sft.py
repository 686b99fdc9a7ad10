"""Records -> token ids and a loss mask, with the data policy applied and counted.

The full sequence is tokenised once; which tokens are trained is decided in
token space from the character spans of the completion (offset mapping), so a
BPE merge across the prompt/completion boundary cannot shift the mask.

Policy (docs/data.md): empty completions, examples with no trained token and
examples longer than ``max_length`` are dropped and counted, or are errors
with ``strict``. Nothing is truncated.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field

import torch

from tether.console import progress
from tether.data.records import ACCEPTED_FORMATS, ROLES, DataError, Record
from tether.models.chat import (
    call_id,
    has_template,
    hermes_text,
    render_chat,
    run_format_writer,
    takes_tools,
    template_conversation,
    template_errors,
    template_name,
    written_calls,
)
from tether.models.packing import pack_sequences


@dataclass
class Example:
    input_ids: list[int]
    loss_mask: list[int]  # 1 where this token is a trained target (predicted from the token before it)
    where: str
    position_ids: list[int] | None = None  # only for packed rows
    vision: dict | None = None  # a vision-language model's pixel tensors for this example (data/multimodal.py)


@dataclass
class DataReport:
    path: str
    format: str = "?"
    records: int = 0
    dropped: Counter = field(default_factory=Counter)
    examples: int = 0
    tokens: int = 0
    trained_tokens: int = 0
    warnings: Counter = field(default_factory=Counter)
    unused: list = field(default_factory=list)  # columns of the file the format does not read
    images: int = 0
    examples_with_images: int = 0
    image_tokens: int = 0  # the tokens the processor widened the images' placeholders into

    def drop(self, drop: Exception, where: str, strict: bool) -> None:
        """Count a dropped example by its reason, or, with --strict, stop on it naming the record."""
        if strict:
            raise DataError(f"{where}: example {drop.args[0]} (--strict)") from None
        self.dropped[str(drop.args[0])] += 1

    def summary(self) -> str:
        parts = [
            f"{self.path}: {self.records} records ({self.format}) -> {self.examples} examples, "
            f"{self.tokens} tokens, {self.trained_tokens} trained"
        ]
        if self.images:
            parts.append(
                f"{self.images} images in {self.examples_with_images} examples, {self.image_tokens} image tokens "
                f"({self.image_tokens / self.images:.0f} an image, {self.image_tokens / max(self.tokens, 1):.0%} of "
                "the tokens)"
            )
        if self.unused:
            parts.append(f"columns not used: {', '.join(self.unused)}")
        if self.dropped:
            parts.append(
                "dropped: "
                + ", ".join(f"{n} {why}" for why, n in sorted(self.dropped.items()))
                + " (use --strict to make these errors)"
            )
        for why, n in sorted(self.warnings.items()):
            parts.append(f"warning: {n} {why}")
        return "; ".join(parts)


FORMAT_FIELDS = {
    "messages": ("messages", "tools"),
    "prompt/completion": ("prompt", "completion", "tools"),
    "text": ("text",),
}


def detect_format(fields: dict, where: str) -> str:
    if "messages" in fields:
        return "messages"
    if "prompt" in fields and "completion" in fields:
        return "prompt/completion"
    if "text" in fields:
        return "text"
    raise DataError(
        f"{where}: no field this data format needs; the record has fields {sorted(fields)}. "
        f"Accepted formats: {'; '.join(ACCEPTED_FORMATS)}. Map other names with --columns, e.g. --columns prompt=question,completion=answer"
    )


class _Drop(Exception):
    """Internal: this example is dropped (or an error under strict) for the given reason."""


def check_kept(ids: list[int], mask: list[int], max_length: int) -> None:
    """An example is kept when it has a trained token and fits max_length; else a _Drop says why."""
    if not any(mask):
        raise _Drop("with no trained token")
    if len(ids) > max_length:
        raise _Drop(f"longer than max_length={max_length} tokens")


def check_str(value, where: str, name: str) -> str:
    if not isinstance(value, str):
        raise DataError(f"{where}: field {name!r} must be a string, got {type(value).__name__}")
    return value


def check_messages(value, where: str, name: str) -> list[dict]:
    if not isinstance(value, list) or not value:
        raise DataError(f"{where}: field {name!r} must be a non-empty list of {{role, content}} messages")
    for i, msg in enumerate(value):
        if not isinstance(msg, dict) or "role" not in msg or "content" not in msg:
            raise DataError(f"{where}: field {name}[{i}] must be an object with 'role' and 'content', got {msg!r:.80}")
        if msg["role"] not in ROLES:
            raise DataError(f"{where}: field {name}[{i}].role is {msg['role']!r}; roles are {', '.join(ROLES)}")
        if isinstance(msg["content"], list) and msg["role"] != "assistant":  # text and image parts (data/images.py)
            continue
        check_str(msg["content"], where, f"{name}[{i}].content")
    return value


def schema_problem(schema) -> str | None:
    """What is wrong with a tool schema, naming its field (None: nothing): {"type": "function", "function": {"name":
    str, "description": str, "parameters": {"type": "object", "properties": {...}, "required": [names]}}}, what
    templates' ``tools=`` and tether's system message read."""
    shape = '{"type": "function", "function": {"name", "description", "parameters"}}'
    if not isinstance(schema, dict) or not isinstance(schema.get("function"), dict):
        return f"must be {shape}, not {str(schema)[:120]!r}"
    function = schema["function"]
    if not isinstance(function.get("name"), str) or not function["name"]:
        return f"function.name must be the tool's name (a string), not {function.get('name')!r}"
    parameters = function.get("parameters", {})
    if not isinstance(parameters, dict):
        return f"function.parameters must be a JSON schema object, not {parameters!r:.80}"
    if not isinstance(parameters.get("properties", {}), dict):
        return f"function.parameters.properties must be an object, not {parameters['properties']!r:.80}"
    required = parameters.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        return f"function.parameters.required must be a list of parameter names, not {required!r:.80}"
    return None


def check_tool_schemas(schemas: list, where: str) -> list[dict]:
    """``schemas`` (a record's ``tools``), or a DataError naming the record, the tool and the field."""
    for i, schema in enumerate(schemas):
        problem = schema_problem(schema)
        if problem:
            raise DataError(f"{where}: field tools[{i}]: {problem}")
    return schemas


def tools_system_message(schemas: list[dict], write=None) -> dict:
    """A system message listing the tools, for chat templates without their own ``tools=`` support, with an example
    call written by ``write(calls)``: the same writer as the calls the model is trained on and read by (the chat
    template's own, or the run's parser's: one choice, docs/agents.md); Hermes text by default. A writer that
    cannot write (a user's parser without ``write``) leaves the example out."""
    listed = "\n".join(json.dumps(s) for s in schemas)
    function = schemas[0].get("function", schemas[0]) if schemas else {}
    required = function.get("parameters", {}).get("required", [])
    example = [{"name": function.get("name", "NAME"), "arguments": {p: f"<{p}>" for p in required}, "id": call_id(1)}]
    try:
        how = (write or hermes_text)(example)
    except NotImplementedError:
        how = None
    return {
        "role": "system",
        "content": f"You may call functions to help with the request. The functions:\n<tools>\n{listed}\n</tools>\n"
        + (f"To call one, write the call as in this example (its values are placeholders):\n{how}\n" if how else "")
        + "A call's result comes back in a tool message.",
    }


def template_call_writer(tokenizer):
    """How the run's template writes calls in a conversation without ``tools=``: its own rendering, or, where it
    writes none, the run's call format (what template_conversation then puts in the turn)."""
    fallback = run_format_writer(tokenizer)

    def write(calls):
        try:
            return written_calls(tokenizer, calls) or fallback(calls)
        except template_errors():  # it renders calls, but not this example: the turns' own rendering decides
            return fallback(calls)

    return write


def with_tools(
    tokenizer, messages: list[dict], tools: list[dict] | None, where: str = "tools"
) -> tuple[list[dict], dict]:
    """(messages, render keywords) for a conversation with tool schemas, rendered as the online stages render an
    environment's tools: given to a template that takes ``tools=``, else listed in a system message; its tool
    calls and results as the template takes them (models/chat.py, template_conversation). A schema either would
    misread is a DataError naming ``where`` (the record)."""
    if not tools:
        return template_conversation(tokenizer, messages), {}
    check_tool_schemas(tools, where)
    if takes_tools(tokenizer):
        return template_conversation(tokenizer, messages, tools=True), {"tools": tools}
    system = tools_system_message(tools, template_call_writer(tokenizer))
    return [system, *template_conversation(tokenizer, messages)], {}


def render_record(tokenizer, messages, where, add_generation_prompt: bool = False, tools=None) -> str:
    """A conversation through the run's chat template and options (models/chat.py); a missing template, or one
    that refuses the conversation, names ``where``."""
    if not has_template(tokenizer):
        raise DataError(
            f"{where}: chat messages need a chat template, and the tokenizer has none "
            "(add 'chat_template' to its tokenizer_config.json, or use prompt/completion strings)"
        )
    messages = template_conversation(tokenizer, messages, bool(tools))
    try:
        return render_chat(tokenizer, messages, add_generation_prompt, tools)
    except template_errors() as err:
        roles = ", ".join(m.get("role", "?") + ("+tool_calls" if m.get("tool_calls") else "") for m in messages)
        raise DataError(
            f"{where}: the chat template ({template_name(tokenizer, bool(tools))}) refuses the conversation "
            f"[{roles}]: {type(err).__name__}: {err}"
        ) from None


def _assistant_spans(
    tokenizer, messages, first_trained: int, where: str, report: DataReport, tools: list[dict] | None = None
) -> tuple[str, list]:
    """Render a conversation (with its tool schemas, if any) and return the character spans of assistant turns
    from index first_trained on."""
    shown, extra = with_tools(tokenizer, messages, tools, where)
    first_trained += len(shown) - len(messages)
    messages = shown
    full = render_record(tokenizer, messages, where, **extra)
    from tether.models.lm import end_of_turn_id

    spans = []
    eos = tokenizer.eos_token
    eot_id = end_of_turn_id(tokenizer)
    end_of_turn = tokenizer.convert_ids_to_tokens(eot_id) if eot_id is not None else ""
    for i in range(first_trained, len(messages)):
        if messages[i]["role"] != "assistant":
            continue
        if not (messages[i]["content"] or "").strip() and not messages[i].get("tool_calls"):
            raise _Drop("empty completion")
        prefix = render_record(tokenizer, messages[:i], where, add_generation_prompt=True, **extra)
        # the last turn's rendering is the whole conversation's, already rendered (most records: one turn)
        upto = full if i == len(messages) - 1 else render_record(tokenizer, messages[: i + 1], where, **extra)
        if not (upto.startswith(prefix) and full.startswith(upto)):
            raise DataError(
                f"{where}: the chat template renders earlier turns differently once later turns are added, "
                "so assistant tokens cannot be located; use prompt/completion strings instead"
            )
        end = len(upto)
        turn = upto[len(prefix) :]
        closing = eos if eos and eos in turn else end_of_turn if end_of_turn and end_of_turn in turn else ""
        if closing:  # train up to and including EOS (or the template's end-of-turn token), not the newline after it
            end = len(prefix) + turn.rindex(closing) + len(closing)
        else:
            report.warnings[
                "assistant turns without the EOS or end-of-turn token (the model may not learn to stop)"
            ] += 1
        spans.append((len(prefix), end))
    if not spans:
        raise _Drop("no assistant turn")
    return full, spans


def render(fields: dict, fmt: str, tokenizer, train_on_prompt: bool, where: str, report: DataReport):
    """Text to tokenise, character spans to train on, and whether the tokenizer adds its own special tokens."""
    eos = tokenizer.eos_token or ""
    if fmt == "text":
        text = check_str(fields["text"], where, "text")
        if not text.strip():
            raise _Drop("empty text")
        text = text if text.endswith(eos) else text + eos
        return text, [(0, len(text))], True
    if fmt == "messages":
        messages = check_messages(fields["messages"], where, "messages")
        text, spans = _assistant_spans(tokenizer, messages, 0, where, report, fields.get("tools"))
        return text, ([(0, len(text))] if train_on_prompt else spans), False
    prompt, completion = fields["prompt"], fields["completion"]
    if isinstance(prompt, list) or isinstance(completion, list):
        prompt = check_messages(prompt, where, "prompt")
        completion = check_messages(completion, where, "completion")
        text, spans = _assistant_spans(tokenizer, prompt + completion, len(prompt), where, report, fields.get("tools"))
        return text, ([(0, len(text))] if train_on_prompt else spans), False
    prompt = check_str(prompt, where, "prompt")
    completion = check_str(completion, where, "completion")
    if not completion.strip():
        raise _Drop("empty completion")
    text = prompt + completion
    text = text if text.endswith(eos) else text + eos  # EOS is a trained label: models must learn to stop
    return text, [(0 if train_on_prompt else len(prompt), len(text))], True


def tokenize_records(
    records: list[Record],
    tokenizer,
    max_length: int,
    train_on_prompt: bool = False,
    strict: bool = False,
    path: str = "data",
) -> tuple[list[Example], DataReport]:
    if not getattr(tokenizer, "is_fast", False):
        raise DataError(
            f"tokenizer {getattr(tokenizer, 'name_or_path', '')!r} is not a fast tokenizer; tether needs "
            "offset mappings (a tokenizer.json) to locate completion tokens"
        )
    report = DataReport(path=str(path), records=len(records))
    if not records:
        raise DataError(f"{path}: no records")
    fmt = detect_format(records[0].fields, records[0].where)
    labelled = next((r for r in records if isinstance(r.fields.get("label"), bool)), None)
    if labelled is not None:  # KTO's rows in any shape (prompt/completion, messages or alpaca with kto_tag...)
        raise DataError(
            f"{labelled.where}: unpaired preference data (a true/false 'label' or 'kto_tag' on each answer, as "
            "for KTO): SFT would train on the answers labelled false too. Train on them with `tether dpo --loss "
            "kto`, or keep the rows labelled true and drop the column for SFT"
        )
    report.format = fmt
    report.unused = sorted(set(records[0].fields) - set(FORMAT_FIELDS[fmt]))
    examples = []
    # Rendered one record at a time (errors name the record), tokenised in chunks: the fast tokenizer encodes a list
    # in one call, faster than record by record, with the same ids and offsets. Records are then taken in order, so
    # --strict names the first bad one.
    chunk = 512
    for start in progress(
        range(0, len(records), chunk),
        (len(records) + chunk - 1) // chunk,
        f"tokenising {path} ({chunk} records a chunk)",
        min_items=2000 // chunk,
    ):
        outcomes = []  # per record: (text, spans, add_special) or the _Drop that rendering raised
        for rec in records[start : start + chunk]:
            if detect_format(rec.fields, rec.where) != fmt:
                raise DataError(
                    f"{rec.where}: record is {detect_format(rec.fields, rec.where)} but earlier records are {fmt}; one format per file"
                )
            try:
                outcomes.append(render(rec.fields, fmt, tokenizer, train_on_prompt, rec.where, report))
            except _Drop as why:
                outcomes.append(why)
        encoded = iter(encode_in_order(tokenizer, [o for o in outcomes if not isinstance(o, _Drop)]))
        for rec, outcome in zip(records[start : start + chunk], outcomes):
            try:
                if isinstance(outcome, _Drop):
                    raise outcome
                ids, offsets = next(encoded)
                spans = outcome[1]
                mask = [int(any(s < e_span and e > s_span for s_span, e_span in spans)) for s, e in offsets]
                mask[0] = (
                    0  # nothing predicts the first token (and in a packed row it must not see the previous example)
                )
                check_kept(ids, mask, max_length)
            except _Drop as drop:
                report.drop(drop, rec.where, strict)
                continue
            examples.append(Example(ids, mask, rec.where))
            report.tokens += len(ids)
            report.trained_tokens += sum(mask)
    report.examples = len(examples)
    if not examples:
        raise DataError(f"{path}: every record was dropped ({report.summary()})")
    return examples, report


def encode_in_order(tokenizer, rendered: list[tuple]) -> list[tuple]:
    """(ids, offsets) of each rendered (text, spans, add_special), in order. A file's prompt/completion rows may be
    strings (the tokenizer adds its special tokens: BOS) or chat messages (the template wrote them), so each kind is
    encoded in its own call: one call's add_special for both would double or drop a BOS."""
    out = [None] * len(rendered)
    for add_special in (True, False):
        at = [i for i, r in enumerate(rendered) if bool(r[2]) is add_special]
        if at:
            enc = tokenizer([rendered[i][0] for i in at], add_special_tokens=add_special, return_offsets_mapping=True)
            for i, ids, offsets in zip(at, enc["input_ids"], enc["offset_mapping"]):
                out[i] = (ids, offsets)
    return out


def pack_examples(examples: list[Example], max_length: int) -> list[Example]:
    """Greedy packing, in order, into rows of at most max_length tokens.

    Each example keeps its own position ids (restarting at 0); with no 2-D
    attention mask, transformers builds a block-diagonal causal mask from
    those resets, so no token attends across examples (a test checks the
    logits equal the unpacked ones).
    """
    rows, cur = [], None
    for ex in examples:
        if cur is not None and len(cur.input_ids) + len(ex.input_ids) > max_length:
            rows.append(cur)
            cur = None
        if cur is None:
            cur = Example([], [], "packed", [])
        cur.input_ids += ex.input_ids
        cur.loss_mask += ex.loss_mask
        cur.position_ids += list(range(len(ex.input_ids)))
    if cur is not None:
        rows.append(cur)
    return rows


def collate(examples: list[Example], pad_id: int, padding_free: bool = False) -> dict[str, torch.Tensor]:
    """Right-pad a micro-batch (training needs no left padding). Packed rows get position_ids and no attention mask.
    ``padding_free`` lays the micro-batch's examples end to end in fewer rows (tether/models/packing.py); examples that
    are already packed rows (--packing) are laid out as they are."""
    vision = any(ex.vision for ex in examples)  # padded rows: the vision features fill each row's image tokens
    if padding_free and not vision and examples[0].position_ids is None:
        batch = pack_sequences([ex.input_ids for ex in examples], pad_id, [ex.loss_mask for ex in examples])
        return {k: batch[k] for k in ("input_ids", "position_ids", "loss_mask")}
    width = max(len(ex.input_ids) for ex in examples)
    n = len(examples)
    input_ids = torch.full((n, width), pad_id, dtype=torch.long)  # (B, T)
    loss_mask = torch.zeros((n, width), dtype=torch.long)  # (B, T)
    attention_mask = torch.zeros((n, width), dtype=torch.long)  # (B, T)
    packed = examples[0].position_ids is not None
    position_ids = torch.zeros((n, width), dtype=torch.long) if packed else None
    for i, ex in enumerate(examples):
        k = len(ex.input_ids)
        input_ids[i, :k] = torch.tensor(ex.input_ids)
        loss_mask[i, :k] = torch.tensor(ex.loss_mask)
        attention_mask[i, :k] = 1
        if packed:
            position_ids[i, :k] = torch.tensor(ex.position_ids)
            position_ids[i, k:] = torch.arange(width - k)  # padding is its own segment
    batch = {"input_ids": input_ids, "loss_mask": loss_mask}
    if packed:
        batch["position_ids"] = position_ids
    else:
        batch["attention_mask"] = attention_mask
    if vision:
        from tether.data.images import collate_vision

        batch.update(collate_vision(examples, width))
    return batch
