"""`tether judge`: a generative reward model — a language model trained to write the verdict of a pairwise judge
template from preference pairs (docs/algorithms.md §12, "Training a judge"), evaluated as a reward model is
(docs/reward-models.md, "Training a judge").

Each pair (x, y_w, y_l) gives two examples, one per order: the template rendered with y_w shown first and the
verdict "first wins", and with y_l first and "second wins"; the loss is the language-model loss on the verdict token
alone (no prompt, no EOS), averaged over the step's verdicts. The evaluation reads the model as `--judge-model`
reads it (rewards/judge.py): held-out accuracy, per order, the Brier score and ECE of the swap-averaged P(w ≻ l),
the order-inconsistency (flip) rate and first-slot bias, the length bias, and the counterfactual probes (filler,
confident opener, an injected "This is the better answer.") as P(changed ≻ original). final/ is a causal LM with
the template beside it (judge_template.txt), which --judge-model then reads by default.
"""

from __future__ import annotations

import shutil
import time

import torch

from tether.algorithms.judge import (
    brier_score,
    expected_calibration_error,
    first_slot_bias,
    first_slot_probability,
    order_inconsistent,
    swap_averaged_preference,
)
from tether.config import ConfigError
from tether.data.preferences import ordered_responses, preference_format, split_implicit_prompt
from tether.data.probes import DEFAULT_PROBES, INJECTION
from tether.data.sft import DataReport, Example, collate
from tether.data.sft import _Drop as Dropped
from tether.errors import DataError
from tether.models.checks import check_chunked_head
from tether.models.judge import JudgeLM
from tether.models.lm import load_stage_tokenizer, load_trainable_model, parameter_summary
from tether.models.packing import describe_head
from tether.online_sections import JudgeSection
from tether.rewards.judge import JudgeScorer
from tether.rewards.judge_template import SAVED
from tether.stages.judge_config import JudgeConfig
from tether.train.checkpoint import save_final
from tether.train.lm_objective import SFTObjective
from tether.train.offline_run import OfflineRun, plan_steps, prepare_trained, read_split, run_offline
from tether.train.run import start_run


def _text(response, where: str, name: str) -> str:
    """A response as the judge shows it: a string, or the content of a list of messages' last one."""
    if isinstance(response, str):
        return response
    if isinstance(response, list) and response and isinstance(response[-1], dict):
        return str(response[-1].get("content", ""))
    raise DataError(f"{where}: field {name!r} must be a string or a list of messages, got {type(response).__name__}")


def preference_pairs(records, path) -> list[tuple[dict, str, str, str]]:
    """(row, chosen, rejected, where) per pair; a ranked list gives its adjacent pairs (1st ≻ 2nd, 2nd ≻ 3rd, ...)."""
    fmt = preference_format(records, path)
    if fmt == "unpaired":
        raise DataError(f"{records[0].where}: unpaired labels: a judge learns from pairs or ranked lists")
    pairs = []
    for rec in records:
        fields = split_implicit_prompt(rec.fields, rec.where)
        try:
            ranked = ordered_responses(fields, fmt, rec.where)
        except Dropped:  # chosen equal to rejected: counted by the caller
            pairs.append((fields, "", "", rec.where))
            continue
        texts = [_text(value, rec.where, name) for name, value in ranked]
        row = {**fields, "prompt": fields.get("prompt") or ""}
        pairs += [(row, better, worse, rec.where) for better, worse in zip(texts, texts[1:])]
    return pairs


class JudgeData:
    """Pairs → verdict examples with the judge's own prompt rendering (a JudgeScorer over the tokenizer)."""

    def __init__(self, cfg: JudgeConfig, tokenizer):
        section = JudgeSection(model=cfg.model.path, template=cfg.judge.template or "pairwise", max_unparsed=1.0)
        self.scorer = JudgeScorer(section, _TokenizerOnly(tokenizer))
        self.cfg, self.tokenizer = cfg, tokenizer

    def tokenize(self, records, label: str, limit: int):
        report = DataReport(path=label, format="pairs (judge verdicts, both orders)", records=len(records))
        examples, kept = [], []
        first, second = self.scorer.verdict_ids
        for row, chosen, rejected, where in preference_pairs(records, label):
            if not chosen and not rejected:
                report.dropped["with chosen equal to rejected"] += 1
                continue
            bodies = self.scorer.bodies([row, row], [chosen, rejected], [rejected, chosen])
            ids = self.scorer.prompt_ids(bodies)
            if max(map(len, ids)) + 1 > limit:
                if self.cfg.data.strict:
                    raise DataError(f"{where}: a judge prompt longer than max_length={limit} tokens (--strict)")
                report.dropped[f"longer than max_length={limit} tokens"] += 1
                continue
            for prompt, verdict in zip(ids, (first, second)):
                examples.append(Example(prompt + [verdict], [0] * len(prompt) + [1], where))
                report.tokens += len(prompt) + 1
                report.trained_tokens += 1
            kept.append((row, chosen, rejected))
        report.examples = len(examples)
        if not examples:
            raise DataError(f"{label}: every pair was dropped ({report.summary()})")
        self.pairs = kept
        return examples, report


class _TokenizerOnly:
    """What the judge's prompt rendering reads of a judge before any model loads: its tokenizer."""

    normalised = False
    context = None

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer


def _words(text: str) -> int:
    return len(text.split())


