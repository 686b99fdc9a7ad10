"""What images cost a vision-language GRPO step at the visual lab's size (issue 56): the same prompts, policy and
reward, once with each prompt's image and once with the image removed (its content part and its ``images`` entry
dropped, so the prompt is the question alone), each in a fresh process, alternating, ``--repeats`` times.

Reported, as ratios within this one run: each phase's seconds per step (sampling and scoring, old/reference
log-probs, update) with and without images, the images' share of a step (1 − without / with, median over the
repeats, with the repeats' range), the prompt tokens per step (an image is widened into its image tokens: what every
forward pays for), and the peak resident memory of each process.

    python examples/vision_bench.py --lab runs/lab/visual/seed-0   # after `tether lab --multimodal`
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

PHASES = ("time/generate_score_s", "time/logprobs_s", "time/update_s")


def text_only(prompts: Path, out: Path) -> Path:
    """The prompt file with every image removed: image parts out of the messages, no ``images`` column."""
    rows = [json.loads(line) for line in prompts.read_text().splitlines()]
    for row in rows:
        row.pop("images", None)
        for message in row["prompt"]:
            if isinstance(message["content"], list):
                message["content"] = "".join(p["text"] for p in message["content"] if p["type"] == "text")
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out


def run(lab: Path, prompts: Path, out: Path, steps: int) -> dict:
    """One GRPO run in a fresh process: the per-step phase seconds (steps after the first) and its peak RSS."""
    command = [
        sys.executable, "-m", "tether", "grpo",
        "--model", str(lab / "sft" / "final"),
        "--prompts", str(prompts),
        "--reward", "tether.lab.scenes:caption_f1",
        "--prompts-per-step", "16", "--group-size", "4", "--max-new-tokens", "32",
        "--max-steps", str(steps), "--save-every", "1000000",
        "--lr", "1e-4", "--report-to", "none", "--output", str(out), "--overwrite",
    ]  # fmt: skip
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(child.pid, 0)
    if status != 0:
        raise SystemExit(f"grpo failed ({status}): {child.stderr.read()[-2000:]}")
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()][1:]  # warm steps
    figures = {k: statistics.mean(m[k] for m in metrics) for k in PHASES}
    figures["step_s"] = sum(figures[k] for k in PHASES)  # the three phases make the step
    figures["peak_rss_mib"] = usage.ru_maxrss / 1024  # KiB on Linux
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lab", default="runs/lab/visual/seed-0", help="a seed folder of `tether lab --multimodal`")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="runs/vision_bench")
    args = parser.parse_args()
    lab, out = Path(args.lab), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with_images = lab / "world" / "rl.jsonl"
    without = text_only(with_images, out / "rl_text_only.jsonl")
    results: dict[str, list[dict]] = {"images": [], "text_only": []}
    for r in range(args.repeats):
        for name, prompts in (("images", with_images), ("text_only", without)):
            results[name].append(run(lab, prompts, out / f"{name}-{r}", args.steps))
    from tether.models.lm import load_tokenizer
    from tether.models.vision import load_processor
    from tether.train.sampling import ImagePrompts

    folder = lab / "sft" / "final"
    tokenizer = load_tokenizer(folder)
    processor = load_processor(folder, tokenizer)
    from tether.data.prompts import prompt_rows
    from tether.rollout.prompts import render_prompts

    rows = prompt_rows(with_images, images=2**62)
    tokens = ImagePrompts(tokenizer, processor, rows[:64], "rl", 2**62).lengths
    plain = [len(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in render_prompts(tokenizer, prompt_rows(without)[:64], "rl")]  # fmt: skip
    report = {"repeats": args.repeats, "steps": args.steps, "phases": {}, "prompt_tokens": {}}
    for key in (*PHASES, "step_s", "peak_rss_mib"):
        a = [x[key] for x in results["images"]]
        b = [x[key] for x in results["text_only"]]
        shares = [1 - y / x for x, y in zip(a, b)]
        report["phases"][key] = {
            "with_images": round(statistics.median(a), 4),
            "text_only": round(statistics.median(b), 4),
            "images_share": round(statistics.median(shares), 3),
            "share_range": [round(min(shares), 3), round(max(shares), 3)],
        }
    report["prompt_tokens"] = {
        "with_images": statistics.mean(tokens),
        "text_only": statistics.mean(plain),
        "note": "mean tokens of a rendered prompt (64 rows): with the image's placeholder widened into its image "
        "tokens, and the question alone",
    }
    (out / "vision_bench.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
