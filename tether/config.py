"""Config machinery: frozen dataclasses, YAML files, command-line overrides — one declaration, one validation.

Each option is declared once with ``option(...)`` in a ``Section``; its help text is both the ``--help`` and
the documentation. A section checks its ``choices`` and its own rules when it is constructed, so flags, YAML
files and configs built in Python are validated alike; a stage config checks the rules that span sections.
A stage's defaults are its default section instances (``rollout: SamplingSection = SamplingSection(...)``).
Precedence: those defaults < a preset (the group family's recipes) < ``--config`` YAML < command-line flags; a
preset named by a flag (``--recipe``) sits over the YAML instead, under the other flags.
Keys renamed in a later version keep working for a while: ``RENAMED`` maps them to the new key, with a warning.
A tool command (``tether eval``, ``tether data check``) declares its flags the same way, as a ``CommandConfig``.

``STAGES`` is the stage table: one row per stage, read by the command line, the Python API and ``tether``'s lazy
names. Its paths are strings, imported on use: reading the table imports no stage (and no torch).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import typing
from pathlib import Path
from typing import Any, ClassVar

import yaml

from tether.errors import ConfigError  # noqa: F401 - re-exported: tether.config.ConfigError is public

log = logging.getLogger("tether.config")


def option(
    default: Any, help: str, *, flag: str | None = None, choices: tuple | None = None, aliases: tuple[str, ...] = ()
):
    """A documented config field. ``flag`` overrides the command-line name (default: --field-name; a name without
    dashes is a positional argument); ``choices`` are enforced at construction (for a list field, on every item);
    ``aliases`` are further flag names. A ``list`` field takes comma-separated items, a ``tuple`` field one whole
    item per flag (``--set a=1,2 --set b=3``)."""
    meta = {"help": help, "flag": flag, "choices": choices, "aliases": aliases}
    if isinstance(default, list):
        return dataclasses.field(default_factory=lambda d=tuple(default): list(d), metadata=meta)
    if isinstance(default, dict):
        return dataclasses.field(default_factory=lambda d=tuple(default.items()): dict(d), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


@dataclasses.dataclass(frozen=True)
class Section:
    """Base of every config section: ``choices`` are checked at construction, then the section's ``check()``."""

    def __post_init__(self):
        for f in dataclasses.fields(self):
            allowed = f.metadata.get("choices")
            value = getattr(self, f.name)
            for item in (value if isinstance(value, list) else [value]) if allowed else ():
                if item not in allowed:
                    raise ConfigError(f"{f.name}={item!r} is not one of {', '.join(map(str, allowed))}")
        self.check()

    def check(self) -> None:
        """Rules between this section's fields; raise ConfigError naming the field."""


@dataclasses.dataclass(frozen=True)
class StageConfig:
    """Base of a stage's config: one field per section; ``check()`` holds the rules that span sections."""

    RENAMED: ClassVar[dict[str, str]] = {}  # old dotted key (or "section.*") -> new dotted key (or "section.*")
    OLD_FLAGS: ClassVar[dict[str, str]] = {}  # old flags whose name does not follow from the old key -> old key
    PRESET_KEY: ClassVar[str] = ""  # the dotted option that names the preset (the group family's algo.recipe)

    def __post_init__(self):
        self.check()

    def check(self) -> None:
        """Rules between sections; raise ConfigError naming the fields."""

    @classmethod
    def preset(cls, values: dict[str, Any]) -> dict[str, Any]:
        """Dotted settings that sit between the defaults and the user's values (the group family's recipes); one named
        by a flag or keyword (PRESET_KEY) sits over a --config file's or a config object's values (build_config)."""
        return {}


