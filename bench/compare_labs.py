"""Compare the figures of two `tether lab` runs stage by stage (each stage's stage.json), ignoring timings: the
check that a refactor left every lab figure as it was.

    .venv/bin/python bench/compare_labs.py OLD/runs/lab runs/lab
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

TIMINGS = ("seconds", "minutes", "steps_per_minute", "time_split", "wall_s")


def figures(value, prefix: str = ""):
    """(dotted name, value) for every leaf of a stage's result, timings left out."""
    if isinstance(value, dict):
        for key, item in value.items():
            if key not in TIMINGS:
                yield from figures(item, f"{prefix}.{key}" if prefix else key)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from figures(item, f"{prefix}[{i}]")
    else:
        yield prefix, value


def main(old: Path, new: Path) -> int:
    total = different = 0
    for stage in sorted(p.name for p in old.iterdir() if (p / "stage.json").is_file()):
        a = json.loads((old / stage / "stage.json").read_text())
        if not (new / stage / "stage.json").is_file():
            print(f"{stage}: missing in {new}")
            different += 1
            continue
        b = json.loads((new / stage / "stage.json").read_text())
        fa, fb = dict(figures(a["result"])), dict(figures(b["result"]))
        diff = [k for k in sorted(set(fa) | set(fb)) if fa.get(k) != fb.get(k)]
        total, different = total + len(fa), different + len(diff)
        same_recipe = "same recipe" if a["recipe_hash"] == b["recipe_hash"] else "another recipe"
        print(f"{stage}: {len(fa)} figures, {len(diff)} differ ({same_recipe})")
        for key in diff[:10]:
            print(f"    {key}: {fa.get(key)!r} -> {fb.get(key)!r}")
    print(f"{total} figures, {different} differ")
    return 1 if different else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
