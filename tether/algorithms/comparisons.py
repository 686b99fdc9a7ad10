"""Comparing logged figures (docs/algorithms.md §7): whether a difference reaches a threshold as the decimals mean
it, and the standard error of a difference of two rates. Python floats in, Python values out."""

from __future__ import annotations

import math


def reaches(a: float, b: float, threshold: float) -> bool:
    """a − b ≥ t − (ulp(a) + ulp(b) + ulp(t)): a − b ≥ t as the decimal figures mean it.

    A logged 0.7 and 0.5 are the doubles nearest those decimals (each within ½ ulp of its own), and their computed
    difference is rounded once more (by ½ ulp of the larger operand at most): 0.7 − 0.5 = 0.19999999999999996 while
    0.9 − 0.7 = 0.20000000000000007, and a fall of exactly 0.2 must count both ways. The difference is off by at
    most ulp(a) + ulp(b), the threshold by ½ ulp(t); a difference that misses by more than that is a real miss."""
    return a - b >= threshold - (math.ulp(a) + math.ulp(b) + math.ulp(threshold))


def rate_difference_se(p: float, n, q: float, m) -> float:
    """√(p(1 − p)/n + q(1 − q)/m): the standard error of q − p for means of [0, 1] values over n and m prompts (an
    upper bound for means of [0, 1] values; inf when a count is missing). The monitors and the lab's lesson rules
    use it."""
    if not n or not m or not (0.0 <= p <= 1.0 and 0.0 <= q <= 1.0):
        return math.inf
    return math.sqrt(p * (1 - p) / n + q * (1 - q) / m)
