"""`tether rm`: reward models from preference pairs or ranked lists (docs/algorithms.md §2).

Trains with the shared offline loop; evaluates held-out accuracy, margin and the
score distribution; keeps best/ by validation accuracy; watches for
over-fitting; ends with bias probes and normalisation statistics (rm_probes.py).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path

import torch

from tether.algorithms.reward import (
    all_pairs_loss,
    bradley_terry_loss,
    ordered_pair_accuracy,
    plackett_luce_loss,
    reward_centering_penalty,
)
from tether.config import ConfigError
from tether.console import console
from tether.data.multimodal import refuse_images, text_only
from tether.data.preferences import collate_preferences, preference_format, tokenize_preferences
from tether.data.records import read_records
from tether.models.checks import check_position_restarts, check_prompt_sharing
from tether.models.lm import length_limit, load_stage_tokenizer, parameter_summary
from tether.models.packing import describe, prompt_sharing, score_inputs
from tether.models.reward import NORM_FILE, load_reward_model, load_trainable_reward_model, save_reward_model
from tether.models.vision import is_vision_language, load_processor
from tether.stages.rm_config import RMConfig
from tether.stages.rm_probes import (
    image_probe,
    image_reading,
    normalization_stats,
    preference_scores,
    run_probes,
    stats_of_scores,
)
from tether.train.checkpoint import write_atomically
from tether.train.early_stop import OverfitDetector
from tether.train.offline_run import OfflineRun, plan_steps, prepare_trained, read_split, run_offline
from tether.train.run import start_run
from tether.train.sharding import is_sharded, reshard, save_full_model, unsharded_on_main


class RewardObjective:
    """Σ of pairwise (or list) losses over the batch; the loop divides by the step's pair count."""

    unit = "pairs"

    def __init__(self, ranking_loss: str = "plackett-luce", center_coef: float = 0.0):
        self.ranking_loss, self.center_coef = ranking_loss, center_coef

    def count(self, batch: dict) -> int:
        return int(batch["margin"].shape[0]) if "margin" in batch else int(batch["list_mask"].shape[0])

    def loss_sum(self, model, batch: dict):
        scores = model(**score_inputs(batch))  # (2B, heads) or (B·K, heads)
        if "margin" in batch:
            return self.pair_losses(scores, batch)
        b, k = batch["list_mask"].shape
        ranked = scores[:, 0].view(b, k)  # (B, K) best first
        fn = plackett_luce_loss if self.ranking_loss == "plackett-luce" else all_pairs_loss
        losses = fn(ranked, batch["list_mask"])
        return losses.sum(), {"accuracy": ordered_pair_accuracy(ranked, batch["list_mask"]).sum()}

    def pair_losses(self, scores: torch.Tensor, batch: dict):
        b = batch["margin"].shape[0]
        chosen, rejected = scores[:b], scores[b:]  # (B, heads)
        labels = batch["head_labels"].to(scores.device)  # (B, heads) +1 / -1 / 0
        better = torch.where(labels >= 0, chosen, rejected)
        worse = torch.where(labels >= 0, rejected, chosen)
        margin = torch.zeros_like(chosen)
        margin[:, 0] = batch["margin"].to(scores.device)  # the margin column belongs to the main preference
        per = bradley_terry_loss(better, worse, margin)  # (B, heads)
        if self.center_coef:
            per = per + reward_centering_penalty(chosen, rejected, self.center_coef)
        per = torch.where(labels != 0, per, torch.zeros_like(per))
        return per.sum(), {
            "accuracy": (chosen[:, 0] > rejected[:, 0]).float().sum(),
            "margin": (chosen[:, 0] - rejected[:, 0]).sum(),
        }


