"""Step labels without annotators, as Math-Shepherd makes them (Wang et al. 2024, arXiv 2312.08935, §3.3;
docs/algorithms.md §2.4): from the prefix that ends at step k, a policy writes ``samples`` continuations; step k is
right (hard label) when any reaches the correct answer, and its soft label is the share that do.

`tether data prm-labels` runs it over a file of step-split solutions with a model folder as the policy and a
reward function as the answer check; ``step_labels`` is the pure part, taking any ``generate`` and ``check``.
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
