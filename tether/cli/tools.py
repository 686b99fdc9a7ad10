"""The tool commands: `tether lab`, `eval`, `bench`, `diagnose`, `report`, `recipes`. Each declares its flags once,
as a CommandConfig of sections (tether/config.py): its own small section, and the shared ones where a flag means
what it means to a stage (--model and the chat template from the model section, --data from the data section)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tether.config import CommandConfig, ConfigError, Section, option
from tether.errors import DataError
from tether.sections import DataSection, ModelSection

CHAT_MODEL = ("path", "chat_template", "chat_template_kwargs")  # what a tool that renders takes of the model section


@dataclass(frozen=True)
class Command:
    """A row of the command line's table of tools: its name, one-line help (``details``: the rest of its --help),
    the function that runs it on its built config, and its flags (``config``); or a group of ``commands``."""

    name: str
    help: str
    run: Callable | None = None
    config: type | None = None
    details: str = ""
    commands: tuple = ()


@dataclass(frozen=True)
class DecodingSection(Section):
    """How a tool samples: `tether eval`'s completions, `tether data prm-labels`' continuations."""

    max_new_tokens: int = option(96, "Most tokens generated per completion.")
    temperature: float = option(0.0, "Sampling temperature; 0 = greedy.")
    top_p: float = option(1.0, "Nucleus sampling threshold when sampling.")
    samples: int = option(1, "Completions per prompt (data prm-labels: continuations per step, Math-Shepherd's N).")
    seed: int = option(0, "Sampling seed (eval: also the seed of the world whose held-out split it reads by default).")

    def check(self):
        if self.samples < 1 or self.temperature < 0:
            raise ConfigError(f"samples={self.samples} must be >= 1 and temperature={self.temperature} >= 0")


@dataclass(frozen=True)
class FiguresSection(Section):
    """Where a tool's figures go besides the terminal."""

    json: str = option("", "Also write the figures to this JSON file.")


@dataclass(frozen=True)
class LabSection(Section):
    """Where the lab runs, how big, from which seed."""

    output: str = option("runs/lab", "Lab run folder; stages already done there with the same recipe are reused.")
    quick: bool = option(False, "A smaller world and model (about a minute); used by the tests.")
    multimodal: bool = option(
        False,
        "The visual world instead (tether/lab/visual.py): a tiny vision-language model from scratch, its reward "
        "models, GRPO, DPO and multimodal reward hacking, over seeds --seed and --seed + 1, into OUTPUT/visual "
        "(about 7 minutes on 2 cores; --quick: a smaller one).",
    )
    seed: int = option(0, "Seed of the world, the model and every stage.")
    fresh: bool = option(False, "Redo every stage, ignoring cached outputs.")
    workers: int = option(
        0,
        "Processes that run the stages whose inputs are ready side by side (0: one per core; 1: one stage at a "
        "time, in this process). The figures do not depend on it.",
    )
    set: tuple = option(
        (),
        "FIELD=VALUE: another value for a LabConfig field (tether/lab/settings.py; repeatable), e.g. "
        "pretrain_steps=8000. Stages whose recipe it changes are computed again; the others are reused.",
    )

    def check(self):
        if self.workers < 0:
            raise ConfigError(f"--workers must be 0 (one per core) or a number of processes, got {self.workers}")


@dataclass(frozen=True)
class LabCommand(CommandConfig):
    lab: LabSection = LabSection()


def run_lab_command(cfg: LabCommand) -> None:
    from dataclasses import replace

    from tether.lab.pipeline import run_lab
    from tether.lab.schedule import usable_cores
    from tether.lab.settings import QUICK, LabConfig, lab_settings

    lab = cfg.lab
    if lab.multimodal:
        from pathlib import Path

        from tether.lab.visual import QUICK_VISUAL, VisualLabConfig, run_visual_lab

        if lab.set:
            raise ConfigError("--set changes the text lab's settings; the visual lab's are VisualLabConfig's")
        run_visual_lab(
            Path(lab.output) / "visual", (lab.seed, lab.seed + 1), QUICK_VISUAL if lab.quick else VisualLabConfig()
        )
        return
    settings = replace(QUICK if lab.quick else LabConfig(), seed=lab.seed, **lab_settings(list(lab.set)))
    run_lab(lab.output, settings, fresh=lab.fresh, workers=lab.workers or usable_cores())


