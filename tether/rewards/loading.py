"""Finding a reward function (or an environment class) by its spec: ``package.module:function``,
``path/to/file.py:function``, ``function(k=v)`` arguments, and ``python:<name>`` for objects handed to the Python
API in this process; and ``TrainerState``, the run's progress as a function sees it. Loading only: calling the
functions (weights, timeouts, the worker process) is tether/rewards/functions.py, which the worker process needs
none of."""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import inspect
import re
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tether.config import ConfigError

PYTHON_OBJECTS: dict[str, Callable] = {}  # python:<name> -> a function or class handed over through the Python API


@dataclass
class TrainerState:
    """The run's progress as a reward function sees it (``trainer_state``; the attribute names are TRL's)."""

    global_step: int = 0  # optimizer steps done before this batch was sampled
    max_steps: int = 0  # the run's total optimizer steps


def register_python_object(obj: Callable, name: str | None = None) -> str:
    """The ``python:<name>`` spec under which ``obj`` (a reward function or an environment class) is found in this
    process; the name is the object's own, with a suffix if another object holds it."""
    base = name or getattr(obj, "__name__", None) or type(obj).__name__
    key, n = base, 1
    while key in PYTHON_OBJECTS and PYTHON_OBJECTS[key] is not obj:
        n += 1
        key = f"{base}_{n}"
    PYTHON_OBJECTS[key] = obj
    return f"python:{key}"


def _spec_arguments(spec: str, text: str, flag: str = "--reward") -> dict:
    usage = f"{flag} {spec!r}: arguments must be name=literal, e.g. (target=40,scale=0.01)"
    try:
        call = ast.parse(f"f({text})", mode="eval").body
    except SyntaxError as err:
        raise ConfigError(usage) from err
    if call.args or any(kw.arg is None for kw in call.keywords):  # a positional value or **: no name to bind it to
        raise ConfigError(f"{usage}; every argument needs its name")
    try:
        return {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords}
    except ValueError as err:  # not a literal
        raise ConfigError(usage) from err


def _where_raised(err: BaseException, path: Path | None) -> str:
    """ "file.py:LINE" of the line of ``path`` (None: of the user's module, any file but Python's import machinery
    and this one) where an exception raised while a module was imported; "" (None) or the path if no such line."""
    frames = [
        f
        for f in traceback.extract_tb(err.__traceback__)
        if not f.filename.startswith("<")
        and Path(f.filename).resolve() != Path(__file__).resolve()
        and Path(f.filename).parent.name != "importlib"
    ]
    if path is not None:
        frames = [f for f in frames if Path(f.filename).resolve() == path.resolve()]
        return f"{path}:{frames[-1].lineno}" if frames else str(path)
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else ""


def load_reward_function(target: str, flag: str = "--reward") -> Callable:
    """``package.module:function`` (importable) or ``path/to/file.py:function``, optionally ``function(k=v,...)``;
    errors name ``flag``, the option that gave the spec."""
    if target.startswith("python:"):
        obj = PYTHON_OBJECTS.get(target[len("python:") :])
        if obj is None:
            raise ConfigError(
                f"{flag} {target!r}: this object was handed to tether's Python API in another process; "
                "resume the run from Python with the same objects (reward_funcs=..., env=...), or name "
                "an importable module:function instead"
            )
        return obj
    arguments = {}
    called = re.fullmatch(r"(.*?)\((.*)\)", target)
    if called:
        target, arguments = called.group(1), _spec_arguments(target, called.group(2), flag)
    if ":" not in target:
        raise ConfigError(f"{flag} {target!r}: expected module:function or path/file.py:function")
    module_name, _, attr = target.rpartition(":")
    if not attr.isidentifier():  # an unclosed argument list, a stray bracket
        raise ConfigError(
            f"{flag} {target!r}: a malformed spec; the form is module:function or path/file.py:function, with "
            "arguments function(name=literal, ...)"
        )
    if module_name.endswith(".py"):
        path = Path(module_name)
        if not path.is_file():
            raise ConfigError(f"{flag} {target!r}: no file {path}")
        spec = importlib.util.spec_from_file_location(f"tether_reward_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        try:
            spec.loader.exec_module(module)
        except SyntaxError as err:
            raise ConfigError(f"{flag} {target!r}: {path}:{err.lineno}: {err.msg}") from None
        except Exception as err:  # noqa: BLE001 - whatever the user's module raises while it is imported
            raise ConfigError(
                f"{flag} {target!r}: {_where_raised(err, path)}: importing it raised {type(err).__name__}: {err}"
            ) from None
    else:
        try:
            module = importlib.import_module(module_name)
        except SyntaxError as err:
            raise ConfigError(f"{flag} {target!r}: {err.filename}:{err.lineno}: {err.msg}") from None
        except Exception as err:  # noqa: BLE001 - ImportError, or whatever the module raises while it is imported
            where = _where_raised(err, None)
            where = f" ({where})" if where else ""
            raise ConfigError(
                f"{flag} {target!r}: cannot import {module_name}{where}: {type(err).__name__}: {err}"
            ) from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ConfigError(f"{flag} {target!r}: {module_name} has no function {attr!r}")
    if arguments:
        declared = [
            q.name
            for q in inspect.signature(fn).parameters.values()
            if q.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        ]
        unknown = sorted(set(arguments) - set(declared))
        if unknown:  # a **kwargs catch-all would swallow a misspelt argument silently
            raise ConfigError(f"{flag} {target!r}: {attr} has no parameter {unknown}; it takes {declared}")
        bound = functools.partial(fn, **arguments)
        functools.update_wrapper(bound, fn)
        return bound
    return fn
