"""Preference rows that carry several annotators' votes: agreement statistics, filtering, majority labels.

A row's ``votes`` maps annotator id -> label (for pairs, "chosen" or
"rejected": which of the stored pair that annotator preferred). Agreement
uses tether.algorithms.agreement. Policies (docs/preferences.md):
- a vote that is null or absent is *missing*: the pair of annotators is
  compared on items both labelled; Fleiss' κ uses only items with every vote;
- an annotator id outside ``annotators`` (when given) is an error;
- chosen equal to rejected: the row is dropped and counted;
- ties (two labels with the same top count): no majority, the row is dropped by
  ``filter_by_agreement`` and counted;
- κ for pairs is computed on a vote-independent coding (see _code_pair).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from tether.algorithms.agreement import cohen_kappa, fleiss_kappa, landis_koch
from tether.data.records import DataError, Record


@dataclass
class VotedRow:
    fields: dict
    votes: dict  # annotator -> label (missing votes removed)
    where: str
    coded: dict | None = None  # annotator -> vote-independent label used for κ (pairs: which text, "A" or "B")

    @property
    def kappa_votes(self) -> dict:
        return self.coded if self.coded is not None else self.votes

    @property
    def majority(self) -> tuple[str | None, float]:
        """(majority label or None on a tie, fraction of votes that agree with the top label)."""
        counts = Counter(self.votes.values()).most_common()
        if not counts:
            return None, 0.0
        top = counts[0][1]
        agreement = top / len(self.votes)
        if len(counts) > 1 and counts[1][1] == top:
            return None, agreement
        return counts[0][0], agreement


@dataclass
class VoteReport:
    path: str
    rows: int = 0
    annotators: list = field(default_factory=list)
    dropped: Counter = field(default_factory=Counter)
    missing_votes: int = 0


def _content(value) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def read_votes(
    records: list[Record], annotators: list[str] | None = None, path: str = "data"
) -> tuple[list[VotedRow], VoteReport]:
    report = VoteReport(path=str(path), rows=len(records))
    known = list(annotators) if annotators else None
    seen: list[str] = []
    rows = []
    for rec in records:
        f, where = rec.fields, rec.where
        if "votes" not in f:
            raise DataError(
                f"{where}: no 'votes' field; agreement needs a mapping annotator -> label per row. "
                f"The record has {sorted(f)}"
            )
        votes = f["votes"]
        if not isinstance(votes, dict):
            raise DataError(f"{where}: field 'votes' must map annotator ids to labels, got {type(votes).__name__}")
        for ann, label in votes.items():
            if known is not None and ann not in known:
                raise DataError(f"{where}: votes has unknown annotator id {ann!r}; --annotators lists {known}")
            if label is not None and not isinstance(label, (str, int, bool)):
                raise DataError(f"{where}: votes[{ann!r}] must be a label (string), got {label!r}")
            if ann not in seen:
                seen.append(ann)
        if "chosen" in f and "rejected" in f and _content(f["chosen"]).strip() == _content(f["rejected"]).strip():
            report.dropped["with chosen equal to rejected"] += 1
            continue
        clean = {a: v for a, v in votes.items() if v is not None}
        if not clean:
            report.dropped["with no vote"] += 1
            continue
        rows.append(VotedRow(f, clean, where, _code_pair(f, clean, where)))
    report.annotators = known or seen
    report.missing_votes = sum(len(report.annotators) - len(r.votes) for r in rows)
    return rows, report


def _code_pair(fields: dict, votes: dict, where: str) -> dict | None:
    """For pairs, recode "chosen"/"rejected" as "A"/"B": which of the two texts, in alphabetical order.

    "chosen" is itself defined by the votes (the majority), so coding by it makes every annotator's label
    frequencies depend on the others' votes and drives κ towards 0 however well they agree. The alphabetical
    order of the two texts does not depend on any vote.
    """
    if "chosen" not in fields or "rejected" not in fields:
        return None
    chosen_first = _content(fields["chosen"]) <= _content(fields["rejected"])
    coded = {}
    for annotator, label in votes.items():
        if label not in ("chosen", "rejected"):
            raise DataError(f"{where}: votes[{annotator!r}] is {label!r}; pair votes must be 'chosen' or 'rejected'")
        coded[annotator] = "A" if (label == "chosen") == chosen_first else "B"
    return coded


def agreement_statistics(rows: list[VotedRow], annotators: list[str]) -> dict:
    """Cohen's κ for every pair of annotators, Fleiss' κ, per-item agreement, agreement with the majority."""
    out: dict = {"items": len(rows), "annotators": list(annotators), "cohen_kappa": {}, "per_annotator": {}}
    for i, a in enumerate(annotators):
        for b in annotators[i + 1 :]:
            both = [(r.kappa_votes[a], r.kappa_votes[b]) for r in rows if a in r.votes and b in r.votes]
            if both:
                kappa = cohen_kappa([x for x, _ in both], [y for _, y in both])
                out["cohen_kappa"][f"{a}~{b}"] = {
                    "kappa": round(kappa, 4),
                    "items": len(both),
                    "reading": landis_koch(kappa),
                }
    labels = sorted({v for r in rows for v in r.kappa_votes.values()}, key=str)
    complete = [r for r in rows if len(r.votes) == len(annotators)]
    if complete and len(annotators) >= 2:
        table = [[sum(v == c for v in r.kappa_votes.values()) for c in labels] for r in complete]
        kappa = fleiss_kappa(table)
        out["fleiss_kappa"] = {
            "kappa": round(kappa, 4),
            "items": len(complete),
            "reading": landis_koch(kappa),
            "left_out_with_missing_votes": len(rows) - len(complete),
        }
    agreements = [r.majority[1] for r in rows]
    ties = sum(r.majority[0] is None for r in rows)
    out["per_item"] = {
        "mean_agreement": round(sum(agreements) / max(1, len(agreements)), 4),
        "unanimous": round(sum(a == 1.0 for a in agreements) / max(1, len(agreements)), 4),
        "ties": ties,
        "histogram": {f"{k:.2f}": v for k, v in sorted(Counter(round(a, 2) for a in agreements).items())},
    }
    for a in annotators:
        voted = [r for r in rows if a in r.votes and r.majority[0] is not None]
        out["per_annotator"][a] = {
            "votes": sum(a in r.votes for r in rows),
            "agreement_with_majority": round(sum(r.votes[a] == r.majority[0] for r in voted) / max(1, len(voted)), 4),
        }
    return out


def filter_by_agreement(rows: list[VotedRow], min_agreement: float) -> tuple[list[dict], Counter]:
    """Rows whose top label has at least ``min_agreement`` of the votes, relabelled to the majority.

    For pairs, a majority of "rejected" swaps chosen and rejected. Ties are dropped and counted.
    Each kept row gains ``agreement`` (fraction of votes for the majority label).
    """
    kept, dropped = [], Counter()
    for r in rows:
        label, agreement = r.majority
        if label is None:
            dropped["tie (no majority)"] += 1
            continue
        if agreement < min_agreement:
            dropped[f"agreement below {min_agreement:g}"] += 1
            continue
        row = dict(r.fields)
        if "chosen" in row and "rejected" in row:
            if label not in ("chosen", "rejected"):
                raise DataError(f"{r.where}: majority label {label!r}: pair votes must be 'chosen' or 'rejected'")
            if label == "rejected":
                row["chosen"], row["rejected"] = row["rejected"], row["chosen"]
                row["votes"] = {
                    a: {"chosen": "rejected", "rejected": "chosen"}.get(v, v) for a, v in row["votes"].items()
                }
        row["agreement"] = round(agreement, 4)
        kept.append(row)
    return kept, dropped


def write_jsonl(rows: list[dict], path: str | Path) -> None:
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with tmp.open("w") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")
    tmp.replace(path)