@torch.no_grad()
def evaluate_judge(scorer: JudgeScorer, pairs: list[tuple[dict, str, str]]) -> dict[str, float]:
    """The held-out figures of a judge (docs/algorithms.md §12; docs/metrics.md, `tether judge`)."""
    rows, chosen, rejected = [p[0] for p in pairs], [p[1] for p in pairs], [p[2] for p in pairs]
    lp_ab, lp_ba = scorer.verdict_logprobs(rows, chosen, rejected)
    p_ab, p_ba = first_slot_probability(lp_ab), first_slot_probability(lp_ba)
    p = swap_averaged_preference(p_ab, p_ba)
    loss = -(lp_ab[:, 0].sum() + lp_ba[:, 1].sum()) / (2 * len(pairs))
    out = {
        "eval/loss": float(loss),
        "eval/accuracy": float((p > 0.5).double().mean()),
        "eval/accuracy_chosen_first": float((p_ab > 0.5).double().mean()),
        "eval/accuracy_chosen_second": float((p_ba < 0.5).double().mean()),
        "eval/brier": float(brier_score(p)),
        "eval/ece": float(expected_calibration_error(p)),
        "eval/order_inconsistency": float(order_inconsistent(p_ab, p_ba).double().mean()),
        "eval/first_slot_bias": float(first_slot_bias(p_ab, p_ba).mean()),
        "eval/verdict_mass_mean": float(torch.cat([lp_ab, lp_ba]).exp().sum(-1).mean()),
    }
    longer = [_words(c) - _words(r) for c, r in zip(chosen, rejected)]
    unequal = [i for i, d in enumerate(longer) if d]
    if unequal:
        picks_longer = [(float(p[i]) > 0.5) == (longer[i] > 0) for i in unequal]
        out["eval/longer_picked"] = sum(picks_longer) / len(unequal)
        out["eval/labels_longer"] = sum(longer[i] > 0 for i in unequal) / len(unequal)
    for name, change in {**DEFAULT_PROBES, **INJECTION}.items():
        changed = scorer.prefer(rows, [change(c) for c in chosen], chosen).p
        out[f"eval/probe_{name}_preferred"] = float(changed.mean())  # P(changed ≻ original): ½ = indifferent
        out[f"eval/probe_{name}_up_share"] = float((changed > 0.5).double().mean())
    return out


def run_judge(cfg: JudgeConfig) -> dict:
    """Train, checkpoint, evaluate and write final/ (a causal LM and its judge_template.txt); returns the summary."""
    t_start = time.perf_counter()
    tokenizer = load_stage_tokenizer(cfg.model)
    if not cfg.data.path:
        raise ConfigError("--data is required: preference pairs (prompt, chosen, rejected) or ranked lists")
    data = JudgeData(cfg, tokenizer)
    held_out: list = []

    def tokenize(records, label, limit):
        examples, report = data.tokenize(records, label, limit)
        if "held out" in label or label == cfg.data.eval_path:
            held_out[:] = data.pairs
        return examples, report

    _, _, train, evals, reports = read_split(cfg, tokenize)
    opened = start_run(cfg, {"--model": cfg.model.path, "--data": cfg.data.path, "--output": cfg.train.output})
    accelerator, _, out, start_step, checkpoint = opened
    total_steps = plan_steps(cfg, accelerator, len(train), start_step, checkpoint)
    model = load_trainable_model(cfg.model, tokenizer, checkpoint)
    if cfg.model.chunked_head:
        check_chunked_head(model, cfg.model.path)
    model, optimizer, scheduler, _ = prepare_trained(model, cfg, accelerator, total_steps, checkpoint)
    template = data.scorer.template
    plan = {
        "pairs (train / eval)": f"{len(train) // 2} / {len(held_out)}, each in both orders",
        "batch per optimizer step": f"{cfg.train.batch_size} verdicts",
        "processes x micro-batch x accumulation": cfg.train.micro_batch_plan(accelerator.num_processes),
        "optimizer steps": total_steps,
        "start step": start_step,
        "model": parameter_summary(model),
        "template": f"{template.path} (verdicts {template.verdicts[0]!r} / {template.verdicts[1]!r} after "
        f"{template.answer_prefix!r}, {'chat' if data.scorer.chat else 'plain'})",
        "loss": "the verdict token only (−log p(verdict | judge prompt), no EOS)",
        "LM head": describe_head(cfg.model.chunked_head),
    }
    unwrapped = accelerator.unwrap_model(model)

    def evaluate(step: int) -> dict:
        unwrapped.eval()
        section = JudgeSection(model=cfg.model.path, template=str(template.path), batch_size=cfg.judge.batch_size)
        scorer = JudgeScorer(section, JudgeLM(unwrapped, tokenizer, cfg.judge.batch_size))
        figures = evaluate_judge(scorer, held_out)
        unwrapped.train()
        return figures

    def save(summary: dict) -> None:
        save_final(accelerator, model, tokenizer, out / "final")
        if accelerator.is_main_process:
            shutil.copyfile(template.path, out / "final" / SAVED)

    run = OfflineRun("judge", cfg, opened, total_steps, (model, optimizer, scheduler), tokenizer, t_start)
    return run_offline(
        run,
        plan,
        reports,
        lambda last_eval, steps: {
            "train_pairs": len(train) // 2,
            "eval_pairs": len(held_out),
            "template": str(template.path),
            **last_eval,
            "data": [r.summary() for r in reports],
        },
        save=save,
        train_examples=train,
        eval_examples=evals,
        objective=SFTObjective(cfg.model.chunked_head),
        collate_fn=lambda exs: collate(exs, tokenizer.pad_token_id, cfg.model.padding_free),
        evaluate_fn=evaluate if held_out else None,
    )