@torch.no_grad()
def evaluate_rm(
    model,
    examples,
    pad_id: int,
    objective: RewardObjective,
    heads: list[str],
    micro: int,
    device,
    scored: dict | None = None,
    padding_free: bool = False,
    share_prompt: bool = False,
) -> dict[str, float]:
    """Held-out loss, accuracy (per head), margin and score distributions (every process evaluates the whole set).
    One forward per batch gives both the loss and the scores. ``scored``, when given, is filled with
    {token ids: scores} of every response, for the probes to reuse (tether/stages/rm_probes.py)."""
    model.eval()
    loss, n, chosen, rejected, labels, list_acc = 0.0, 0, [], [], [], []
    for start in range(0, len(examples), micro):
        part = examples[start : start + micro]
        batch = {k: v.to(device) for k, v in collate_preferences(part, pad_id, padding_free, share_prompt).items()}
        n += objective.count(batch)
        if "margin" in batch:
            scores = model(**score_inputs(batch))
            loss_sum, _ = objective.pair_losses(scores, batch)
            loss += float(loss_sum)
            scores = scores.float().cpu()
            b = batch["margin"].shape[0]
            chosen.append(scores[:b])
            rejected.append(scores[b:])
            labels.append(batch["head_labels"].cpu())
            if scored is not None:
                for e, c_row, r_row in zip(part, scores[:b], scores[b:]):
                    scored[tuple(e.chosen_ids)], scored[tuple(e.rejected_ids)] = c_row, r_row
        else:
            loss_sum, stats = objective.loss_sum(model, batch)
            loss += float(loss_sum)
            list_acc.append(float(stats["accuracy"]))
    model.train()
    out = {"eval/loss": loss / max(1, n)}
    if not chosen:
        out["eval/accuracy"] = sum(list_acc) / max(1, n)
        return out
    c, r, lab = torch.cat(chosen), torch.cat(rejected), torch.cat(labels)
    out["eval/accuracy"] = (c[:, 0] > r[:, 0]).float().mean().item()
    out["eval/margin"] = (c[:, 0] - r[:, 0]).mean().item()
    for h, name in enumerate(heads[1:], start=1):
        has = lab[:, h] != 0
        if has.any():
            right = torch.where(lab[:, h] > 0, c[:, h] > r[:, h], r[:, h] > c[:, h])
            out[f"eval/accuracy_{name}"] = right[has].float().mean().item()
    for side, values in (("chosen", c[:, 0]), ("rejected", r[:, 0])):
        out[f"eval/{side}_mean"] = values.mean().item()
        out[f"eval/{side}_std"] = values.std(unbiased=False).item()
        for q in (0.1, 0.5, 0.9):
            out[f"eval/{side}_q{int(q * 100)}"] = torch.quantile(values, q).item()
    return out


def _model_and_optimizer(cfg: RMConfig, tokenizer, accelerator, checkpoint: Path | None, total_steps: int):
    """(model — sharded with --fsdp, else prepared for data parallelism —, optimizer, scheduler, over-fitting
    detector), restored from the checkpoint when resuming."""
    model = load_trainable_rm(cfg, tokenizer, checkpoint)
    if cfg.model.padding_free and not is_vision_language(cfg.model.path):  # a vision model's rows are padded
        check_position_restarts(model, cfg.model.path)
    if shared_prompt_layout(cfg, model)[0]:
        check_prompt_sharing(model.inner.base_model, cfg.model.path)
    model, optimizer, scheduler, state = prepare_trained(model, cfg, accelerator, total_steps, checkpoint)
    detector = OverfitDetector(cfg.rm.overfit_drop, cfg.rm.overfit_patience)
    if "overfit" in state:  # the detector's memory of earlier evaluations continues too
        detector = OverfitDetector(**{**state["overfit"], "history": [tuple(h) for h in state["overfit"]["history"]]})
    return model, optimizer, scheduler, detector


def shared_prompt_layout(cfg: RMConfig, model) -> tuple[bool, str]:
    """packing.prompt_sharing for the reward model's backbone; a vision-language model's rows are padded."""
    if is_vision_language(cfg.model.path):
        return False, ""
    return prompt_sharing(cfg.model, model.inner.base_model)