@dataclasses.dataclass(frozen=True)
class CommandConfig(StageConfig):
    """Base of a tool command's settings (``tether eval``, ``tether data check``...): sections as a stage's, set by
    flags alone (no --config file, no other projects' names). A section lends the command every field, or those
    named in ``TAKES`` (the model section lends --model and the chat template, not LoRA); ``REQUIRED`` flags must
    be given."""

    TAKES: ClassVar[dict[str, tuple[str, ...]]] = {}  # section -> the fields the command takes (absent: all)
    REQUIRED: ClassVar[tuple[str, ...]] = ()  # dotted fields whose flag must be given

    @classmethod
    def takes(cls, section: str, field: str) -> bool:
        return field in cls.TAKES.get(section, (field,))


@dataclasses.dataclass(frozen=True)
class Stage:
    """A row of the stage table: the stage's name (its command and ``tether.<name>()``), its config class and run
    function as ``module:name`` strings, and its one-line help (``details``: the rest of its --help)."""

    name: str
    config: str
    run: str
    help: str
    details: str = ""

    @property
    def config_name(self) -> str:
        return self.config.partition(":")[2]

    @property
    def config_module(self) -> str:
        return self.config.partition(":")[0]

    def config_class(self):
        return _import(self.config)

    def run_function(self):
        return _import(self.run)


def _import(target: str):
    import importlib

    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


STAGES = (  # in the order `tether --help` lists them
    Stage(
        "sft",
        "tether.stages.sft_config:SFTConfig",
        "tether.stages.sft:run_sft",
        "Supervised fine-tuning on prompt/completion, messages or text data.",
    ),
    Stage(
        "rm",
        "tether.stages.rm_config:RMConfig",
        "tether.stages.rm:run_rm",
        "Reward model from preference pairs or ranked lists, with bias probes and normalisation.",
    ),
    Stage(
        "prm",
        "tether.stages.prm_config:PRMConfig",
        "tether.stages.prm:run_prm",
        "Process reward model from step-labelled solutions: a score per step (step accuracy, AUROC, first wrong step).",
    ),
    Stage(
        "judge",
        "tether.stages.judge_config:JudgeConfig",
        "tether.stages.judge:run_judge",
        "A generative reward model: a language model trained to write a pairwise judge's verdict from preference "
        "pairs (both orders), evaluated as a reward model.",
    ),
    Stage(
        "ppo",
        "tether.stages.ppo_config:PPOConfig",
        "tether.stages.ppo:run_ppo",
        "PPO with a critic, a reward model and/or reward functions (or an environment) and a KL-tied reference.",
    ),
    Stage(
        "grpo",
        "tether.stages.grpo_config:GRPOConfig",
        "tether.stages.grpo:run_grpo",
        "The group family (GRPO, Dr. GRPO, DAPO, GSPO, RLOO, REINFORCE++): `tether grpo --recipe dapo ...`.",
        " A recipe sets the algo options; any flag or YAML value overrides it, but --recipe given as a flag is applied "
        "over the --config file's values (defaults shown are those of no recipe).",
    ),
    Stage(
        "dpo",
        "tether.stages.dpo_config:DPOConfig",
        "tether.stages.dpo:run_dpo",
        "The direct-preference family (DPO, cDPO, robust, IPO, hinge, SimPO, ORPO, β-DPO, listwise, KTO), offline "
        "or --online.",
        " Formulas: docs/dpo.md.",
    ),
)


def stage(name: str) -> Stage:
    """The stage table's row of ``name``; an unknown name is a ConfigError listing the stages."""
    for row in STAGES:
        if row.name == name:
            return row
    raise ConfigError(f"no stage {name!r}; stages are {sorted(row.name for row in STAGES)}")


def _leaf_fields(section_cls):
    hints = typing.get_type_hints(section_cls)
    for f in dataclasses.fields(section_cls):
        yield f, hints[f.name]


def _sections(config_cls):
    hints = typing.get_type_hints(config_cls)
    for f in dataclasses.fields(config_cls):
        yield f.name, hints[f.name]


