"""A corpus of bad inputs, run through the command line: does each get a clear answer?

Each case builds a broken input (model folder, checkpoint, data row, prompt file, reward function, judge, config
value, output folder) around a tiny model and runs `python -m tether <stage> ...` on it. Outcomes: **clear** — a
non-zero exit whose last line is tether's own error message (no traceback); **traceback**; **accepted** — it ran
as if nothing were wrong. Flags and YAML keys are those both tether 0.1 and later accept, so the same corpus
measures an older checkout: pass its interpreter.

    .venv/bin/python bench/bad_inputs.py                                  # this checkout
    .venv/bin/python bench/bad_inputs.py --python /path/to/old/.venv/bin/python
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CORPUS = [
    "What is 12 + 7?\n12 + 7 = 19. The answer is 19.",
    "Tell me about cats. Cats are mammals.",
    "user assistant system hello there, how are you? I am fine, thanks!",
] * 20
RULES = (
    "import math\ncalls = []\n"
    "def count_a(completions):\n    return [float(c.count('a')) for c in completions]\n"
    "def nan(completions):\n    return [math.nan] * len(completions)\n"
    "def text(completions):\n    return ['good'] * len(completions)\n"
    "def short(completions):\n    return [1.0]\n"
    "def late_raise(completions):\n    calls.append(1)\n    if len(calls) > 2:\n        raise RuntimeError('broke')\n"
    "    return [0.0] * len(completions)\n"
    "def late_nan(completions):\n    calls.append(1)\n    return [math.nan if len(calls) > 2 else 0.0] * len(completions)\n"
    "def needs_answer(completions, answer):\n    return [float(str(a) in c) for c, a in zip(completions, answer)]\n"
)
JUDGES = (
    "import math\n"
    "def nan(prompts, first, second, **_):\n    return [math.nan] * len(first)\n"
    "def big(prompts, first, second, **_):\n    return [2.0] * len(first)\n"
    "def boom(prompts, first, second, **_):\n    raise ValueError('no verdict')\n"
    "def words(prompts, first, second, **_):\n    return ['first'] * len(first)\n"
)


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def fixtures(root: Path) -> dict:
    from tether.lab.tokenizer import train_bpe_tokenizer
    from tether.models.lm import build_tiny_model

    tok = train_bpe_tokenizer(CORPUS, vocab_size=320)
    model = build_tiny_model("llama", tok, root / "model", seed=0, hidden=32, layers=2, heads=2, max_positions=128)
    words = ["cats", "dogs", "rain", "sun"] * 4
    f = {
        "model": model,
        "root": root,
        "sft": write_jsonl(root / "sft.jsonl", [{"prompt": f"Say {w}.", "completion": f" {w}."} for w in words]),
        "prefs": write_jsonl(
            root / "prefs.jsonl",
            [{"prompt": f"About {w}.", "chosen": f"{w} are fine.", "rejected": "no"} for w in words],
        ),
        "prompts": write_jsonl(root / "prompts.jsonl", [{"prompt": f"Say {w}.", "answer": w} for w in words]),
        "rules": root / "rules.py",
        "judges": root / "judges.py",
    }
    f["rules"].write_text(RULES)
    f["judges"].write_text(JUDGES)
    return f


def copy_model(f: dict, name: str) -> Path:
    folder = f["root"] / name
    shutil.copytree(f["model"], folder)
    return folder


def sft(f, out, data=None, model=None, *extra):
    return [
        "sft",
        "--model",
        str(model or f["model"]),
        "--data",
        str(data or f["sft"]),
        "--output",
        str(out),
        "--max-steps",
        "2",
        "--batch-size",
        "4",
        "--micro-batch-size",
        "4",
        "--eval-fraction",
        "0",
        "--save-every",
        "1",
        "--report-to",
        "none",
        *extra,
    ]


def grpo(f, out, reward="count_a", prompts=None, *extra):
    return [
        "grpo",
        "--policy",
        str(f["model"]),
        "--prompts",
        str(prompts or f["prompts"]),
        "--output",
        str(out),
        "--reward",
        f"{f['rules']}:{reward}",
        "--steps",
        "3",
        "--prompts-per-step",
        "2",
        "--group-size",
        "2",
        "--max-new-tokens",
        "6",
        "--save-every",
        "1",
        "--report-to",
        "none",
        *extra,
    ]


def ppo(f, out, *extra):
    return [
        "ppo",
        "--policy",
        str(f["model"]),
        "--prompts",
        str(f["prompts"]),
        "--output",
        str(out),
        "--reward",
        f"{f['rules']}:count_a",
        "--steps",
        "2",
        "--prompts-per-step",
        "4",
        "--minibatch",
        "4",
        "--max-new-tokens",
        "6",
        "--save-every",
        "1",
        "--report-to",
        "none",
        *extra,
    ]


def rm(f, out, rows, *extra):
    data = write_jsonl(f["root"] / f"rm-{out.name}.jsonl", rows)
    return [
        "rm",
        "--model",
        str(f["model"]),
        "--data",
        str(data),
        "--output",
        str(out),
        "--max-steps",
        "2",
        "--batch-size",
        "4",
        "--micro-batch-size",
        "4",
        "--eval-fraction",
        "0",
        "--report-to",
        "none",
        *extra,
    ]


def online_dpo(f, out, judge):
    return [
        "dpo",
        "--model",
        str(f["model"]),
        "--online",
        "--online-prompts",
        str(f["prompts"]),
        "--judge",
        f"{f['judges']}:{judge}",
        "--rounds",
        "1",
        "--prompts-per-round",
        "4",
        "--steps-per-round",
        "1",
        "--batch-size",
        "2",
        "--micro-batch-size",
        "2",
        "--max-new-tokens",
        "6",
        "--keep-truncated",
        "--output",
        str(out),
        "--report-to",
        "none",
    ]


def yaml_case(f, name: str, text: str) -> Path:
    path = f["root"] / f"{name}.yaml"
    path.write_text(text)
    return path


def cases(f: dict, run) -> list[tuple[str, list[str]]]:
    """(name, argv). ``run(argv)`` runs a preparatory command (for the resume cases)."""
    r, out = f["root"], lambda name: f["root"] / "runs" / name
    no_tok = copy_model(f, "no-tokenizer")
    for p in no_tok.glob("tokenizer*"):
        p.unlink()
    truncated = copy_model(f, "truncated")
    (truncated / "model.safetensors").write_bytes((truncated / "model.safetensors").read_bytes()[:2000])
    garbage = copy_model(f, "garbage-config")
    (garbage / "config.json").write_text("{oops")
    no_weights = copy_model(f, "no-weights")
    (no_weights / "model.safetensors").unlink()
    resumed = {}
    for name in ("ckpt-weights", "ckpt-optimizer", "ckpt-state"):
        run(sft(f, out(name)))
        ckpts = sorted(out(name).glob("checkpoint-*"))
        for c in ckpts:
            if name == "ckpt-weights":
                (c / "model.safetensors").write_bytes(b"garbage")
            elif name == "ckpt-optimizer":
                for p in list(c.glob("optimizer*")):
                    p.write_bytes(b"garbage")
            else:
                (c / "trainer_state.json").write_text("{oops")
        resumed[name] = sft(f, out(name), None, None, "--resume", "--max-steps", "4")  # steps left to train
    run(grpo(f, out("grpo-changed")))
    run(ppo(f, out("ppo-changed")))
    user = out("user-folder")
    (user / "final").mkdir(parents=True)
    (user / "config.yaml").write_text("mine: true\n")
    (user / "final" / "README.md").write_text("notes")
    (r / "a-file").write_text("x")
    bad_utf8 = r / "bad-utf8.jsonl"
    bad_utf8.write_bytes(b'{"prompt": "a", "completion": " b"}\n{"prompt": "caf\xe9", "completion": " x"}\n')
    empty = r / "empty.jsonl"
    empty.write_text("")
    return [
        ("model folder without tokenizer files", sft(f, out("m1"), None, no_tok)),
        ("truncated model.safetensors", sft(f, out("m2"), None, truncated)),
        ("garbage config.json", sft(f, out("m3"), None, garbage)),
        ("model folder without weights", sft(f, out("m4"), None, no_weights)),
        ("resume: every checkpoint's weights garbage", resumed["ckpt-weights"]),
        ("resume: every checkpoint's optimizer state garbage", resumed["ckpt-optimizer"]),
        ("resume: every trainer_state.json garbage", resumed["ckpt-state"]),
        (
            "resume GRPO with a changed learning rate",
            grpo(f, out("grpo-changed"), "count_a", None, "--resume", "--steps", "5", "--lr", "0.5"),
        ),
        (
            "resume PPO with a changed KL coefficient",
            ppo(f, out("ppo-changed"), "--resume", "--steps", "4", "--kl-coef", "0.5"),
        ),
        (
            "RM margin NaN",
            rm(
                f,
                out("rm1"),
                [{"prompt": "a", "chosen": "b c", "rejected": "d", "m": float("nan")}] * 8,
                "--margin-column",
                "m",
            ),
        ),
        (
            "RM margin negative",
            rm(f, out("rm2"), [{"prompt": "a", "chosen": "b c", "rejected": "d", "m": -2}] * 8, "--margin-column", "m"),
        ),
        (
            "RM ranking given as floats",
            rm(f, out("rm3"), [{"prompt": "a", "responses": ["b c", "d"], "ranking": [1.0, 0.0]}] * 8),
        ),
        ("RL prompt file empty", grpo(f, out("p1"), "count_a", empty)),
        (
            "RL prompt empty string",
            grpo(f, out("p2"), "count_a", write_jsonl(r / "p2.jsonl", [{"prompt": "", "answer": 1}] * 4)),
        ),
        (
            "RL messages without role",
            grpo(
                f, out("p3"), "count_a", write_jsonl(r / "p3.jsonl", [{"prompt": [{"content": "hi"}], "answer": 1}] * 4)
            ),
        ),
        (
            "RL answer column missing in one row",
            grpo(
                f,
                out("p4"),
                "needs_answer",
                write_jsonl(r / "p4.jsonl", [{"prompt": "a", "answer": 1}] * 3 + [{"prompt": "b"}]),
            ),
        ),
        (
            "reward file with a syntax error",
            [*grpo(f, out("f1")), "--reward", str(_write(r / "broken.py", "def f(:\n")) + ":f"],
        ),
        (
            "reward file with an import error",
            [*grpo(f, out("f2")), "--reward", str(_write(r / "imports.py", "import not_a_module_anywhere\n")) + ":f"],
        ),
        ("reward returns NaN", grpo(f, out("f3"), "nan")),
        ("reward returns strings", grpo(f, out("f4"), "text")),
        ("reward returns the wrong count", grpo(f, out("f5"), "short")),
        ("reward raises late in the run", grpo(f, out("f6"), "late_raise")),
        ("reward returns NaN late in the run", grpo(f, out("f7"), "late_nan")),
        ("judge returns NaN", online_dpo(f, out("j1"), "nan")),
        ("judge returns 2.0", online_dpo(f, out("j2"), "big")),
        ("judge raises", online_dpo(f, out("j3"), "boom")),
        ("judge returns words", online_dpo(f, out("j4"), "words")),
        ("SFT data not UTF-8", sft(f, out("d1"), bad_utf8)),
        ("SFT messages not a list", sft(f, out("d2"), write_jsonl(r / "d2.jsonl", [{"messages": "hi"}] * 4))),
        ("SFT unknown format", sft(f, out("d3"), write_jsonl(r / "d3.jsonl", [{"question": "a", "answer": "b"}] * 4))),
        (
            "SFT unknown role",
            sft(
                f,
                out("d4"),
                write_jsonl(
                    r / "d4.jsonl",
                    [
                        {
                            "messages": [
                                {"role": "user", "content": "a"},
                                {"role": "wizard", "content": "b"},
                                {"role": "assistant", "content": "c"},
                            ]
                        }
                    ]
                    * 4,
                ),
            ),
        ),
        ("SFT empty file", sft(f, out("d5"), empty)),
        ("--output is a file", sft(f, r / "a-file")),
        ("--overwrite on a folder tether did not write", sft(f, user, None, None, "--overwrite")),
        (
            "GRPO kl_estimator k4 (YAML)",
            [*grpo(f, out("y1")), "--config", str(yaml_case(f, "y1", "algo:\n  kl_estimator: k4\n"))],
        ),
        (
            "PPO critic layout 'weird' (YAML)",
            [*ppo(f, out("y2")), "--config", str(yaml_case(f, "y2", "roles:\n  critic_layout: weird\n"))],
        ),
        (
            "PPO best_mode median (YAML)",
            [*ppo(f, out("y3")), "--config", str(yaml_case(f, "y3", "run:\n  best_mode: median\n"))],
        ),
        (
            "DPO loss 'nope' (YAML)",
            [
                "dpo",
                "--model",
                str(f["model"]),
                "--data",
                str(f["prefs"]),
                "--output",
                str(out("y4")),
                "--max-steps",
                "1",
                "--batch-size",
                "4",
                "--micro-batch-size",
                "4",
                "--report-to",
                "none",
                "--config",
                str(yaml_case(f, "y4", "dpo:\n  loss: nope\n")),
            ],
        ),
        ("SFT dtype int8 (YAML)", [*sft(f, out("y5")), "--config", str(yaml_case(f, "y5", "model:\n  dtype: int8\n"))]),
    ]


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def classify(proc: subprocess.CompletedProcess, stage: str) -> str:
    if "Traceback" in proc.stderr:
        return "traceback"
    if proc.returncode == 0:
        return "accepted"
    last = (proc.stderr.strip().splitlines() or [""])[-1]
    return "clear" if last.startswith(f"tether {stage}: error:") else "unclear"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=sys.executable, help="Interpreter whose tether to measure.")
    args = parser.parse_args()
    # run from the interpreter's checkout (…/checkout/.venv/bin/python): `python -m` imports from the working folder
    checkout = Path(args.python).absolute().parents[2] if ".venv" in Path(args.python).parts else Path.cwd()
    checkout = checkout if (checkout / "tether").is_dir() else Path.cwd()
    run = lambda argv: subprocess.run(
        [args.python, "-m", "tether", *argv], capture_output=True, text=True, timeout=600, cwd=checkout
    )
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        f = fixtures(root)
        results = []
        for name, argv in cases(f, run):
            proc = run(argv)
            verdict = classify(proc, argv[0])
            last = (proc.stderr.strip().splitlines() or [""])[-1][:110]
            results.append((name, verdict, last))
    for name, verdict, last in results:
        print(f"{verdict:9s}  {name:48s}  {last if verdict != 'accepted' else ''}")
    counts = {v: sum(r[1] == v for r in results) for v in ("clear", "unclear", "traceback", "accepted")}
    print(
        f"{counts['clear']} of {len(results)} clear; "
        + ", ".join(f"{v} {n}" for v, n in counts.items() if v != "clear")
    )


if __name__ == "__main__":
    main()
