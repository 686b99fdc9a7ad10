"""Finding a key's entry for a stage, and the one numeric reading every derivation shares."""

from __future__ import annotations

import math
import os

from tether.compat.table import INDEX, Foreign
from tether.errors import ConfigError


def knows(key: str) -> bool:
    return key in INDEX


def _entry(stage: str, key: str, flags: dict) -> Foreign | None:
    """The entry for ``key`` in this stage: the first that names this stage among its stages, else the first for
    every stage (whose target, when it has one per stage, this stage has)."""
    entries = INDEX.get(key, ())
    for entry in [e for e in entries if stage in e.stages] + [e for e in entries if not e.stages]:
        if isinstance(entry.to, dict) and stage not in entry.to:
            continue
        return entry
    return None


def _target(entry: Foreign, stage: str) -> str:
    return entry.to.get(stage, "") if isinstance(entry.to, dict) else entry.to


def _world() -> int:
    return max(1, int(os.environ.get("WORLD_SIZE", "1") or 1))


def _number(values: dict, key: str, default):
    value = values.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ConfigError(f"{key} must be a number, got {value!r}")
    try:
        number = float(value)
    except ValueError:
        raise ConfigError(f"{key} must be a number, got {value!r}") from None
    if number != int(number) or number < 1:
        raise ConfigError(f"{key} must be a whole number >= 1, got {value!r}")
    return int(number)


def _finite(value, key: str) -> float:
    """A number of another project's list (reward_weights, loss_weights), or a ConfigError naming the key."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{key}: {value!r} is not a number") from None
    if isinstance(value, bool) or not math.isfinite(number):
        raise ConfigError(f"{key}: {value!r} is not a finite number")
    return number


def _reward_spec(name: str) -> str:
    """TRL names a reward function by its dotted path (``my_rewards.accuracy``); tether by module:function."""
    name = str(name)
    if ":" in name or "." not in name:
        return name
    module, _, function = name.rpartition(".")
    return f"{module}:{function}"


def _also(note: str) -> str:
    return f"; {note}" if note else ""


def problem_report(source: str, problems: list[str]) -> str:
    if len(problems) == 1:
        return f"{source}: {problems[0]}"
    return f"{source}: {len(problems)} key(s) cannot be read:\n  " + "\n  ".join(problems)
