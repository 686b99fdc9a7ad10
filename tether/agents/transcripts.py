"""The chat template in episodes (docs/agents.md): the transcript continued by appending tokens, the policy's call
turns and the environment's results as the template takes them, and the start-up check that runs a scripted episode
through the template and the parser before any model is loaded, so that nothing fails mid-run for a template reason.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from tether.agents.formats import FORMATS, call_id, same_calls
from tether.config import ConfigError
from tether.models.chat import (
    PROBE_TOOL,
    PROBE_USER,
    has_template,
    render_chat,
    takes_tools,
    template_errors,
    template_name,
    trained_calls,
    written_calls,
)

ONE_CALL = (
    "this model's chat template takes one tool call per turn, so this call was not made: call the tools one turn at "
    "a time"
)

PROBE = "\u27e6tether-probe-{}\u27e7"  # stands in for an environment message's content when locating it


class Transcript:
    """A conversation continued turn by turn by appending tokens, never by re-rendering what came before.

    The prompt is rendered through the chat template once. After each policy turn (its tokens exactly as sampled),
    the tokens appended are what the template writes after the end of an assistant turn: the glue after the turn's
    end marker, the environment's messages and the next generation prompt. They are found by rendering the whole
    conversation twice, once with the environment's messages and once with placeholders in their place: the two
    agree up to the first message's content, and the last end-of-turn marker before it closes the policy's turn
    (templates that drop earlier reasoning or put ``<think>`` in the generation prompt are continued alike: what they
    would re-render differently is never re-rendered).
    """

    def __init__(self, tokenizer, messages: list[dict], tools: list[dict] | None = None, markers: tuple = ()):
        if not has_template(tokenizer):
            raise ConfigError(
                "--env: episodes are chat conversations, and the tokenizer has no chat template to render "
                "them (use a model folder whose tokenizer_config.json has a chat_template)"
            )
        self.tokenizer, self.messages, self.tools, self.markers = tokenizer, list(messages), tools, markers
        self.text = self.render(self.messages, True)
        self.prompt_ids = tokenizer(self.text, add_special_tokens=False)["input_ids"]

    def render(self, messages: list[dict], generation_prompt: bool) -> str:
        try:
            return render_chat(self.tokenizer, messages, generation_prompt, self.tools)
        except Exception as err:  # noqa: BLE001 - a template's own raise_exception, or a jinja error
            roles = ", ".join(m["role"] + ("+tool_calls" if m.get("tool_calls") else "") for m in messages)
            raise TemplateError(
                f"the chat template ({template_name(self.tokenizer, bool(self.tools))}) cannot render the "
                f"conversation [{roles}]: {type(err).__name__}: {err}"
            ) from None

    def following(self, assistant: dict, observations: list[dict]) -> str:
        """The text after the policy's turn: the glue after its end marker, ``observations``, the generation prompt."""
        base = self.messages + [assistant]
        real = self.render(base + observations, True)
        probe = self.render(base + [{**m, "content": PROBE.format(k)} for k, m in enumerate(observations)], True)
        if real == probe:
            raise TemplateError(
                f"the chat template ({template_name(self.tokenizer, bool(self.tools))}) does not show the "
                f"environment's messages (roles {sorted({m['role'] for m in observations})})"
            )
        same = next((i for i, (a, b) in enumerate(zip(real, probe)) if a != b), min(len(real), len(probe)))
        at, marker = max(((real.rfind(m, 0, same), m) for m in self.markers if m), default=(-1, ""))
        if at < 0:
            raise TemplateError(
                f"the chat template ({template_name(self.tokenizer, bool(self.tools))}) closes the assistant's "
                f"turn with none of the stop tokens ({', '.join(self.markers)})"
            )
        return real[at + len(marker) :]

    def continue_with(self, assistant: dict, observations: list[dict]) -> list[int]:
        """The token ids that follow the policy's turn (the assistant message it becomes, structured with its tool
        calls), and the conversation advanced past ``observations``."""
        text = self.following(assistant, observations)
        self.messages += [assistant] + observations
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]