def _section_defaults(config_cls) -> dict[str, dict]:
    """{section: {field: default}}: a stage's defaults are its default section instances."""
    out = {}
    for f in dataclasses.fields(config_cls):
        instance = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        out[f.name] = {g.name: getattr(instance, g.name) for g in dataclasses.fields(instance)}
    return out


def flag_name(f: dataclasses.Field) -> str:
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def stage_name(config_cls) -> str:
    """The stage a config class belongs to: SFTConfig -> "sft"."""
    return config_cls.__name__.removesuffix("Config").lower()


def flag_fields(config_cls) -> dict[str, str]:
    """{flag: "section.field"} for every flag of the stage, its aliases included."""
    out = {}
    for section, section_cls in _sections(config_cls):
        for f, _ in _leaf_fields(section_cls):
            out[flag_name(f)] = f"{section}.{f.name}"
    for section, section_cls in _sections(config_cls):
        for f, _ in _leaf_fields(section_cls):
            for name in f.metadata.get("aliases", ()):
                out.setdefault(name, f"{section}.{f.name}")  # a flag's own name wins over another's alias
    return out


def _parse_list(text: str) -> list[str]:
    """Comma-separated, except inside parentheses: ``a:f(x=1,y=2)=0.5,b:g`` is two items."""
    parts, depth, current = [], 0, ""
    for ch in text:
        depth += (ch == "(") - (ch == ")")
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    parts.append(current)
    return [part.strip() for part in parts if part.strip()]


def _parse_mapping(text: str) -> dict:
    """``NAME=VALUE,...`` (each value read as YAML: ``enable_thinking=false`` is a boolean) or a JSON object."""
    import json

    import yaml

    text = text.strip()
    if text.startswith("{"):
        try:
            value = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"not a JSON object ({err.msg})") from None
        if not isinstance(value, dict):
            raise ValueError("not a JSON object")
        return value
    out = {}
    for item in _parse_list(text):
        name, eq, raw = item.partition("=")
        if not eq or not name.strip():
            raise ValueError(f"{item!r} is not NAME=VALUE")
        out[name.strip()] = yaml.safe_load(raw) if raw.strip() else ""
    return out


