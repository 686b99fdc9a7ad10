"""The parser: `tether --help`'s commands (a row of the stage table, tether.config.STAGES, per stage; the tools of
tether/cli/tools.py and tether/cli/data.py), each with the flags its config declares; other projects' flag names
read as their YAML keys are; one line per unknown flag."""

from __future__ import annotations

import argparse
import sys

from tether.cli.data import DATA
from tether.cli.tools import TOOLS, Command
from tether.config import STAGES, add_config_arguments


def build_parser() -> argparse.ArgumentParser:
    """A subcommand per stage (its flags from its config class), then the tools (theirs from their CommandConfig).
    Only settings are imported: neither torch nor transformers (bench/startup.py times it)."""
    from importlib.metadata import PackageNotFoundError, version

    parser = argparse.ArgumentParser(
        prog="tether", description="Post-training for language models, with a ground-truth lab."
    )
    try:
        installed = version("tether")
    except PackageNotFoundError:  # a source tree on PYTHONPATH, not installed
        installed = "(not installed)"
    parser.add_argument("--version", action="version", version=f"tether {installed}")
    sub = parser.add_subparsers(dest="stage", metavar="STAGE", title="stages")  # each listed once, by its help
    for row in STAGES:
        command = sub.add_parser(row.name, help=row.help, description=row.help + row.details)
        if row.name == "sft":
            command.add_argument(
                "--demo",
                action="store_true",
                help="Run the built-in demo: writes its own data and a tiny model, needs no files.",
            )
        add_config_arguments(command, row.config_class())
    add_commands(sub, (*TOOLS, DATA))
    return parser


def add_commands(sub, commands: tuple[Command, ...]) -> None:
    """A subparser per command, with its config's flags; a group of commands gets its own (``data check``...)."""
    for command in commands:
        parser = sub.add_parser(command.name, help=command.help, description=command.help + command.details)
        if command.config is not None:
            add_config_arguments(parser, command.config)
        if command.commands:
            nested = parser.add_subparsers(dest=f"{command.name}_command", metavar="COMMAND")
            add_commands(nested, command.commands)


def exit_on_unknown_arguments(parser: argparse.ArgumentParser, args, unknown: list[str]) -> None:
    """Exit with one line per unknown flag: what it means in tether (tether/compat/table.py), or the flag it most
    likely meant — without the whole usage, which buries the line that matters."""
    import difflib

    from tether.compat import knows

    stage = parser
    for action in parser._actions:  # the stage's own parser, whose flags the user was writing
        if isinstance(action, argparse._SubParsersAction) and args.stage in action.choices:
            stage = action.choices[args.stage]
    options = [o for a in stage._actions for o in a.option_strings if o.startswith("--")]
    lines = []
    for i, item in enumerate(unknown):
        name = item.split("=", 1)[0]
        if not name.startswith("-"):
            if i == 0 or not unknown[i - 1].startswith("-") or "=" in unknown[i - 1]:
                lines.append(f"{item}: a value with no flag before it")
            continue  # else the value of the unknown flag before it
        if knows(name.lstrip("-").replace("-", "_")):
            lines.append(f"{name}: not a setting of tether {args.stage} (tether/compat/ lists where it applies)")
            continue
        dashed = "--" + name.lstrip("-").replace("_", "-")
        close = difflib.get_close_matches(dashed, options, n=1, cutoff=0.7)
        lines.append(f"{name}: unknown" + (f" (did you mean {close[0]}?)" if close else ""))
    print(f"{stage.prog}: error: unrecognized arguments\n  " + "\n  ".join(lines), file=sys.stderr)
    print(f"(tether {args.stage} --help lists every flag)", file=sys.stderr)
    sys.exit(2)


def yaml_scalar(text: str):
    """A command-line value as YAML would read it (true, 3, 1e-5, [a, b]); anything else stays a string."""
    import yaml

    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    if isinstance(value, str):
        try:
            return float(value) if any(c in value.lower() for c in ".e") else int(value)
        except ValueError:
            return value
    return value


def foreign_flags(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[list[str], dict]:
    """(argv with tether's flags, {key: value} of other projects' flags): ``--max_steps 3`` is tether's --max-steps
    written with underscores; ``--learning_rate 1e-5`` or ``--bf16`` are TRL's names (tether/compat/table.py), read as
    flat keys of a YAML file are. Anything else is left for argparse to judge."""
    command = command_parser(parser, argv)
    if command is None:
        return argv, {}
    from tether.compat import knows

    options = {o for a in command._actions for o in a.option_strings}
    translated = "--config" in options  # a stage built from a config; the tools (data ...) read only their flags
    out, foreign = [], {}
    i = 0
    while i < len(argv):
        item = argv[i]
        i += 1
        name, eq, value = item.partition("=")
        if not name.startswith("--") or name in options:
            out.append(item)
            continue
        dashed = "--" + name[2:].replace("_", "-")
        key = name[2:].replace("-", "_")
        if dashed in options and not (translated and knows(key)):  # its own flag, written with underscores
            out.append(dashed + eq + value)
        elif translated and knows(key):
            if not eq:
                takes = i < len(argv) and not argv[i].startswith("--")
                value, i = (argv[i], i + 1) if takes else ("true", i)
            foreign[key] = yaml_scalar(value)
        else:
            out.append(item)
    return out, foreign


def command_parser(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.ArgumentParser | None:
    """The parser of the command argv names, down through nested commands (``data prm-labels``): its flags are
    the ones the user is writing, and they win over other projects' names."""
    command = None
    for word in argv:
        choices = next(
            (a.choices for a in (command or parser)._actions if isinstance(a, argparse._SubParsersAction)), None
        )
        if not choices or word not in choices:
            break
        command = choices[word]
    return command


# Commands people type from other projects' vocabularies, and the tether command that does it
POINTERS = {
    "kto": "tether dpo --loss kto (KTO is a loss of the DPO stage: unpaired true/false labels, docs/data.md)",
    "orpo": "tether dpo --loss orpo",
    "simpo": "tether dpo --loss simpo",
    "ipo": "tether dpo --loss ipo",
    "demo": "tether sft --demo (a two-minute SFT on a built-in task), or tether lab for the whole pipeline",
    "reward": "tether rm",
    "train": "tether sft, rm, dpo, ppo or grpo: one command per stage (a LLaMA-Factory YAML's stage: names it)",
    "rloo": "tether grpo --recipe rloo",
    "dapo": "tether grpo --recipe dapo",
    "gspo": "tether grpo --recipe gspo",
}