class TemplateError(ConfigError):
    """The chat template cannot continue an episode: found by the start-up check (check_template) before any
    model is loaded."""


def tool_replies(messages: list[dict], calls: list[dict]) -> list[dict]:
    """The environment's messages with the k-th tool message answering the k-th call: its id (``tool_call_id``) and
    the tool's ``name``, unless the environment gave them (templates need both: Mistral's the id, Hermes' the
    name)."""
    out, k = [], 0
    for m in messages:
        if m.get("role") == "tool" and k < len(calls):
            m = {**m, "tool_call_id": m.get("tool_call_id") or calls[k]["id"]}
            m.setdefault("name", calls[k].get("name") or "invalid_call")
            k += 1
        out.append(m)
    return out


def structured_call(call: dict, arguments_as_string: bool) -> dict:
    """A parsed call as an assistant message's tool_calls entry (one that did not parse: its name or
    "invalid_call", no arguments; the tokens stay as the policy wrote them)."""
    arguments = call.get("arguments", {}) if "error" not in call else {}
    return {
        "id": call["id"],
        "type": "function",
        "function": {
            "name": call.get("name") or "invalid_call",
            "arguments": json.dumps(arguments) if arguments_as_string else arguments,
        },
    }


@dataclass
class TemplateCheck:
    """What the start-up check found: notes for the plan, and whether the template takes one call per turn."""

    notes: list[str] = field(default_factory=list)
    one_call_per_turn: bool = False


def check_template(
    tokenizer, fmt, stops: list[int], tools: list[dict] | None = None, chosen: bool = False, tool_use: bool = True
) -> TemplateCheck:
    """The start-up check, before any model is loaded: a scripted two-turn episode rendered through the run's chat
    template and continued as episodes are — with ``tool_use``, a call, its result and a final answer; without
    (an environment that answers as the user), an answer, a user's reply and a second answer. Each policy turn is
    the template's own writing of it, so a note says what the template itself would re-render differently. With
    ``tool_use`` the template's own writing of a call must be read by the parser, and a turn with two calls is
    rendered: a template that refuses it takes one call per turn. Raises a ConfigError naming the template, what
    failed and the option that fixes it. A parser the run ``chosen`` (--tool-parser) that does not read the
    template's own calls is a note, not a refusal."""
    if not tool_use:
        return TemplateCheck(_check_plain_template(tokenizer, stops))
    tools = tools or ([PROBE_TOOL] if takes_tools(tokenizer) else None)
    name = template_name(tokenizer, tools=bool(tools))
    first = (tools or [PROBE_TOOL])[0]["function"]
    arguments = {p: "tether" for p in first["parameters"].get("required", [])}
    call = {"name": first["name"], "arguments": arguments, "id": call_id(1)}
    markers = tuple(dict.fromkeys(tokenizer.decode([t]) for t in stops))
    stop = stops[0] if stops else tokenizer.eos_token_id
    try:
        notes = _check_call_reading(tokenizer, fmt, call, tools, name, chosen)
        notes += _probe_tool_episode(Transcript(tokenizer, [PROBE_USER], tools, markers), fmt, call, stop, name)
        one_call = _takes_one_call_per_turn(Transcript(tokenizer, [PROBE_USER], tools, markers), fmt, call, name)
    except TemplateError as err:
        raise ConfigError(
            f"--env: {err}. Episodes cannot be continued with this template; fix with --chat-template FILE (a "
            f"training template), --chat-template-kwargs, or --tool-parser ({', '.join(FORMATS)} or module:function)"
        ) from None
    return TemplateCheck(notes, one_call)


