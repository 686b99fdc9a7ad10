"""Tool-call formats: how each model family writes a call in its turn, read back into {"name", "arguments"}
(docs/agents.md, "Model families").

    hermes       <tool_call>{"name": ..., "arguments": {...}}</tool_call>, several per turn      Qwen2.5, Qwen3, Hermes 2/3
    llama3_json  {"name": ..., "parameters": {...}}, alone in the turn or after <|python_tag|>   Llama 3.1, 3.2, 3.3
    pythonic     [add(a=2, b=3), echo(text="x")]                                                 Llama 3.2, Llama 4
    mistral      [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]                          Mistral v0.3, Nemo
    deepseek     <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME
                 ```json {...} ```<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>                    DeepSeek-V3, R1 distills

A format is chosen from the chat template's own text (``detect``), named in the plan, and overridden with
``agent.tool_parser`` (``--tool-parser NAME`` or ``module:function``). Turns are parsed from their text decoded
*with* special tokens: several families' call markers are special tokens, which a decode that skips them loses.

Each parsed call is {"name", "arguments"} (arguments a dict) or, for a call that cannot be made, {"error": why}
(and "name" when it is known); a call the model wrote an id for keeps it as "id". A malformed call is the policy's
observation, never a crash (tools.py answers it with an error message).
"""

from __future__ import annotations

import json
import re
from typing import Callable

from tether.errors import ConfigError
from tether.models.chat import CALL_ID_LENGTH as ID_LENGTH  # noqa: F401 - re-exported: the agents' names
from tether.models.chat import CALL_WRITERS, DEEPSEEK_TOKENS, call_id, hermes_text  # noqa: F401 - call_id re-exported
from tether.models.chat import call_format as detect  # the format a template's text speaks: one rule for SFT and RL


def answer_text(text: str) -> str:
    """A turn's answer without its reasoning: the text after the last ``</think>`` (thinking models: Qwen3, R1), or
    the whole turn. Claim patterns, final-answer rewards and the text monitors read this."""
    return text.rsplit("</think>", 1)[1].lstrip() if "</think>" in text else text


