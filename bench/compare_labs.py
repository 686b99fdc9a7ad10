"""Compare the figures of two `tether lab` runs stage by stage (each stage's stage.json), ignoring timings: the
check that a refactor left every lab figure as it was. With ``--lessons``: two labs meant to differ (another
precision, another setting) side by side instead — each lesson's verdict and evidence, and each stage's seconds with
their ratio, the stages of one kind summed (docs/performance.md "The whole lab in bf16").

    .venv/bin/python bench/compare_labs.py OLD/runs/lab runs/lab
    .venv/bin/python bench/compare_labs.py --lessons runs/lab runs/lab-autocast
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


# the kinds of stage whose times are summed (docs/performance.md's table): a stage's kind is the first whose names
# its own starts with; a stage of none is its own kind
KINDS = {
    "pretraining": ("pretrain",),
    "sft": ("sft", "calc_sft", "shop_sft"),
    "reward_models": ("rm",),
    "ppo": ("ppo",),
    "grpo_arith": ("grpo",),
    "dpo_sampled": ("dpo_sigmoid_sft_samples", "dpo_sigmoid_online"),
    "dpo_offline": ("dpo",),
    "agent_grpo": ("calc_grpo", "shop_state", "shop_claim"),
}


def lessons(old: Path, new: Path) -> int:
    """Each lesson's verdict and evidence in both labs, then the stages' seconds and their ratio new / old."""
    a, b = (json.loads((lab / "summary.json").read_text()) for lab in (old, new))
    verdict = lambda lesson: "holds" if lesson["holds"] else "FAILS"
    for la, lb in zip(a["lessons"], b["lessons"], strict=True):
        print(f"{la['name']}: {verdict(la)} -> {verdict(lb)}\n    {la['evidence']}\n    {lb['evidence']}")
    kinds: dict[str, list[float]] = {}
    print(f"\n{'stage':26s} {'old s':>8s} {'new s':>8s} {'ratio':>6s}")
    for stage, seconds in a["seconds"].items():
        if stage in b["seconds"] and seconds >= 1.0:
            print(f"{stage:26s} {seconds:8.1f} {b['seconds'][stage]:8.1f} {b['seconds'][stage] / seconds:6.2f}")
            kind = next((k for k, names in KINDS.items() if stage.startswith(names)), stage)
            totals = kinds.setdefault(kind, [0.0, 0.0])
            totals[0], totals[1] = totals[0] + seconds, totals[1] + b["seconds"][stage]
    print(f"\n{'kind':26s} {'old s':>8s} {'new s':>8s} {'ratio':>6s}")
    for kind, (x, y) in kinds.items():
        print(f"{kind:26s} {x:8.1f} {y:8.1f} {y / x:6.2f}")
    wall = a["stages_wall_seconds"], b["stages_wall_seconds"]
    print(f"{'all stages, wall':26s} {wall[0]:8.1f} {wall[1]:8.1f} {wall[1] / wall[0]:6.2f}")
    return 0 if all(lesson["holds"] for lesson in b["lessons"]) else 1


if __name__ == "__main__":
    if sys.argv[1] == "--lessons":
        sys.exit(lessons(Path(sys.argv[2]), Path(sys.argv[3])))
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
