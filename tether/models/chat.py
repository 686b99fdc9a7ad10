"""The chat template: which one a run renders with, with which options, and the one function every rendering goes
through (SFT data, prompts, preference pairs, agent episodes, the end-of-turn probe).

A tokenizer may ship one template or several named ones (Hermes 3: ``default`` and ``tool_use``). The run chooses
with ``model.chat_template`` (``--chat-template``): empty takes the tokenizer's own (for a named set: ``tool_use``
when the conversation has tools, else ``default``, as transformers does); a name picks one of the set; a path to a
``.jinja`` file is a training template of your own. ``model.chat_template_kwargs`` (``--chat-template-kwargs``, e.g.
``enable_thinking=false``) are handed to every rendering. Both travel on the tokenizer object (``use_chat``), so
every module that renders sees the same choice without threading it through. A template file is checked there,
before any model is loaded: it compiles, and renders a user turn and a user turn with an answer.

What a template does with tools is found by rendering probes, never read from its text: whether it lists a
``tools=`` list (``takes_tools``), whether and how it writes an assistant turn's ``tool_calls`` (``call_writing``,
``written_calls``); ``template_conversation`` hands a conversation's calls and results to it as the online stages
do (ids, names, arguments), or as text in the run's call format to a template that does not write them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from tether.errors import ConfigError


@dataclass(frozen=True)
class ChatChoice:
    template: str | None = None  # a template's text, a name of the tokenizer's set, or None: the tokenizer's own
    kwargs: dict = field(default_factory=dict)  # extra variables for the template (enable_thinking...)
    source: str = ""  # how the plan names it


def named_templates(tokenizer) -> dict[str, str]:
    """The tokenizer's templates by name ({"default": text} for a tokenizer with one, {} for none)."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        return dict(template)
    return {"default": template} if template else {}


def use_chat(tokenizer, template: str = "", kwargs: dict | None = None):
    """Fix the run's chat template and options on ``tokenizer`` (returned): ``template`` is empty, a name of the
    tokenizer's set or a path to a Jinja file; errors name the option."""
    names = named_templates(tokenizer)
    chosen, source, path = None, "the tokenizer's own", None
    if template:
        if template in names and isinstance(tokenizer.chat_template, dict):
            chosen, source = template, f"the tokenizer's {template!r} template"
        elif template in names:  # "default" of a tokenizer with one template
            chosen, source = None, "the tokenizer's own"
        elif Path(template).is_file():
            chosen, source = Path(template).read_text(), f"{template} (a training template)"
            path = template
        else:
            raise ConfigError(
                f"model.chat_template={template!r} (--chat-template) is neither a template of this tokenizer "
                f"({', '.join(sorted(names)) or 'it has none'}) nor a Jinja file"
            )
    if kwargs is not None and not isinstance(kwargs, dict):
        raise ConfigError(f"model.chat_template_kwargs must be a mapping (NAME=VALUE,...), not {kwargs!r}")
    tokenizer.tether_chat = ChatChoice(chosen, dict(kwargs or {}), source)
    if path is not None:
        check_template_file(tokenizer, path)
    return tokenizer


PROBE_TURNS = [{"role": "user", "content": "What is 2 + 3?"}, {"role": "assistant", "content": "5."}]


def check_template_file(tokenizer, path: str) -> None:
    """The run's template, read from ``path``, compiles and renders a user turn with the generation prompt and a
    user turn with its answer (what every stage renders); else a ConfigError naming the file, the line and what
    failed. Conversations the template refuses on purpose (roles that must alternate) are the data's matter."""
    import traceback

    from jinja2 import TemplateSyntaxError

    for messages, generation_prompt in ((PROBE_TURNS[:1], True), (PROBE_TURNS, False)):
        try:
            render_chat(tokenizer, messages, generation_prompt)
        except TemplateSyntaxError as err:
            raise ConfigError(
                f"--chat-template {path}:{err.lineno}: not a valid Jinja template: {err.message}"
            ) from None
        except Exception as err:  # noqa: BLE001 - whatever a template raises while rendering: named below
            lines = [f.lineno for f in traceback.extract_tb(err.__traceback__) if f.filename == "<template>"]
            what = "a user turn and its answer" if len(messages) > 1 else "a user turn and the generation prompt"
            raise ConfigError(
                f"--chat-template {path}{f':{lines[-1]}' if lines else ''}: rendering {what} raised "
                f"{type(err).__name__}: {err}"
            ) from None


