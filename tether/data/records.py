"""Read records from JSONL, JSON, CSV, Parquet, a `datasets` save_to_disk folder, or a folder of data files laid
out as on the Hugging Face hub (`data/train-00000-of-00002.parquet`, `train.jsonl`, ...).

ShareGPT rows (`conversations` of `{from, value}`) are read as `messages`, message contents given as lists of
parts (`[{"type": "text", "text": ...}]`) as their text, and assistant turns' `tool_calls` checked and kept structured
(each chat template writes them its own way). LLaMA-Factory's shapes are read as LLaMA-Factory reads them (docs/data.md,
"Files from LLaMA-Factory"): alpaca rows (`instruction`, `input`, `output` or `chosen`/`rejected`, `system`, `history`,
`kto_tag`) become chat turns, ShareGPT `function_call`/`observation` turns tool calls and results, a `system` column
the first message, `tools` the schemas the chat template is given; ShareGPT preference rows (`chosen`/`rejected` as
one `{from, value}` turn) and KTO rows (`kto_tag`, or a true/false `label` on `messages`) become prompt and
response(s). ``dataset_info.json:NAME`` reads one dataset of a LLaMA-Factory data folder with its column mapping.

Every record keeps where it came from ("file.jsonl:12", "file.parquet row 3")
so that any later validation error can name the file, line and field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tether.data.images import message_content
from tether.errors import DataError  # noqa: F401 - re-exported: tether.data.records.DataError is public


@dataclass(frozen=True)
class Record:
    fields: dict
    where: str  # "path:line" (JSONL), "path record N" (JSON), "path row N" (Parquet, datasets)


ACCEPTED_FORMATS = (
    "prompt/completion (strings, or lists of chat messages)",
    "messages (a list of {role, content})",
    "text (plain text, every token trained)",
)


def parse_column_map(spec: str | dict | None) -> dict[str, str]:
    """ "prompt=question,completion=answer" -> {"question": "prompt", "answer": "completion"} (source -> tether name)."""
    if not spec:
        return {}
    if isinstance(spec, dict):
        pairs = spec.items()
    else:
        pairs = []
        for part in spec.split(","):
            if not part.strip():
                continue
            if "=" not in part:
                raise DataError(f"--columns: {part!r} should look like NAME=SOURCE_COLUMN, e.g. prompt=question")
            name, source = part.split("=", 1)
            pairs.append((name.strip(), source.strip()))
    return {source: name for name, source in pairs}


def read_records(
    path: str | Path, columns: str | dict | None = None, split: str = "train", limit: int = 0
) -> list[Record]:
    """All records of a data file or folder (the first ``limit`` when > 0), with column renames applied."""
    info = _dataset_info_entry(path)
    if info is not None:
        return _read_llamafactory(*info, columns, split, limit)
    path = Path(path)
    if not path.exists():
        raise DataError(f"{path}: no such file or folder")
    if path.is_dir():
        saved = (
            (path / "dataset_info.json").is_file()
            or (path / "dataset_dict.json").is_file()
            or (path / "state.json").is_file()
        )
        records = _read_saved_dataset(path, split) if saved else _read_data_folder(path, split)
    else:
        records = _read_file(path)
    return [_normalise(r) for r in _renamed(records[:limit] if limit > 0 else records, columns, path)]


def _renamed(records: list[Record], columns, path) -> list[Record]:
    """The raw rows with --columns' renames applied (before normalising); a source column the rows lack is named."""
    rename = parse_column_map(columns)
    if not rename or not records:
        return records
    missing = [source for source in rename if source not in records[0].fields]
    if missing:
        raise DataError(
            f"{path}: --columns names source column(s) {missing} that the data does not have; "
            f"it has {sorted(records[0].fields)}"
        )
    return [Record({rename.get(k, k): v for k, v in r.fields.items()}, r.where) for r in records]


