"""Config machinery: frozen dataclasses, YAML files, command-line overrides.

Each option is declared once with ``option(...)``; its help text is both the
``--help`` and the documentation. Precedence: defaults < ``--config`` YAML <
command-line flags. The stage-specific sections live next to their stages.
"""
from __future__ import annotations

import argparse
import dataclasses
import typing
from pathlib import Path
from typing import Any

import yaml


class ConfigError(ValueError):
    """A setting is wrong; the message says which and how to fix it."""


def option(default: Any, help: str, *, flag: str | None = None, choices: tuple | None = None):
    """A documented config field. ``flag`` overrides the command-line name (default: --field-name)."""
    meta = {"help": help, "flag": flag, "choices": choices}
    if isinstance(default, list):
        return dataclasses.field(default_factory=lambda d=tuple(default): list(d), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def _leaf_fields(section_cls):
    hints = typing.get_type_hints(section_cls)
    for f in dataclasses.fields(section_cls):
        yield f, hints[f.name]


def _sections(config_cls):
    hints = typing.get_type_hints(config_cls)
    for f in dataclasses.fields(config_cls):
        yield f.name, hints[f.name]


def flag_name(f: dataclasses.Field) -> str:
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


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


class _AppendListAction(argparse.Action):
    """A list flag may be given several times (``--reward a --reward b``) or once with commas; the items add up."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, list(getattr(namespace, self.dest, None) or []) + list(values))


def add_config_arguments(parser: argparse.ArgumentParser, config_cls) -> None:
    """One flag per leaf field of every section; unset flags stay absent from the namespace."""
    parser.add_argument("--config", default=None, help="YAML file with any of the options below; flags given on the command line win.")
    for section, section_cls in _sections(config_cls):
        group = parser.add_argument_group(section, (section_cls.__doc__ or "").strip().splitlines()[0] if section_cls.__doc__ else None)
        for f, typ in _leaf_fields(section_cls):
            dest = f"{section}.{f.name}"
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            help_text = f"{f.metadata.get('help', '')} (default: {default!r})"
            kwargs: dict[str, Any] = dict(dest=dest, default=argparse.SUPPRESS, help=help_text)
            if typ is not bool:
                kwargs["metavar"] = f.name.upper()
            if typ is bool:
                kwargs["action"] = argparse.BooleanOptionalAction
            elif typ in (list, list[str], typing.List[str]):
                kwargs["type"] = _parse_list
                kwargs["action"] = _AppendListAction
                kwargs["metavar"] = "A,B"
            else:
                kwargs["type"] = typ
                if f.metadata.get("choices"):
                    kwargs["choices"] = f.metadata["choices"]
            group.add_argument(flag_name(f), **kwargs)


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


def build_config(config_cls, file_values: dict | None = None, overrides: dict | None = None, source: str = "config"):
    """Defaults, then ``file_values`` ({section: {field: value}}), then ``overrides`` ({"section.field": value})."""
    values: dict[str, dict] = {name: {} for name, _ in _sections(config_cls)}
    section_types = dict(_sections(config_cls))
    for section, entries in (file_values or {}).items():
        if section not in section_types:
            raise ConfigError(f"{source}: unknown section {section!r}; sections are {sorted(section_types)}")
        if not isinstance(entries, dict):
            raise ConfigError(f"{source}: section {section!r} must be a mapping, got {type(entries).__name__}")
        known = {f.name for f in dataclasses.fields(section_types[section])}
        for key, value in entries.items():
            if key not in known:
                raise ConfigError(f"{source}: unknown field {section}.{key}; {section} has {sorted(known)}")
            values[section][key] = value
    for dotted, value in (overrides or {}).items():
        section, key = dotted.split(".", 1)
        values[section][key] = value
    sections = {}
    for section, section_cls in section_types.items():
        hints = {f.name: typ for f, typ in _leaf_fields(section_cls)}
        for key, value in values[section].items():
            values[section][key] = _coerce(value, hints[key], f"{section}.{key}", source)
        sections[section] = section_cls(**values[section])
    return config_cls(**sections)


def _coerce(value, typ, name, source):
    if value is None:
        return value
    try:
        if typ is bool:
            if isinstance(value, bool):
                return value
            raise TypeError
        if typ in (list, list[str], typing.List[str]):
            return _parse_list(value) if isinstance(value, str) else [str(v) for v in value]
        if typ is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if typ is int and isinstance(value, int) and not isinstance(value, bool):
            return value
        if typ is str:
            return str(value)
        return typ(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{source}: {name} must be {getattr(typ, '__name__', typ)}, got {value!r}") from None


def config_from_args(config_cls, args: argparse.Namespace):
    file_values = load_yaml(args.config) if getattr(args, "config", None) else {}
    overrides = {k: v for k, v in vars(args).items() if "." in k}
    return build_config(config_cls, file_values, overrides, source=args.config or "command line")


def config_to_dict(config) -> dict:
    return dataclasses.asdict(config)


def save_config(config, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(config_to_dict(config), sort_keys=False))


def config_diff(old: dict, new: dict) -> list[str]:
    """Dotted names of leaf fields that differ between two config dicts."""
    diffs = []
    for section in sorted(set(old) | set(new)):
        a, b = old.get(section, {}), new.get(section, {})
        for key in sorted(set(a) | set(b)):
            if a.get(key) != b.get(key):
                diffs.append(f"{section}.{key}: {a.get(key)!r} -> {b.get(key)!r}")
    return diffs


def choice(value: str, allowed: tuple, name: str) -> None:
    if value not in allowed:
        raise ConfigError(f"{name}={value!r} is not one of {', '.join(allowed)}")
