"""Annotator agreement: κ against scikit-learn, statistics, filtering to majority labels, bad vote data."""

import json
import random

import pytest
from conftest import write_jsonl

from tether.algorithms.agreement import cohen_kappa, fleiss_kappa
from tether.cli import main
from tether.data.records import DataError, Record
from tether.data.votes import agreement_statistics, filter_by_agreement, read_votes


def exact_kappa_from_the_confusion_matrix(a, b):
    """κ = 1 − Σ_{i≠j} O_ij / Σ_{i≠j} E_ij, O the observed confusion counts and E_ij = row_i · column_j / n the
    counts chance expects (the confusion-matrix form, as scikit-learn writes it), in exact rational arithmetic."""
    from fractions import Fraction

    labels, n = sorted(set(a) | set(b)), len(a)
    observed = {(i, j): sum(x == i and y == j for x, y in zip(a, b)) for i in labels for j in labels}
    rows = {i: sum(observed[i, j] for j in labels) for i in labels}
    columns = {j: sum(observed[i, j] for i in labels) for j in labels}
    off = [(i, j) for i in labels for j in labels if i != j]
    return 1 - Fraction(sum(observed[c] for c in off)) / sum(Fraction(rows[i] * columns[j], n) for i, j in off)


@pytest.mark.parametrize("seed", range(5))
def test_cohen_kappa_matches_the_exact_confusion_matrix_form_on_random_labels(seed):
    rng = random.Random(seed)
    labels = ["a", "b", "c"][: rng.randint(2, 3)]
    a = [rng.choice(labels) for _ in range(200)]
    b = [x if rng.random() < 0.6 else rng.choice(labels) for x in a]  # correlated with a
    # tether's float64 arithmetic (a few operations on quantities ≤ 1) against the exact value
    assert cohen_kappa(a, b) == pytest.approx(float(exact_kappa_from_the_confusion_matrix(a, b)), abs=1e-12)


def test_fleiss_kappa_equals_cohen_style_reading_for_perfect_and_random():
    assert fleiss_kappa([[5, 0], [0, 5], [5, 0]]) == pytest.approx(1.0)
    rng = random.Random(0)
    rows = []
    for _ in range(3000):
        ones = sum(rng.random() < 0.5 for _ in range(4))
        rows.append([ones, 4 - ones])
    assert abs(fleiss_kappa(rows)) < 0.03  # independent coin flips: no agreement beyond chance


def pair(i, votes, chosen="good answer", rejected="bad answer"):
    return Record(
        {"prompt": "q", "chosen": f"{chosen} {i}", "rejected": f"{rejected} {i}", "votes": votes}, f"v.jsonl:{i}"
    )


def test_statistics_filter_and_majority_relabel():
    records = [
        pair(1, {"x": "chosen", "y": "chosen", "z": "chosen"}),
        pair(2, {"x": "rejected", "y": "rejected", "z": "chosen"}),
        pair(3, {"x": "chosen", "y": "rejected", "z": None}),  # missing vote -> 1-1 tie
        pair(4, {"x": "chosen", "y": "chosen"}, chosen="same", rejected="same"),
    ]
    rows, report = read_votes(records, ["x", "y", "z"])
    assert report.dropped == {"with chosen equal to rejected": 1} and report.missing_votes == 1
    stats = agreement_statistics(rows, report.annotators)
    assert stats["fleiss_kappa"]["items"] == 2 and stats["fleiss_kappa"]["left_out_with_missing_votes"] == 1
    assert stats["cohen_kappa"]["x~z"]["items"] == 2
    assert stats["per_item"]["ties"] == 1 and stats["per_item"]["unanimous"] == pytest.approx(1 / 3, abs=1e-4)
    assert stats["per_annotator"]["z"]["agreement_with_majority"] == 0.5  # right on 1, wrong on 2
    kept, dropped = filter_by_agreement(rows, 0.6)
    assert dropped == {"tie (no majority)": 1}
    assert [k["chosen"] for k in kept] == ["good answer 1", "bad answer 2"]  # row 2 swapped to its majority
    assert kept[1]["votes"] == {"x": "chosen", "y": "chosen", "z": "rejected"} and kept[1][
        "agreement"
    ] == pytest.approx(2 / 3, abs=1e-4)
    kept, dropped = filter_by_agreement(rows, 0.9)
    assert len(kept) == 1 and dropped["agreement below 0.9"] == 1


def test_bad_votes_are_clear_errors():
    with pytest.raises(
        DataError, match=r"v.jsonl:1: votes has unknown annotator id 'w'; --annotators lists \['x', 'y'\]"
    ):
        read_votes([pair(1, {"x": "chosen", "w": "chosen"})], ["x", "y"])
    with pytest.raises(DataError, match=r"v.jsonl:1: field 'votes' must map annotator ids to labels"):
        read_votes([pair(1, ["chosen", "rejected"])])
    with pytest.raises(DataError, match=r"v.jsonl:7: no 'votes' field"):
        read_votes([Record({"chosen": "a", "rejected": "b"}, "v.jsonl:7")])
    with pytest.raises(DataError, match=r"pair votes must be 'chosen' or 'rejected'"):
        read_votes([pair(1, {"x": "A"})])


def test_data_agreement_and_filter_commands(tmp_path, capsys):
    rows = [
        {
            "prompt": "q",
            "chosen": f"c{i}",
            "rejected": f"r{i}",
            "votes": {"x": "chosen", "y": "chosen" if i % 2 else "rejected", "z": "chosen"},
        }
        for i in range(10)
    ]
    src = write_jsonl(tmp_path / "prefs.jsonl", rows)
    stats_file = tmp_path / "stats.json"
    assert main(["data", "agreement", str(src), "--json", str(stats_file)]) == 0
    err = capsys.readouterr().err
    assert "Fleiss' κ" in err and "Cohen's κ x~y" in err and "Landis & Koch" in err
    assert json.loads(stats_file.read_text())["items"] == 10
    out = tmp_path / "filtered.jsonl"
    assert main(["data", "filter", str(src), "--min-agreement", "1.0", "--output", str(out)]) == 0
    assert len(out.read_text().splitlines()) == 5
    assert "kept 5 of 10" in capsys.readouterr().err