def _dataset_info_entry(path) -> tuple[Path, str] | None:
    """(registry, names) for a LLaMA-Factory spec ``FOLDER/dataset_info.json:NAME[,NAME...]`` (or
    ``FOLDER:NAME``, or a registry saved under another name, ``registry.json:NAME``), else None. A registry named
    without ``:NAME`` is an error naming the datasets it lists."""
    text = str(path)
    where, colon, names = text.rpartition(":")
    if not colon or not names or "/" in names:
        bare = Path(text)
        registry = bare / "dataset_info.json" if bare.is_dir() else bare
        if bare.name == "dataset_info.json" or (bare.is_dir() and _is_registry(registry)):
            listed = _registry_names(registry)
            raise DataError(
                f"{text}: a LLaMA-Factory data folder's registry; name the dataset(s) to read: "
                f"{registry}:NAME[,NAME...]" + (f" (it lists {listed})" if listed else "")
            )
        return None
    info = Path(where)
    if info.is_dir():
        info = info / "dataset_info.json"
    if info.name != "dataset_info.json" and not (info.suffix == ".json" and info.is_file()):
        return None
    if not info.is_file():
        raise DataError(f"{info}: no such file (a LLaMA-Factory data folder has one, naming its datasets)")
    return info, names


def _is_registry(path: Path) -> bool:
    """A LLaMA-Factory dataset_info.json (entries with file_name or a hub url), not a `datasets` folder's."""
    if not path.is_file() or (path.parent / "state.json").is_file() or (path.parent / "dataset_dict.json").is_file():
        return False
    return bool(_registry_names(path))


def _registry_names(path: Path) -> list[str]:
    try:
        table = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return []
    keys = ("file_name", "hf_hub_url", "ms_hub_url", "om_hub_url", "script_url")
    if not isinstance(table, dict):
        return []
    return sorted(k for k, v in table.items() if isinstance(v, dict) and any(key in v for key in keys))


LLAMAFACTORY_COLUMNS = {  # dataset_info.json "columns" name -> the field name tether reads, per formatting
    "alpaca": {
        "prompt": "instruction",
        "query": "input",
        "response": "output",
        "system": "system",
        "history": "history",
        "chosen": "chosen",
        "rejected": "rejected",
        "kto_tag": "kto_tag",
        "tools": "tools",
        "images": "images",
    },
    "sharegpt": {
        "messages": "conversations",
        "system": "system",
        "tools": "tools",
        "chosen": "chosen",
        "rejected": "rejected",
        "kto_tag": "kto_tag",
        "images": "images",
    },
}
# LLaMA-Factory's OpenAI-style rows: messages of {role, content}, as tether reads them itself; else as sharegpt
LLAMAFACTORY_COLUMNS["openai"] = {**LLAMAFACTORY_COLUMNS["sharegpt"], "messages": "messages"}


def _read_llamafactory(info: Path, names: str, columns, split: str, limit: int) -> list[Record]:
    """The datasets ``names`` (comma-separated, read one after another as LLaMA-Factory mixes them by default)
    of a LLaMA-Factory data folder: each entry's file_name, formatting, columns and tags honoured."""
    try:
        table = json.loads(info.read_text())
    except json.JSONDecodeError as exc:
        raise DataError(f"{info}:{exc.lineno}: not valid JSON ({exc.msg})") from None
    if not isinstance(table, dict):
        raise DataError(
            f"{info}: must be a JSON object mapping each dataset's name to its entry (file_name, formatting, "
            f"columns, ...); it is a {type(table).__name__}"
        )
    named = [n.strip() for n in names.split(",") if n.strip()]
    records = [r for n in named for r in _registry_records(info, n, _registry_entry(info, table, n), split, columns)]
    return records[:limit] if limit > 0 else records


def _registry_entry(info: Path, table: dict, name: str) -> dict:
    """One dataset_info.json entry, its structure checked (each error names the file and the field)."""
    if name not in table:
        raise DataError(f"{info}: no dataset {name!r}; it lists {sorted(table)}")
    entry = table[name]
    if not isinstance(entry, dict):
        raise DataError(
            f"{info}: dataset {name!r} must be an object (file_name, formatting, columns, ...), "
            f"not a {type(entry).__name__}"
        )
    if "file_name" not in entry:
        hub = next((entry[k] for k in ("hf_hub_url", "ms_hub_url", "om_hub_url", "script_url") if k in entry), "")
        raise DataError(
            f"{info}: dataset {name!r} has no file_name ({hub or 'no local file'}); tether reads local files: "
            'download it into the folder and add "file_name"'
        )
    for key in ("columns", "tags"):
        if not isinstance(entry.get(key) or {}, dict):
            raise DataError(
                f"{info}: dataset {name!r}: {key} must be an object mapping names to names, "
                f"not a {type(entry[key]).__name__}"
            )
    count = entry.get("num_samples")
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
        raise DataError(f"{info}: dataset {name!r}: num_samples must be a whole number >= 1, got {count!r}")
    if not isinstance(entry["file_name"], str) or not isinstance(entry.get("formatting", "alpaca"), str):
        raise DataError(f"{info}: dataset {name!r}: file_name and formatting must be strings")
    return entry