def chat_choice(tokenizer) -> ChatChoice:
    return getattr(tokenizer, "tether_chat", None) or ChatChoice()


def has_template(tokenizer) -> bool:
    return bool(named_templates(tokenizer)) or bool(chat_choice(tokenizer).template)


def template_text(tokenizer, tools: bool = False) -> str:
    """The text of the template a rendering uses (with ``tools``: the one a conversation with tools gets)."""
    choice, names = chat_choice(tokenizer), named_templates(tokenizer)
    if choice.template is not None:
        return names.get(choice.template, choice.template)
    if len(names) == 1:
        return next(iter(names.values()))
    return names.get("tool_use" if tools and "tool_use" in names else "default", "")


def template_name(tokenizer, tools: bool = False) -> str:
    """How the plan names the template a rendering uses."""
    choice, names = chat_choice(tokenizer), named_templates(tokenizer)
    if choice.template is not None or len(names) <= 1:
        return choice.source or "the tokenizer's own"
    return f"the tokenizer's {'tool_use' if tools and 'tool_use' in names else 'default'!r} template"


def render_chat(tokenizer, messages: list[dict], generation_prompt: bool = False, tools: list | None = None) -> str:
    """``messages`` (and ``tools``, when given) through the run's template with the run's options, as text."""
    choice = chat_choice(tokenizer)
    extra = {"tools": tools} if tools else {}
    if choice.template is not None:
        extra["chat_template"] = choice.template
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=generation_prompt, **choice.kwargs, **extra
    )


# What the template does with tools and tool calls is found by rendering, never read from its text: a template may
# mention "tools" and ignore tools= (Phi-4-mini's), or write a call by its id rather than its name (Kimi K2's).
PROBE_USER = {"role": "user", "content": "Use a tool, then answer."}
PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": "tether_probe_lookup",
        "description": "Look a word up.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
    },
}
PROBE_CALL = {"name": "tether_probe_lookup", "arguments": {"query": "tether_probe_word"}}
CALL_ID_LENGTH = 9  # Mistral's templates refuse any other; every family gets the same form


def template_errors() -> tuple:
    """The exceptions a chat template raises on a conversation it refuses: its own raise_exception (a jinja
    TemplateError) or an operation on a value of the wrong type (DeepSeek's templates join arguments as text)."""
    from jinja2 import TemplateError

    return (TemplateError, TypeError)


def call_id(n: int) -> str:
    """The id of the n-th call of a conversation: 9 alphanumeric characters (``call00001``), unique within it."""
    return f"call{n:05d}"


def valid_call_id(value) -> bool:
    return isinstance(value, str) and len(value) == CALL_ID_LENGTH and value.isalnum()


