"""The chat template: which one a run renders with, with which options, and the one function every rendering goes
through (SFT data, prompts, preference pairs, agent episodes, the end-of-turn probe).

A tokenizer may ship one template or several named ones (Hermes 3: ``default`` and ``tool_use``). The run chooses
with ``model.chat_template`` (``--chat-template``): empty takes the tokenizer's own (for a named set: ``tool_use``
when the conversation has tools, else ``default``, as transformers does); a name picks one of the set; a path to a
``.jinja`` file is a training template of your own. ``model.chat_template_kwargs`` (``--chat-template-kwargs``, e.g.
``enable_thinking=false``) are handed to every rendering. Both travel on the tokenizer object (``use_chat``), so
every module that renders sees the same choice without threading it through. A template file is checked there,
before any model is loaded: it compiles, and renders a user turn and a user turn with an answer.
"""

from __future__ import annotations

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


def takes_tools(tokenizer) -> bool:
    """Whether the template renders a ``tools=`` list itself (Qwen2.5, Llama 3.1, Mistral, Hermes templates do)."""
    return "tools" in template_text(tokenizer, tools=True)


def render_chat(tokenizer, messages: list[dict], generation_prompt: bool = False, tools: list | None = None) -> str:
    """``messages`` (and ``tools``, when given) through the run's template with the run's options, as text."""
    choice = chat_choice(tokenizer)
    extra = {"tools": tools} if tools else {}
    if choice.template is not None:
        extra["chat_template"] = choice.template
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=generation_prompt, **choice.kwargs, **extra
    )