def _registry_records(info: Path, name: str, entry: dict, split: str, columns) -> list[Record]:
    formatting = entry.get("formatting", "alpaca")
    if formatting not in LLAMAFACTORY_COLUMNS:
        raise DataError(
            f"{info}: dataset {name!r}: formatting {formatting!r} is not one of {', '.join(LLAMAFACTORY_COLUMNS)}"
        )
    rename = {}
    for key, source in (entry.get("columns") or {}).items():
        if key not in LLAMAFACTORY_COLUMNS[formatting]:
            raise DataError(
                f"{info}: dataset {name!r}: columns.{key} is not a {formatting} column; they are "
                f"{sorted(LLAMAFACTORY_COLUMNS[formatting])}"
            )
        rename[source] = LLAMAFACTORY_COLUMNS[formatting][key]
    tags = entry.get("tags") or None
    if formatting == "openai" and tags:  # role/content messages, read as a file of them is: no tags to map
        raise DataError(
            f"{info}: dataset {name!r}: tags are for sharegpt turns; an openai dataset's messages are "
            "{role, content} objects, read as they are"
        )
    file = info.parent / entry["file_name"]
    if not file.exists():
        raise DataError(f"{info}: dataset {name!r}: file_name {entry['file_name']!r}: no {file}")
    raw = _read_data_folder(file, entry.get("split", split)) if file.is_dir() else _read_file(file)
    raw = _renamed(raw[: entry.get("num_samples")], columns, file)
    records = []
    for r in raw:
        fields = {rename.get(k, k): v for k, v in r.fields.items()}
        need = {"sharegpt": "conversations", "openai": "messages"}.get(formatting)
        if need and need not in fields:
            raise DataError(
                f"{r.where}: a {formatting} dataset's row needs its messages column ({need}, or the one "
                f"columns.messages names); the row has {sorted(r.fields)}"
            )
        records.append(_normalise(Record(fields, r.where), tags))
    return records


READERS = {".jsonl": "_read_jsonl", ".json": "_read_json", ".csv": "_read_csv", ".parquet": "_read_parquet"}


def _read_file(path: Path) -> list[Record]:
    if path.suffix not in READERS:
        raise DataError(
            f"{path}: unknown data format {path.suffix!r}; use .jsonl, .json, .csv, .parquet, a datasets "
            "folder saved with save_to_disk, or a folder of such files"
        )
    return globals()[READERS[path.suffix]](path)


def _read_data_folder(path: Path, split: str) -> list[Record]:
    """A hub-layout folder: the data files whose name starts with the split (`train-00000-of-00002.parquet`,
    `train.jsonl`), anywhere below it, read in name order."""
    files = sorted(f for f in path.rglob("*") if f.is_file() and f.suffix in READERS and not f.name.startswith("."))
    if not files:
        raise DataError(
            f"{path}: a folder with no data files (.jsonl, .json, .csv, .parquet) and not a datasets "
            "folder saved with save_to_disk"
        )
    chosen = [f for f in files if f.stem == split or f.stem.startswith(f"{split}-") or f.stem.startswith(f"{split}_")]
    if not chosen:
        splits = sorted({f.stem.split("-")[0].split("_")[0] for f in files})
        raise DataError(f"{path}: no data files for split {split!r}; files start with {splits} (--split, --eval-split)")
    return [r for f in chosen for r in _read_file(f)]


SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "system": "system",
    "tool": "tool",
    "observation": "tool",
    "function_response": "tool",
    "function_call": "assistant",  # LLaMA-Factory: the assistant's tool call(s), as JSON
}
SHAREGPT_TAGS = {"role_tag": "from", "content_tag": "value"}  # LLaMA-Factory's defaults (dataset_info.json "tags")