def _evaluate(model, *args, scored: dict, **kwargs) -> dict[str, float]:
    """evaluate_rm, then (sharded) free the parameters the no-grad forwards left gathered. ``scored`` is emptied
    first: it holds the latest evaluation's scores only."""
    scored.clear()
    out = evaluate_rm(model, *args, scored=scored, **kwargs)
    if is_sharded(model):
        reshard(model)
    return out


def load_trainable_rm(cfg: RMConfig, tokenizer, checkpoint: Path | None):
    return load_trainable_reward_model(cfg.model, tokenizer, list(cfg.rm.heads), checkpoint)


def run_rm(cfg: RMConfig) -> dict:
    t_start = time.perf_counter()
    for flag, value in (("--model", cfg.model.path), ("--data", cfg.data.path)):
        if not value:
            raise ConfigError(f"{flag} is required")
    tokenizer = load_stage_tokenizer(cfg.model)
    heads = list(cfg.rm.heads)
    processor = None
    if is_vision_language(cfg.model.path):  # each response scored with its record's images
        if cfg.data.norm_path or cfg.data.probe_path:
            raise ConfigError(
                "--norm-data and --probe-data score text alone; a vision-language reward model's normalisation comes "
                "from its held-out pairs with their images (leave both out)"
            )
        processor = load_processor(cfg.model.path, tokenizer, cfg.model.trust_remote_code)
    # before the run folder is touched
    train_recs, eval_recs, train, evals, reports = load_rm_data(cfg, tokenizer, processor)
    opened = start_run(cfg, {"--output": cfg.train.output})
    accelerator, _, out, start_step, checkpoint = opened
    total_steps = plan_steps(cfg, accelerator, len(train), start_step, checkpoint)
    model, optimizer, scheduler, detector = _model_and_optimizer(cfg, tokenizer, accelerator, checkpoint, total_steps)
    share, rows_note = shared_prompt_layout(cfg, accelerator.unwrap_model(model))
    plan = _rm_plan(cfg, train, evals, reports[0], accelerator, total_steps, start_step, model, rows_note)
    objective = RewardObjective(cfg.rm.ranking_loss, cfg.rm.center_coef)
    unwrapped = accelerator.unwrap_model(model)
    final_scores: dict = {}  # the latest evaluation's scores per response (after the last step: the final weights')
    mb, device = cfg.train.micro_batch_size, accelerator.device
    pad_id, padding_free = tokenizer.pad_token_id, cfg.model.padding_free and processor is None
    saved_with = processor or tokenizer  # a vision model's folders hold its processor (tokenizer, image processor)

    def save(summary: dict) -> None:
        """The bias probes and final/ (process 0), on an ordinary copy of the trained model when it is sharded."""
        probed = unwrapped
        if is_sharded(model):
            m = cfg.model
            probed = unsharded_on_main(
                model, lambda: load_reward_model(m.path, tokenizer, heads, m.dtype, m.trust_remote_code), accelerator
            )
        if accelerator.is_main_process and processor is not None:
            finish_vision_rm(cfg, probed, saved_with, out, summary, evals or train, device)
        elif accelerator.is_main_process:
            last_eval_step = detector.history[-1][0] if detector.history else None
            known = final_scores if last_eval_step == summary["steps"] else None  # scores of the final weights only
            finish_rm(cfg, probed, tokenizer, out, summary, (train_recs, eval_recs, train, evals), known)

    run = OfflineRun("rm", cfg, opened, total_steps, (model, optimizer, scheduler), tokenizer, t_start)
    return run_offline(
        run,
        plan,
        reports,
        lambda last_eval, steps: {
            "heads": heads,
            **last_eval,
            "best_step": detector.best_step if detector.history else None,
            "best_accuracy": detector.best if detector.history else None,
            "overfit_alarm_step": detector.fired_at,
            "eval_history": detector.history,
            "data": [r.summary() for r in reports],
        },
        save,
        closing=lambda summary, last_eval: _final_line(out, detector, last_eval, summary["probes"]),
        train_examples=train,
        eval_examples=evals,
        objective=objective,
        collate_fn=lambda exs: collate_preferences(exs, pad_id, padding_free, share),
        on_eval=_best_keeper(cfg, detector, model, unwrapped, saved_with, out, accelerator),
        checkpoint_state=lambda: {"overfit": asdict(detector)},
        evaluate_fn=lambda step: _evaluate(
            unwrapped,
            evals,
            pad_id,
            objective,
            heads,
            mb,
            device,
            scored=final_scores if processor is None else {},  # keyed by token ids: a text model's only
            padding_free=padding_free,
            share_prompt=share,
        ),
    )