def _check_call_reading(tokenizer, fmt, call: dict, tools, name: str, chosen: bool) -> list[str]:
    """The parser reads the template's own writing of a call, whatever the template writes it with (a template
    that writes none has nothing to read), and a call written in the parser's format survives tokenizing and
    decoding. A refusal names the parser that reads it, or asks for one."""
    notes = []
    written = template_call_text(tokenizer, call, tools)
    if written is not None and not same_calls(fmt.parse(written)[1], [call]):
        readers = [f.name for f in FORMATS.values() if same_calls(f.parse(written)[1], [call])]
        mismatch = (
            f"the chat template ({name}) writes a tool call as {written[:160]!r}, which the {fmt.name} parser reads "
            f"as {fmt.parse(written)[1]}"
        )
        if not chosen:
            raise TemplateError(
                f"{mismatch}; "
                + (
                    f"use --tool-parser {readers[0]}"
                    if readers
                    else "no built-in parser reads it: give --tool-parser module:function (a parser of your own)"
                )
            )
        notes.append(f"{mismatch}: calls in the data the model learnt from may not be read")
    notes += _check_trained_calls(tokenizer, fmt, call, tools, name, chosen)
    try:
        text = fmt.write([call])
    except NotImplementedError:  # a user's parser without write(): it reads the template's call (or an empty turn)
        text = written or ""
    decoded = tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"], skip_special_tokens=False)
    parsed = fmt.parse(decoded)[1]
    if not chosen and not same_calls(parsed, [call]):
        raise TemplateError(
            f"a call written in the {fmt.name} format does not survive tokenizing and decoding ({parsed}); "
            "use --tool-parser"
        )
    return notes


def _check_trained_calls(tokenizer, fmt, call: dict, tools, name: str, chosen: bool) -> list[str]:
    """The parser reads a call turn as ``tether sft`` trains it on this template (the template's own writing, or
    where it writes none the run's format): SFT and RL make one format choice (docs/agents.md). A mismatch is
    refused, or a note for a parser the run ``chosen``."""
    try:
        trained = trained_calls(tokenizer, [call], tools)
    except template_errors():  # a template that refuses a call turn: template_call_text names it
        return []
    if same_calls(fmt.parse(trained)[1], [call]):
        return []
    mismatch = (
        f"tether sft trains a tool call on this chat template ({name}) as {trained[:160]!r}, which the {fmt.name} "
        f"parser reads as {fmt.parse(trained)[1]}"
    )
    if chosen:
        return [f"{mismatch}: a model trained by tether sft on this template writes calls this run does not read"]
    raise TemplateError(f"{mismatch}; use --tool-parser")


def _probe_tool_episode(transcript: Transcript, fmt, call: dict, stop: int, name: str) -> list[str]:
    """The scripted tool episode: the call, its result, a final answer; the note when re-rendering it differs."""
    tokenizer = transcript.tokenizer
    ids = list(transcript.prompt_ids)
    assistant = {"role": "assistant", "content": "", "tool_calls": [structured_call(call, fmt.arguments_as_string)]}
    try:
        written = fmt.write([call])
    except NotImplementedError:  # a user's parser without write(): its calls in the probe are the template's
        written = template_call_text(tokenizer, call, transcript.tools) or ""
    ids += template_turn(transcript, assistant, written, stop)
    reply = tool_replies([{"role": "tool", "content": "PROBE RESULT"}], [call])
    following = transcript.continue_with(assistant, reply)
    if "PROBE RESULT" not in tokenizer.decode(following, skip_special_tokens=False):
        raise TemplateError(f"the chat template ({name}) does not show a tool's result after a call")
    answer = {"role": "assistant", "content": "The answer is here."}
    ids += following + template_turn(transcript, answer, answer["content"], stop)
    full = transcript.render(transcript.messages + [answer], False)
    return rewrite_note(tokenizer.decode(ids, skip_special_tokens=False), full, name)


def _takes_one_call_per_turn(transcript: Transcript, fmt, call: dict, name: str) -> bool:
    """Whether the template refuses a turn with two calls but continues one with a call and two results (Llama 3.1's:
    the runner then answers a turn's later calls with an error); a template that refuses both is refused."""
    calls = [call, {**call, "id": call_id(2)}]
    replies = tool_replies([{"role": "tool", "content": "PROBE RESULT"}] * 2, calls)
    refusal = None
    for kept in (calls, calls[:1]):
        turn = {
            "role": "assistant",
            "content": "",
            "tool_calls": [structured_call(c, fmt.arguments_as_string) for c in kept],
        }
        try:
            transcript.following(turn, replies)
        except TemplateError as err:
            refusal = refusal or err
            continue
        return len(kept) == 1
    raise TemplateError(f"{refusal}; nor does it continue a turn whose second call is answered with an error")