def _sharegpt_messages(turns, where: str, field: str, tags: dict | None = None) -> list[dict]:
    """ShareGPT turns ({from, value}) as chat messages; a ``function_call`` turn (a JSON call or list of calls, as
    LLaMA-Factory writes it) as the assistant's structured ``tool_calls``. ``tags`` are dataset_info.json's
    (role_tag, content_tag, user_tag, ...), mapping another file's names."""
    tags = {**SHAREGPT_TAGS, **(tags or {})}
    role_names = dict(SHAREGPT_ROLES)
    for tag, role in (
        ("user_tag", "human"),
        ("assistant_tag", "gpt"),
        ("observation_tag", "observation"),
        ("function_tag", "function_call"),
        ("system_tag", "system"),
    ):
        if tags.get(tag):
            role_names[str(tags[tag]).lower()] = SHAREGPT_ROLES[role] if role != "function_call" else "function_call"
    messages = []
    for i, turn in enumerate(turns if isinstance(turns, list) else [turns]):
        here = f"{where}: {field}[{i}]" if isinstance(turns, list) else f"{where}: {field}"
        if not isinstance(turn, dict) or tags["role_tag"] not in turn:
            raise DataError(f"{here} must be an object with {tags['role_tag']!r} and {tags['content_tag']!r}")
        name = str(turn[tags["role_tag"]]).lower()
        role = role_names.get(name)
        if role is None:
            raise DataError(
                f"{here}.{tags['role_tag']} is {turn[tags['role_tag']]!r}; ShareGPT roles read are "
                f"{', '.join(sorted(role_names))}"
            )
        content = turn.get(tags["content_tag"])
        if content is None:  # a lost turn, not an empty one (read as empty, the record was dropped unnamed)
            raise DataError(f"{here} has no {tags['content_tag']!r} (the turn's text); the turn is {turn}")
        if name == "function_call" or role == "function_call":
            messages.append({"role": "assistant", "content": "", "tool_calls": _function_calls(content, here)})
        else:
            messages.append({"role": role, "content": content})
    return messages


def _function_calls(value, where: str) -> list[dict]:
    """A LLaMA-Factory ``function_call`` value ('{"name": ..., "arguments": {...}}', or a list) as ``tool_calls``."""
    try:
        calls = json.loads(value) if isinstance(value, str) else value
    except json.JSONDecodeError:
        raise DataError(f"{where}: a function_call turn whose value is not JSON ({str(value)[:60]!r})") from None
    calls = calls if isinstance(calls, list) else [calls]
    for call in calls:
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            raise DataError(f"{where}: a function_call must be {{'name': ..., 'arguments': {{...}}}}, got {call!r:.80}")
    return _tool_calls({"tool_calls": calls}, f"{where}: function_call")["tool_calls"]


