"""Reward functions named on the command line as ``module:function[=weight]``.

A reward function is called once per batch with keyword arguments:

    prompts         list[str | list[dict]]  the prompt column as it is in the file (a string or chat messages)
    completions     list[str]               the sampled responses, special tokens removed
    completion_ids  list[list[int]]         their token ids, up to and including the stop token
    truncated       list[bool]              True where the response hit max_new_tokens without a stop token
    trainer_state   TrainerState            the run's progress: .global_step (steps done), .max_steps (as TRL's)
    <column>        list                    every other column of the prompt file, by name

It declares the arguments it wants (or ``**kwargs`` for all of them) and returns one float per completion,
or, for process rewards, one list of step scores per completion. ``None`` for a completion means "no opinion": it
adds 0 to that completion's score and is counted in ``reward/<name>/none`` (cumulative).

Functions written the TRL way run unchanged: for chat prompts TRL passes each completion as a message list
(``[{"role": "assistant", "content": text}]``). The dry call below tries the plain text first; a function that
fails on it with chat prompts and works on message lists gets message lists from then on (``RewardComponent.chat``). Its signature is checked against the
prompt file's columns, and it is called once on a few rows with empty completions, before any training:
a function must accept an empty completion (policies do produce them).

When a function raises, or runs past ``timeout`` seconds, ``on_error`` decides: ``raise`` stops the run with the
function's name and the batch's first prompt; ``score`` gives every completion of that call ``error_score``
and counts the call in ``reward/<name>/errors``. With a time limit, functions named by a spec run in a worker
process (tether/rewards/worker.py) that is killed with a call that outlives it; functions handed over as Python
objects run in a daemon thread, abandoned on a timeout. Model-written code belongs in ``tether.rewards.sandbox``.
``async def`` functions of one batch run concurrently in one event loop (a timeout cancels them).

Functions handed to the Python API as objects (``tether.grpo(reward_funcs=[fn])``) are registered under a
``python:<name>`` spec (``register_python_object``): the run's config.yaml names them, and a run resumed from
Python with the same objects finds them again.

Arguments for a function go in the spec: ``tether.rewards.builtin:length_penalty(target=40,scale=0.01)=0.5``
(Python literals, bound with functools.partial).
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import math
import re
from dataclasses import dataclass, field
from typing import Callable

from tether.config import ConfigError
from tether.data.images import IMAGES
from tether.data.multimodal import prompt_images
from tether.rewards.loading import TrainerState, load_reward_function
from tether.rewards.worker import images_to_json

BATCH_ARGUMENTS = ("prompts", "completions", "completion_ids", "truncated", "trainer_state")


class RewardFunctionError(RuntimeError):
    """A reward function raised or returned something unusable; the message names it and the sample."""


@dataclass
class RewardComponent:
    name: str  # how it is logged: reward/<name>/mean
    fn: Callable
    weight: float = 1.0
    errors: int = 0  # calls that raised and were scored as error_score
    spec: str = ""  # the module:function[(...)] it was loaded from; such a function runs in the worker process
    chat: bool = False  # completions of chat prompts passed as message lists (TRL's convention), found by the dry call
    nones: int = 0  # completions it returned None for ("no opinion"), scored 0
    flag: str = "--reward"  # the option that named it (`tether data prm-labels --check`): what its errors say

    @property
    def label(self) -> str:
        """How messages name it: "reward function NAME", or "--check function NAME"."""
        return f"reward function {self.name}" if self.flag == "--reward" else f"{self.flag} function {self.name}"

    def wanted(self) -> tuple[set[str], bool]:
        """(argument names it declares, whether it takes **kwargs)."""
        params = inspect.signature(self.fn).parameters.values()
        takes_all = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
        names = {
            p.name
            for p in params
            if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        }
        return names, takes_all

    def required(self) -> set[str]:
        return {
            p.name
            for p in inspect.signature(self.fn).parameters.values()
            if p.default is inspect.Parameter.empty
            and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        }


def parse_reward_specs(specs: list[str]) -> list[RewardComponent]:
    """``module:function`` or ``module:function=weight``; the component is named after the function."""
    components: list[RewardComponent] = []
    for spec in specs:
        target, weight = spec, 1.0
        if re.search(r"=[^()]*$", spec) and not spec.endswith(")"):  # a weight after the last ')'
            head, _, tail = spec.rpartition("=")
            try:
                target, weight = head, float(tail)
            except ValueError as err:
                raise ConfigError(f"--reward {spec!r}: the weight after '=' must be a number") from err
        fn = load_reward_function(target)
        name = target.rpartition(":")[2].split("(")[0]
        if any(c.name == name for c in components):
            name = target.replace("/", ".").replace(":", ".")
        # an object from the Python API cannot be re-imported by the worker process: it runs in a daemon thread
        components.append(RewardComponent(name, fn, weight, spec="" if target.startswith("python:") else target))
    return components


def _as_scores(value, n: int, label: str, first_prompt) -> list:
    if hasattr(value, "tolist") and not isinstance(value, list):  # a tensor or an array
        value = value.tolist()
    try:
        values = list(value)
    except TypeError:
        raise RewardFunctionError(
            f"{label} returned {type(value).__name__}, expected a list of "
            f"{n} floats (first prompt: {str(first_prompt)[:80]!r})"
        ) from None
    if len(values) != n:
        raise RewardFunctionError(
            f"{label} returned {len(values)} values for {n} completions (first prompt: {str(first_prompt)[:80]!r})"
        )
    out = []
    for i, v in enumerate(values):
        if v is None:  # no opinion on this completion (TRL's convention): scored 0 and counted
            out.append(None)
            continue
        items = v if isinstance(v, (list, tuple)) else [v]
        if any(isinstance(x, (str, bytes)) for x in items):  # float() would read "0.9": text is not a score
            raise RewardFunctionError(f"{label}: value {i} is {v!r}, not a number or a list of step scores")
        try:
            numbers = [float(x) for x in items]
        except (TypeError, ValueError):
            raise RewardFunctionError(f"{label}: value {i} is {v!r}, not a number or a list of step scores") from None
        if not all(math.isfinite(x) for x in numbers):
            raise RewardFunctionError(f"{label}: value {i} is {v!r} (not finite) for completion {i} of the batch")
        out.append(numbers if isinstance(v, (list, tuple)) else numbers[0])
    kinds = {isinstance(x, list) for x in out if x is not None}
    if len(kinds) > 1:  # a process reward gives every completion its step scores (None: no opinion), never one score
        raise RewardFunctionError(
            f"{label} returned a score for some completions and a list of step scores for others; return one kind "
            f"(first prompt: {str(first_prompt)[:80]!r})"
        )
    return out


@dataclass
class RewardSet:
    """Weighted sum of reward components; keeps each component's values for logging."""

    components: list[RewardComponent]
    on_error: str = "raise"  # raise | score
    error_score: float = 0.0
    columns: list[str] = field(default_factory=list)
    timeout: float = 0.0  # seconds per call; 0 = none (and no worker process)
    worker: object = field(default=None, repr=False)  # the RewardWorker of spec-loaded functions, started on first use
    trainer_state: TrainerState = field(default_factory=TrainerState)  # moved on by the online loop before each step
    given: tuple = BATCH_ARGUMENTS  # the batch arguments a function may take (prm-labels' --check: fewer)
    # a vision-language model's rows: row -> its prompt's images (PIL, RGB), given as ``images`` (TRL's keyword)
    images_of: Callable | None = field(default=None, repr=False)

    @property
    def what(self) -> str:
        """How messages name the set: "the reward functions", or the option that named them ("--check")."""
        flags = {c.flag for c in self.components}
        return "the reward functions" if flags <= {"--reward"} else ", ".join(sorted(flags))

    def check(self, rows: list[dict]) -> None:
        """Before training: every declared argument exists, and a dry call on a few rows returns one score each."""
        available = set(self.given) | set(self.columns) | ({IMAGES} if self.images_of is not None else set())
        for c in self.components:
            names, _ = c.wanted()
            missing = sorted(c.required() - available)
            if missing:
                raise ConfigError(
                    f"{c.label} needs {missing}, but the prompt file has columns "
                    f"{sorted(self.columns)} (and tether passes {list(self.given)})"
                )
        sample = rows[:2]
        chat_prompts = any(isinstance(r.get("prompt"), list) for r in sample)
        while True:
            try:
                values = self.score(
                    sample, [""] * len(sample), [[] for _ in sample], [False] * len(sample), on_error="raise"
                )
                if all(v is None for scores in values.values() for v in scores):
                    raise ConfigError(
                        f"dry run of {self.what} on the first rows with empty completions: "
                        f"{', '.join(values)} returned None ('no opinion') for every completion, so "
                        "training would see a score of 0 everywhere; return a number (0.0 for a wrong "
                        "or empty answer) and keep None for completions a function does not judge"
                    )
                return
            except RewardFunctionError as err:
                failed = next((c for c in self.components if f"{c.label} " in str(err)), None)
                if not chat_prompts or failed is None or failed.chat:
                    raise ConfigError(
                        f"dry run of {self.what} on the first rows with empty completions: {err}"
                        + (
                            " (with the completions as text and as message lists)"
                            if failed is not None and failed.chat
                            else ""
                        )
                    ) from err
                failed.chat = True  # written for TRL's chat convention: try message lists

    def score(
        self,
        rows: list[dict],
        completions: list[str],
        completion_ids: list[list[int]],
        truncated: list[bool],
        on_error: str | None = None,
    ) -> dict[str, list]:
        """{component name: one value per completion (a float, or a list of step scores)}."""
        policy = on_error or self.on_error
        batch = {
            "prompts": [r.get("prompt") for r in rows],
            "completions": completions,
            "completion_ids": completion_ids,
            "truncated": truncated,
            "trainer_state": self.trainer_state,
        }
        batch = {k: v for k, v in batch.items() if k in self.given}
        as_messages = [
            [{"role": "assistant", "content": text}] if isinstance(r.get("prompt"), list) else text
            for r, text in zip(rows, completions)
        ]
        if self.images_of is not None:  # the images themselves, not the file's references to them
            batch[IMAGES] = [self.images_of(r) for r in rows]
        for column in self.columns:
            if column != "prompt":
                batch.setdefault(column, [r.get(column) for r in rows])
        out: dict[str, list] = {}
        results = self._call_all({**batch, "chat_completions": as_messages})
        for c in self.components:
            try:
                value = results[c.name]
                if isinstance(value, BaseException):
                    raise value
                out[c.name] = _as_scores(value, len(completions), c.label, batch["prompts"][0] if rows else None)
            except Exception as err:  # noqa: BLE001 - a user's function; the policy says what to do
                if policy == "score":
                    c.errors += 1
                    out[c.name] = [self.error_score] * len(completions)
                    continue
                if isinstance(err, RewardFunctionError):
                    raise
                first = str(batch["prompts"][0])[:80] if rows else ""
                raise RewardFunctionError(
                    f"{c.label} raised {getattr(err, 'kind', type(err).__name__)}: {err} "
                    f"(batch of {len(completions)}, first prompt: {first!r})"
                ) from err
        return out

    def _call_all(self, batch: dict) -> dict:
        """{name: return value or the exception}; async functions concurrently, others one by one in a thread."""

        def kwargs_for(c):
            names, takes_all = c.wanted()
            given = {**batch, "completions": batch["chat_completions"]} if c.chat else batch
            given = {k: v for k, v in given.items() if k != "chat_completions"}
            return given if takes_all else {k: v for k, v in given.items() if k in names}

        timeout = self.timeout or None
        results: dict = {}
        async_components = [
            c
            for c in self.components
            if inspect.iscoroutinefunction(inspect.unwrap(c.fn))
            or inspect.iscoroutinefunction(getattr(c.fn, "func", None))
        ]
        if async_components:

            async def run_all():
                calls = [asyncio.wait_for(c.fn(**kwargs_for(c)), timeout) for c in async_components]
                return await asyncio.gather(*calls, return_exceptions=True)

            for c, value in zip(async_components, asyncio.run(run_all())):
                results[c.name] = _timeout_error(c, self.timeout) if isinstance(value, asyncio.TimeoutError) else value
        for c in self.components:
            if c.name in results:
                continue
            if c.spec and timeout:  # killable: the worker process dies with a call that outlives its limit
                kwargs = kwargs_for(c)
                if "trainer_state" in kwargs:  # travels as JSON; the worker rebuilds the TrainerState
                    kwargs["trainer_state"] = dataclasses.asdict(kwargs["trainer_state"])
                if IMAGES in kwargs:  # as PNG text; the worker rebuilds the images
                    kwargs[IMAGES] = images_to_json(kwargs[IMAGES])
                results[c.name] = self._worker().call(c.name, kwargs, timeout)
            else:
                results[c.name] = _call_in_daemon_thread(c, kwargs_for(c), timeout)
        return results

    def set_progress(self, global_step: int, max_steps: int) -> None:
        """What ``trainer_state`` says from now on (the online loop moves it on before each step)."""
        self.trainer_state.global_step, self.trainer_state.max_steps = global_step, max_steps

    def close(self) -> None:
        """Stop the worker process (the run is over)."""
        if self.worker is not None:
            self.worker.stop()
            self.worker = None

    def _worker(self):
        if self.worker is None:
            from tether.rewards.worker import RewardWorker

            self.worker = RewardWorker({c.name: c.spec for c in self.components if c.spec})
        return self.worker


