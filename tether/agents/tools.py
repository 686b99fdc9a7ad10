"""Tool calling as an environment: tools are plain Python functions (``async def`` ones are awaited); the policy
calls them in its model family's format (formats.py: Hermes / Qwen's <tool_call> JSON, Llama 3's JSON, Mistral's
[TOOL_CALLS], DeepSeek's call tokens), and results go back as "tool" messages through the model's chat template
(docs/agents.md).

    <tool_call>{"name": "calc", "arguments": {"expression": "47 + 38 - 19"}}</tool_call>

The episode runner parses the turn (from its text decoded with special tokens) and hands the calls to ``step``;
called on its own, ``step(text)`` parses ``text`` in ``tool_format`` (Hermes by default). A turn with calls gets
one tool message per call, in order (the runner adds each call's id and name to it). A call that cannot be made — not JSON, no such tool, arguments
the function does not take, a function that raises — is answered with an "error: ..." tool message the policy
sees on its next turn (a malformed call is an observation, never a crash) and counted as a failed call. A turn
without a call is the policy's final answer and ends the episode.
"""

from __future__ import annotations

import inspect
import json
import logging
import re
from collections import Counter
from typing import Callable

from tether.agents.environment import Outcome, StepResult, await_if_needed
from tether.agents.formats import FORMATS, ToolFormat, answer_text
from tether.config import ConfigError
from tether.data.sft import schema_problem, tools_system_message

TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)  # kept for 0.1's importers
ARGS_HEADERS = ("Args:", "Arguments:", "Parameters:")
WARNED: set[str] = set()  # tools whose failure has been printed
log = logging.getLogger("tether")
JSON_TYPES = {int: "integer", float: "number", str: "string", bool: "boolean", list: "array", dict: "object"}
ARRAYS = (list, tuple, set, frozenset)


def json_type(hint) -> dict:
    """The JSON schema of a parameter's type hint: list[str] -> an array of strings, Optional[int] / int | None ->
    integer, Literal["a", "b"] -> an enum, dict -> object. A hint it cannot map gets no "type" at all: a wrong one
    ("string" for a list) tells the model to write calls the tool cannot take."""
    import types
    import typing

    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Annotated:
        return json_type(args[0])
    if origin is typing.Union or origin is types.UnionType:
        return _union_type([a for a in args if a is not type(None)])
    if origin is typing.Literal:
        kinds = {JSON_TYPES.get(type(a)) for a in args}
        return {"enum": list(args), **({"type": kinds.pop()} if len(kinds) == 1 and None not in kinds else {})}
    if hint in ARRAYS or origin in ARRAYS:
        items = [json_type(a) for a in args if a is not Ellipsis]
        same = items and all(i == items[0] for i in items) and items[0]
        return {"type": "array", **({"items": items[0]} if same else {})}
    if hint is dict or origin is dict:
        return {"type": "object"}
    return {"type": JSON_TYPES[hint]} if hint in JSON_TYPES else {}


def _union_type(options: list) -> dict:
    """A Union's schema without its None: the one other type, or anyOf the others (none when one cannot be mapped)."""
    schemas = [json_type(o) for o in options]
    if len(schemas) == 1:
        return schemas[0]
    return {"anyOf": schemas} if schemas and all(schemas) else {}


def docstring_arguments(doc: str) -> tuple[str, dict[str, str]]:
    """(the description, {parameter: its description}) of a Google-style docstring: the text before the ``Args:``
    section (its first paragraph), and each ``name (type): description`` line of the section, continuation lines
    joined."""
    lines = doc.splitlines()
    at = next((i for i, line in enumerate(lines) if line.strip() in ARGS_HEADERS), len(lines))
    description = "\n".join(lines[:at]).split("\n\n")[0].strip()
    arguments, current, indent = {}, None, None
    for line in lines[at + 1 :]:
        if not line.strip():
            continue
        depth = len(line) - len(line.lstrip())
        if indent is None:
            indent = depth
        if depth < indent or (depth == indent and line.strip().endswith(":") and " " not in line.strip()):
            break  # the next section (Returns:, Raises:)
        match = re.match(r"\s*\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)", line) if depth == indent else None
        if match:
            current = match.group(1)
            arguments[current] = match.group(2).strip()
        elif current is not None:
            arguments[current] = (arguments[current] + " " + line.strip()).strip()
    return description, arguments


