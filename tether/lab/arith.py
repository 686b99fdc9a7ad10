"""The `arith` task: multi-step addition/subtraction with worked solutions, and its gold checks.

A problem "Compute 47 + 38 - 19." has the worked solution
"47 + 38 = 85. 85 - 19 = 66. The answer is 66." Gold checks: the final answer
is right; the format is followed; each step is right (a step is right when its
arithmetic is right and it continues from the previous result with the
problem's next operand; process rewards use this list).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

ANSWER_ONLY_RE = re.compile(r"^The answer is -?\d+\.$")  # a direct answer, no working
ANSWER_RE = re.compile(r"The answer is (-?\d+)\.$")
STEP_RE = re.compile(r"(-?\d+) ([+-]) (\d+) = (-?\d+)\.")
FORMAT_RE = re.compile(r"^(?:-?\d+ [+-] \d+ = -?\d+\. )*The answer is -?\d+\.$")


@dataclass(frozen=True)
class ArithProblem:
    operands: tuple[int, ...]
    ops: tuple[str, ...]  # len(operands) - 1 of "+" / "-"

    @property
    def question(self) -> str:
        expr = str(self.operands[0]) + "".join(f" {op} {x}" for op, x in zip(self.ops, self.operands[1:]))
        return f"Compute {expr}."

    def partial_results(self) -> list[int]:
        results, acc = [], self.operands[0]
        for op, x in zip(self.ops, self.operands[1:]):
            acc = acc + x if op == "+" else acc - x
            results.append(acc)
        return results

    @property
    def answer(self) -> int:
        return self.partial_results()[-1]

    def direct_answer(self) -> str:
        """The answer with no working, as a lazy demonstrator writes it (still a well-formatted answer)."""
        return f"The answer is {self.answer}."

    def solution(self, error_step: int | None = None, error_delta: int = 0) -> str:
        """The worked solution; with error_step, that step's result is off by error_delta and the error propagates."""
        parts, acc = [], self.operands[0]
        for i, (op, x) in enumerate(zip(self.ops, self.operands[1:])):
            result = acc + x if op == "+" else acc - x
            if i == error_step:
                result += error_delta
            parts.append(f"{acc} {op} {x} = {result}.")
            acc = result
        return " ".join(parts) + f" The answer is {acc}."


def sample_problem(rng: random.Random, min_operands: int, max_operands: int, max_value: int) -> ArithProblem:
    """Operands in [0, max_value]; subtractions only where the running total stays >= 0 (so no negative numbers)."""
    n = rng.randint(min_operands, max_operands)
    operands, ops, acc = [rng.randint(0, max_value)], [], None
    acc = operands[0]
    for _ in range(n - 1):
        x = rng.randint(0, max_value)
        op = "-" if x <= acc and rng.random() < 0.5 else "+"
        acc = acc + x if op == "+" else acc - x
        operands.append(x)
        ops.append(op)
    return ArithProblem(tuple(operands), tuple(ops))


def plausible_error(rng: random.Random) -> int:
    """The kind of slip a learner makes: a dropped or extra carry (±10) or an off-by-one-or-two."""
    return rng.choice([10, -10, 1, -1, 2, -2, 9, -9])


@dataclass(frozen=True)
class ArithGold:
    correct: bool  # final answer equals the true answer
    format_ok: bool  # only "a op b = c." steps followed by "The answer is N."
    steps: tuple[bool, ...]  # one per expected step: right arithmetic, continuing from the right previous result
    worked: bool = False  # at least one "a op b = c." step is written out

    @property
    def step_accuracy(self) -> float:
        return sum(self.steps) / len(self.steps) if self.steps else 0.0


def check_arith(completion: str, problem: ArithProblem) -> ArithGold:
    text = completion.strip()
    match = ANSWER_RE.search(text)
    correct = bool(match) and int(match.group(1)) == problem.answer
    format_ok = bool(FORMAT_RE.match(text))
    found = STEP_RE.findall(text)
    steps = []
    expected_results = problem.partial_results()
    for i, (op, x) in enumerate(zip(problem.ops, problem.operands[1:])):
        if i >= len(found):
            steps.append(False)
            continue
        a, got_op, b, c = int(found[i][0]), found[i][1], int(found[i][2]), int(found[i][3])
        start = problem.operands[0] if i == 0 else expected_results[i - 1]
        steps.append(a == start and got_op == op and b == x and c == expected_results[i])
    return ArithGold(correct, format_ok, tuple(steps), worked=bool(found))


def written_steps(completion: str) -> list[tuple[str, bool]]:
    """Each "a op b = c." step a completion writes: its operator, and whether c = a op b for the operands it wrote.
    The model's arithmetic alone, whether or not it copied the right operands (check_arith judges those)."""
    return [
        (op, int(c) == (int(a) + int(b) if op == "+" else int(a) - int(b)))
        for a, op, b, c in STEP_RE.findall(completion)
    ]


def parse_question(question: str) -> ArithProblem:
    """Inverse of ArithProblem.question (used when a dataset row carries only the text)."""
    tokens = question.removeprefix("Compute ").removesuffix(".").split()
    operands = tuple(int(t) for t in tokens[0::2])
    ops = tuple(tokens[1::2])
    return ArithProblem(operands, ops)