class _AppendListAction(argparse.Action):
    """A list flag may be given several times (``--reward a --reward b``) or once with commas; the items add up."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, list(getattr(namespace, self.dest, None) or []) + list(values))


def _is_list(typ) -> bool:
    return typ in (list, list[str], typing.List[str])


def _argument_kwargs(f, typ, dest: str, help_text: str) -> dict:
    kwargs: dict[str, Any] = dict(dest=dest, default=argparse.SUPPRESS, help=help_text)
    if not flag_name(f).startswith("-"):  # a positional argument: its dest is its first name
        del kwargs["dest"]
        kwargs.update(metavar=flag_name(f), nargs="+" if _is_list(typ) else None)
    elif typ is bool:
        kwargs["action"] = argparse.BooleanOptionalAction
    elif _is_list(typ):
        kwargs.update(type=_parse_list, action=_AppendListAction, metavar="A,B")
    elif typ is tuple:
        kwargs.update(action="append", metavar=f.name.upper())
    elif typ is dict:
        kwargs.update(type=_parse_mapping, metavar="NAME=VALUE,...")
    else:
        kwargs.update(type=typ, metavar=f.name.upper())
        if f.metadata.get("choices"):
            kwargs["choices"] = f.metadata["choices"]
    return kwargs


def add_config_arguments(parser: argparse.ArgumentParser, config_cls) -> None:
    """One flag per leaf field of every section (and a hidden one per renamed key); unset flags stay absent. A
    stage's flags come in a group per section, after --config; a command's (CommandConfig) are those it takes."""
    command = issubclass(config_cls, CommandConfig)
    if not command:
        parser.add_argument(
            "--config",
            default=None,
            help="YAML file with any of the options below; flags given on the command line win.",
        )
    defaults = _section_defaults(config_cls)
    flags = flag_fields(config_cls)
    taken = set()
    for section, section_cls in _sections(config_cls):
        doc = (section_cls.__doc__ or "").strip().splitlines()
        group = parser if command else parser.add_argument_group(section, doc[0] if doc else None)
        for f, typ in _leaf_fields(section_cls):
            dotted = f"{section}.{f.name}"
            if command and not config_cls.takes(section, f.name):
                continue
            default = defaults[section][f.name]
            where = "" if command else f"YAML {dotted}; "
            help_text = f"{f.metadata.get('help', '')} ({where}default: {default!r})"
            names = [n for n in (flag_name(f), *f.metadata.get("aliases", ())) if flags[n] == dotted]
            kwargs = _argument_kwargs(f, typ, dotted, help_text)
            if command:
                names, kwargs = _command_argument(config_cls, f, dotted, kwargs)
            taken.update(names)
            group.add_argument(*names, **kwargs)
    old_flags = {
        "--" + old.split(".", 1)[1].replace("_", "-"): old for old in config_cls.RENAMED if not old.endswith(".*")
    }
    for flag, old in {**old_flags, **config_cls.OLD_FLAGS}.items():
        new = config_cls.RENAMED[old]
        new_section, new_field = new.split(".", 1)
        section_cls = dict(_sections(config_cls))[new_section]
        f, typ = next((f, t) for f, t in _leaf_fields(section_cls) if f.name == new_field)
        if flag not in taken:
            taken.add(flag)
            parser.add_argument(flag, **{**_argument_kwargs(f, typ, old, argparse.SUPPRESS), "help": argparse.SUPPRESS})


def _command_argument(config_cls, f, dotted: str, kwargs: dict) -> tuple[list[str], dict]:
    """A command's flag goes by its own name only (a stage's aliases are other projects' or older names); a
    positional argument by its field (argparse's dest), without a default; a required flag says so instead."""
    if not flag_name(f).startswith("-"):
        return [dotted], {**kwargs, "help": f.metadata.get("help", "")}
    if dotted in config_cls.REQUIRED:
        return [flag_name(f)], {**kwargs, "required": True, "help": f"{f.metadata.get('help', '')} (required)"}
    return [flag_name(f)], kwargs


def load_yaml(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"--config {path}: no such file")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of sections (model:, data:, ...), got {type(data).__name__}")
    return data


# Keys also read under a second name, without a warning: the chat template belongs to the model's tokenizer, and
# recipes write it beside the data (LLaMA-Factory's template, the data.chat_template_kwargs).
SAME_AS = {
    "data.chat_template": "model.chat_template",
    "data.chat_template_kwargs": "model.chat_template_kwargs",
    "rollout.chat_template_kwargs": "model.chat_template_kwargs",
}


def _renamed(config_cls, dotted: str) -> str | None:
    renamed = config_cls.RENAMED
    if dotted in renamed:
        return renamed[dotted]
    section, key = dotted.split(".", 1)
    wildcard = renamed.get(f"{section}.*")
    return f"{wildcard[:-2]}.{key}" if wildcard else None


def _mapping_fields(config_cls) -> set[str]:
    """Names of the options whose value is a mapping (a flat key with a mapping value is one of them, not a section)."""
    return {f.name for _, section_cls in _sections(config_cls) for f, typ in _leaf_fields(section_cls) if typ is dict}


FILE_ONLY_KEYS = ("plan",)  # what tether writes into a run's config.yaml beside the settings (read back: ignored)


def _flatten(config_cls, file_values: dict | None, source: str, written: dict | None = None) -> dict[str, Any]:
    """{section: {field: value}} -> {"section.field": value}, renamed keys mapped; unknown ones named, all at once.

    Top-level keys whose value is not a mapping are flat keys, as TRL and LLaMA-Factory users write a file
    (``max_steps: 100``, ``learning_rate: 1e-5``): a tether flag name, or another project's name for a setting,
    read through tether/compat/'s table (after the sections: a flat key wins)."""
    from tether.compat import problem_report, translate

    section_types = dict(_sections(config_cls))
    nested: dict[str, Any] = {}
    flat: dict[str, Any] = {}
    for section, entries in (file_values or {}).items():
        if section in FILE_ONLY_KEYS:
            continue
        mapping_option = section not in section_types and section in _mapping_fields(config_cls)
        if isinstance(entries, dict) and not mapping_option:
            for key, value in entries.items():
                nested[f"{section}.{key}"] = value
        else:
            flat[str(section)] = entries
    problems: list[str] = []
    out = _apply_renames(config_cls, nested, source, section_types, problems)
    if flat:
        out.update(translate(stage_name(config_cls), flat, flag_fields(config_cls), source, problems, written))
    if problems:
        raise ConfigError(problem_report(source, problems))
    return out


def _known(section_types: dict, dotted: str) -> bool:
    section, key = dotted.split(".", 1)
    return section in section_types and key in {f.name for f in dataclasses.fields(section_types[section])}


def _apply_renames(
    config_cls, values: dict[str, Any], source: str, section_types: dict, problems: list | None = None
) -> dict[str, Any]:
    """Renamed keys mapped to their new names (with a warning); unknown ones collected in ``problems`` (or, without
    it, raised at the first)."""
    out, origin = {}, {}  # dotted -> value, and the name it was given under
    for given, value in values.items():
        dotted = given
        if not _known(section_types, dotted) and _known(section_types, SAME_AS.get(dotted, ".")):
            dotted = SAME_AS[dotted]
        if not _known(section_types, dotted):
            new = _renamed(config_cls, dotted)
            if new is None or not _known(section_types, new):
                section = dotted.split(".", 1)[0]
                if section not in section_types and new is None:
                    problem = f"unknown section {section!r}; sections are {sorted(section_types)}"
                else:
                    section = (new or dotted).split(".", 1)[0]
                    fields = sorted(f.name for f in dataclasses.fields(section_types[section]))
                    problem = f"unknown field {dotted}; {section} has {fields}"
                if problems is None:
                    raise ConfigError(f"{source}: {problem}")
                problems.append(problem)
                continue
            log.warning("%s: %s is now called %s; the old name still works but will be removed", source, dotted, new)
            dotted = new
        if dotted in out and out[dotted] != value:  # two names of one setting (an alias, an old name) disagree
            problem = f"{origin[dotted]}={out[dotted]!r} and {given}={value!r} are one setting ({dotted}): give one"
            if problems is None:
                raise ConfigError(f"{source}: {problem}")
            problems.append(problem)
        out[dotted], origin[dotted] = value, given
    return out


def build_config(
    config_cls,
    file_values: dict | None = None,
    overrides: dict | None = None,
    source: str = "config",
    base: dict | None = None,
):
    """Defaults, then ``base`` (a config object's {section: {field: value}}, tether.grpo(cfg, ...)), then
    ``file_values`` ({section: {field: value}} or flat keys), then ``overrides`` ({"section.field": value}). The
    preset sits just below the highest of those that names it (``PRESET_KEY``): a recipe named by a flag or a keyword
    is applied over a file's or a config object's values, and under the flags and keywords beside it. Every value is
    type-checked and every section validated, naming the field."""
    section_types = dict(_sections(config_cls))
    written: dict[str, str] = {}  # dotted key -> the flat key the file wrote (its own name, or TRL's)
    from_file = _flatten(config_cls, file_values, source, written)
    explicit = _apply_renames(config_cls, dict(overrides or {}), source, section_types)
    layers = [_flatten(config_cls, base, source), from_file, explicit]
    user = {k: v for layer in layers for k, v in layer.items()}
    named = {dotted: key for dotted, key in written.items() if dotted in from_file and dotted not in (overrides or {})}
    values = _section_defaults(config_cls)
    at = max([i for i, layer in enumerate(layers) if config_cls.PRESET_KEY in layer], default=0)
    for layer in [*layers[:at], config_cls.preset(user), *layers[at:]]:
        for dotted, value in layer.items():
            section, key = dotted.split(".", 1)
            values[section][key] = value
    sections = {}
    for section, section_cls in section_types.items():
        hints = {f.name: typ for f, typ in _leaf_fields(section_cls)}
        entries = {k: _coerce(v, hints[k], _named(f"{section}.{k}", named), source) for k, v in values[section].items()}
        try:
            sections[section] = section_cls(**entries)
        except ConfigError as err:
            raise ConfigError(f"{source}: {section} section: {err}") from None
    try:
        return config_cls(**sections)
    except ConfigError as err:
        raise ConfigError(f"{source}: {err}") from None


def _named(dotted: str, written: dict[str, str]) -> str:
    """A field as an error names it: the key the file wrote (``cutoff_len``), with tether's own where they differ."""
    key = written.get(dotted, dotted)
    return dotted if key == dotted else f"{key} (tether's {dotted})"


def _coerce(value, typ, name, source):
    """``value`` as a ``typ``, checked rather than converted where converting would change it (2.5 is no int, true
    no number, NaN no bound); a ConfigError naming the field otherwise. No field is optional: null is refused."""
    if value is None:
        raise ConfigError(f"{source}: {name} must be {getattr(typ, '__name__', typ)}, got null")
    try:
        if typ is bool:
            if isinstance(value, bool):
                return value
            raise TypeError
        if _is_list(typ):
            return _parse_list(value) if isinstance(value, str) else [str(v) for v in value]
        if typ is tuple:
            return (value,) if isinstance(value, str) else tuple(str(v) for v in value)
        if typ is dict:
            if isinstance(value, str):
                return _parse_mapping(value)
            if not isinstance(value, dict):
                raise TypeError
            return {str(k): v for k, v in value.items()}
        if typ is str:
            if isinstance(value, (dict, list, tuple)):  # its repr would be read as a path or a NAME=SOURCE list
                raise TypeError
            return str(value)
        return _number(value, typ)
    except (TypeError, ValueError):
        kind = "a finite float" if typ is float else getattr(typ, "__name__", typ)
        raise ConfigError(f"{source}: {name} must be {kind}, got {value!r}") from None


def _number(value, typ):
    """An int or float field's value: a bool is no number (YAML's true would be 1), an int takes only whole numbers
    (2.5 would be cut to 2), and a float must be finite (NaN passes every range check)."""
    import math

    if isinstance(value, bool):
        raise TypeError
    number = typ(value)
    if typ is float and not math.isfinite(number):
        raise ValueError
    if typ is int and isinstance(value, float) and number != value:
        raise ValueError
    return number


def config_from_args(config_cls, args: argparse.Namespace):
    """The config of a command line: defaults < --config YAML < other projects' flags (``--learning_rate``, read as
    a flat YAML key would be) < tether's own flags."""
    config_file = getattr(args, "config", None)  # a tool command (CommandConfig) has no --config
    file_values = load_yaml(config_file) if config_file else {}
    file_values = {**file_values, **getattr(args, "foreign_flags", {})}
    overrides = {k: v for k, v in vars(args).items() if "." in k}
    return build_config(config_cls, file_values, overrides, source=config_file or "command line")


def config_to_dict(config) -> dict:
    return dataclasses.asdict(config)


def config_diff(old: dict, new: dict) -> list[str]:
    """Dotted names of leaf fields that differ between two config dicts."""
    diffs = []
    for section in sorted(set(old) | set(new)):
        a, b = old.get(section, {}), new.get(section, {})
        for key in sorted(set(a) | set(b)):
            if a.get(key) != b.get(key):
                diffs.append(f"{section}.{key}: {a.get(key)!r} -> {b.get(key)!r}")
    return diffs