def tool_schema(fn: Callable) -> dict:
    """The JSON schema of a Python function as chat templates take it ({"type": "function", "function": {...}}): its
    name, its docstring's first paragraph, its parameters' annotated types and their ``Args:`` descriptions;
    parameters without a default are required. A function with a ``schema`` attribute gives its own, a ConfigError
    naming the tool and the field where it is not a schema (data/sft.py, schema_problem)."""
    if getattr(fn, "schema", None) is not None:
        problem = schema_problem(fn.schema)
        if problem:
            raise ConfigError(f"tool {getattr(fn, '__name__', fn)!r}: its schema attribute {problem}")
        return fn.schema
    import typing

    try:
        hints = typing.get_type_hints(fn)  # resolves string annotations (from __future__ import annotations)
    except (
        NameError,
        SyntaxError,
        TypeError,
    ):  # an annotation that does not resolve: no "type" below, never a wrong one
        hints = {}
    description, described = docstring_arguments(inspect.getdoc(fn) or "")
    properties, required = {}, []
    for p in inspect.signature(fn).parameters.values():
        if p.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            continue
        properties[p.name] = json_type(hints[p.name]) if p.name in hints else {}
        if described.get(p.name):
            properties[p.name]["description"] = described[p.name]
        if p.default is inspect.Parameter.empty:
            required.append(p.name)
    return {
        "type": "function",
        "function": {
            "name": fn.__name__,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


def warn_once(tool: str, err: Exception) -> None:
    """The first time a tool raises (in this process): a warning, since the policy's error message is all a run
    shows otherwise, and a tool broken for every call (a client closed under it) looks like a policy's mistakes."""
    if tool in WARNED:
        return
    WARNED.add(tool)
    log.warning(
        "tool %s raised %s: %s (the policy is answered with the error, the call counted in agent/failed_calls_mean; "
        "later failures of %s are not printed)",
        tool,
        type(err).__name__,
        err,
        tool,
    )


def parse_tool_calls(text: str) -> list[dict]:
    """The calls in a policy turn written in the Hermes / Qwen convention, in order: {"name", "arguments"} for a
    well-formed call, {"error": why} for one that is not (a dangling <tool_call> without its closing tag is parsed up
    to the end of the turn). Other families: formats.py."""
    return FORMATS["hermes"].parse(text)[1]


class ToolEnvironment:
    """An episode of tool use: the policy calls tools until it answers without a call (or runs out of turns).

    Subclass it (or pass ``tools``) and override ``score(final_text)`` for the outcome reward and ``success()`` for
    the task's real state; ``claim_pattern`` (a regular expression) marks final answers that say the task is done.
    Per-call rewards: ``call_reward`` for each call made and ``error_reward`` for each failed one, credited to the
    turn that made them (0: not given)."""

    tools: list[Callable] = []
    describe_tools: bool = True  # add a system message listing the tools (False: the model knows them already)
    tool_format: ToolFormat = FORMATS["hermes"]  # how step(text) reads calls when the runner gives none
    write_calls: Callable | None = None  # how the system message shows a call (the runner's; else tool_format's)

    def __init__(
        self,
        tools: list[Callable] | None = None,
        call_reward: float = 0.0,
        error_reward: float = 0.0,
        claim_pattern: str = "",
        describe_tools: bool | None = None,
    ):
        self.tools = list(tools if tools is not None else type(self).tools)
        self.by_name = {getattr(t, "__name__", str(t)): t for t in self.tools}
        self.call_reward, self.error_reward = call_reward, error_reward
        self.claim = re.compile(claim_pattern) if claim_pattern else None
        if describe_tools is not None:
            self.describe_tools = describe_tools
        self.row, self.final_text, self.calls = {}, None, Counter()

    @property
    def schemas(self) -> list[dict]:
        return [tool_schema(t) for t in self.tools]

    def reset(self, row: dict) -> list[dict]:
        self.row, self.final_text, self.calls = row, None, Counter()
        prompt = row.get("prompt")
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        if not (self.describe_tools and self.tools):
            return messages
        return [tools_system_message(self.schemas, self.write_calls or self.tool_format.write), *messages]

    def step(self, text: str, calls: list[dict] | None = None) -> StepResult:
        """``calls``: the turn's calls as the runner parsed them in the model family's format; None: parse ``text``
        in ``tool_format``."""
        if calls is None:
            calls = self.tool_format.parse(text)[1]
        if not calls:
            self.final_text = answer_text(text)  # without a thinking model's reasoning
            return StepResult(done=True)
        replies, made = [], []
        for call in calls:
            reply, ok = self.call(call)
            replies.append({"role": "tool", "content": reply})
            made.append({"name": call.get("name", "?"), "ok": ok})
            self.calls[call.get("name", "?")] += 1
        rewards = {}
        if self.call_reward:
            rewards["tool_calls"] = self.call_reward * len(made)
        if self.error_reward:
            rewards["tool_errors"] = self.error_reward * sum(not m["ok"] for m in made)
        return StepResult(replies, rewards, done=False, info={"calls": made})

    def call(self, call: dict) -> tuple[str, bool]:
        """(the tool message's content, whether the call worked)."""
        if "error" in call:
            return f"error: {call['error']}", False
        fn = self.by_name.get(call["name"])
        if fn is None:
            return f"error: there is no tool {call['name']!r}; the tools are {', '.join(self.by_name)}", False
        try:
            inspect.signature(fn).bind(**call["arguments"])
        except TypeError as err:
            return f"error: {call['name']}: {err}", False
        try:
            result = await_if_needed(fn(**call["arguments"]))
        except Exception as err:  # noqa: BLE001 - a tool's failure is the policy's observation
            warn_once(call["name"], err)
            return f"error: {call['name']} raised {type(err).__name__}: {err}", False
        return result if isinstance(result, str) else json.dumps(result), True

    def score(self, final_text: str | None) -> dict[str, float]:
        """Outcome reward parts of the finished episode (override); final_text is None if it never answered."""
        return {}

    def success(self) -> bool | None:
        """Whether the task is really done, from the environment's state (override)."""
        return None

    def outcome(self) -> Outcome:
        claimed = bool(self.claim.search(self.final_text or "")) if self.claim else None
        return Outcome(self.score(self.final_text), self.success(), claimed)