@dataclass(frozen=True)
class EvalSection(Section):
    """What `tether eval` measures, against what, and where the figures go."""

    task: str = option("lab-arith", "Which lab task: lab-arith or lab-assist.", choices=("lab-arith", "lab-assist"))
    reference: str = option("", "Reference model folder: assist then reports the gold win rate against it.")
    data: str = option(
        "",
        "Evaluation file (arith_eval.jsonl / assist_eval.jsonl); default: the default world's held-out split, "
        "rebuilt from --seed.",
    )
    limit: int = option(0, "Evaluate only the first N prompts (0 = all).")
    output: str = option(
        "", "JSON file for the figures; empty: printed only (nothing is written beside the model folder)."
    )


@dataclass(frozen=True)
class EvalCommand(CommandConfig):
    model: ModelSection = ModelSection()
    eval: EvalSection = EvalSection()
    decoding: DecodingSection = DecodingSection()
    TAKES = {"model": CHAT_MODEL}
    REQUIRED = ("model.path", "eval.task")


def eval_rows(cfg: EvalCommand) -> list[dict]:
    """The prompts `tether eval` measures: --data's rows (each with the fields the task's gold reads), or the
    default world's held-out split; the first --limit of them."""
    from tether.lab.world import WorldConfig, default_eval_rows

    task = cfg.eval.task
    if cfg.eval.data:
        from tether.data.prompts import prompt_rows

        rows = prompt_rows(cfg.eval.data)  # read and checked as the online stages read prompts (same columns each)
        need = "question" if task == "lab-arith" else "topic"  # what the task's gold reads
        if need not in rows[0]:  # every row has the first one's columns (prompt_rows): the first record is named
            from tether.data.records import read_records

            where = read_records(cfg.eval.data)[0].where
            raise DataError(f"{where}: {task} rows need 'prompt' and '{need}'; the row has {sorted(rows[0])}")
    else:
        rows = default_eval_rows(task, WorldConfig(seed=cfg.decoding.seed))
    return rows[: cfg.eval.limit] if cfg.eval.limit else rows


def run_eval_command(cfg: EvalCommand) -> None:
    """The model (and --reference, rendered with the same chat template and options) on a lab task: the figures
    as JSON on stdout, a reader's summary on stderr."""
    import json
    from dataclasses import asdict

    from tether.console import console
    from tether.lab.evaluate import Decoding, evaluate_task
    from tether.models.chat import use_chat
    from tether.models.lm import load_model, load_stage_tokenizer, load_tokenizer

    rows = eval_rows(cfg)
    tokenizer = load_stage_tokenizer(cfg.model)
    model = load_model(cfg.model.path, tokenizer)
    ref_model = ref_tok = None
    if cfg.eval.reference:
        ref_tok = use_chat(load_tokenizer(cfg.eval.reference), cfg.model.chat_template, cfg.model.chat_template_kwargs)
        ref_model = load_model(cfg.eval.reference, ref_tok)
    decoding = Decoding(**asdict(cfg.decoding))
    figures = evaluate_task(model, tokenizer, cfg.eval.task, rows, decoding, ref_model, ref_tok)
    figures["model"] = str(cfg.model.path)
    figures["reference"] = cfg.eval.reference or None
    console.print(f"tether eval: {cfg.eval.task} on {len(rows)} prompt(s), {cfg.model.path}")
    for key, value in figures.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            console.print(f"  {key:<32} {value:.4g}")
    print(json.dumps(figures, indent=2))
    if cfg.eval.output:
        Path(cfg.eval.output).write_text(json.dumps(figures, indent=2))
        console.print(f"written to {cfg.eval.output}")


