"""`tether data check | agreement | filter | prm-labels`: what a stage would make of a file, annotator agreement, the
rows a majority agrees on, and Math-Shepherd step labels. Each command's flags are declared once, in its
CommandConfig: the shared sections lend what means the same to a stage (--model and the chat template, --columns,
--max-length...), the commands' own sections the rest."""

from __future__ import annotations

from dataclasses import dataclass

from tether.cli.tools import CHAT_MODEL, Command, DecodingSection, FiguresSection
from tether.config import CommandConfig, ConfigError, Section, option
from tether.sections import DataSection, ModelSection, SFTDataSection
from tether.stages.prm_config import PRMDataSection


@dataclass(frozen=True)
class ExampleSection(Section):
    """Which file, and which of its examples to show."""

    file: str = option("", "Data file or datasets folder.", flag="file")
    index: int = option(0, "Which kept example to render.")


@dataclass(frozen=True)
class CheckCommand(CommandConfig):
    model: ModelSection = ModelSection()
    data: SFTDataSection = SFTDataSection()
    example: ExampleSection = ExampleSection()
    TAKES = {
        "model": (*CHAT_MODEL, "max_image_pixels"),
        "data": ("columns", "split", "max_length", "strict", "train_on_prompt"),
    }
    REQUIRED = ("model.path",)


def run_data_check(cfg: CheckCommand) -> None:
    """What a stage would make of a file: SFT data (counts, drops, one example's loss mask), preference data (the
    DPO view: each response's mask), or an RL prompt file (the rendered prompts, their lengths, the columns reward
    functions receive). The kind is read from the first record's fields; everything renders with the run's chat
    template and its options (--chat-template, --chat-template-kwargs), as the stage would."""
    from tether.data.records import read_records
    from tether.models.lm import length_limit, load_stage_tokenizer

    tokenizer = load_stage_tokenizer(cfg.model)
    records = read_records(cfg.example.file, cfg.data.columns, cfg.data.split)
    limit = length_limit(cfg.data.max_length, cfg.model.path)  # the stages' limit: a shorter model context lowers it
    first = records[0].fields if records else {}
    unpaired = "completion" in first and isinstance(first.get("label"), bool)
    if ("chosen" in first and "rejected" in first) or ("responses" in first and "ranking" in first) or unpaired:
        check_preferences(cfg, tokenizer, records, unpaired, limit)
    elif "prompt" in first and not ({"completion", "messages", "text"} & set(first)):
        check_prompts(cfg, tokenizer, first)
    else:
        check_demonstrations(cfg, tokenizer, records, limit)


def check_preferences(cfg: CheckCommand, tokenizer, records, unpaired: bool, limit: int) -> None:
    from tether.console import console
    from tether.data.dpo import tokenize_policy_preferences, tokenize_unpaired
    from tether.data.multimodal import refuse_images, text_only
    from tether.models.vision import is_vision_language, load_processor

    m = cfg.model
    processor = None  # a vision-language model's: the images read, counted and widened as `tether dpo` would
    if is_vision_language(m.path):
        processor = load_processor(m.path, tokenizer, m.trust_remote_code)
    else:
        refuse_images(records, text_only(m.path))
    tokenize = tokenize_unpaired if unpaired else tokenize_policy_preferences
    examples, report = tokenize(
        records, tokenizer, limit, cfg.data.strict, cfg.example.file, processor, m.max_image_pixels
    )
    console.print(report.summary())
    ex = examples[min(cfg.example.index, len(examples) - 1)]
    if unpaired:
        console.print(
            f"\nexample from {ex.where}: label {ex.desirable} (`tether dpo --loss kto`); response 2 is "
            "the next record's completion under this prompt, for KTO's reference point "
            "(trained tokens are between ⟦ ⟧)"
        )
    else:
        console.print(
            f"\nexample from {ex.where}: {len(ex.responses)} responses, best first (trained tokens are between ⟦ ⟧)"
        )
    for rank, response in enumerate(ex.responses):
        console.print(f"\nresponse {rank + 1}: {len(response.input_ids)} tokens, {sum(response.loss_mask)} trained")
        print_mask(tokenizer, response.input_ids, response.loss_mask)