def template_turn(transcript: Transcript, assistant: dict, fallback: str, stop: int) -> list[int]:
    """A policy turn as the template itself writes ``assistant`` after the conversation so far: its rendering after
    the generation prompt, through the stop token that closes it (what a model trained on the template writes).
    Where its rendering does not continue its generation prompt (R1 puts ``<think>`` there and never renders it
    back) or has no stop token: ``fallback`` and ``stop``."""
    tokenizer = transcript.tokenizer
    before = transcript.render(transcript.messages, True)
    after = transcript.render(transcript.messages + [assistant], False)
    turn = after[len(before) :] if after.startswith(before) else ""
    at, marker = max(((turn.rfind(m), m) for m in transcript.markers if m), default=(-1, ""))
    if at < 0:
        return tokenizer(fallback, add_special_tokens=False)["input_ids"] + [stop]
    return tokenizer(turn[: at + len(marker)], add_special_tokens=False)["input_ids"]


def _check_plain_template(tokenizer, stops: list[int]) -> list[str]:
    """check_template for an environment without tools: answer, the user's reply, a second answer."""
    name = template_name(tokenizer)
    stop = stops[0] if stops else tokenizer.eos_token_id
    markers = tuple(dict.fromkeys(tokenizer.decode([t]) for t in stops))
    try:
        transcript = Transcript(tokenizer, [{"role": "user", "content": "Answer, then try again."}], None, markers)
        first = {"role": "assistant", "content": "A first answer."}
        ids = transcript.prompt_ids + template_turn(transcript, first, first["content"], stop)
        ids += transcript.continue_with(first, [{"role": "user", "content": "PROBE REPLY"}])
        second = {"role": "assistant", "content": "A second answer."}
        ids += template_turn(transcript, second, second["content"], stop)
        full = transcript.render(transcript.messages + [second], False)
    except TemplateError as err:
        raise ConfigError(
            f"--env: {err}. Episodes cannot be continued with this template; fix with --chat-template FILE (a "
            "training template) or --chat-template-kwargs"
        ) from None
    return rewrite_note(tokenizer.decode(ids, skip_special_tokens=False), full, name)


def rewrite_note(appended: str, full: str, name: str) -> list[str]:
    """The plan's note when re-rendering a finished probe episode differs from its appended transcript."""
    if full.startswith(appended.rstrip()) or appended.startswith(full.rstrip()):
        return []
    at = next((i for i, (a, b) in enumerate(zip(appended, full)) if a != b), min(len(appended), len(full)))
    return [
        f"the chat template ({name}) re-renders a finished episode differently from its transcript (from "
        f"{appended[max(0, at - 30) : at + 30]!r} it writes {full[max(0, at - 30) : at + 30]!r}): the policy is "
        "trained on its turns exactly as it sampled them, each in the context it was sampled in; a server "
        "that re-renders the conversation shows it the template's version"
    ]


def template_call_text(tokenizer, call: dict, tools) -> str | None:
    """How the chat template writes an assistant turn with one tool call (None: it writes no tool calls)."""
    try:
        return written_calls(tokenizer, [call], tools)
    except template_errors() as err:
        raise TemplateError(
            f"the chat template ({template_name(tokenizer, bool(tools))}) cannot render an assistant turn with "
            f"tool_calls: {type(err).__name__}: {err}"
        ) from None


def instruction_writer(tokenizer, fmt):
    """How the tool system message shows a call (tools.ToolEnvironment): as the template itself writes it where the
    parser reads that (so SFT data and episodes say the same), else as the parser's format writes it; the
    instruction and the parser are one choice."""

    def write(calls: list[dict]) -> str:
        try:
            text = written_calls(tokenizer, calls)
        except template_errors():
            text = None
        if text is not None and same_calls(fmt.parse(text)[1], calls):
            return text
        return fmt.write(calls)

    return write
