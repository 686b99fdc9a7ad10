"""The environment protocol (docs/agents.md) and how tether calls it: loaded by spec like reward functions, every
call under a time limit, with the reward functions' fault rules.

An environment is a Python class; tether makes one instance per episode, with the spec's keyword arguments:

    reset(row) -> list[dict]           the episode's opening messages, from its prompt-file row (default: the
                                       row's prompt, a string becoming one user message)
    step(text) -> StepResult           the policy's turn (its text, special tokens removed) -> the messages the
                                       environment answers with (role "tool" or "user"), reward parts earned by
                                       this turn, whether the episode is over, and info (its numbers are logged
                                       as env/<name>). A step(text, calls) also gets the turn's tool calls, parsed
                                       in the model family's format (formats.py)
    outcome() -> Outcome               called once when the episode ends (done, out of turns or out of tokens):
                                       reward parts from the environment's own final state, and whether the task
                                       is really done ("success", checked on the state, never on the model's word)
                                       and whether the policy said it was ("claimed")

Any of them may be ``async def`` (awaited). The calls of one turn across the batch run concurrently, at most
``env_concurrency`` at a time, each on its own instance (an environment sharing state between instances must lock
it, or run with env_concurrency=1). Every coroutine of the environment runs on one event loop for the run
(``EventLoop``), so a client opened in ``reset`` is still usable in ``step`` and ``outcome``.

A call that raises, or runs past ``env_timeout`` seconds (it is abandoned in its daemon thread), is a fault:
``env_on_error=raise`` stops the run (the online loop checkpoints the steps done and names the environment and the
prompt); ``score`` ends that episode, scores it ``env_error_score`` and counts it in ``reward/env/errors``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import threading
from dataclasses import dataclass, field
from typing import Callable, Protocol

from tether.config import ConfigError
from tether.rewards.functions import RewardFunctionError, call_in_daemon_thread
from tether.rewards.loading import load_reward_function


@dataclass
class StepResult:
    """What the environment answers one policy turn with."""

    messages: list[dict] = field(default_factory=list)  # chat messages shown to the policy next (tool results...)
    rewards: dict[str, float] = field(default_factory=dict)  # reward parts earned by this turn (process rewards)
    done: bool = False  # the episode is over (the environment says so)
    info: dict = field(default_factory=dict)  # tool calls made ("calls": [{"name", "ok"}]), anything to log


@dataclass
class Outcome:
    """The environment's verdict on a finished episode, from its own state."""

    rewards: dict[str, float] = field(default_factory=dict)  # outcome reward parts
    success: bool | None = None  # the task is done, checked on the environment's state (None: no notion of it)
    claimed: bool | None = None  # the policy's final message says the task is done (None: not measured)


class Environment(Protocol):
    def reset(self, row: dict) -> list[dict]: ...

    def step(self, text: str) -> StepResult: ...

    def outcome(self) -> Outcome: ...


class EnvironmentFault(RewardFunctionError):
    """An environment raised, timed out or answered with something unusable; the message names it and the prompt.
    A RewardFunctionError, so the online loop's checkpoint-and-stop applies to it unchanged."""

    is_environment = True


PROTOCOL = ("reset", "step", "outcome")


def load_environment(spec: str) -> Callable[[], Environment]:
    """``module:Class`` or ``path/file.py:Class``, optionally ``Class(k=v,...)``: a factory of fresh instances. A
    class is checked for the protocol's methods here; what another callable makes, at its first instance."""
    try:
        factory = load_reward_function(spec)
    except ConfigError as err:
        raise ConfigError(str(err).replace("--reward", "--env").replace("function", "class")) from None
    made = getattr(factory, "func", factory)  # a spec with arguments is a functools.partial
    if isinstance(made, type):
        check_protocol(made, spec)
    return factory


def check_protocol(env, spec: str) -> None:
    """A ConfigError naming the methods of the protocol that ``env`` (a class or an instance) lacks."""
    missing = [m for m in PROTOCOL if not callable(getattr(env, m, None))]
    if missing:
        what = env.__name__ if isinstance(env, type) else f"what it makes ({type(env).__name__})"
        raise ConfigError(
            f"--env {spec}: {what} has no {' and no '.join(f'{m}()' for m in missing)} method; an environment "
            "defines reset(row) -> messages, step(text) -> StepResult and outcome() -> Outcome (docs/agents.md, "
            '"The protocol")'
        )


def environment_name(spec: str) -> str:
    return spec.split("(")[0].rpartition(":")[2] or spec


class OutOfTime(TimeoutError):
    """A coroutine of the environment ran past env_timeout (and was cancelled)."""


class EventLoop:
    """The one asyncio event loop of a run's environment, running in its own daemon thread (started on the first
    ``async def`` call): every coroutine of the environment — ``reset``, ``step``, ``outcome``, ToolEnvironment's
    async tools, of every instance, from every worker thread — runs on it. A client opened in one call (an HTTP
    session, an MCP connection: both belong to the loop they were opened on) is usable in the next, and coroutines
    of one turn across the batch run concurrently on it."""

    def __init__(self, name: str):
        self.name, self.loop, self.thread = name, None, None
        self.lock = threading.Lock()

    def complete(self, value, timeout: float | None = None):
        """``value``, or, for a coroutine, its result once it has run on the loop; a coroutine still running after
        ``timeout`` seconds is cancelled (TimeoutError)."""
        if not inspect.isawaitable(value):
            return value
        if self.thread is threading.current_thread():  # blocking here would stop the loop it waits on
            raise RuntimeError(
                f"environment {self.name}: an async def method called plain code that runs a coroutine (an async "
                "tool) to its end; await the coroutine, or make the method a plain def"
            )

        async def wait():
            return await value

        future = asyncio.run_coroutine_threadsafe(wait(), self.started())
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise OutOfTime(f"no result within {timeout:g} s") from None

    def started(self) -> asyncio.AbstractEventLoop:
        with self.lock:
            if self.loop is None:
                self.loop = asyncio.new_event_loop()
                self.thread = threading.Thread(target=self.run, name=f"env-{self.name}-loop", daemon=True)
                self.thread.start()
            return self.loop

    def run(self) -> None:
        CURRENT.loop = self
        self.loop.run_forever()

    def close(self) -> None:
        """Stop the loop (the run is over); a later async call starts a new one."""
        with self.lock:
            loop, thread, self.loop, self.thread = self.loop, self.thread, None, None
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(5.0)
            if not thread.is_alive():
                loop.close()