def check_prompts(cfg: CheckCommand, tokenizer, first: dict) -> None:
    from tether.console import console
    from tether.data.prompts import prompt_rows
    from tether.models.vision import is_vision_language, load_processor
    from tether.rollout.prompts import render_prompts

    file, m = cfg.example.file, cfg.model
    if cfg.data.split != "train":  # the online stages read a prompt folder's train split: they take no --split
        raise ConfigError(
            f"--split {cfg.data.split}: {file} holds RL prompts, which tether ppo/grpo/dpo --online read from the "
            "train split; check that split (save the prompts you mean as their own file or train split)"
        )
    vision = is_vision_language(m.path)  # the prompts as the policy samples them: images widened by its processor
    rows = prompt_rows(file, cfg.data.columns, images=m.max_image_pixels if vision else 0)
    shown = ""
    if vision:
        from tether.train.sampling import ImagePrompts

        encoded = ImagePrompts(
            tokenizer, load_processor(m.path, tokenizer, m.trust_remote_code), rows, str(file), m.max_image_pixels
        )
        prompts, lengths = encoded.texts, encoded.lengths
        shown = f"; {encoded.shown} show images (counted in their tokens; reward functions get them as 'images')"
    else:
        prompts = render_prompts(tokenizer, rows, str(file))
        lengths = [len(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in prompts]
    console.print(
        f"{file}: {len(rows)} RL prompts ({'chat messages' if isinstance(first['prompt'], list) else 'text'}); "
        f"prompt tokens min {min(lengths)}, mean {sum(lengths) / len(lengths):.1f}, max {max(lengths)}; "
        f"columns reward functions receive by name: {sorted(set(first) - {'prompt'}) or 'none'}{shown}"
    )
    i = min(cfg.example.index, len(prompts) - 1)
    console.print(f"\nprompt {i + 1} as the policy sees it ({lengths[i]} tokens; it writes after the end):")
    console.print(prompts[i], highlight=False)


def check_demonstrations(cfg: CheckCommand, tokenizer, records, limit: int) -> None:
    from tether.console import console
    from tether.data.multimodal import refuse_images, text_only, tokenize_multimodal
    from tether.data.sft import tokenize_records
    from tether.models.vision import is_vision_language, load_processor

    data, path = cfg.data, cfg.example.file
    if is_vision_language(cfg.model.path):  # the images read, counted and widened as the stage would
        processor = load_processor(cfg.model.path, tokenizer, cfg.model.trust_remote_code)
        examples, report = tokenize_multimodal(
            records, tokenizer, processor, limit, data.train_on_prompt, data.strict, path, cfg.model.max_image_pixels
        )
    else:
        refuse_images(records, text_only(cfg.model.path))
        examples, report = tokenize_records(records, tokenizer, limit, data.train_on_prompt, data.strict, path)
    console.print(report.summary())
    ex = examples[min(cfg.example.index, len(examples) - 1)]
    console.print(
        f"\nexample from {ex.where}: {len(ex.input_ids)} tokens, {sum(ex.loss_mask)} trained "
        "(trained tokens are between ⟦ ⟧)"
    )
    print_mask(tokenizer, ex.input_ids, ex.loss_mask)


def print_mask(tokenizer, input_ids: list[int], loss_mask: list[int]) -> None:
    from tether.console import console

    # Brackets mark trained runs so the mask is visible without colour too; a run of one repeated untrained added
    # token (an image's placeholder tokens) is written once with its count.
    added, out, in_run, i = set(tokenizer.get_added_vocab().values()), [], False, 0
    while i < len(input_ids):
        token_id, trained = input_ids[i], loss_mask[i]
        if trained and not in_run:
            out.append("⟦")
        if not trained and in_run:
            out.append("⟧")
        in_run = bool(trained)
        run = 1
        while (
            token_id in added
            and not trained
            and (input_ids[i + run : i + run + 1], loss_mask[i + run : i + run + 1]) == ([token_id], [0])
        ):
            run += 1
        out.append(tokenizer.decode([token_id]) + (f"×{run}" if run > 3 else tokenizer.decode([token_id]) * (run - 1)))
        i += run
    if in_run:
        out.append("⟧")
    console.print("".join(out), highlight=False)


@dataclass(frozen=True)
class VotesSection(Section):
    """Preference rows that carry annotators' votes: which file, whose votes; filter's output."""

    file: str = option("", "Preference file whose rows carry votes: {annotator: label}.", flag="file")
    annotators: list = option([], "Expected annotator ids, A,B,...; any other id is an error.")
    output: str = option("", "JSONL file to write.")
    min_agreement: float = option(0.0, "Fraction of votes that must agree with the majority label (e.g. 0.8 = 4 of 5).")


@dataclass(frozen=True)
class AgreementCommand(CommandConfig):
    data: DataSection = DataSection()
    votes: VotesSection = VotesSection()
    figures: FiguresSection = FiguresSection()
    TAKES = {"data": ("columns",), "votes": ("file", "annotators")}


@dataclass(frozen=True)
class FilterCommand(CommandConfig):
    data: DataSection = DataSection()
    votes: VotesSection = VotesSection()
    TAKES = {"data": ("columns",), "votes": ("file", "annotators", "output", "min_agreement")}
    REQUIRED = ("votes.output",)


def read_voted_rows(cfg: AgreementCommand | FilterCommand):
    """(rows with votes, the VoteReport) of FILE, its columns renamed by --columns, checked against --annotators."""
    from tether.data.records import read_records
    from tether.data.votes import read_votes

    votes = cfg.votes
    return read_votes(read_records(votes.file, cfg.data.columns), votes.annotators or None, votes.file)


def run_data_agreement(cfg: AgreementCommand) -> None:
    import json
    from pathlib import Path

    from tether.console import console
    from tether.data.votes import agreement_statistics

    rows, report = read_voted_rows(cfg)
    stats = agreement_statistics(rows, report.annotators)
    stats["dropped"] = dict(report.dropped)
    stats["missing_votes"] = report.missing_votes
    console.print(
        f"{cfg.votes.file}: {report.rows} rows, {len(rows)} with votes, {len(report.annotators)} annotators, "
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
    if cfg.figures.json:
        Path(cfg.figures.json).write_text(json.dumps(stats, indent=2))


def run_data_filter(cfg: FilterCommand) -> None:
    from tether.console import console
    from tether.data.votes import filter_by_agreement, write_jsonl

    rows, report = read_voted_rows(cfg)
    kept, dropped = filter_by_agreement(rows, cfg.votes.min_agreement)
    dropped.update(report.dropped)
    write_jsonl(kept, cfg.votes.output)
    console.print(
        f"{cfg.votes.file}: kept {len(kept)} of {report.rows} rows (majority labels) -> {cfg.votes.output}"
        + ("; dropped: " + ", ".join(f"{n} {w}" for w, n in sorted(dropped.items())) if dropped else "")
    )


@dataclass(frozen=True)
class LabelsSection(Section):
    """The solutions to label, the check that says whether a continuation reached the answer, the labels' file."""

    file: str = option(
        "", "Step-split solutions: prompt, completions (steps) or completion, and columns --check reads.", flag="file"
    )
    answer_check: str = option(
        "",
        "Reward function module:fn scoring a whole solution (prompt columns as keywords); > 0.5 = reached the answer.",
        flag="--check",
    )
    output: str = option("", "JSONL file to write: the rows with labels and label_scores.")
    soft: bool = option(False, "Labels are the share that reached the answer, not any.")


@dataclass(frozen=True)
class PRMLabelsCommand(CommandConfig):
    model: ModelSection = ModelSection()
    data: PRMDataSection = PRMDataSection()
    decoding: DecodingSection = DecodingSection(max_new_tokens=64, temperature=1.0, samples=8)
    labels: LabelsSection = LabelsSection()
    TAKES = {
        "model": ("path",),
        "data": ("columns", "step_separator"),
        "decoding": ("max_new_tokens", "temperature", "samples", "seed"),
    }
    REQUIRED = ("model.path", "labels.answer_check", "labels.output")


def run_data_prm_labels(cfg: PRMLabelsCommand) -> None:
    """Label each step of each solution the Math-Shepherd way with a model folder as the policy; print the cost."""
    from types import SimpleNamespace

    from tether.console import console
    from tether.stages.prm_labels import label_file

    labels, decoding = cfg.labels, cfg.decoding
    args = SimpleNamespace(
        file=labels.file,
        check=labels.answer_check,
        output=labels.output,
        soft=labels.soft,
        model=cfg.model.path,
        columns=cfg.data.columns,
        step_separator=cfg.data.step_separator,
        samples=decoding.samples,
        max_new_tokens=decoding.max_new_tokens,
        temperature=decoding.temperature,
        seed=decoding.seed,
    )
    console.print(label_file(args))


DATA = Command(
    "data",
    "Data tools: `check` (counts, loss mask), `agreement` (annotator κ), `filter` (by agreement, to majority labels), "
    "`prm-labels` (Math-Shepherd step labels).",
    commands=(
        Command(
            "check",
            "Counts, drops and one rendered example with its loss mask (SFT and preference data), or the rendered "
            "prompts and their lengths (RL prompt files), rendered with the run's chat template and its options.",
            run_data_check,
            CheckCommand,
        ),
        Command(
            "agreement",
            "Cohen's κ per annotator pair, Fleiss' κ, per-item agreement, agreement with the majority, for rows "
            "with a 'votes' mapping.",
            run_data_agreement,
            AgreementCommand,
        ),
        Command(
            "filter",
            "Keep rows whose majority has at least --min-agreement of the votes, relabelled to the majority (ties "
            "dropped).",
            run_data_filter,
            FilterCommand,
        ),
        Command(
            "prm-labels",
            "Math-Shepherd step labels: from each step's prefix a policy writes --samples continuations; the step "
            "is right when any reaches the answer (--check), its soft label the share that do.",
            run_data_prm_labels,
            PRMLabelsCommand,
        ),
    ),
)
