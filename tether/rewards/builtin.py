"""Built-in reward functions: each a documented pure function of the completion text and the row's columns.

Use them by name, with arguments in the spec when they take any:

    --reward tether.rewards.builtin:exact_answer
    --reward 'tether.rewards.builtin:format_match(pattern="^.*The answer is -?\\d+\\.$")=0.5'
    --reward tether.rewards.builtin:overlong(max_length=64,cache=16)
"""

from __future__ import annotations

import math
import re
from functools import lru_cache

NUMBER_RE = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?")
ANSWER_PATTERNS = (
    re.compile(r"\\boxed\{([^{}]*)\}"),
    re.compile(r"[Tt]he answer is[:\s]*([^\n]*?)\.?\s*$", re.M),
    re.compile(r"####\s*([^\n]+)"),
)


def extract_answer(text: str) -> str | None:
    """The final answer of a completion: \\boxed{X}, 'The answer is X', '#### X', else the last number."""
    for pattern in ANSWER_PATTERNS:
        found = pattern.findall(text)
        if found:
            return found[-1].strip()
    numbers = NUMBER_RE.findall(text)
    return numbers[-1] if numbers else None


def _as_number(text) -> float | None:
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return float(text)
    match = NUMBER_RE.fullmatch(str(text).strip().rstrip(".").replace("$", ""))
    return float(match.group(0).replace(",", "")) if match else None


def answers_match(predicted: str | None, reference) -> bool:
    """Numeric equality (to 1e-6 relative) when both parse as numbers, else case/space-normalised strings."""
    if predicted is None:
        return False
    a, b = _as_number(predicted), _as_number(reference)
    if a is not None and b is not None:
        return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)
    norm = lambda s: " ".join(str(s).lower().strip().rstrip(".").split())
    return norm(predicted) == norm(reference)


def exact_answer(completions, answer, **_) -> list[float]:
    """1 if the completion's final answer (extract_answer) equals the row's ``answer`` column, else 0."""
    return [1.0 if answers_match(extract_answer(c), a) else 0.0 for c, a in zip(completions, answer)]


def format_match(completions, pattern: str = r"^.+$", **_) -> list[float]:
    """1 if the whole stripped completion matches the regular expression ``pattern`` (re.DOTALL), else 0."""
    regex = re.compile(pattern, re.DOTALL)
    return [1.0 if regex.fullmatch(c.strip()) else 0.0 for c in completions]


def length_penalty(completion_ids, target: int = 256, scale: float = 0.001, **_) -> list[float]:
    """−scale · max(0, |y| − target): tokens beyond ``target`` cost ``scale`` each."""
    return [-scale * max(0, len(ids) - target) for ids in completion_ids]


def overlong(completion_ids, max_length: int = 512, cache: int = 128, **_) -> list[float]:
    """DAPO's soft overlong punishment (tether.algorithms.group.overlong_penalty) of the token count."""
    free = max_length - cache
    out = []
    for ids in completion_ids:
        n = len(ids)
        out.append(0.0 if n <= free else (free - n) / cache if n <= max_length else -1.0)
    return out


def repetition_penalty(completions, n: int = 3, scale: float = 1.0, **_) -> list[float]:
    """−scale · (1 − distinct n-grams / n-grams) over the completion's words; 0 for fewer than n words."""
    out = []
    for c in completions:
        words = c.split()
        grams = [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]
        out.append(-scale * (1 - len(set(grams)) / len(grams)) if grams else 0.0)
    return out


def python_tests(
    completions, tests, timeout_s: float = 5.0, memory_mb: int = 512, isolation: str = "bubblewrap", **_
) -> list[float]:
    """1 if the completion's code (a ```python block, else the whole text) followed by the row's ``tests`` runs
    to exit status 0 in the sandbox (tether.rewards.sandbox: namespaces, a cgroup for memory and processes, a
    time limit), else 0. isolation="weak" (named on purpose) runs without the boundary where none can be had."""
    from tether.rewards.sandbox import run_python

    scores = []
    for c, t in zip(completions, tests):
        block = re.search(r"```(?:python)?\n(.*?)```", c, re.S)
        code = (block.group(1) if block else c) + "\n" + str(t) + "\n"
        scores.append(
            1.0 if run_python(code, timeout_s=timeout_s, memory_mb=memory_mb, isolation=isolation).ok else 0.0
        )
    return scores


@lru_cache(maxsize=4)
def _scorer(path: str, normalize: bool):
    from tether.models.reward import RewardScorer

    return RewardScorer(path, None, normalize, "cpu")


def reward_model(prompts, completions, path: str = "", normalize: bool = True, **_) -> list[float]:
    """A `tether rm` model's (normalised) score of prompt + completion + EOS, the prompt rendered with the
    reward model's chat template when it is a list of messages."""
    if not path:
        raise ValueError("reward_model needs path=... (a `tether rm` final/ folder)")
    from tether.models.chat import render_chat

    tok = _tokenizer(path)
    eos = tok.eos_token or ""
    texts = []
    for p, c in zip(prompts, completions):
        rendered = render_chat(tok, p, generation_prompt=True) if isinstance(p, list) else p
        texts.append(rendered + c + eos)
    return list(_scorer(path, normalize)(texts))


@lru_cache(maxsize=4)
def _tokenizer(path: str):
    from tether.models.lm import load_tokenizer

    return load_tokenizer(path)
