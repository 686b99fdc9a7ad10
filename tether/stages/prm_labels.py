"""Step labels without annotators, as Math-Shepherd makes them (Wang et al. 2024, arXiv 2312.08935, §3.3;
docs/algorithms.md §2.4): from the prefix that ends at step k, a policy writes ``samples`` continuations; step k is
right (hard label) when any reaches the correct answer, and its soft label is the share that do.

`tether data prm-labels` runs it over a file of step-split solutions with a model folder as the policy and a
reward function as the answer check (``label_file``); ``step_labels`` is the pure part, taking any ``generate`` and
``check``. The check is guarded as a ``--reward`` function is (tether/rewards/functions.py RewardSet): its arguments
are checked against the file's columns and it is called once on empty completions before the model loads; one that
raises, or returns anything but one number (or None) per text, NaN included, stops the run naming the record's file
and line and ``--check``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable


@dataclass
class LabelCost:
    """What the labels cost: generated continuations, their tokens, seconds."""

    continuations: int = 0
    tokens: int = 0
    seconds: float = 0.0

    def line(self, rows: int, steps: int) -> str:
        return (
            f"{rows} solutions, {steps} steps: {self.continuations} continuations generated "
            f"({self.tokens} tokens) in {self.seconds:.1f} s"
        )


def step_labels(
    rows: list[dict],
    steps_of: Callable[[dict], list[str]],
    generate: Callable[[list[str]], list[tuple[str, int]]],
    check: Callable[[list[dict], list[str]], list[bool]],
    samples: int,
    separator: str = "\n",
    soft: bool = False,
) -> tuple[list[dict], LabelCost]:
    """Each row with ``labels`` (and ``label_scores``: the share of continuations that reached the answer).

    ``generate(contexts) -> [(continuation, its token count)]``, one per context (each context is repeated
    ``samples`` times by this function); ``check(rows, texts) -> [reached the answer]`` reads the whole solution
    text (the prefix's steps and the continuation) as a reward function would. A step whose prefix already fails
    is still sampled from: the label is about the prefix, not about the steps after it."""
    cost, out, start = LabelCost(), [], time.perf_counter()
    for row in rows:
        steps = steps_of(row)
        prefixes = [separator.join(steps[: k + 1]) + separator for k in range(len(steps))]
        contexts = [row["prompt"] + p for p in prefixes for _ in range(samples)]
        written = generate(contexts)
        cost.continuations += len(written)
        cost.tokens += sum(n for _, n in written)
        texts = [p + w for p, (w, _) in zip([p for p in prefixes for _ in range(samples)], written)]
        reached = check([row] * len(texts), texts)
        shares = [sum(reached[k * samples : (k + 1) * samples]) / samples for k in range(len(steps))]
        out.append({**row, "labels": shares if soft else [s > 0 for s in shares], "label_scores": shares})
    cost.seconds = time.perf_counter() - start
    return out, cost


CHECK_ARGUMENTS = ("prompts", "completions")  # what --check is given besides the file's own columns


def load_check(spec: str, rows: list[dict]):
    """--check as a RewardSet of one function (the reward functions' guard, messages naming --check): its arguments
    checked against the file's columns, and a dry call on the first rows, before any model loads."""
    from tether.rewards.functions import RewardComponent, RewardSet
    from tether.rewards.loading import load_reward_function

    name = spec.rpartition(":")[2].split("(")[0]
    component = RewardComponent(name, load_reward_function(spec, "--check"), flag="--check")
    columns = sorted(set().union(*(r.keys() for r in rows[:8])) - {"completions", "labels"})
    checks = RewardSet([component], columns=columns, given=CHECK_ARGUMENTS)
    checks.check(rows)
    return checks


def reached(checks, rows: list[dict], texts: list[str]) -> tuple[list[bool], int]:
    """([score > 0.5 for each text], how many texts the check had no opinion on: None, counted as not reached)."""
    from tether.rewards.functions import RewardFunctionError

    (component,) = checks.components
    values = checks.score(rows, texts, None, None)[component.name]
    lists = [i for i, v in enumerate(values) if isinstance(v, list)]
    if lists:
        raise RewardFunctionError(f"{component.label}: value {lists[0]} is a list; a check returns one number per text")
    return [v is not None and v > 0.5 for v in values], sum(v is None for v in values)


def label_file(args) -> str:
    """`tether data prm-labels`: label every solution of args.file, write args.output, and return the cost line.
    Errors name the record's file and line: a prompt that is not a string, a solution without steps, a failing
    --check."""
    import json
    from pathlib import Path

    from tether.config import ConfigError
    from tether.data.records import DataError, read_records
    from tether.data.steps import step_texts
    from tether.models.lm import load_model, load_tokenizer
    from tether.rewards.functions import RewardFunctionError
    from tether.rollout.texts import generate_texts

    if args.samples < 1:
        raise ConfigError(f"--samples {args.samples}: must be >= 1")
    records = read_records(args.file, args.columns)
    solutions = []  # (record, its steps)
    for rec in records:
        if not isinstance(rec.fields.get("prompt"), str):
            raise DataError(f"{rec.where}: field 'prompt' must be a string (the text continuations follow)")
        solutions.append((rec, step_texts(rec.fields, rec.where, args.step_separator)[0]))
        if not solutions[-1][1]:
            raise DataError(f"{rec.where}: no steps to label (field 'completions' or 'completion' is empty)")
    checks = load_check(args.check, [r.fields for r in records])
    tokenizer = load_tokenizer(args.model)
    model = load_model(args.model, tokenizer)

    def generate(contexts):
        texts = generate_texts(model, tokenizer, contexts, args.max_new_tokens, args.temperature, seed=args.seed)
        return [(t, len(tokenizer(t, add_special_tokens=False)["input_ids"])) for t in texts]

    labelled, cost, no_opinion = [], LabelCost(), 0

    def check(rows, texts):
        nonlocal no_opinion
        result, nones = reached(checks, rows, texts)
        no_opinion += nones
        return result

    for rec, steps in solutions:
        try:
            (row,), part = step_labels(
                [rec.fields], lambda _: steps, generate, check, args.samples, args.step_separator, args.soft
            )
        except RewardFunctionError as err:
            raise DataError(f"{rec.where}: {err}") from None
        labelled.append(row)
        cost.continuations, cost.tokens = cost.continuations + part.continuations, cost.tokens + part.tokens
        cost.seconds += part.seconds
    Path(args.output).write_text("".join(json.dumps(r) + "\n" for r in labelled))
    unjudged = f"; --check had no opinion (None) on {no_opinion} continuations, counted as not reaching the answer"
    line = cost.line(len(labelled), sum(len(r["labels"]) for r in labelled)) + (unjudged if no_opinion else "")
    return f"{line}; wrote {args.output}"
