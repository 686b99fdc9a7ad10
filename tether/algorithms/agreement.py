"""Inter-annotator agreement (docs/algorithms.md §2, "Annotator agreement"). Pure functions over label lists."""

from __future__ import annotations

from collections import Counter
from typing import Hashable, Sequence


def cohen_kappa(labels_a: Sequence[Hashable], labels_b: Sequence[Hashable]) -> float:
    """Cohen's κ for two annotators over the same items.

    κ = (p_o − p_e) / (1 − p_e), p_o the observed agreement,
    p_e = Σ_c p_{a,c} p_{b,c} the chance agreement from each annotator's label
    frequencies (Cohen 1960). Returns 1.0 when p_e = 1 and the annotators agree
    everywhere (a single label used by both), 0.0 when p_e = 1 otherwise.
    """
    if len(labels_a) != len(labels_b) or not labels_a:
        raise ValueError("cohen_kappa needs two equally long, non-empty label lists")
    n = len(labels_a)
    p_o = sum(a == b for a, b in zip(labels_a, labels_b)) / n
    freq_a, freq_b = Counter(labels_a), Counter(labels_b)
    p_e = sum(freq_a[c] * freq_b[c] for c in freq_a) / (n * n)
    if p_e == 1.0:
        return 1.0 if p_o == 1.0 else 0.0
    return (p_o - p_e) / (1 - p_e)


def fleiss_kappa(counts: Sequence[Sequence[int]]) -> float:
    """Fleiss' κ from an N × C table: counts[i][c] = raters who put item i in category c (n raters per item).

    P_i = (Σ_c n_ic² − n) / (n(n−1)), P̄ = mean_i P_i, p_c = Σ_i n_ic / (N n),
    P̄_e = Σ_c p_c², κ = (P̄ − P̄_e) / (1 − P̄_e) (Fleiss 1971).
    """
    if not counts:
        raise ValueError("fleiss_kappa needs at least one item")
    n = sum(counts[0])
    if n < 2 or any(sum(row) != n for row in counts):
        raise ValueError("fleiss_kappa needs the same number (>= 2) of ratings for every item")
    big_n = len(counts)
    p_bar = sum((sum(x * x for x in row) - n) / (n * (n - 1)) for row in counts) / big_n
    cats = len(counts[0])
    p_c = [sum(row[c] for row in counts) / (big_n * n) for c in range(cats)]
    p_e = sum(p * p for p in p_c)
    if p_e == 1.0:
        return 1.0
    return (p_bar - p_e) / (1 - p_e)


def landis_koch(kappa: float) -> str:
    """The usual reading of κ (Landis & Koch 1977)."""
    if kappa < 0:
        return "poor"
    for bound, word in ((0.2, "slight"), (0.4, "fair"), (0.6, "moderate"), (0.8, "substantial")):
        if kappa <= bound:
            return word
    return "almost perfect"