def _call_arguments(arguments, where: str) -> dict:
    """A call's arguments, given as an object or a JSON string, as an object."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            raise DataError(f"{where} is a string that is not JSON") from None
    if not isinstance(arguments, dict):
        raise DataError(f"{where} must be a JSON object of the arguments, got {arguments!r:.60}")
    return arguments


def _tool_schemas(value, where: str) -> list[dict]:
    """A ``tools`` column (a JSON string or a list, as LLaMA-Factory and OpenAI-style files write it) as the list
    of JSON schemas ``apply_chat_template(tools=...)`` takes: bare function definitions are wrapped as
    ``{"type": "function", "function": ...}``."""
    if isinstance(value, str):
        if not value.strip():
            return []
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise DataError(f"{where}: field 'tools' is a string that is not JSON") from None
    if isinstance(value, dict):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        raise DataError(f"{where}: field 'tools' must be a list of function schemas")
    return [
        t if "function" in t and t.get("type", "function") == "function" else {"type": "function", "function": t}
        for t in value
    ]


ALPACA_FIELDS = ("instruction", "input", "output", "chosen", "rejected", "system", "history", "kto_tag")


def _alpaca(fields: dict, where: str) -> dict:
    """An alpaca row as LLaMA-Factory reads it: the user's turn is ``instruction`` and ``input`` joined by a
    newline, after the ``system`` message and the ``history`` ([[question, answer], ...], trained like any
    assistant turn); ``output`` is the answer (a list of two: chosen then rejected, its ranking form),
    ``chosen``/``rejected`` a preference pair, and ``kto_tag`` an unpaired true/false label."""
    instruction = fields.get("instruction") or ""
    query = fields.get("input") or ""
    if not isinstance(instruction, str) or not isinstance(query, str):
        raise DataError(f"{where}: alpaca fields 'instruction' and 'input' must be strings")
    prompt = []
    if fields.get("system"):
        prompt.append({"role": "system", "content": fields["system"]})
    for i, pair in enumerate(fields.get("history") or []):
        if not isinstance(pair, (list, tuple)) or len(pair) != 2 or not all(isinstance(t, str) for t in pair):
            raise DataError(f"{where}: history[{i}] must be [question, answer], got {pair!r:.80}")
        prompt += [{"role": "user", "content": pair[0]}, {"role": "assistant", "content": pair[1]}]
    prompt.append({"role": "user", "content": "\n".join(t for t in (instruction, query) if t)})
    rest = {k: v for k, v in fields.items() if k not in ALPACA_FIELDS}
    output, chosen, rejected = fields.get("output"), fields.get("chosen"), fields.get("rejected")
    if chosen is None and isinstance(output, list) and len(output) == 2:
        chosen, rejected = output
    if chosen is not None or rejected is not None:
        answer = {"chosen": chosen, "rejected": rejected}
        for name, value in answer.items():
            if not isinstance(value, str):
                raise DataError(f"{where}: alpaca field {name!r} must be a string, got {type(value).__name__}")
        return {**rest, "prompt": prompt, **{k: [{"role": "assistant", "content": v}] for k, v in answer.items()}}
    if not isinstance(output, str):
        raise DataError(f"{where}: alpaca field 'output' must be a string, got {type(output).__name__}")
    answer = [{"role": "assistant", "content": output}]
    if "kto_tag" in fields:
        return {**rest, "prompt": prompt, "completion": answer, "label": _kto_label(fields["kto_tag"], where)}
    return {**rest, "messages": prompt + answer}


def _kto_label(value, where: str) -> bool:
    if not isinstance(value, bool):
        raise DataError(f"{where}: field 'kto_tag' must be true or false, got {value!r}")
    return value


def _unpaired_conversation(fields: dict, where: str) -> dict:
    """KTO rows written as one conversation and a label (``messages`` + ``label``/``kto_tag``): the last turn is
    the labelled completion, the turns before it the prompt."""
    label_key = "kto_tag" if "kto_tag" in fields else "label"
    messages = fields["messages"]
    if not isinstance(messages, list) or len(messages) < 2:
        raise DataError(f"{where}: a labelled conversation needs the prompt turns and the labelled answer")
    rest = {k: v for k, v in fields.items() if k not in ("messages", label_key)}
    label = _kto_label(fields[label_key], where) if label_key == "kto_tag" else fields[label_key]
    return {**rest, "prompt": messages[:-1], "completion": messages[-1:], "label": label}


def _normalise(record: Record, tags: dict | None = None) -> Record:
    """ShareGPT conversations as messages, LLaMA-Factory's alpaca and preference shapes as tether's, content-part
    lists as their text, or text and image parts (data/images.py; errors name the record)."""
    fields, where = record.fields, record.where
    if (
        "instruction" in fields
        and not {"prompt", "messages", "conversations"} & set(fields)
        and {"output", "chosen", "rejected"} & set(fields)
    ):
        fields = _alpaca(fields, where)
    tags = {**SHAREGPT_TAGS, **(tags or {})}
    turns = fields.get("conversations")
    if (
        "messages" not in fields
        and isinstance(turns, list)
        and turns
        and all(isinstance(t, dict) and tags["role_tag"] in t for t in turns)
    ):
        messages = _sharegpt_messages(turns, where, "conversations", tags)
        if fields.get("system") and messages[0]["role"] != "system":
            messages.insert(0, {"role": "system", "content": fields["system"]})
        fields = {**{k: v for k, v in fields.items() if k not in ("conversations", "system")}, "messages": messages}
        for name in ("chosen", "rejected"):  # ShareGPT preference rows: one {from, value} answer each
            if isinstance(fields.get(name), dict) and tags["role_tag"] in fields[name]:
                fields = {**fields, name: _sharegpt_messages(fields[name], where, name, tags)}
        if isinstance(fields.get("chosen"), list) and isinstance(fields.get("rejected"), list):
            fields = {**{k: v for k, v in fields.items() if k != "messages"}, "prompt": fields["messages"]}
    if "messages" in fields and ("kto_tag" in fields or isinstance(fields.get("label"), bool)):
        fields = _unpaired_conversation(fields, where)
    if "tools" in fields:
        fields = {**fields, "tools": _tool_schemas(fields["tools"], where)}
    for name in ("messages", "prompt", "completion", "chosen", "rejected"):
        value = fields.get(name)
        if isinstance(value, list) and any(isinstance(m, dict) and isinstance(m.get("content"), list) for m in value):
            fields = {**fields, name: [message_content(m, f"{record.where}: {name}[{i}]") for i, m in enumerate(value)]}
        value = fields.get(name)
        if isinstance(value, list) and any(isinstance(m, dict) and m.get("tool_calls") for m in value):
            fields = {**fields, name: [_tool_calls(m, f"{record.where}: {name}[{i}]") for i, m in enumerate(value)]}
    return record if fields is record.fields else Record(fields, record.where)


def _tool_calls(message, where: str):
    """An assistant turn given as structured tool calls (OpenAI's ``tool_calls``, content null), checked and kept
    structured: ``{"id"?, "type": "function", "function": {"name", "arguments": {...}}}`` each, content text. The chat
    template writes them as its model family does when the conversation is rendered (models/chat.py)."""
    if not isinstance(message, dict) or not message.get("tool_calls"):
        return message
    calls = []
    for j, call in enumerate(message["tool_calls"]):
        function = call.get("function", call) if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise DataError(f"{where}.tool_calls[{j}] must be {{'function': {{'name': ..., 'arguments': ...}}}}")
        arguments = _call_arguments(function.get("arguments", {}), f"{where}.tool_calls[{j}].function.arguments")
        given = {"id": call["id"]} if isinstance(call.get("id"), str) and call["id"] else {}
        calls.append({**given, "type": "function", "function": {"name": function["name"], "arguments": arguments}})
    return {**message, "content": message.get("content") or "", "tool_calls": calls}


def _read_csv(path: Path) -> list[Record]:
    """One record per row, the header naming the fields (a UTF-8 BOM, as Excel writes, dropped); each row is named by
    the line it starts on (a quoted cell may span lines). Cells as _csv_cell reads them."""
    import csv
    import io

    text = _decode(path.read_bytes(), str(path)).removeprefix("\ufeff")
    reader = csv.DictReader(io.StringIO(text, newline=""))
    records, lines = [], io.StringIO(text, newline="").readlines()  # the lines as the reader counts them
    try:
        end = reader.line_num if reader.fieldnames else 0  # the header's last line
        for row in reader:  # blank lines between rows are skipped: a row starts at the next line with text
            start = next((n for n in range(end + 1, reader.line_num) if lines[n - 1].strip("\r\n")), reader.line_num)
            end = reader.line_num
            if None in row:
                raise DataError(f"{path}:{start}: more cells than the header has columns")
            records.append(Record({key: _csv_cell(value) for key, value in row.items()}, f"{path}:{start}"))
    except csv.Error as exc:
        raise DataError(f"{path}:{reader.line_num}: not valid CSV ({exc})") from None
    return records


def _csv_cell(value):
    """A cell holding a JSON list (chat messages exported from a table) as that list; true/false (any case) as a
    boolean, as JSON would give it: a KTO file's label column (docs/data.md)."""
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    if isinstance(value, str) and value.startswith("[") and value.endswith("]"):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def _decode(raw: bytes, where: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(
            f"{where}: not valid UTF-8 (byte {exc.start} of the line: {raw[exc.start : exc.start + 4]!r}); "
            "save the file as UTF-8"
        ) from None


def _read_jsonl(path: Path) -> list[Record]:
    records = []
    with path.open("rb") as handle:
        for line_no, raw in enumerate(handle, start=1):
            line = _decode(raw, f"{path}:{line_no}")
            if not line.strip():
                continue  # blank lines (often a trailing newline) are not records
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}:{line_no}: not valid JSON ({exc.msg} at column {exc.colno})") from None
            if not isinstance(obj, dict):
                raise DataError(f"{path}:{line_no}: expected a JSON object with fields, got {type(obj).__name__}")
            records.append(Record(obj, f"{path}:{line_no}"))
    return records


def _read_json(path: Path) -> list[Record]:
    raw = path.read_bytes()
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        _decode(raw.splitlines()[line - 1], f"{path}:{line}")
    try:
        data = json.loads(raw.decode("utf-8"))
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg} at column {exc.colno})") from None
    if isinstance(data, dict) and len(data) == 1 and isinstance(next(iter(data.values())), list):
        data = next(iter(data.values()))  # {"data": [...]} / {"train": [...]}
    if not isinstance(data, list):
        raise DataError(f"{path}: expected a JSON list of objects (or one key holding such a list)")
    records = []
    for i, obj in enumerate(data, start=1):
        if not isinstance(obj, dict):
            raise DataError(f"{path} record {i}: expected a JSON object with fields, got {type(obj).__name__}")
        records.append(Record(obj, f"{path} record {i}"))
    return records


