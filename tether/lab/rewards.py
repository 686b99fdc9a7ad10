"""Reward functions for the lab's arith world, in the `--reward module:function` form (docs/rewards.md).

Rows of arith_rl.jsonl carry `question` and `answer`; each function reads what it needs by name.
"""
from __future__ import annotations

from tether.lab import arith


def arith_correct(completions, question, **_) -> list[float]:
    """1 if the completion ends with `The answer is N.` and N is the true result, else 0."""
    return [float(arith.check_arith(c, arith.parse_question(q)).correct) for c, q in zip(completions, question)]


def arith_format(completions, **_) -> list[float]:
    """1 if the completion is nothing but `a ± b = c.` steps followed by `The answer is N.`, else 0."""
    return [float(bool(arith.FORMAT_RE.match(c.strip()))) for c in completions]


def arith_steps(completions, question, **_) -> list[list[float]]:
    """Process reward: one score per sentence of a worked answer — each expected step (1 if its operands
    continue from the right previous result and its arithmetic is right), then the final answer (1 if correct).

    With the default step pattern (a full stop followed by a space or the end) the k-th score lands on the
    token that ends the k-th sentence.
    """
    out = []
    for c, q in zip(completions, question):
        gold = arith.check_arith(c, arith.parse_question(q))
        out.append([float(s) for s in gold.steps] + [float(gold.correct)])
    return out
