"""The lab's noise: intervals, standard errors and the noise of a difference, and how an interval is written.

Every held-out figure of the lab is a mean over prompts, and every rule that reads two figures (lessons.py, the
tables) asks whether they differ beyond the noise of the prompts drawn:
- a gold reward or win rate carries its 95 % bootstrap interval over prompts (``bootstrap_interval``), logged as
  ``eval/<figure>_low`` and ``_high`` and read back by ``logged_interval``; two are apart when their intervals do
  not overlap (``intervals_apart``);
- a rate p over n prompts has the 95 % half-width 1.96 √(p(1 − p)/n) (``rate_interval95``, the normal approximation
  of that bootstrap), and two rates differ beyond the noise when their difference exceeds
  1.96 √(p₁(1 − p₁)/n₁ + p₂(1 − p₂)/n₂) (``rate_difference_noise``, on the monitors' standard error);
- a mean of per-prompt means has the standard error s/√n (``mean_standard_error``), and two such means differ beyond
  the noise when their difference exceeds 1.96 √(s₁² + s₂²) (``difference_noise``).
"""

from __future__ import annotations

import math
import random

from tether.algorithms.comparisons import rate_difference_se

Z95 = 1.96  # the normal quantile of a two-sided 95 % interval


def bootstrap_interval(per_prompt: list[list[float]], resamples: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95 % percentile interval of the mean over all answers when the held-out prompts are drawn again: each
    resample takes len(per_prompt) prompts with replacement, every answer of a drawn prompt with it (a prompt's
    answers are not independent of each other, so answers are not resampled one by one)."""
    rng = random.Random(seed)
    n = len(per_prompt)
    sums, counts = [sum(v) for v in per_prompt], [len(v) for v in per_prompt]
    means = []
    for _ in range(resamples):
        picks = [rng.randrange(n) for _ in range(n)]
        means.append(sum(sums[i] for i in picks) / max(1, sum(counts[i] for i in picks)))
    means.sort()
    return means[int(0.025 * resamples)], means[min(resamples - 1, int(0.975 * resamples))]


def mean_standard_error(values: list[float]) -> float:
    """Standard error of the mean of independent values: s / √n with the sample standard deviation s (n − 1 in its
    denominator); 0.0 for fewer than two values."""
    n = len(values)
    if n < 2:
        return 0.0
    mean = sum(values) / n
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n)


def rate_interval95(p: float, n: int) -> float:
    """Half-width of the 95 % interval of a rate over n held-out prompts (the normal approximation of the bootstrap
    over prompts: a mean of 0/1 outcomes has standard error √(p(1 − p)/n))."""
    return Z95 * (p * (1 - p) / max(n, 1)) ** 0.5


def rate_difference_noise(p1: float, n1: int, p2: float, n2: int) -> float:
    """95 % half-width of p₂ − p₁ for rates over n₁ and n₂ prompts: 1.96 standard errors (the monitors' formula)."""
    return Z95 * rate_difference_se(p1, max(n1, 1), p2, max(n2, 1))


def difference_noise(se1: float, se2: float) -> float:
    """95 % half-width of the difference of two independent estimates with standard errors s₁, s₂: 1.96 √(s₁² + s₂²)."""
    return Z95 * math.sqrt(se1**2 + se2**2)


def logged_interval(history_row: dict, key: str) -> list | None:
    """The 95 % bootstrap interval over prompts logged with an evaluation, [low, high] (None in runs from before it
    was logged)."""
    low, high = history_row.get(f"eval/{key}_low"), history_row.get(f"eval/{key}_high")
    return None if low is None else [low, high]


def intervals_apart(low_ci, high_ci) -> bool | None:
    """True when the interval low_ci lies wholly below high_ci; None when either is missing."""
    if not low_ci or not high_ci:
        return None
    return low_ci[1] < high_ci[0]


def format_interval(ci, digits: int) -> str:
    """ " [low, high]" with ``digits`` decimals (empty for a missing interval: runs from before it was logged)."""
    return f" [{ci[0]:.{digits}f}, {ci[1]:.{digits}f}]" if ci else ""
