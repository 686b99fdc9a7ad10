"""Command line: `tether <stage> [options]`. Each stage's options come from its config dataclasses."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from tether.api import run_stage
from tether.config import ConfigError, add_config_arguments, build_config, config_from_args, load_yaml
from tether.data.records import DataError

STAGES = {
    "lab": "The offline lab: build the world, pretrain a tiny model, SFT it, measure against gold.",
    "eval": "Measure a model on a lab task against gold: `tether eval --model DIR --task lab-arith`.",
    "sft": "Supervised fine-tuning on prompt/completion, messages or text data.",
    "rm": "Reward model from preference pairs or ranked lists, with bias probes and normalisation.",
    "prm": "Process reward model from step-labelled solutions: a score per step (step accuracy, AUROC, first wrong step).",
    "ppo": "PPO with a critic, a reward model and/or reward functions (or an environment) and a KL-tied reference.",
    "grpo": "The group family (GRPO, Dr. GRPO, DAPO, GSPO, RLOO, REINFORCE++): `tether grpo --recipe dapo ...`.",
    "dpo": "The direct-preference family (DPO, cDPO, robust, IPO, hinge, SimPO, ORPO, β-DPO, listwise, KTO), offline or --online.",
    "diagnose": "Re-run the reward-hacking monitors on a finished (or running) online run: `tether diagnose RUN_DIR`.",
    "report": "One self-contained HTML report of one or several runs: `tether report RUN [RUN ...] --output report.html`.",
    "recipes": "List the group-family recipes with their equations, settings and sources.",
    "bench": "Where a step's time goes on this machine: matmul peak, each phase's time and share of it, padding.",
    "data": "Data tools: `check` (counts, loss mask), `agreement` (annotator κ), `filter` (by agreement, to majority labels).",
}


def build_parser() -> argparse.ArgumentParser:
    from tether.stages.ppo_config import PPOConfig
    from tether.stages.rm_config import RMConfig
    from tether.stages.sft_config import SFTConfig

    parser = argparse.ArgumentParser(
        prog="tether", description="Post-training for language models, with a ground-truth lab."
    )
    from importlib.metadata import PackageNotFoundError, version

    try:
        installed = version("tether")
    except PackageNotFoundError:  # a source tree on PYTHONPATH, not installed
        installed = "(not installed)"
    parser.add_argument("--version", action="version", version=f"tether {installed}")
    sub = parser.add_subparsers(dest="stage", metavar="STAGE", title="stages")  # each listed once, by its help
    sft = sub.add_parser("sft", help=STAGES["sft"], description=STAGES["sft"])
    sft.add_argument(
        "--demo",
        action="store_true",
        help="Run the built-in demo: writes its own data and a tiny model, needs no files.",
    )
    add_config_arguments(sft, SFTConfig)

    rm = sub.add_parser("rm", help=STAGES["rm"], description=STAGES["rm"])
    add_config_arguments(rm, RMConfig)
    from tether.stages.prm_config import PRMConfig

    prm = sub.add_parser("prm", help=STAGES["prm"], description=STAGES["prm"])
    add_config_arguments(prm, PRMConfig)

    ppo = sub.add_parser("ppo", help=STAGES["ppo"], description=STAGES["ppo"])
    add_config_arguments(ppo, PPOConfig)

    from tether.stages.grpo_config import GRPOConfig

    grpo = sub.add_parser(
        "grpo",
        help=STAGES["grpo"],
        description=STAGES["grpo"] + " A recipe sets the algo options; "
        "any flag or YAML value overrides it (defaults shown are those of no recipe).",
    )
    add_config_arguments(grpo, GRPOConfig)
    from tether.stages.dpo_config import DPOConfig

    dpo = sub.add_parser("dpo", help=STAGES["dpo"], description=STAGES["dpo"] + " Formulas: docs/dpo.md.")
    add_config_arguments(dpo, DPOConfig)
    diag = sub.add_parser(
        "diagnose",
        help=STAGES["diagnose"],
        description=STAGES["diagnose"] + " Monitors, thresholds and windows: docs/monitors.md.",
    )
    diag.add_argument("run", help="Run folder with metrics.jsonl (and samples.jsonl).")
    diag.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="Override a monitor setting, e.g. --set task_drop=0.3 (names in docs/monitors.md).",
    )
    diag.add_argument("--write", action="store_true", help="Write the alarms to RUN/alarms.jsonl (replacing it).")
    rep = sub.add_parser("report", help=STAGES["report"], description=STAGES["report"])
    rep.add_argument("runs", nargs="+", help="Run folders (each with metrics.jsonl).")
    rep.add_argument("--output", default="report.html", help="The HTML file to write.")
    sub.add_parser("recipes", help=STAGES["recipes"], description=STAGES["recipes"])

    lab = sub.add_parser("lab", help=STAGES["lab"], description=STAGES["lab"])
    lab.add_argument(
        "--output",
        default="runs/lab",
        help="Lab run folder; stages already done there with the same recipe are reused.",
    )
    lab.add_argument(
        "--quick", action="store_true", help="A smaller world and model (about a minute); used by the tests."
    )
    lab.add_argument("--seed", type=int, default=0, help="Seed of the world, the model and every stage.")
    lab.add_argument("--fresh", action="store_true", help="Redo every stage, ignoring cached outputs.")
    lab.add_argument(
        "--workers",
        type=int,
        default=0,
        help="Processes that run the stages whose inputs are ready side by side (0: one per core; "
        "1: one stage at a time, in this process). The figures do not depend on it.",
    )
    lab.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="Another value for a LabConfig field (tether/lab/settings.py; repeatable), e.g. "
        "pretrain_steps=8000. Stages whose recipe it changes are computed again; the others are "
        "reused.",
    )

    ev = sub.add_parser("eval", help=STAGES["eval"], description=STAGES["eval"])
    ev.add_argument("--model", required=True, help="Model folder to evaluate.")
    ev.add_argument("--task", required=True, choices=("lab-arith", "lab-assist"), help="Which lab task.")
    ev.add_argument(
        "--reference", default="", help="Reference model folder: assist then reports the gold win rate against it."
    )
    ev.add_argument(
        "--data",
        default="",
        help="Evaluation file (arith_eval.jsonl / assist_eval.jsonl); default: "
        "the default world's held-out split, rebuilt from --seed.",
    )
    ev.add_argument("--seed", type=int, default=0, help="World seed for the default split, and the sampling seed.")
    ev.add_argument("--temperature", type=float, default=0.0, help="0 = greedy; otherwise sampling temperature.")
    ev.add_argument("--top-p", type=float, default=1.0, help="Nucleus sampling threshold when sampling.")
    ev.add_argument("--samples", type=int, default=1, help="Completions per prompt.")
    ev.add_argument("--max-new-tokens", type=int, default=96, help="Generation budget per completion.")
    ev.add_argument("--limit", type=int, default=0, help="Evaluate only the first N prompts (0 = all).")
    ev.add_argument(
        "--output",
        default="",
        help="JSON file for the figures (default: printed only; nothing is written beside the model folder).",
    )

    bench = sub.add_parser("bench", help=STAGES["bench"], description=STAGES["bench"] + " docs/performance.md.")
    bench.add_argument("--models", default="lab,29m", help="Model sizes, comma-separated: lab (the lab's Llama), 29m.")
    bench.add_argument("--precisions", default="fp32,bf16", help="fp32, bf16 (weights and activations in bf16).")
    bench.add_argument("--batch", type=int, default=8, help="Rows per training batch and per generate() call.")
    bench.add_argument("--length", type=int, default=256, help="Tokens per training row (prompts: a quarter of it).")
    bench.add_argument("--new-tokens", type=int, default=32, help="Tokens generated per row.")
    bench.add_argument("--repeats", type=int, default=5, help="Timed runs per phase (the median is reported).")
    bench.add_argument("--matmul-size", type=int, default=1024, help="Side of the square matmuls of the peak.")
    bench.add_argument(
        "--compile",
        action="store_true",
        help="Also time forward + backward under torch.compile: the compilation, the steady step, the pay-back.",
    )
    bench.add_argument("--data", default="", help="A data file whose padding to measure (with --model).")
    bench.add_argument("--model", default="", help="Model or tokenizer folder for --data.")
    bench.add_argument("--json", default="", help="Also write every figure to this JSON file.")

    data = sub.add_parser("data", help=STAGES["data"], description=STAGES["data"])
    data_sub = data.add_subparsers(dest="data_command", metavar="COMMAND")
    check = data_sub.add_parser(
        "check",
        help="Counts, drops and one rendered example with its loss mask (SFT and "
        "preference data), or the rendered prompts and their lengths (RL prompt files).",
    )
    check.add_argument("file", help="Data file or datasets folder.")
    check.add_argument(
        "--model", required=True, help="Model or tokenizer folder whose tokenizer (and chat template) to use."
    )
    check.add_argument("--columns", default="", help="Rename columns, NAME=SOURCE,...")
    check.add_argument("--split", default="train", help="Split of a datasets folder.")
    check.add_argument("--max-length", type=int, default=1024, help="Longest example in tokens.")
    check.add_argument("--train-on-prompt", action="store_true", help="Show the mask with prompt tokens trained.")
    check.add_argument("--strict", action="store_true", help="Make dropped examples errors.")
    check.add_argument("--index", type=int, default=0, help="Which kept example to render.")
    agree = data_sub.add_parser(
        "agreement",
        help="Cohen's κ per annotator pair, Fleiss' κ, per-item agreement, "
        "agreement with the majority, for rows with a 'votes' mapping.",
    )
    agree.add_argument("file", help="Preference file whose rows carry votes: {annotator: label}.")
    agree.add_argument("--annotators", default="", help="Expected annotator ids, A,B,...; any other id is an error.")
    agree.add_argument("--columns", default="", help="Rename columns, NAME=SOURCE,...")
    agree.add_argument("--json", default="", help="Also write the statistics to this JSON file.")
    filt = data_sub.add_parser(
        "filter",
        help="Keep rows whose majority has at least --min-agreement of the votes, "
        "relabelled to the majority (ties dropped).",
    )
    filt.add_argument("file", help="Preference file whose rows carry votes.")
    filt.add_argument("--output", required=True, help="JSONL file to write.")
    filt.add_argument(
        "--min-agreement",
        type=float,
        default=0.0,
        help="Fraction of votes that must agree with the majority label (e.g. 0.8 = 4 of 5).",
    )
    filt.add_argument("--annotators", default="", help="Expected annotator ids, A,B,...; any other id is an error.")
    filt.add_argument("--columns", default="", help="Rename columns, NAME=SOURCE,...")
    labels = data_sub.add_parser(
        "prm-labels",
        help="Math-Shepherd step labels: from each step's prefix a policy writes --samples continuations; the step "
        "is right when any reaches the answer (--check), its soft label the share that do.",
    )
    labels.add_argument(
        "file", help="Step-split solutions: prompt, completions (steps) or completion, and columns --check reads."
    )
    labels.add_argument("--model", required=True, help="The policy's model folder.")
    labels.add_argument(
        "--check",
        required=True,
        help="Reward function module:fn scoring a whole solution (prompt columns as keywords); > 0.5 = reached the answer.",
    )
    labels.add_argument("--output", required=True, help="JSONL file to write: the rows with labels and label_scores.")
    labels.add_argument("--samples", type=int, default=8, help="Continuations per step (Math-Shepherd's N).")
    labels.add_argument("--max-new-tokens", type=int, default=64, help="Longest continuation.")
    labels.add_argument("--temperature", type=float, default=1.0, help="Sampling temperature of the continuations.")
    labels.add_argument("--step-separator", default="\n", help="What ends each step (and cuts a completion string).")
    labels.add_argument("--soft", action="store_true", help="Labels are the share that reached the answer, not any.")
    labels.add_argument("--columns", default="", help="Rename columns, NAME=SOURCE,...")
    labels.add_argument("--seed", type=int, default=0, help="Sampling seed.")
    return parser


def run_sft_command(args) -> None:
    from tether.stages.sft import SFTConfig, run_sft

    if not args.demo:
        run_stage("sft", config_from_args(SFTConfig, args))
        return
    from tether.lab import demo

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


def run_lab_command(args) -> None:
    from dataclasses import replace

    from tether.lab.pipeline import run_lab
    from tether.lab.schedule import usable_cores
    from tether.lab.settings import QUICK, LabConfig, lab_settings

    if args.workers < 0:
        raise ConfigError(f"--workers must be 0 (one per core) or a number of processes, got {args.workers}")
    cfg = replace(QUICK if args.quick else LabConfig(), seed=args.seed, **lab_settings(args.set))
    run_lab(args.output, cfg, fresh=args.fresh, workers=args.workers or usable_cores())


def run_eval_command(args) -> None:
    import json
    from pathlib import Path

    from tether.config import ConfigError
    from tether.lab.evaluate import Decoding, evaluate_task
    from tether.lab.world import WorldConfig, default_eval_rows
    from tether.models.lm import load_model, load_tokenizer

    if args.data:
        from tether.data.records import read_records

        records = read_records(args.data)
        need = "question" if args.task == "lab-arith" else "topic"
        for r in records:
            if "prompt" not in r.fields or need not in r.fields:
                raise DataError(
                    f"{r.where}: {args.task} rows need 'prompt' and '{need}'; the row has {sorted(r.fields)}"
                )
        rows = [r.fields for r in records]
    else:
        rows = default_eval_rows(args.task, WorldConfig(seed=args.seed))
    if args.limit:
        rows = rows[: args.limit]
    if args.samples < 1 or args.temperature < 0:
        raise ConfigError("--samples must be >= 1 and --temperature >= 0")
    tokenizer = load_tokenizer(args.model)
    model = load_model(args.model, tokenizer)
    ref_model = ref_tok = None
    if args.reference:
        ref_tok = load_tokenizer(args.reference)
        ref_model = load_model(args.reference, ref_tok)
    decoding = Decoding(
        temperature=args.temperature,
        top_p=args.top_p,
        samples=args.samples,
        max_new_tokens=args.max_new_tokens,
        seed=args.seed,
    )
    figures = evaluate_task(model, tokenizer, args.task, rows, decoding, ref_model, ref_tok)
    figures["model"] = str(args.model)
    figures["reference"] = args.reference or None
    from tether.console import console

    # a reader's summary on stderr, the JSON alone on stdout (for a pipe or a script)
    console.print(f"tether eval: {args.task} on {len(rows)} prompt(s), {args.model}")
    for key, value in figures.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            console.print(f"  {key:<32} {value:.4g}")
    print(json.dumps(figures, indent=2))
    if args.output:
        Path(args.output).write_text(json.dumps(figures, indent=2))
        from tether.console import console

        console.print(f"written to {args.output}")


def run_data_agreement(args) -> None:
    import json

    from tether.console import console
    from tether.data.records import read_records
    from tether.data.votes import agreement_statistics, read_votes

    annotators = [a for a in args.annotators.split(",") if a] or None
    rows, report = read_votes(read_records(args.file, args.columns), annotators, args.file)
    stats = agreement_statistics(rows, report.annotators)
    stats["dropped"] = dict(report.dropped)
    stats["missing_votes"] = report.missing_votes
    console.print(
        f"{args.file}: {report.rows} rows, {len(rows)} with votes, {len(report.annotators)} annotators, "
        f"{report.missing_votes} missing votes"
        + ("; dropped: " + ", ".join(f"{n} {w}" for w, n in report.dropped.items()) if report.dropped else "")
    )
    if "fleiss_kappa" in stats:
        f = stats["fleiss_kappa"]
        console.print(f"Fleiss' κ {f['kappa']:.3f} ({f['reading']}) over {f['items']} items with every vote")
    for pair, c in stats["cohen_kappa"].items():
        console.print(f"  Cohen's κ {pair}: {c['kappa']:.3f} ({c['reading']}, {c['items']} items)")
    for name, a in stats["per_annotator"].items():
        console.print(f"  {name}: agrees with the majority on {a['agreement_with_majority']:.1%} of {a['votes']} votes")
    p = stats["per_item"]
    console.print(
        f"per item: mean agreement {p['mean_agreement']:.1%}, unanimous {p['unanimous']:.1%}, ties {p['ties']}"
    )
    console.print(
        "κ reading (Landis & Koch): < 0 poor, 0-0.2 slight, 0.2-0.4 fair, 0.4-0.6 moderate, 0.6-0.8 substantial, > 0.8 almost perfect"
    )
    if args.json:
        from pathlib import Path

        Path(args.json).write_text(json.dumps(stats, indent=2))


def run_data_filter(args) -> None:
    from tether.console import console
    from tether.data.records import read_records
    from tether.data.votes import filter_by_agreement, read_votes, write_jsonl

    annotators = [a for a in args.annotators.split(",") if a] or None
    rows, report = read_votes(read_records(args.file, args.columns), annotators, args.file)
    kept, dropped = filter_by_agreement(rows, args.min_agreement)
    dropped.update(report.dropped)
    write_jsonl(kept, args.output)
    console.print(
        f"{args.file}: kept {len(kept)} of {report.rows} rows (majority labels) -> {args.output}"
        + ("; dropped: " + ", ".join(f"{n} {w}" for w, n in sorted(dropped.items())) if dropped else "")
    )


def run_data_prm_labels(args) -> None:
    """Label each step of each solution the Math-Shepherd way with a model folder as the policy; print the cost."""
    from tether.console import console
    from tether.stages.prm_labels import label_file

    console.print(label_file(args))


def run_data_check(args) -> None:
    """What a stage would make of a file: SFT data (counts, drops, one example's loss mask), preference data (the
    DPO view: each response's mask), or an RL prompt file (the rendered prompts, their lengths, the columns reward
    functions receive). The kind is read from the first record's fields."""
    from tether.console import console
    from tether.data.records import read_records
    from tether.models.lm import load_tokenizer

    tokenizer = load_tokenizer(args.model)
    records = read_records(args.file, args.columns, args.split)
    first = records[0].fields if records else {}
    unpaired = "completion" in first and isinstance(first.get("label"), bool)
    if ("chosen" in first and "rejected" in first) or ("responses" in first and "ranking" in first) or unpaired:
        from tether.data.dpo import tokenize_policy_preferences, tokenize_unpaired

        tokenize = tokenize_unpaired if unpaired else tokenize_policy_preferences
        examples, report = tokenize(records, tokenizer, args.max_length, args.strict, args.file)
        console.print(report.summary())
        ex = examples[min(args.index, len(examples) - 1)]
        if unpaired:
            console.print(
                f"\nexample from {ex.where}: label {ex.desirable} (`tether dpo --loss kto`); response 2 is "
                "the next row's completion under this prompt, for KTO's reference point "
                "(trained tokens are between ⟦ ⟧)"
            )
        else:
            console.print(
                f"\nexample from {ex.where}: {len(ex.responses)} responses, best first (trained tokens are between ⟦ ⟧)"
            )
        for rank, response in enumerate(ex.responses):
            console.print(f"\nresponse {rank + 1}: {len(response.input_ids)} tokens, {sum(response.loss_mask)} trained")
            _print_mask(tokenizer, response.input_ids, response.loss_mask)
        return
    if "prompt" in first and not ({"completion", "messages", "text"} & set(first)):
        from tether.data.records import prompt_rows
        from tether.rollout.prompts import render_prompts

        rows = prompt_rows(args.file)
        prompts = render_prompts(tokenizer, rows, str(args.file))
        lengths = [len(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in prompts]
        console.print(
            f"{args.file}: {len(rows)} RL prompts ({'chat messages' if isinstance(first['prompt'], list) else 'text'}); "
            f"prompt tokens min {min(lengths)}, mean {sum(lengths) / len(lengths):.1f}, max {max(lengths)}; "
            f"columns reward functions receive by name: {sorted(set(first) - {'prompt'}) or 'none'}"
        )
        i = min(args.index, len(prompts) - 1)
        console.print(f"\nprompt {i + 1} as the policy sees it ({lengths[i]} tokens; it writes after the end):")
        console.print(prompts[i], highlight=False)
        return
    from tether.data.sft import tokenize_records

    examples, report = tokenize_records(
        records, tokenizer, args.max_length, args.train_on_prompt, args.strict, args.file
    )
    console.print(report.summary())
    ex = examples[min(args.index, len(examples) - 1)]
    console.print(
        f"\nexample from {ex.where}: {len(ex.input_ids)} tokens, {sum(ex.loss_mask)} trained "
        "(trained tokens are between ⟦ ⟧)"
    )
    _print_mask(tokenizer, ex.input_ids, ex.loss_mask)


def _print_mask(tokenizer, input_ids: list[int], loss_mask: list[int]) -> None:
    from tether.console import console

    # Brackets mark trained runs so the mask is visible without colour too.
    out, in_run = [], False
    for token_id, trained in zip(input_ids, loss_mask):
        if trained and not in_run:
            out.append("⟦")
        if not trained and in_run:
            out.append("⟧")
        in_run = bool(trained)
        out.append(tokenizer.decode([token_id]))
    if in_run:
        out.append("⟧")
    console.print("".join(out), highlight=False)


def _unknown_arguments(parser: argparse.ArgumentParser, args, unknown: list[str]) -> None:
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


def _scalar(text: str):
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


def _foreign_flags(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[list[str], dict]:
    """(argv with tether's flags, {key: value} of other projects' flags): ``--max_steps 3`` is tether's --max-steps
    written with underscores; ``--learning_rate 1e-5`` or ``--bf16`` are TRL's names (tether/compat/table.py), read as
    flat keys of a YAML file are. Anything else is left for argparse to judge."""
    command = _command_parser(parser, argv)
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
            foreign[key] = _scalar(value)
        else:
            out.append(item)
    return out, foreign


def _command_parser(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.ArgumentParser | None:
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


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in POINTERS:
        print(f"tether {argv[0]}: there is no such command; use {POINTERS[argv[0]]}", file=sys.stderr)
        return 2
    argv, foreign = _foreign_flags(parser, argv)
    args, unknown = parser.parse_known_args(argv)
    args.foreign_flags = foreign
    if unknown:
        _unknown_arguments(parser, args, unknown)
    if args.stage is None:
        parser.print_help()
        return 0
    from tether.console import quiet_libraries

    quiet_libraries()
    try:
        if args.stage == "sft":
            run_sft_command(args)
        elif args.stage == "lab":
            run_lab_command(args)
        elif args.stage == "eval":
            run_eval_command(args)
        elif args.stage == "ppo":
            from tether.stages.ppo_config import PPOConfig

            run_stage("ppo", config_from_args(PPOConfig, args))
        elif args.stage == "grpo":
            from tether.stages.grpo_config import GRPOConfig

            run_stage("grpo", config_from_args(GRPOConfig, args))
        elif args.stage == "dpo":
            from tether.stages.dpo_config import DPOConfig

            run_stage("dpo", config_from_args(DPOConfig, args))
        elif args.stage == "report":
            from tether.diagnostics.report import write_report

            missing = [r for r in args.runs if not (Path(r) / "metrics.jsonl").is_file()]
            if missing:
                raise ConfigError(f"not a run folder (no metrics.jsonl): {', '.join(missing)}")
            print(f"report: {write_report(args.runs, args.output)}")
        elif args.stage == "diagnose":
            return run_diagnose_command(args)
        elif args.stage == "bench":
            from tether.diagnostics.bench import main as bench_main

            bench_main(args)
        elif args.stage == "recipes":
            print_recipes()
        elif args.stage == "rm":
            from tether.stages.rm_config import RMConfig

            run_stage("rm", config_from_args(RMConfig, args))
        elif args.stage == "prm":
            from tether.stages.prm_config import PRMConfig

            run_stage("prm", config_from_args(PRMConfig, args))
        elif args.stage == "data":
            commands = {
                "check": run_data_check,
                "agreement": run_data_agreement,
                "filter": run_data_filter,
                "prm-labels": run_data_prm_labels,
            }
            if args.data_command not in commands:
                parser.parse_args(["data", "--help"])
            commands[args.data_command](args)
    except (ConfigError, DataError) as exc:
        print(f"tether {args.stage}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(interrupted_line(args), file=sys.stderr)
        return 130
    finally:
        _close_process_group()
    return 0


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


def run_diagnose_command(args) -> int:
    import dataclasses
    import json

    from tether.diagnostics.monitors import MONITORS, MonitorSettings, check_all, format_alarm, read_jsonl

    run = Path(args.run)
    if not (run / "metrics.jsonl").is_file():
        raise ConfigError(f"{run}: no metrics.jsonl (is it a tether run folder?)")
    fields = {f.name: f for f in dataclasses.fields(MonitorSettings)}
    values = {}
    for item in args.set:
        name, _, raw = item.partition("=")
        if name not in fields:
            raise ConfigError(f"--set {item}: no monitor setting {name!r}; settings are {sorted(fields)}")
        default = fields[name].default
        values[name] = tuple(raw.split(",")) if isinstance(default, tuple) else type(default)(raw)
    metrics, samples = read_jsonl(run / "metrics.jsonl"), read_jsonl(run / "samples.jsonl")
    alarms = check_all(metrics, samples, MonitorSettings(**values))
    print(
        f"{len(MONITORS)} monitors on {len(metrics)} step(s) of metrics.jsonl and {len(samples)} sample(s) of "
        f"samples.jsonl: {', '.join(m.__name__ for m in MONITORS)} (docs/monitors.md says what each watches)"
    )
    for alarm in alarms:
        print(format_alarm(alarm))
    live = read_jsonl(run / "alarms.jsonl")
    if (run / "alarms.jsonl").is_file() and not values:
        same = [(a["monitor"], a["step"]) for a in live] == [(a.monitor, a.step) for a in alarms]
        print(
            f"{len(alarms)} alarm(s); the live alarms.jsonl has {len(live)}: " + ("the same" if same else "they differ")
        )
    else:
        print(f"{len(alarms)} alarm(s)")
    if args.write:
        (run / "alarms.jsonl").write_text("".join(json.dumps(a.as_dict()) + "\n" for a in alarms))
    return 0


def print_recipes() -> None:
    from tether.stages.grpo_recipes import RECIPES

    for name, recipe in RECIPES.items():
        print(f"{name}\n  {recipe.summary}\n  {recipe.equations}")
        print("  settings: " + ", ".join(f"{k}={v}" for k, v in recipe.settings.items()))
        print(f"  source: {recipe.sources}\n")


if __name__ == "__main__":
    sys.exit(main())
