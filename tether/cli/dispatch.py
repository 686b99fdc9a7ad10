"""`tether <command>`: parse, run the command, and end with its exit code: 0, or 2 with one line for a ConfigError
or a DataError (no traceback), 1 with the worker's own words for a WorkerError, 130 with the last step and checkpoint on Ctrl-C. A stage's command builds its config
from flags and YAML (its row of the stage table, tether.config.STAGES, names the class) and runs it through
``run_stage``, as the Python API does; a tool's builds its CommandConfig from flags and calls its function."""

from __future__ import annotations

import os
import sys

from tether import api
from tether.cli.data import DATA
from tether.cli.parser import POINTERS, build_parser, exit_on_unknown_arguments, foreign_flags
from tether.cli.tools import TOOLS
from tether.config import STAGES, ConfigError, build_config, config_from_args, load_yaml, stage
from tether.errors import DataError, WorkerError

COMMANDS = {command.name: command for command in (*TOOLS, DATA)}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in POINTERS:
        print(f"tether {argv[0]}: there is no such command; use {POINTERS[argv[0]]}", file=sys.stderr)
        return 2
    argv, foreign = foreign_flags(parser, argv)
    args, unknown = parser.parse_known_args(argv)
    args.foreign_flags = foreign
    if unknown:
        exit_on_unknown_arguments(parser, args, unknown)
    if args.stage is None:
        parser.print_help()
        return 0
    from tether.console import quiet_libraries

    quiet_libraries()
    try:
        run_command(parser, args)
    except (ConfigError, DataError) as exc:
        print(f"tether {args.stage}: error: {exc}", file=sys.stderr)
        return 2
    except WorkerError as exc:
        print(f"tether {args.stage}: stopped: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(interrupted_line(args), file=sys.stderr)
        return 130
    finally:
        _close_process_group()
    return 0


def run_command(parser, args) -> None:
    """The stage's run (sft --demo: the demo), or the tool's function on its config (a group's: its command's)."""
    if args.stage in {row.name for row in STAGES}:
        if getattr(args, "demo", False):
            return run_sft_demo(args)
        row = stage(args.stage)
        api.run_stage(row.name, config_from_args(row.config_class(), args))
        return
    command = COMMANDS[args.stage]
    if command.commands:
        chosen = {c.name: c for c in command.commands}.get(getattr(args, f"{command.name}_command"))
        if chosen is None:
            parser.parse_args([command.name, "--help"])  # prints the group's commands and exits
        command = chosen
    command.run(config_from_args(command.config, args) if command.config else None)


def run_sft_demo(args) -> None:
    """`tether sft --demo`: its own data and tiny model beside the run folder, any flag or YAML value on top; then
    a few greedy answers and their accuracy."""
    from tether.lab import demo

    overrides = {k: v for k, v in vars(args).items() if "." in k}
    output = overrides.setdefault("train.output", "runs/demo-sft")
    if not overrides.get("train.resume"):
        overrides.setdefault("train.overwrite", True)  # the demo is re-runnable as is
    inputs = demo.write_demo_inputs(os.path.join(output, "..", os.path.basename(output) + "-inputs"))
    file_values = load_yaml(args.config) if args.config else {}
    cfg = build_config(stage("sft").config_class(), file_values, {**inputs, **overrides}, source="demo")
    summary = api.run_stage("sft", cfg)
    show_demo_generations(cfg, summary)


def show_demo_generations(cfg, summary) -> None:
    import json
    from pathlib import Path

    from tether.console import console
    from tether.lab import demo
    from tether.models.lm import load_model, load_tokenizer
    from tether.rollout.texts import generate_texts

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
    console.print(
        f"held-out loss {summary.get('eval/loss', float('nan')):.3f}, greedy answer accuracy "
        f"{accuracy:.1%} on {len(rows)} held-out problems (samples.jsonl)"
    )


def interrupted_line(args) -> str:
    """Ctrl-C's one line, instead of a traceback: the last step logged, the last checkpoint, how to go on."""
    import json
    from pathlib import Path

    output = vars(args).get("train.output")
    if output is None and getattr(args, "config", None):
        try:
            values = load_yaml(args.config)
        except ConfigError:
            values = {}
        output = (values.get("train") or {}).get("output") or values.get("output") or values.get("output_dir")
    if not output or not Path(output).is_dir():
        return f"tether {args.stage}: interrupted before the run folder was written; nothing to resume"
    out = Path(output)
    step = 0
    metrics = out / "metrics.jsonl"
    if metrics.is_file():
        lines = [line for line in metrics.read_text().splitlines() if line.strip()]
        if lines:
            step = json.loads(lines[-1]).get("step", len(lines))
    saved = sorted(int(p.name.split("-")[1]) for p in out.glob("checkpoint-*") if p.name.split("-")[1].isdigit())
    if not saved:
        return (
            f"tether {args.stage}: interrupted at step {step}; no checkpoint was saved yet (--save-every), so the "
            "same command with --overwrite starts over"
        )
    return (
        f"tether {args.stage}: interrupted at step {step}; the last checkpoint is step {saved[-1]} in {out}; "
        "the same command with --resume continues from it"
    )


def _close_process_group() -> None:
    """Shut down torch.distributed's process group (every stage ends with a barrier, so no process still uses it)
    and remember that this process ran distributed, so that run() can skip the interpreter's shutdown. No barrier
    here: after an error on one process, the others may be waiting in another collective."""
    global _RAN_DISTRIBUTED
    if "torch" not in sys.modules:
        return
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        _RAN_DISTRIBUTED = True
        dist.destroy_process_group()


_RAN_DISTRIBUTED = False


def run() -> None:
    """The `tether` command and `python -m tether`: main(), then exit. A process that ran distributed leaves
    without the interpreter's shutdown (its files are closed, its trackers finished, its output flushed): there,
    gloo's C++ threads can still hold tensors whose release needs the interpreter being torn down, and a finished
    run then dies of SIGABRT ("terminate called without an active exception"): measured, 1 of 30 launches of a
    2-process GRPO run (and 2 of 3 CI runs had one such launch) with sys.exit, 0 of 30 with this exit."""
    code = main()
    if _RAN_DISTRIBUTED:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