def _read_parquet(path: Path) -> list[Record]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises several types for corrupt files
        raise DataError(f"{path}: cannot read as Parquet ({exc})") from None
    return [Record(row, f"{path} row {i}") for i, row in enumerate(table.to_pylist(), start=1)]


def _read_saved_dataset(path: Path, split: str) -> list[Record]:
    import datasets

    try:
        ds = datasets.load_from_disk(str(path))
    except Exception as exc:
        raise DataError(f"{path}: not a datasets folder saved with save_to_disk ({exc})") from None
    if isinstance(ds, datasets.DatasetDict):
        if split not in ds:
            raise DataError(f"{path}: has splits {sorted(ds)}, not {split!r}; choose one with --split/--eval-split")
        ds = ds[split]
    return [Record(row, f"{path} row {i}") for i, row in enumerate(ds, start=1)]


def split_records(records, eval_fraction: float, seed: int, path: str | Path = "data", group=None):
    """Deterministic held-out split (a seeded shuffle of record positions); an empty file is named first.

    ``group(record) -> key`` splits each group on its own (KTO's labels: a small file's held-out share would
    otherwise draw one label only): a seeded ``eval_fraction`` of each group with two or more records, at least
    one record of each."""
    import random

    from tether.config import ConfigError

    if not records:
        raise DataError(f"{path}: no records (the file is empty)")
    if eval_fraction <= 0:
        return records, []
    groups: dict = {}
    for i, rec in enumerate(records):
        groups.setdefault(group(rec) if group else None, []).append(i)
    held = set()
    for positions in groups.values():
        order = list(positions)
        random.Random(seed).shuffle(order)
        n_eval = max(1, int(round(eval_fraction * len(order)))) if len(order) > 1 or not group else 0
        held.update(order[:n_eval])
    if len(held) >= len(records):
        raise ConfigError(f"eval_fraction={eval_fraction} leaves no training records out of {len(records)}")
    return [r for i, r in enumerate(records) if i not in held], [r for i, r in enumerate(records) if i in held]


