"""Command line: `tether <stage> [options]`. Each stage's options come from its config dataclasses."""
from __future__ import annotations

import argparse
import logging
import os
import sys

from tether.config import ConfigError, add_config_arguments, build_config, config_from_args, load_yaml
from tether.data.records import DataError

STAGES = {
    "sft": "Supervised fine-tuning on prompt/completion, messages or text data.",
    "data": "Inspect data: `tether data check FILE --model DIR` shows counts and the loss mask.",
}


def _quiet_libraries() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")


def build_parser() -> argparse.ArgumentParser:
    from tether.stages.sft import SFTConfig

    parser = argparse.ArgumentParser(prog="tether", description="Post-training for language models, with a ground-truth lab.")
    sub = parser.add_subparsers(dest="stage", metavar="STAGE", title="stages",
                                description="\n".join(f"{k:6s} {v}" for k, v in STAGES.items()))
    sft = sub.add_parser("sft", help=STAGES["sft"], description=STAGES["sft"])
    sft.add_argument("--demo", action="store_true",
                     help="Run the built-in demo: writes its own data and a tiny model, needs no files.")
    add_config_arguments(sft, SFTConfig)

    data = sub.add_parser("data", help=STAGES["data"], description=STAGES["data"])
    data_sub = data.add_subparsers(dest="data_command", metavar="COMMAND")
    check = data_sub.add_parser("check", help="Counts, drops and one rendered example with its loss mask.")
    check.add_argument("file", help="Data file or datasets folder.")
    check.add_argument("--model", required=True, help="Model or tokenizer folder whose tokenizer (and chat template) to use.")
    check.add_argument("--columns", default="", help="Rename columns, NAME=SOURCE,...")
    check.add_argument("--split", default="train", help="Split of a datasets folder.")
    check.add_argument("--max-length", type=int, default=1024, help="Longest example in tokens.")
    check.add_argument("--train-on-prompt", action="store_true", help="Show the mask with prompt tokens trained.")
    check.add_argument("--strict", action="store_true", help="Make dropped examples errors.")
    check.add_argument("--index", type=int, default=0, help="Which kept example to render.")
    return parser


def run_sft_command(args) -> None:
    from tether.stages.sft import SFTConfig, run_sft

    if not args.demo:
        run_sft(config_from_args(SFTConfig, args))
        return
    from tether import demo

    overrides = {k: v for k, v in vars(args).items() if "." in k}
    output = overrides.setdefault("train.output", "runs/demo-sft")
    if not overrides.get("train.resume"):
        overrides.setdefault("train.overwrite", True)  # the demo is re-runnable as is
    inputs = demo.write_demo_inputs(os.path.join(output, "..", os.path.basename(output) + "-inputs"))
    file_values = load_yaml(args.config) if args.config else {}
    cfg = build_config(SFTConfig, file_values, {**inputs, **overrides}, source="demo")
    summary = run_sft(cfg)
    show_demo_generations(cfg, summary)


def show_demo_generations(cfg, summary) -> None:
    import json
    from pathlib import Path

    from tether import demo
    from tether.generation import generate_texts
    from tether.models import load_model, load_tokenizer
    from tether.train.logger import console

    final = Path(cfg.train.output) / "final"
    tokenizer = load_tokenizer(final)
    model = load_model(final, tokenizer)
    rows = [json.loads(line) for line in Path(cfg.data.eval_path).read_text().splitlines()]
    completions = generate_texts(model, tokenizer, [r["prompt"] for r in rows], max_new_tokens=40)
    accuracy = demo.answer_accuracy(completions, [r["answer"] for r in rows])
    with (Path(cfg.train.output) / "samples.jsonl").open("w") as f:
        for r, c in zip(rows, completions):
            f.write(json.dumps({"prompt": r["prompt"], "completion": c, "answer": r["answer"]}) + "\n")
    for r, c in list(zip(rows, completions))[:3]:
        console.print(f"  {r['prompt'].strip()!r} -> {c!r}")
    console.print(f"held-out loss {summary.get('eval/loss', float('nan')):.3f}, greedy answer accuracy "
                  f"{accuracy:.1%} on {len(rows)} held-out problems (samples.jsonl)")


def run_data_check(args) -> None:
    from tether.data.records import read_records
    from tether.data.sft import tokenize_records
    from tether.models import load_tokenizer
    from tether.train.logger import console

    tokenizer = load_tokenizer(args.model)
    records = read_records(args.file, args.columns, args.split)
    examples, report = tokenize_records(records, tokenizer, args.max_length, args.train_on_prompt, args.strict, args.file)
    console.print(report.summary())
    ex = examples[min(args.index, len(examples) - 1)]
    console.print(f"\nexample from {ex.where}: {len(ex.input_ids)} tokens, {sum(ex.loss_mask)} trained "
                  "(trained tokens are between ⟦ ⟧ and green)")
    plain, rich_text = [], []
    from rich.markup import escape
    from rich.text import Text

    text = Text()
    for token_id, trained in zip(ex.input_ids, ex.loss_mask):
        piece = tokenizer.decode([token_id])
        text.append(piece, style="bold green" if trained else "dim")
    # Brackets mark trained runs so the mask is visible without colour too.
    out, in_run = [], False
    for token_id, trained in zip(ex.input_ids, ex.loss_mask):
        if trained and not in_run:
            out.append("⟦")
        if not trained and in_run:
            out.append("⟧")
        in_run = bool(trained)
        out.append(tokenizer.decode([token_id]))
    if in_run:
        out.append("⟧")
    console.print(escape("".join(out)), highlight=False)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.stage is None:
        parser.print_help()
        return 0
    _quiet_libraries()
    try:
        if args.stage == "sft":
            run_sft_command(args)
        elif args.stage == "data":
            if args.data_command != "check":
                parser.parse_args(["data", "--help"])
            run_data_check(args)
    except (ConfigError, DataError) as exc:
        print(f"tether {args.stage}: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