def _json_call(obj, keys=("arguments", "parameters")) -> dict:
    """One call object -> {"name", "arguments"} or {"error": ...}; ``arguments`` may be a JSON string."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return {"error": 'a tool call is a JSON object with a "name" and "arguments"'}
    arguments = next((obj[k] for k in keys if k in obj), {})
    if isinstance(arguments, str):  # some templates and models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            return {"name": obj["name"], "error": '"arguments" is a string that is not JSON'}
    if not isinstance(arguments, dict):
        return {"name": obj["name"], "error": '"arguments" must be a JSON object'}
    call = {"name": obj["name"], "arguments": arguments}
    if isinstance(obj.get("id"), str) and obj["id"]:
        call["id"] = obj["id"]
    return call


def _loads(raw: str) -> tuple[object, str | None]:
    try:
        return json.loads(raw), None
    except json.JSONDecodeError as err:
        return None, f"the tool call is not valid JSON ({err.msg} at character {err.pos})"


def _json_sequence(text: str) -> tuple[list, str | None]:
    """JSON values written one after another (separated by whitespace, ``;`` or ``,``): (values, error or None)."""
    decoder, values, at = json.JSONDecoder(), [], 0
    while True:
        while at < len(text) and text[at] in " \t\r\n;,":
            at += 1
        if at >= len(text):
            return values, None
        try:
            value, at = decoder.raw_decode(text, at)
        except json.JSONDecodeError as err:
            return values, f"the tool call is not valid JSON ({err.msg} at character {err.pos})"
        values.append(value)


class ToolFormat:
    """One family's way of writing calls: ``parse(text) -> (content, calls)``, ``looks_like_call(text)`` (the turn
    tried to call: used to count turns whose calls do not parse), ``write(calls)`` (the text a model of the family
    writes for them: scripted policies, tests), and whether its templates want arguments as a JSON string."""

    name = ""
    families = ""
    markers: tuple[str, ...] = ()  # text whose presence means the turn tried to call
    stop_markers: tuple[str, ...] = ()  # tokens that end a call turn besides the template's end of turn
    arguments_as_string = False

    def parse(self, text: str) -> tuple[str, list[dict]]:
        raise NotImplementedError

    def looks_like_call(self, text: str) -> bool:
        return any(m in text for m in self.markers)

    def write(self, calls: list[dict]) -> str:
        raise NotImplementedError

    def describe(self) -> str:
        return f"{self.name} ({self.families})" if self.families else self.name


class Hermes(ToolFormat):
    name, families = "hermes", "Qwen2.5, Qwen3, Hermes 2/3; tether's own convention"
    markers = ("<tool_call>",)
    CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)

    def parse(self, text):
        calls = []
        for raw in self.CALL.findall(text):
            value, error = _loads(raw.strip())
            calls.append({"error": error} if error else _json_call(value, ("arguments",)))
        return text.split("<tool_call>", 1)[0].strip(), calls

    def write(self, calls):
        return CALL_WRITERS[self.name](calls)


class Llama3Json(ToolFormat):
    """Llama 3.x's custom-tool calls: a JSON object with "name" and "parameters" as the whole turn, or after the
    <|python_tag|> token (ended by <|eom_id|>); several separated by ";" are read as several calls."""

    name, families = "llama3_json", "Llama 3.1, 3.2, 3.3"
    markers = ("<|python_tag|>",)
    stop_markers = ("<|eom_id|>",)
    STARTS = re.compile(r'\s*\{\s*"(name|type|function)"')

    def parse(self, text):
        body = text
        for end in ("<|eom_id|>", "<|eot_id|>", "<|end_of_text|>"):
            body = body.replace(end, "")
        tagged = "<|python_tag|>" in body
        content, body = body.split("<|python_tag|>", 1) if tagged else ("", body)
        if not tagged and not self.STARTS.match(body):
            return text.strip(), []  # a plain answer
        values, error = _json_sequence(body)
        values = [v.get("function", v) if isinstance(v, dict) else v for v in values]
        if not tagged and not error and not all(self.has_arguments(v) for v in values):
            return text.strip(), []  # a JSON answer with a "name" ({"name": "Alice", "age": 31}), not a call
        calls = [_json_call(v, ("parameters", "arguments")) for v in values]
        if error:
            calls.append({"error": error})
        return content.strip(), calls

    @staticmethod
    def has_arguments(value) -> bool:
        """An untagged call names its arguments ("parameters", or "arguments"): a JSON answer with a "name" does not."""
        return isinstance(value, dict) and ("parameters" in value or "arguments" in value)

    def looks_like_call(self, text):
        named = '"parameters"' in text or '"arguments"' in text
        return "<|python_tag|>" in text or (named and (bool(self.STARTS.match(text)) or '"name"' in text))

    def write(self, calls):
        return CALL_WRITERS[self.name](calls)


class Pythonic(ToolFormat):
    """Calls as a Python list of calls with keyword arguments, ``[add(a=2, b=3), echo(text="x")]`` (Llama 3.2's and
    Llama 4's zero-shot format); argument values are Python literals, read with ``ast.literal_eval``, never run."""

    name, families = "pythonic", "Llama 3.2 / Llama 4 pythonic calls"
    STARTS = re.compile(r"\s*(<\|python_start\|>)?\s*\[\s*[A-Za-z_][\w.]*\s*\(")

    def parse(self, text):
        import ast

        body = text.replace("<|python_start|>", "").replace("<|python_end|>", "").strip()
        if not self.STARTS.match(body):
            return text.strip(), []
        try:
            tree = ast.parse(body, mode="eval").body
        except SyntaxError as err:
            return "", [{"error": f"the tool call is not a Python list of calls ({err.msg})"}]
        if not isinstance(tree, ast.List):
            return "", [{"error": "the tool calls are not a Python list"}]
        calls = []
        for node in tree.elts:
            if not isinstance(node, ast.Call) or node.args:
                calls.append({"error": "each call is name(argument=value, ...), keyword arguments only"})
                continue
            name = ast.unparse(node.func)
            try:
                calls.append({"name": name, "arguments": {k.arg: ast.literal_eval(k.value) for k in node.keywords}})
            except (ValueError, SyntaxError, TypeError):
                calls.append({"name": name, "error": "argument values must be Python literals"})
        return "", calls

    def looks_like_call(self, text):
        return bool(self.STARTS.match(text.replace("<|python_start|>", "")))

    def write(self, calls):
        return CALL_WRITERS[self.name](calls)


class Mistral(ToolFormat):
    name, families = "mistral", "Mistral v0.3, Mistral Nemo, Mixtral 8x22B"
    markers = ("[TOOL_CALLS]",)

    def parse(self, text):
        if "[TOOL_CALLS]" not in text:
            return text.strip(), []
        content, body = text.split("[TOOL_CALLS]", 1)
        body = body.replace("</s>", "")
        values, error = _json_sequence(body)
        calls = []
        for v in values:
            calls += [_json_call(c) for c in v] if isinstance(v, list) else [_json_call(v)]
        if error or not values:
            calls.append({"error": error or "[TOOL_CALLS] is followed by no JSON list of calls"})
        return content.strip(), calls

    def write(self, calls):
        return CALL_WRITERS[self.name](calls)


class DeepSeek(ToolFormat):
    """DeepSeek-V3 / R1's call tokens; the arguments in a ```json block (V3, R1) or bare after the separator with the
    name before it (V3.1). Their templates join the arguments into the prompt as a string."""

    name, families = "deepseek", "DeepSeek-V3, DeepSeek-R1 and its distills"
    BEGIN, CALL, SEP, CALL_END, END = DEEPSEEK_TOKENS
    markers = (BEGIN, CALL)
    arguments_as_string = True

    def parse(self, text):
        if self.CALL not in text:
            if self.BEGIN in text:
                return text.split(self.BEGIN, 1)[0].strip(), [{"error": f"{self.BEGIN} is followed by no call"}]
            return text.strip(), []
        content = text.split(self.BEGIN if self.BEGIN in text else self.CALL, 1)[0]
        calls = []
        for raw in text.split(self.CALL)[1:]:
            raw = raw.split(self.CALL_END, 1)[0].split(self.END, 1)[0]
            kind, sep, rest = raw.partition(self.SEP)
            if not sep:
                calls.append({"error": f"a call has no {self.SEP} between its type and its name"})
                continue
            name, arguments = self.name_and_arguments(kind, rest)
            value, error = _loads(arguments) if arguments else ({}, None)
            calls.append({"name": name, "error": error} if error else _json_call({"name": name, "arguments": value}))
        return content.strip(), calls

    @staticmethod
    def name_and_arguments(kind: str, rest: str) -> tuple[str, str]:
        """(name, arguments' JSON text) of one call: after the separator either bare JSON (V3.1: the name is before
        the separator) or the name and a fenced block. The block's JSON is read as JSON, not up to the next fence,
        so arguments whose strings hold ``` (a README, a shell snippet) are read whole."""
        body = rest.strip()
        if not body or body[0] in "{[":
            return kind.strip(), body
        name, fence, after = body.partition("```")
        if not fence or not name.strip():  # no block after a name: read as V3.1's, whose bare JSON it is not
            return kind.strip(), body
        name = name.strip()
        after = after.removeprefix("json").strip()
        try:
            end = json.JSONDecoder().raw_decode(after)[1]
        except json.JSONDecodeError:
            return name, after.removesuffix("```").strip()  # not JSON: _loads names the error
        return name, after[:end]

    def write(self, calls):
        return CALL_WRITERS[self.name](calls)


class UserFormat(ToolFormat):
    """``--tool-parser module:function``: ``function(text)`` returns the turn's calls (a list of {"name",
    "arguments"} dicts) or (content, calls); an attribute ``markers`` on it enables the unparsed-call count."""

    def __init__(self, spec: str, fn: Callable):
        self.name, self.fn = spec, fn
        self.markers = tuple(getattr(fn, "markers", ()))
        self.arguments_as_string = bool(getattr(fn, "arguments_as_string", False))

    CONTRACT = (
        'a tool parser takes a turn\'s text and returns its calls: a list of {"name": str, "arguments": dict} '
        "(empty for a turn without a call), or (content, calls)"
    )

    def parse(self, text):
        try:
            out = self.fn(text)
        except Exception as err:  # noqa: BLE001 - a user's parser: named, with the text it failed on
            raise ConfigError(
                f"--tool-parser {self.name} raised {type(err).__name__}: {err} on the turn {text[:160]!r}; "
                + self.CONTRACT
            ) from err
        content, calls = out if isinstance(out, tuple) and len(out) == 2 else (text, out)
        if not isinstance(content, str) or not isinstance(calls, list) or not all(isinstance(c, dict) for c in calls):
            raise ConfigError(
                f"--tool-parser {self.name} returned {str(out)[:120]!r} ({type(out).__name__}) for the turn "
                f"{text[:160]!r}; {self.CONTRACT}"
            )
        return content, [c if "error" in c else _json_call(c) for c in calls]

    def write(self, calls):
        write = getattr(self.fn, "write", None)
        if write is None:
            raise NotImplementedError(f"tool parser {self.name} has no write(calls)")
        try:
            return write(calls)
        except Exception as err:  # noqa: BLE001 - a user's writer, named
            raise ConfigError(
                f"--tool-parser {self.name}: its write({calls}) raised {type(err).__name__}: {err}"
            ) from err


FORMATS: dict[str, ToolFormat] = {f.name: f for f in (Hermes(), Llama3Json(), Pythonic(), Mistral(), DeepSeek())}


def same_calls(parsed: list[dict], calls: list[dict]) -> bool:
    """Whether parsed calls are ``calls`` (names and arguments, in order)."""
    return [(c.get("name"), c.get("arguments")) for c in parsed] == [(c["name"], c["arguments"]) for c in calls]


def foreign_format(text: str, fmt: ToolFormat) -> str | None:
    """The built-in format, other than ``fmt``, in which ``text`` writes a well-formed call (a model trained on
    another family's convention, or told to use one): None when there is none."""
    for other in FORMATS.values():
        if other.name != fmt.name and any("error" not in c for c in other.parse(text)[1]):
            return other.name
    return None


def tool_format(spec: str, template: str) -> tuple[ToolFormat, str]:
    """(the format, how it was chosen) for ``agent.tool_parser``: empty = from the template, a name, or
    module:function."""
    if not spec:
        name = detect(template)
        how = "from the chat template" if name != "hermes" or "<tool_call>" in template else "tether's default"
        return FORMATS[name], how
    if spec in FORMATS:
        return FORMATS[spec], "--tool-parser"
    if ":" not in spec:
        raise ConfigError(
            f"agent.tool_parser={spec!r} (--tool-parser): choose {', '.join(FORMATS)} or give module:function"
        )
    from tether.rewards.loading import load_reward_function

    try:
        fn = load_reward_function(spec)
    except ConfigError as err:
        raise ConfigError(f"agent.tool_parser: {err}".replace("--reward", "--tool-parser")) from None
    return UserFormat(spec, fn), "--tool-parser"