@dataclass(frozen=True)
class BenchSection(Section):
    """What `tether bench` times, and how often."""

    models: str = option("lab,29m", "Model sizes, comma-separated: lab (the lab's Llama), 29m.")
    precisions: str = option("fp32,bf16", "fp32, bf16 (weights and activations in bf16).")
    batch: int = option(8, "Rows per training batch and per generate() call.")
    length: int = option(256, "Tokens per training row (prompts: a quarter of it).")
    new_tokens: int = option(32, "Tokens generated per row.")
    repeats: int = option(5, "Timed runs per phase (the median is reported).")
    matmul_size: int = option(1024, "Side of the square matmuls of the peak.")
    compile: bool = option(
        False, "Also time forward + backward under torch.compile: the compilation, the steady step, the pay-back."
    )

    def check(self):
        from tether.diagnostics.bench import PRECISIONS, SIZES  # the table read when the section is built

        for name, allowed in (("models", tuple(SIZES)), ("precisions", PRECISIONS)):
            unknown = [v for v in getattr(self, name).split(",") if v not in allowed]
            if unknown:
                shown = ", ".join(v or "''" for v in unknown)
                verb = "is" if len(unknown) == 1 else "are"
                raise ConfigError(f"{name}: {shown} {verb} not one of {', '.join(allowed)}")


@dataclass(frozen=True)
class BenchCommand(CommandConfig):
    model: ModelSection = ModelSection()
    data: DataSection = DataSection()
    bench: BenchSection = BenchSection()
    figures: FiguresSection = FiguresSection()
    TAKES = {"model": ("path",), "data": ("path",)}


def run_bench_command(cfg: BenchCommand) -> None:
    import json

    from tether.diagnostics.bench import print_bench, run_bench

    b = cfg.bench
    result = run_bench(
        tuple(b.models.split(",")),
        tuple(b.precisions.split(",")),
        b.batch,
        b.length,
        b.new_tokens,
        b.repeats,
        b.matmul_size,
        cfg.data.path,
        cfg.model.path,
        b.compile,
    )
    print_bench(result)
    if cfg.figures.json:
        Path(cfg.figures.json).write_text(json.dumps(result, indent=2))


@dataclass(frozen=True)
class DiagnoseSection(Section):
    """Which run, which monitor settings."""

    run: str = option("", "Run folder with metrics.jsonl (and samples.jsonl).", flag="run")
    set: tuple = option(
        (), "NAME=VALUE: another monitor setting, e.g. --set task_drop=0.3 (names in docs/monitors.md; repeatable)."
    )
    write: bool = option(False, "Write the alarms to RUN/alarms.jsonl (replacing it).")


@dataclass(frozen=True)
class DiagnoseCommand(CommandConfig):
    diagnose: DiagnoseSection = DiagnoseSection()


def monitor_settings(items: tuple[str, ...]):
    """--set NAME=VALUE items as MonitorSettings, each value read as its default is typed (a tuple: A,B,...); the
    settings' ranges are MonitorSettings' own checks."""
    import dataclasses

    from tether.diagnostics.monitors import MonitorSettings

    fields = {f.name: f for f in dataclasses.fields(MonitorSettings)}
    values = {}
    for item in items:
        name, _, raw = item.partition("=")
        if name not in fields:
            raise ConfigError(f"--set {item}: no monitor setting {name!r}; settings are {sorted(fields)}")
        values[name] = setting_from_text(name, fields[name].default, raw)
    return MonitorSettings(**values)


def setting_from_text(name: str, default, raw: str):
    """``raw`` (the text after --set NAME=) as ``default`` is typed: true/false for a bool (bool("false") is True), a
    whole number for an int, a finite number for a float, A,B,... for a tuple, else the text."""
    import math

    if isinstance(default, tuple):
        return tuple(raw.split(","))
    if isinstance(default, bool):
        if raw.lower() not in ("true", "false"):
            raise ConfigError(f"--set {name}={raw}: {name} takes true or false")
        return raw.lower() == "true"
    if isinstance(default, (int, float)):
        kind = int if isinstance(default, int) else float
        try:
            value = kind(raw)
        except ValueError:
            value = math.nan
        if not math.isfinite(value):
            raise ConfigError(f"--set {name}={raw}: {name} takes {'a whole number' if kind is int else 'a number'}")
        return value
    return raw