def tokenize_split(records, eval_records, eval_fraction: float, seed: int, path, tokenize, eval_path="", group=None):
    """(train records, held-out records, train examples, held-out examples, reports): ``eval_records`` (from
    --eval-data) or a seeded ``eval_fraction`` of ``records`` held out, each side tokenised by
    ``tokenize(records, label) -> (examples, report)``; ``group`` as split_records takes it.

    Errors name the first bad record of the file, whichever side the split put it on: when tokenising a side (or
    the split itself, e.g. a one-row file) fails, the whole file is tokenised once more in file order, which
    raises at its first bad record; only if the file has none is the side's own error raised."""
    from tether.config import ConfigError

    if eval_records is not None:
        train_recs, eval_recs = records, eval_records
    else:
        try:
            train_recs, eval_recs = split_records(records, eval_fraction, seed, path, group)
        except ConfigError:
            tokenize(records, str(path))
            raise
    try:
        train, report = tokenize(train_recs, str(path))
        reports, evals = [report], []
        if eval_recs:
            evals, eval_report = tokenize(eval_recs, eval_path or f"{path} (held out)")
            reports.append(eval_report)
    except DataError:
        if eval_records is None and eval_recs:
            tokenize(records, str(path))
        raise
    return train_recs, eval_recs, train, evals, reports


ROLES = ("system", "user", "assistant", "tool")
