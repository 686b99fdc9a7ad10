"""The lab's reward-model stage: train on the annotators' pairs (all, or filtered by agreement), judge against gold."""

from __future__ import annotations

import json
from pathlib import Path

from tether.config import build_config
from tether.data.preferences import render_response
from tether.data.records import read_records
from tether.data.votes import filter_by_agreement, read_votes, write_jsonl
from tether.lab import assist
from tether.models.lm import load_tokenizer
from tether.models.reward import load_reward_model, score_texts


def gold_judged_figures(rm_dir: Path, rows: list[dict], max_length: int) -> dict:
    """Accuracy of the reward model against gold on pairs gold separates, and how it treats length and confidence."""
    tokenizer = load_tokenizer(rm_dir)
    rm = load_reward_model(rm_dir, tokenizer)
    texts = [
        render_response(tokenizer, r["prompt"], r[side], "lab", side) for r in rows for side in ("chosen", "rejected")
    ]
    scores = score_texts(rm, tokenizer, texts, max_length=max_length)[:, 0].view(-1, 2)  # (pairs, [chosen, rejected])
    decided = [(i, r) for i, r in enumerate(rows) if r["gold_chosen"] != r["gold_rejected"]]
    right = [(scores[i, 0] > scores[i, 1]) == (r["gold_chosen"] > r["gold_rejected"]) for i, r in decided]
    out = {
        "gold_pairs": len(decided),
        "gold_accuracy": round(float(sum(right)) / max(1, len(right)), 4),
        "annotator_accuracy": round(float((scores[:, 0] > scores[:, 1]).float().mean()), 4),
    }
    for name, feature in (("longer", lambda g: g.words), ("more_confident", lambda g: g.confident)):
        picks_rm = picks_gold = n = 0
        for i, r in decided:
            a = assist.gold_assist(r["chosen"][-1]["content"], r["topic"])
            b = assist.gold_assist(r["rejected"][-1]["content"], r["topic"])
            if feature(a) == feature(b):
                continue
            more_is_chosen = feature(a) > feature(b)
            n += 1
            picks_rm += bool(scores[i, 0] > scores[i, 1]) == more_is_chosen
            picks_gold += (r["gold_chosen"] > r["gold_rejected"]) == more_is_chosen
        out[f"rm_picks_{name}"] = round(picks_rm / max(1, n), 4)
        out[f"gold_picks_{name}"] = round(picks_gold / max(1, n), 4)
        out[f"{name}_pairs"] = n
    return out


def filtered_preferences(source: Path, target: Path, min_agreement: float) -> dict:
    rows, report = read_votes(read_records(source), None, str(source))
    kept, dropped = filter_by_agreement(rows, min_agreement)
    write_jsonl(kept, target)
    return {"kept": len(kept), "of": report.rows, "dropped": dict(dropped)}


def train_lab_rm(
    folder: Path,
    resume: bool,
    *,
    sft_dir: Path,
    pairs: Path,
    eval_pairs: Path,
    epochs: float,
    batch: int,
    lr: float,
    seed: int,
    max_length: int = 256,
    extra: dict | None = None,
) -> dict:
    """A reward model trained on ``pairs``, measured on ``eval_pairs`` against gold; ``extra``: further overrides by
    dotted name (the lab's precision)."""
    from tether.stages.rm import RMConfig, run_rm

    overrides = {
        "model.path": str(sft_dir),
        "data.path": str(pairs),
        "data.eval_path": str(eval_pairs),
        "data.max_length": max_length,
        "optim.lr": lr,
        "optim.warmup_ratio": 0.05,
        "train.output": str(folder / "run"),
        "train.batch_size": batch,
        "train.micro_batch_size": batch,
        "train.epochs": epochs,
        "train.eval_every": 0,
        "train.save_every": 0,
        "train.log_every": 20,
        "train.seed": seed,
        "train.overwrite": True,
        "train.report_to": ["tensorboard"],
        **(extra or {}),
    }
    summary = run_rm(build_config(RMConfig, overrides=overrides, source="lab"))
    rows = [r.fields for r in read_records(eval_pairs)]
    gold = gold_judged_figures(folder / "run" / "final", rows, max_length)
    return {
        "train_pairs": summary["data"][0],
        "steps": summary["steps"],
        "eval_accuracy": summary.get("eval/accuracy"),
        **gold,
        "length_correlation": summary["probes"]["length_correlation"],
        "filler_shift": summary["probes"]["counterfactual"]["filler"]["mean_shift"],
        "confident_shift": summary["probes"]["counterfactual"]["confident"]["mean_shift"],
        "confident_fraction_up": summary["probes"]["counterfactual"]["confident"]["fraction_up"],
    }


def _json(path: Path) -> dict:
    return json.loads(path.read_text())