def run_diagnose_command(cfg: DiagnoseCommand) -> None:
    import json

    from tether.diagnostics.watch import MONITORS, TRUSTED_MONITORS, check_all, format_alarm, read_jsonl

    run = Path(cfg.diagnose.run)
    if not (run / "metrics.jsonl").is_file():
        raise ConfigError(f"{run}: no metrics.jsonl (is it a tether run folder?)")
    metrics, samples = read_jsonl(run / "metrics.jsonl"), read_jsonl(run / "samples.jsonl")
    alarms = check_all(metrics, samples, monitor_settings(cfg.diagnose.set))
    print(
        f"{len(MONITORS)} monitors on {len(metrics)} step(s) of metrics.jsonl and {len(samples)} sample(s) of "
        f"samples.jsonl: {', '.join(m.__name__ for m in MONITORS)} (docs/monitors.md says what each watches)"
    )
    for alarm in alarms:
        print(format_alarm(alarm))
    trusted = sorted({a.monitor for a in alarms} & {m.__name__ for m in TRUSTED_MONITORS})
    print(f"trusted alarms (they read a trusted check): {', '.join(trusted) or 'none'}")
    live = read_jsonl(run / "alarms.jsonl")
    if (run / "alarms.jsonl").is_file() and not cfg.diagnose.set:
        same = [(a["monitor"], a["step"]) for a in live] == [(a.monitor, a.step) for a in alarms]
        print(
            f"{len(alarms)} alarm(s); the live alarms.jsonl has {len(live)}: " + ("the same" if same else "they differ")
        )
    else:
        print(f"{len(alarms)} alarm(s)")
    if cfg.diagnose.write:
        (run / "alarms.jsonl").write_text("".join(json.dumps(a.as_dict()) + "\n" for a in alarms))


@dataclass(frozen=True)
class ReportSection(Section):
    """Which runs, and the page to write."""

    runs: list = option([], "Run folders (each with metrics.jsonl).", flag="runs")
    output: str = option("report.html", "The HTML file to write.")


@dataclass(frozen=True)
class ReportCommand(CommandConfig):
    report: ReportSection = ReportSection()


def run_report_command(cfg: ReportCommand) -> None:
    from tether.diagnostics.report import write_report

    missing = [r for r in cfg.report.runs if not (Path(r) / "metrics.jsonl").is_file()]
    if missing:
        raise ConfigError(f"not a run folder (no metrics.jsonl): {', '.join(missing)}")
    print(f"report: {write_report(cfg.report.runs, cfg.report.output)}")


def print_recipes(_cfg=None) -> None:
    from tether.stages.grpo_recipes import RECIPES

    for name, recipe in RECIPES.items():
        print(f"{name}\n  {recipe.summary}\n  {recipe.equations}")
        print("  settings: " + ", ".join(f"{k}={v}" for k, v in recipe.settings.items()))
        print(f"  source: {recipe.sources}\n")


TOOLS = (  # after the stages, in the order `tether --help` lists them; `data` comes from tether/cli/data.py
    Command(
        "diagnose",
        "Re-run the reward-hacking monitors on a finished (or running) online run: `tether diagnose RUN_DIR`.",
        run_diagnose_command,
        DiagnoseCommand,
        " Monitors, thresholds and windows: docs/monitors.md.",
    ),
    Command(
        "report",
        "One self-contained HTML report of one or several runs: `tether report RUN [RUN ...] --output report.html`.",
        run_report_command,
        ReportCommand,
    ),
    Command("recipes", "List the group-family recipes with their equations, settings and sources.", print_recipes),
    Command(
        "lab",
        "The offline lab: build the world, pretrain a tiny model, SFT it, measure against gold.",
        run_lab_command,
        LabCommand,
    ),
    Command(
        "eval",
        "Measure a model on a lab task against gold: `tether eval --model DIR --task lab-arith`.",
        run_eval_command,
        EvalCommand,
    ),
    Command(
        "bench",
        "Where a step's time goes on this machine: matmul peak, each phase's time and share of it, padding.",
        run_bench_command,
        BenchCommand,
        " docs/performance.md. --data with --model: the padding of that file's micro-batches.",
    ),
)
