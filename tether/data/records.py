"""Read records from JSONL, JSON, CSV, Parquet, a `datasets` save_to_disk folder, or a folder of data files laid
out as on the Hugging Face hub (`data/train-00000-of-00002.parquet`, `train.jsonl`, ...).

ShareGPT rows (`conversations` of `{from, value}`) are read as `messages`, message contents given as lists of
parts (`[{"type": "text", "text": ...}]`) as their text, and assistant turns given as structured `tool_calls` as
Hermes `<tool_call>` text.

Every record keeps where it came from ("file.jsonl:12", "file.parquet row 3")
so that any later validation error can name the file, line and field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

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


def read_records(path: str | Path, columns: str | dict | None = None, split: str = "train") -> list[Record]:
    """All records of a data file or folder, with column renames applied."""
    path = Path(path)
    if not path.exists():
        raise DataError(f"{path}: no such file or folder")
    rename = parse_column_map(columns)
    if path.is_dir():
        saved = (
            (path / "dataset_info.json").is_file()
            or (path / "dataset_dict.json").is_file()
            or (path / "state.json").is_file()
        )
        records = _read_saved_dataset(path, split) if saved else _read_data_folder(path, split)
    else:
        records = _read_file(path)
    if rename:
        records = [Record({rename.get(k, k): v for k, v in r.fields.items()}, r.where) for r in records]
        present = set(records[0].fields) if records else set()
        missing = [src for src, name in rename.items() if name not in present]
        if records and missing:
            raise DataError(
                f"{path}: --columns names source column(s) {missing} that the data does not have; it has {sorted(records[0].fields)}"
            )
    return [_normalise(r) for r in records]


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
        raise DataError(
            f"{path}: no data files for split {split!r}; the files' names start with {splits} (choose one with --split)"
        )
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
}


def _normalise(record: Record) -> Record:
    """ShareGPT conversations as messages; content-part lists as their text (errors name the record)."""
    fields = record.fields
    turns = fields.get("conversations")
    if (
        "messages" not in fields
        and isinstance(turns, list)
        and turns
        and all(isinstance(t, dict) and "from" in t for t in turns)
    ):
        messages = []
        for i, turn in enumerate(turns):
            role = SHAREGPT_ROLES.get(str(turn["from"]).lower())
            if role is None:
                raise DataError(
                    f"{record.where}: conversations[{i}].from is {turn['from']!r}; ShareGPT roles read "
                    f"are {', '.join(SHAREGPT_ROLES)}"
                )
            messages.append({"role": role, "content": turn.get("value", "")})
        fields = {**{k: v for k, v in fields.items() if k != "conversations"}, "messages": messages}
    for name in ("messages", "prompt", "completion", "chosen", "rejected"):
        value = fields.get(name)
        if isinstance(value, list) and any(isinstance(m, dict) and isinstance(m.get("content"), list) for m in value):
            fields = {**fields, name: [_text_content(m, f"{record.where}: {name}[{i}]") for i, m in enumerate(value)]}
        value = fields.get(name)
        if isinstance(value, list) and any(isinstance(m, dict) and m.get("tool_calls") for m in value):
            fields = {**fields, name: [_tool_call_text(m, f"{record.where}: {name}[{i}]") for i, m in enumerate(value)]}
    return record if fields is record.fields else Record(fields, record.where)


def _tool_call_text(message, where: str):
    """An assistant turn given as structured tool calls (OpenAI's ``tool_calls``, content null) as the Hermes text
    the model writes, ``<tool_call>{"name": …, "arguments": {…}}</tool_call>`` after any content: the format tether's
    tool environments parse (tether/agents/tools.py) and Qwen-style templates render."""
    if not isinstance(message, dict) or not message.get("tool_calls"):
        return message
    calls = []
    for j, call in enumerate(message["tool_calls"]):
        function = call.get("function", call) if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise DataError(f"{where}.tool_calls[{j}] must be {{'function': {{'name': ..., 'arguments': ...}}}}")
        arguments = function.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except json.JSONDecodeError:
                raise DataError(f"{where}.tool_calls[{j}].function.arguments is a string that is not JSON") from None
        calls.append("<tool_call>" + json.dumps({"name": function["name"], "arguments": arguments}) + "</tool_call>")
    content = message.get("content") or ""
    return {k: v for k, v in {**message, "content": content + "".join(calls)}.items() if k != "tool_calls"}


def _text_content(message, where: str):
    if not isinstance(message, dict) or not isinstance(message.get("content"), list):
        return message
    texts = []
    for part in message["content"]:
        if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        else:
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise DataError(f"{where}.content has a {kind!r} part; tether trains on text parts only")
    return {**message, "content": "".join(texts)}


def _read_csv(path: Path) -> list[Record]:
    """One record per row, the header naming the fields; a cell holding a JSON list (chat messages exported from a
    table) is read as that list."""
    import csv
    import io

    text = _decode(path.read_bytes(), str(path))
    reader = csv.DictReader(io.StringIO(text, newline=""))
    records = []
    try:
        for row in reader:
            fields = {}
            for key, value in row.items():
                if key is None:
                    raise DataError(f"{path}:{reader.line_num}: more cells than the header has columns")
                if isinstance(value, str) and value.startswith("[") and value.endswith("]"):
                    try:
                        value = json.loads(value)
                    except json.JSONDecodeError:
                        pass
                fields[key] = value
            records.append(Record(fields, f"{path}:{reader.line_num}"))
    except csv.Error as exc:
        raise DataError(f"{path}:{reader.line_num}: not valid CSV ({exc})") from None
    return records


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
            raise DataError(f"{path}: has splits {sorted(ds)}, not {split!r}; choose one with --split")
        ds = ds[split]
    return [Record(row, f"{path} row {i}") for i, row in enumerate(ds, start=1)]


def split_records(records, eval_fraction: float, seed: int, path: str | Path = "data"):
    """Deterministic held-out split (a seeded shuffle of record positions); an empty file is named first."""
    import random

    from tether.config import ConfigError

    if not records:
        raise DataError(f"{path}: no records (the file is empty)")
    if eval_fraction <= 0:
        return records, []
    order = list(range(len(records)))
    random.Random(seed).shuffle(order)
    n_eval = max(1, int(round(eval_fraction * len(records))))
    if n_eval >= len(records):
        raise ConfigError(f"eval_fraction={eval_fraction} leaves no training records out of {len(records)}")
    held = set(order[:n_eval])
    return [r for i, r in enumerate(records) if i not in held], [r for i, r in enumerate(records) if i in held]


def tokenize_split(records, eval_records, eval_fraction: float, seed: int, path, tokenize, eval_path=""):
    """(train records, held-out records, train examples, held-out examples, reports): ``eval_records`` (from
    --eval-data) or a seeded ``eval_fraction`` of ``records`` held out, each side tokenised by
    ``tokenize(records, label) -> (examples, report)``.

    Errors name the first bad record of the file, whichever side the split put it on: when tokenising a side (or
    the split itself, e.g. a one-row file) fails, the whole file is tokenised once more in file order, which
    raises at its first bad record; only if the file has none is the side's own error raised."""
    from tether.config import ConfigError

    if eval_records is not None:
        train_recs, eval_recs = records, eval_records
    else:
        try:
            train_recs, eval_recs = split_records(records, eval_fraction, seed, path)
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


def prompt_rows(path: str | Path) -> list[dict]:
    """The rows of an RL prompt file, checked: at least one row; every row a non-empty 'prompt' — a string, or a
    list of chat messages each with a known 'role' and a string 'content'; and every row with the same columns
    (a reward function reading a column must find it in every row). Errors name the file, line and field."""
    records = read_records(path)
    if not records:
        raise DataError(f"{path}: no prompts (the file is empty)")
    columns = set(records[0].fields)
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
                    or not isinstance(message.get("content"), str)
                ):
                    raise DataError(
                        f"{rec.where}: prompt message {i} must be {{'role': one of {', '.join(ROLES)}, "
                        f"'content': text}}, got {str(message)[:80]!r}"
                    )
        else:
            raise DataError(
                f"{rec.where}: 'prompt' must be a non-empty string or a non-empty list of chat messages"
                + ("" if "prompt" in rec.fields else f" (the row has {sorted(rec.fields)})")
            )
        if set(rec.fields) != columns:
            missing, extra = sorted(columns - set(rec.fields)), sorted(set(rec.fields) - columns)
            raise DataError(
                f"{rec.where}: the columns differ from the first row's ({sorted(columns)}): "
                + (f"missing {missing}" if missing else f"extra {extra}")
            )
    return [rec.fields for rec in records]