def call_in_daemon_thread(call: Callable[[], object], timeout: float | None, name: str) -> tuple[bool, object]:
    """(finished, call()'s value or the exception it raised), running it in a daemon thread for at most ``timeout``
    seconds (None: no limit). A call that never returns is abandoned there (finished False) and does not keep the
    process from exiting: a thread cannot be killed; code that may hang for good belongs in tether.rewards.sandbox,
    which kills it. Reward functions and environments (tether/agents) are called through it."""
    import threading

    outcome: dict = {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as err:  # noqa: BLE001 - even SystemExit: it would only end this thread, unreported
            outcome["value"] = err

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    thread.join(timeout)
    return (False, None) if thread.is_alive() else (True, outcome["value"])


def _call_in_daemon_thread(component: RewardComponent, kwargs: dict, timeout: float | None):
    """The call's return value, its exception, or a TimeoutError after ``timeout`` seconds."""
    finished, value = call_in_daemon_thread(lambda: component.fn(**kwargs), timeout, f"reward-{component.name}")
    return value if finished else _timeout_error(component, timeout or 0.0)


def _timeout_error(component: RewardComponent, seconds: float) -> TimeoutError:
    return TimeoutError(f"no result within {seconds:g} s (reward timeout)")


def load_reward_set(options, rows: list[dict], max_steps: int = 0, max_image_pixels: int = 0) -> RewardSet | None:
    """The RewardSet named by a RewardFunctionOptions section, checked against the prompt rows before training (the
    dry call sees the trainer_state of step 0 of ``max_steps``). ``max_image_pixels`` > 0: the rows are a
    vision-language model's, and each function is given its prompt's images as ``images``."""
    if not options.reward:
        return None
    columns = sorted(set().union(*(row.keys() for row in rows[:8])))
    rewards = RewardSet(
        parse_reward_specs(options.reward),
        options.reward_on_error,
        options.reward_error_score,
        columns,
        options.reward_timeout,
        trainer_state=TrainerState(0, max_steps),
    )
    show_images(rewards, max_image_pixels)
    rewards.check(rows)  # arguments exist, one value per completion
    return rewards


def show_images(functions: RewardSet, max_image_pixels: int) -> None:
    """With ``max_image_pixels`` > 0 (a vision-language model's rows), each function is given its prompt's images
    (through the worker process too: as PNG text, rewards/worker.py)."""
    if max_image_pixels:
        functions.images_of = lambda row: prompt_images(row, "a prompt row", max_image_pixels)


def load_audit_set(options, rows: list[dict], max_steps: int = 0, max_image_pixels: int = 0) -> RewardSet | None:
    """The RewardSection's audit (--audit) as a RewardSet of one function, checked against the prompt rows like the
    reward functions; its failures always stop the run (a trusted check that fails is not a check)."""
    if not getattr(options, "audit", ""):
        return None
    components = parse_reward_specs([options.audit])
    for c in components:
        c.flag = "--audit"
        if c.weight != 1.0:
            raise ConfigError(f"--audit {options.audit}: the audit has no weight (it is logged, never trained on)")
    audit = RewardSet(
        components,
        "raise",
        0.0,
        sorted(set().union(*(row.keys() for row in rows[:8]))),
        options.reward_timeout,
        trainer_state=TrainerState(0, max_steps),
    )
    show_images(audit, max_image_pixels)  # the trusted check sees what the policy saw
    audit.check(rows)
    return audit