def _rm_plan(
    cfg: RMConfig, train, evals, report, accelerator, total_steps: int, start_step: int, model, rows_note: str
) -> dict:
    return {
        "examples (train / eval)": f"{len(train)} / {len(evals)} {report.format}",
        "heads": ", ".join(cfg.rm.heads),
        "batch per optimizer step": cfg.train.batch_size,
        "processes x micro-batch x accumulation": cfg.train.micro_batch_plan(accelerator.num_processes),
        "micro-batch rows": describe(cfg.model.padding_free and not is_vision_language(cfg.model.path))
        + (" (a vision-language model's: each row its images)" if is_vision_language(cfg.model.path) else "")
        + rows_note,
        "optimizer steps": total_steps,
        "start step": start_step,
        "model": parameter_summary(model)
        + (f", sharded over {accelerator.num_processes} processes (FSDP2)" if is_sharded(model) else ""),
    }


def _best_keeper(cfg: RMConfig, detector: OverfitDetector, model, unwrapped, tokenizer, out: Path, accelerator):
    """on_eval for the offline loop: the over-fitting detector's update, best/ written at a new best accuracy."""
    sharded = is_sharded(model)

    def on_eval(step: int, metrics: dict) -> bool:
        fired = detector.update(step, metrics["eval/accuracy"])
        metrics["eval/best_accuracy"] = detector.best
        metrics["eval/overfit_alarm"] = float(detector.fired_at is not None)
        if detector.best_step == step and sharded:  # every process gathers, process 0 writes
            write_atomically(lambda tmp: save_full_model(model, tokenizer, tmp, accelerator), out / "best", accelerator)
        elif detector.best_step == step and accelerator.is_main_process:
            write_atomically(lambda tmp: save_reward_model(unwrapped, tokenizer, tmp, None), out / "best")
        if fired and accelerator.is_main_process:
            console.print(
                f"over-fitting: validation accuracy {metrics['eval/accuracy']:.3f} has been more than "
                f"{cfg.rm.overfit_drop} below its best {detector.best:.3f} (step {detector.best_step}) for "
                f"{cfg.rm.overfit_patience} evaluations" + (" — stopping" if cfg.rm.early_stop else ""),
                style="bold red",
            )
        return fired and cfg.rm.early_stop

    return on_eval


def _final_line(out: Path, detector: OverfitDetector, last_eval: dict, probes: dict) -> str:
    """Where the model is, then each bias probe's figure on a line of its own with its reading (rm_probes.read_probes:
    what the number means, whether it is high and by what rule)."""
    if "image" in probes:  # a vision-language reward model's
        image = probes["image"]
        return (
            f"reward model: {out / 'final'}{_best_line(out, detector, last_eval)}\n  another record's image moves "
            f"a score by {image['mean_abs_shift']:.3f} on average ({image['shift_over_std']:.2f} score std) — "
            f"{image['reading']}"
        )
    readings = probes["readings"]
    figures = {"length_correlation": f"length correlation {probes['length_correlation']:.2f}"}
    figures.update({k: f"{k} shift {v['mean_shift']:+.3f}" for k, v in probes["counterfactual"].items()})
    return f"reward model: {out / 'final'}{_best_line(out, detector, last_eval)}\n" + "\n".join(
        f"  {figure} — {readings[name]['reading']}" for name, figure in figures.items()
    )