def structured_calls(calls: list[dict], arguments_as_string: bool = False) -> list[dict]:
    """Calls ({"name", "arguments", "id"}) as an assistant message's ``tool_calls`` (arguments already a string kept)."""
    as_string = lambda a: json.dumps(a) if arguments_as_string and not isinstance(a, str) else a
    return [
        {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": as_string(c["arguments"])}}
        for c in calls
    ]


def hermes_text(calls: list[dict]) -> str:
    """Calls as the Hermes / Qwen text, each ``{"name": ..., "arguments": {...}}`` on a line of its own between
    ``<tool_call>`` and ``</tool_call>``: tether's default convention (the hermes format's writer)."""
    return "\n".join(
        "<tool_call>\n" + json.dumps({"name": c["name"], "arguments": c["arguments"]}) + "\n</tool_call>" for c in calls
    )


def llama3_text(calls: list[dict]) -> str:
    """Calls as Llama 3's JSON, ``{"name": ..., "parameters": {...}}``, several joined by ``; ``."""
    return "; ".join(json.dumps({"name": c["name"], "parameters": c["arguments"]}) for c in calls)


def pythonic_text(calls: list[dict]) -> str:
    """Calls as a Python list of calls with keyword arguments: ``[add(a=2, b=3)]`` (Llama 3.2 / 4)."""
    args = lambda c: ", ".join(f"{k}={v!r}" for k, v in c["arguments"].items())
    return "[" + ", ".join(f"{c['name']}({args(c)})" for c in calls) + "]"


def mistral_text(calls: list[dict]) -> str:
    return "[TOOL_CALLS]" + json.dumps([{"name": c["name"], "arguments": c["arguments"]} for c in calls])


DEEPSEEK_TOKENS = (
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁sep｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁calls▁end｜>",
)


def deepseek_text(calls: list[dict]) -> str:
    """Calls in DeepSeek-V3 / R1's call tokens, each with its arguments in a ```json block."""
    begin, call, sep, call_end, end = DEEPSEEK_TOKENS
    body = "".join(
        f"{call}function{sep}{c['name']}\n```json\n{json.dumps(c['arguments'])}\n```{call_end}" for c in calls
    )
    return f"{begin}{body}{end}"


# Each built-in call format's writer (agents/formats.py parses them): here, below the agents, so that SFT data writes
# calls a template does not write itself in the format the online stages read (one choice, docs/agents.md).
CALL_WRITERS = {
    "hermes": hermes_text,
    "llama3_json": llama3_text,
    "pythonic": pythonic_text,
    "mistral": mistral_text,
    "deepseek": deepseek_text,
}


def call_format(template: str) -> str:
    """The call format a chat template's text speaks (the default, hermes, for templates that show none): the
    online stages' parser when --tool-parser is not given."""
    if "[TOOL_CALLS]" in template:
        return "mistral"
    if "tool▁calls▁begin" in template or "tool▁call▁begin" in template:
        return "deepseek"
    if "<tool_call>" in template:
        return "hermes"
    if "[func_name" in template or "<|python_start|>" in template:
        return "pythonic"
    if "<|python_tag|>" in template or ("<|start_header_id|>" in template and "parameters" in template):
        return "llama3_json"
    return "hermes"


_PROBED: dict = {}


def _probed(tokenizer, what: str, tools: bool, probe):
    """``probe()`` once per tokenizer, template and options (data preparation asks for every conversation)."""
    key = (id(tokenizer), what, tools, template_text(tokenizer, tools), str(chat_choice(tokenizer).kwargs))
    if key not in _PROBED:
        _PROBED[key] = probe()
    return _PROBED[key]


def takes_tools(tokenizer) -> bool:
    """Whether the template lists a ``tools=`` list itself (Qwen2.5, Llama 3.1, Mistral, Hermes templates do): a
    tool handed to it appears, by name, in what it renders."""

    def probe():
        try:
            return PROBE_CALL["name"] in render_chat(tokenizer, [PROBE_USER], True, [PROBE_TOOL])
        except template_errors():  # a template that refuses tools=: given none, the tools go in a system message
            return False

    return has_template(tokenizer) and _probed(tokenizer, "takes_tools", True, probe)


@dataclass(frozen=True)
class CallWriting:
    shown: bool  # the template writes an assistant turn's tool_calls (their arguments appear in its rendering)
    arguments_as_string: bool  # it takes the arguments as a JSON string (it refuses them as an object)
    content: str | None = ""  # the call turn's content with which it writes them (DeepSeek-R1's needs None)


def call_writing(tokenizer, tools: bool = False) -> CallWriting:
    """How the template treats an assistant turn's ``tool_calls`` (in a conversation given ``tools=`` or not)."""

    def probe():
        schemas, rendered = [PROBE_TOOL] if tools else None, None
        # DeepSeek-R1's own template writes a turn's tool_calls only when its content is None, and with "" writes an
        # empty turn: both are tried, and the first that shows the call is how the template writes calls
        for content in ("", None):
            for as_string in (False, True):
                message = {"role": "assistant", "content": content}
                message["tool_calls"] = structured_calls([probe_call()], as_string)
                try:
                    text = render_chat(tokenizer, [PROBE_USER, message], False, schemas)
                except template_errors():
                    continue
                if PROBE_CALL["arguments"]["query"] in text:
                    return CallWriting(True, as_string, content)
                rendered = rendered or CallWriting(False, as_string)
        return rendered or CallWriting(False, False)

    return _probed(tokenizer, "call_writing", tools, probe) if has_template(tokenizer) else CallWriting(False, False)


def probe_call(n: int = 1) -> dict:
    return {**PROBE_CALL, "id": call_id(n)}


def written_calls(tokenizer, calls: list[dict], tools: list | None = None) -> str | None:
    """The text the template writes for ``calls`` ({"name", "arguments", "id"}) in an assistant turn, without the
    turn's header and end (those of a turn with text, found around a placeholder text); None when it writes no tool
    calls. Raises what the template raises (callers name it)."""
    writing = call_writing(tokenizer, bool(tools))
    if not writing.shown:
        return None
    message = {"role": "assistant", "content": writing.content}
    message["tool_calls"] = structured_calls(calls, writing.arguments_as_string)
    return turn_text(tokenizer, message, tools)


def trained_calls(tokenizer, calls: list[dict], tools: list | None = None) -> str:
    """The text of an assistant turn with ``calls`` as ``tether sft`` trains it (template_conversation, then the
    template): what the RL stage's parser must read. Raises what the template raises (callers name it)."""
    message = {"role": "assistant", "content": "", "tool_calls": structured_calls(calls)}
    return turn_text(tokenizer, template_conversation(tokenizer, [PROBE_USER, message], bool(tools))[1], tools)


def turn_text(tokenizer, message: dict, tools: list | None = None) -> str:
    """What the template writes for the assistant ``message`` after the probe's user turn, without the turn's header
    and end (those of a turn with text, found around a placeholder text)."""
    written = render_chat(tokenizer, [PROBE_USER, message], False, tools)
    plain = render_chat(tokenizer, [PROBE_USER, {"role": "assistant", "content": TURN_TEXT}], False, tools)
    head, _, tail = plain.partition(TURN_TEXT)
    same = next((i for i, (a, b) in enumerate(zip(head, written)) if a != b), min(len(head), len(written)))
    written = written[same:]
    eos = tokenizer.eos_token or ""
    if tail.strip() and written.endswith(tail):
        written = written[: -len(tail)]
    elif eos and eos in written:
        written = written[: written.rindex(eos)]
    return written.strip()


TURN_TEXT = "\u27e6tether-turn\u27e7"  # an assistant turn's text, to find what a template writes around it


def run_format_writer(tokenizer):
    """``write(calls)`` in the format the online stages read calls in with this template and no --tool-parser
    (call_format of the template a conversation with tools gets): the one format choice of a run (docs/agents.md),
    for calls a template does not write itself."""
    return CALL_WRITERS[call_format(template_text(tokenizer, tools=True))]


def template_conversation(tokenizer, messages: list[dict], tools: bool = False, write=None) -> list[dict]:
    """A conversation's tool traffic as the run's template takes it, the way the online stages hand it over
    (agents/episodes.py): each call keeps its id when it has the 9 alphanumeric characters every family's templates
    take, else gets ``callNNNNN`` (its place in the conversation); each tool message gets the id and the name of the
    call it answers (the one its ``tool_call_id`` names, else the turn's next unanswered call); arguments go as an
    object, or as a JSON string to a template that refuses an object. Where the template does not write a turn's
    calls (it writes none, or writes them only for a turn with no text while this one has text), they go as text
    after the turn's content, written by ``write`` (default: the run's format, ``run_format_writer``), so the calls
    a model learns are the calls its RL stage reads."""
    if not any(m.get("tool_calls") or m.get("role") == "tool" for m in messages):
        return messages
    writing = call_writing(tokenizer, tools)
    out, pending, renamed, n = [], [], {}, 0
    for m in messages:
        if m.get("role") == "assistant" and m.get("tool_calls"):
            calls = []
            for c in m["tool_calls"]:
                n += 1
                given = c.get("id")
                calls.append({**c["function"], "id": given if valid_call_id(given) else call_id(n)})
                if isinstance(given, str):
                    renamed[given] = calls[-1]["id"]
            pending = list(calls)
            m = _call_turn(tokenizer, m, calls, writing, write)
        elif m.get("role") == "tool" and pending:
            named = renamed.get(m["tool_call_id"]) if isinstance(m.get("tool_call_id"), str) else None
            call = next((c for c in pending if c["id"] == named), pending[0])
            pending.remove(call)
            m = {**m, "tool_call_id": call["id"], "name": m.get("name") or call["name"]}
        out.append(m)
    return out


def _call_turn(tokenizer, message: dict, calls: list[dict], writing: CallWriting, write) -> dict:
    """An assistant turn with ``calls``: structured, with the content the template writes calls with, or (where
    the template would not write them) the calls as text in the run's format after the turn's content."""
    content = message.get("content") or ""
    if writing.shown and (writing.content is not None or not content):
        structured = structured_calls(calls, writing.arguments_as_string)
        return {**message, "content": content if writing.content is not None else None, "tool_calls": structured}
    text = (write or run_format_writer(tokenizer))(calls)
    return {
        **{k: v for k, v in message.items() if k != "tool_calls"},
        "content": content + ("\n" if content else "") + text,
    }