CURRENT = threading.local()  # .loop: the EventLoop of the environment whose method this thread is running


def await_if_needed(value):
    """The value of a call that may be a coroutine (an ``async def`` tool or environment method): run on the event
    loop of the environment being called (GuardedCall sets it), or, called outside a run (a test of a tool
    environment on its own), on a fresh loop."""
    loop = getattr(CURRENT, "loop", None)
    if loop is not None:
        return loop.complete(value)
    if not inspect.isawaitable(value):
        return value

    async def wait():
        return await value

    return asyncio.run(wait())


class GuardedCall:
    """Calls an environment's methods under the time limit, coroutines on the environment's one event loop, and
    turns every failure into an EnvironmentFault that names the environment, the method and the prompt."""

    def __init__(self, name: str, timeout: float):
        self.name, self.timeout = name, timeout
        self.loop = EventLoop(name)

    def __call__(self, what: str, fn: Callable, *args, prompt=None, **kwargs):
        if self.timeout:
            finished, value = call_in_daemon_thread(
                lambda: self.in_loop(fn, args, kwargs), self.timeout, f"env-{self.name}-{what}"
            )
            if not finished or isinstance(value, OutOfTime):
                raise EnvironmentFault(
                    f"environment {self.name}.{what} gave no result within {self.timeout:g} s "
                    f"(env_timeout; prompt: {str(prompt)[:80]!r})"
                )
        else:
            try:
                value = self.in_loop(fn, args, kwargs)
            except Exception as err:  # noqa: BLE001 - a user's environment; reported with its name below
                value = err
        if isinstance(value, BaseException):
            raise EnvironmentFault(
                f"environment {self.name}.{what} raised {type(value).__name__}: {value} (prompt: {str(prompt)[:80]!r})"
            ) from value
        return value

    def in_loop(self, fn: Callable, args: tuple, kwargs: dict):
        """fn(*args, **kwargs) in this thread with the environment's loop as the current one (its async tools run
        there too), awaited there if it is a coroutine."""
        previous, CURRENT.loop = getattr(CURRENT, "loop", None), self.loop
        try:
            return self.loop.complete(fn(*args, **kwargs), self.timeout or None)
        finally:
            CURRENT.loop = previous

    def close(self) -> None:
        self.loop.close()


def check_messages(value, name: str, what: str) -> list[dict]:
    """A list of {"role", "content"} messages, or an EnvironmentFault naming the message and the field at fault (a
    message without its content would render as an empty turn the policy then answers)."""
    if not isinstance(value, list):
        raise EnvironmentFault(
            f"environment {name}.{what} must give a list of {{'role': str, 'content': str}} messages, not "
            f"{str(value)[:120]!r}"
        )
    for i, m in enumerate(value):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise EnvironmentFault(
                f"environment {name}.{what}: message {i} must be a dict with a 'role' string, not {str(m)[:120]!r}"
            )
        if not isinstance(m.get("content"), str):
            got = f"not {str(m['content'])[:120]!r}" if "content" in m else "and has none"
            raise EnvironmentFault(
                f"environment {name}.{what}: message {i} ({m['role']}) must have a 'content' string, {got}"
            )
    return value


def check_info(value, name: str) -> dict:
    """A step's info: a dict (None: empty) whose "calls", if any, is a list of dicts (each with "name" and "ok"),
    or an EnvironmentFault naming the field."""
    info = {} if value is None else value
    if not isinstance(info, dict):
        raise EnvironmentFault(f"environment {name}.step: info must be a dict, not {type(value).__name__}")
    calls = info.get("calls", [])
    if not isinstance(calls, list) or not all(isinstance(c, dict) for c in calls):
        raise EnvironmentFault(
            f"environment {name}.step: info['calls'] must be a list of {{'name': str, 'ok': bool}} dicts, not "
            f"{str(calls)[:120]!r}"
        )
    return info


def check_parts(value, name: str, what: str) -> dict[str, float]:
    import math

    if not isinstance(value, dict):
        raise EnvironmentFault(
            f"environment {name}.{what}: rewards must be a dict of name -> number, not {type(value).__name__}"
        )
    out = {}
    for k, v in value.items():
        try:
            out[str(k)] = float(v)
        except (TypeError, ValueError):
            raise EnvironmentFault(f"environment {name}.{what}: reward {k!r} is {v!r}, not a number") from None
        if not math.isfinite(out[str(k)]):
            raise EnvironmentFault(f"environment {name}.{what}: reward {k!r} is {v!r} (not finite)")
    return out


def checked_schemas(schemas, name: str) -> list[dict]:
    """An environment's tool schemas, handed to the template's tools=, or an EnvironmentFault naming the
    environment, the tool and the field a template would misread (data/sft.py, schema_problem)."""
    from tether.data.sft import schema_problem

    for i, schema in enumerate(schemas if isinstance(schemas, list) else [schemas]):
        problem = schema_problem(schema)
        if problem:
            raise EnvironmentFault(f"environment {name}.schemas[{i}]: {problem}")
    return schemas