def _best_line(out: Path, detector: OverfitDetector, last_eval: dict) -> str:
    if not detector.history or not (out / "best").is_dir():
        return " (no held-out pairs, so no validation accuracy and no best/)"
    return (
        f" (best by validation accuracy: {out / 'best'}, step {detector.best_step}); accuracy "
        f"{last_eval.get('eval/accuracy', float('nan')):.3f}"
    )


def load_rm_data(cfg: RMConfig, tokenizer, processor=None):
    """(train records, held-out records, train examples, held-out examples, data reports). With a vision-language
    model's ``processor``, each response is scored with its record's images; without one, a record with images is an
    error naming it."""
    d, heads = cfg.data, list(cfg.rm.heads)
    images = (processor, cfg.model.max_image_pixels) if processor is not None else None

    def tokenize(recs, label, limit):
        if cfg.rm.center_coef and recs and preference_format(recs, label) == "ranked lists":
            raise ConfigError(
                f"{label}: ranked lists with --center-coef {cfg.rm.center_coef:g}: reward centring η (r_w + r_l)² "
                "is a per-pair penalty, and the list losses (--ranking-loss) have none; leave --center-coef out, "
                "or give pairs"
            )
        if processor is None:
            refuse_images(recs, text_only(cfg.model.path))
        return tokenize_preferences(recs, tokenizer, limit, heads, d.margin_column, d.strict, label, images)

    return read_split(cfg, tokenize, images_read=True)


def finish_vision_rm(cfg: RMConfig, model, processor, out: Path, summary: dict, examples, device) -> None:
    """final/ of a vision-language reward model: normalisation statistics from its scores of the held-out responses
    with their images, and the image probe in place of the text probes (rm_probes.py image_probe)."""
    pad_id, micro = processor.tokenizer.pad_token_id, cfg.train.micro_batch_size
    own, swapped = image_probe(model, examples, pad_id, micro, device)
    normalization = stats_of_scores(preference_scores(model, examples, pad_id, micro, device), model.head_names)
    summary["probes"] = {"image": image_reading(own[:, 0], swapped[:, 0])}
    summary["normalization"] = normalization
    write_atomically(lambda tmp: save_reward_model(model, processor, tmp, normalization), out / "final")
    if (out / "best").is_dir():  # best/ has its own weights, so its own statistics
        best = load_reward_model(out / "best", processor.tokenizer).to(device)
        scores = preference_scores(best, examples, pad_id, micro, device)
        (out / "best" / NORM_FILE).write_text(json.dumps(stats_of_scores(scores, best.head_names), indent=2))


def finish_rm(cfg: RMConfig, model, tokenizer, out: Path, summary: dict, data, known: dict | None = None) -> None:
    """Bias probes and normalisation statistics on the rows that were trained/evaluated on (not those dropped as
    too long), final/ with them, and best/'s own statistics."""
    d = cfg.data
    train_recs, eval_recs, train, evals = data
    kept = {e.where for e in (evals or train)}
    eval_rows = [r.fields for r in (eval_recs or train_recs) if r.where in kept][:1000]
    norm_rows = [r.fields for r in read_records(d.norm_path, d.columns, d.split)] if d.norm_path else eval_rows
    probe_rows = [r.fields for r in read_records(d.probe_path)] if d.probe_path else []
    limit = length_limit(d.max_length, cfg.model.path)
    probes, normalization = run_probes(model, tokenizer, eval_rows, norm_rows, probe_rows, limit, known)
    summary["probes"] = probes
    summary["normalization"] = normalization
    write_atomically(lambda tmp: save_reward_model(model, tokenizer, tmp, normalization), out / "final")
    if (out / "best").is_dir():  # best/ has its own weights, so its own statistics (unless they are the final ones)
        same = summary.get("best_step") is not None and summary.get("best_step") == summary.get("steps")
        best_norm = (
            normalization
            if same
            else normalization_stats(load_reward_model(out / "best", tokenizer), tokenizer, norm_rows, limit)
        )
        (out / "best" / NORM_FILE).write_text(json.dumps(best_norm, indent=2))
