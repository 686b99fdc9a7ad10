"""Build the lab's world: every stage's data files, seeded, with the annotators' statistics.

Files (JSON lines, the standard field names):
  pretrain.jsonl      messages: both tasks, good and bad answers, right and wrong arithmetic
  sft.jsonl           messages: correct worked solutions, answers without working (lazy demonstrators) and
                      high-gold assist answers; sft_eval.jsonl held out
  arith_rl.jsonl      prompt (chat) + question, answer: RL prompts for arith
  assist_rl.jsonl     prompt (chat) + topic: RL prompts for assist
  prefs.jsonl         prompt, chosen, rejected (majority vote), votes per annotator, gold of both; prefs_eval.jsonl
  rankings.jsonl      prompt, K responses, each annotator's ranking, consensus ranking (Borda), gold of each
  arith_eval.jsonl    held-out problems: in no other file
  assist_eval.jsonl   held-out requests: a (topic, wording) never used for training
  world.json          the recipe, counts and annotator statistics
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tether.algorithms.agreement import cohen_kappa, fleiss_kappa, landis_koch
from tether.lab import arith, assist
from tether.lab.annotators import DEFAULT_PANEL, Annotator


@dataclass(frozen=True)
class WorldConfig:
    seed: int = 0
    # arith
    min_operands: int = 2
    max_operands: int = 3
    max_value: int = 99
    wrong_fraction: float = 0.3  # of pretraining solutions that contain a slip
    n_pretrain_arith: int = 20000
    n_sft_arith: int = 3000  # worked demonstrations
    # Lazy demonstrators: this many more arith demonstrations give only "The answer is N." The SFT model copies
    # the habit (and its greedy answer skips the working, which this small model gets wrong more often), so
    # reinforcement learning on correctness has something real to find: writing the steps pays (docs/grpo.md).
    n_sft_arith_direct: int = 4500
    n_rl_arith: int = 2000
    n_eval_arith: int = 200
    # assist
    held_out_fraction: float = 0.2  # of (topic, wording) requests kept for evaluation only
    n_pretrain_assist: int = 8000
    n_sft_assist: int = 3000
    # Thin demonstrators: this share of the assist demonstrations state one true fact about the topic and fill the
    # rest with filler (gold 0.4–1.0 against a ceiling of 3). The SFT model copies the mix and sits well below the
    # ceiling, so preference learning has something to find: more true facts, less filler (docs/lab.md). Measured
    # (seed 0): the SFT model's sampled gold is 2.06 at 0, 1.19 at 0.5 and 0.76 at 0.7.
    sft_assist_thin_fraction: float = 0.7
    n_pairs: int = 3000
    n_pairs_eval: int = 400
    n_rankings: int = 300
    rank_k: int = 4
    panel: tuple[Annotator, ...] = field(default=DEFAULT_PANEL)

    def recipe_hash(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def assistant(text: str) -> list[dict]:
    return [{"role": "assistant", "content": text}]


def split_requests(rng: random.Random, held_out_fraction: float):
    requests = assist.all_requests()
    order = list(range(len(requests)))
    rng.shuffle(order)
    n_eval = max(1, int(held_out_fraction * len(requests)))
    held = set(order[:n_eval])
    return [r for i, r in enumerate(requests) if i not in held], [r for i, r in enumerate(requests) if i in held]


_ASSIST_TOPIC = {text: topic for topic, text in assist.all_requests()}  # request text -> topic


def _problems(rng, cfg, n, exclude):
    out = []
    while len(out) < n:
        p = arith.sample_problem(rng, cfg.min_operands, cfg.max_operands, cfg.max_value)
        if p.question not in exclude:
            out.append(p)
    return out


def held_out_sets(rng: random.Random, cfg: WorldConfig):
    """The evaluation splits, drawn first from the world's seed so `tether eval` can rebuild them alone."""
    train_requests, eval_requests = split_requests(rng, cfg.held_out_fraction)
    problems = _problems(rng, cfg, cfg.n_eval_arith, exclude=set())
    files = {
        "arith_eval": [{"prompt": user(p.question), "question": p.question, "answer": p.answer} for p in problems],
        "assist_eval": [{"prompt": user(text), "topic": topic} for topic, text in eval_requests],
    }
    return files, train_requests, eval_requests


def default_eval_rows(task: str, cfg: WorldConfig = WorldConfig()) -> list[dict]:
    files, _, _ = held_out_sets(random.Random(cfg.seed), cfg)
    return files[{"lab-arith": "arith_eval", "lab-assist": "assist_eval"}[task]]


def _pretrain_solution(rng: random.Random, p: arith.ArithProblem, wrong_fraction: float) -> str:
    r = rng.random()
    if r < wrong_fraction:
        return p.solution(error_step=rng.randrange(len(p.ops)), error_delta=arith.plausible_error(rng))
    if r < wrong_fraction + 0.05:
        return f"It is {p.answer}."  # format not followed
    return p.solution()


def _vote(rng, panel, topic, answers):
    """Annotators compare two answers shown in random order; returns the row for prefs.jsonl."""
    golds = [assist.gold_assist(a, topic) for a in answers]
    votes_for_0 = {}
    for ann in panel:
        first = rng.randrange(2)  # which answer this annotator sees first
        picked_first = ann.choose_first(rng, golds[first], golds[1 - first])
        votes_for_0[ann.name] = (picked_first and first == 0) or (not picked_first and first == 1)
    chosen = 0 if sum(votes_for_0.values()) * 2 > len(panel) else 1
    return {"chosen_index": chosen, "golds": golds, "votes_for_0": votes_for_0}


def build_world(out_dir: str | Path, cfg: WorldConfig = WorldConfig()) -> dict:
    """Every file of the world into ``out_dir``, drawn from one generator in a fixed order (the held-out sets first,
    then pretraining, SFT, RL prompts, pairs and rankings), and world.json with the counts and annotator figures."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(cfg.seed)
    files, train_requests, eval_requests = held_out_sets(rng, cfg)
    eval_questions = {row["question"] for row in files["arith_eval"]}
    files["pretrain"] = _pretrain_rows(rng, cfg, train_requests, eval_questions)
    files["sft"], files["sft_eval"] = _sft_rows(rng, cfg, train_requests, eval_questions)
    files["arith_rl"] = [
        {"prompt": user(p.question), "question": p.question, "answer": p.answer}
        for p in _problems(rng, cfg, cfg.n_rl_arith, eval_questions)
    ]
    files["assist_rl"] = [{"prompt": user(text), "topic": topic} for topic, text in train_requests]
    files["prefs"], pair_stats = _preference_rows(rng, cfg, cfg.n_pairs, train_requests)
    files["prefs_eval"], _ = _preference_rows(rng, cfg, cfg.n_pairs_eval, eval_requests)
    files["rankings"] = [_ranking_row(rng, cfg, train_requests) for _ in range(cfg.n_rankings)]

    for name, rows in files.items():
        with (out / f"{name}.jsonl").open("w") as handle:
            for row in rows:
                handle.write(json.dumps(row) + "\n")
    manifest = {
        "recipe_hash": cfg.recipe_hash(),
        "config": asdict(cfg),
        "counts": {name: len(rows) for name, rows in files.items()},
        "annotators": annotator_statistics(pair_stats, cfg.panel),
    }
    (out / "world.json").write_text(json.dumps(manifest, indent=2))
    return manifest


def _pretrain_rows(rng: random.Random, cfg: WorldConfig, train_requests, eval_questions: set) -> list[dict]:
    """Arithmetic with slips and assist answers of mixed quality, shuffled."""
    pretrain = [
        {"messages": user(p.question) + assistant(_pretrain_solution(rng, p, cfg.wrong_fraction))}
        for p in _problems(rng, cfg, cfg.n_pretrain_arith, eval_questions)
    ]
    for _ in range(cfg.n_pretrain_assist):
        topic, text = rng.choice(train_requests)
        style = assist.GOOD if rng.random() < 0.25 else assist.MIXED
        pretrain.append({"messages": user(text) + assistant(assist.sample_answer(rng, topic, style))})
    rng.shuffle(pretrain)
    return pretrain


def _sft_rows(rng: random.Random, cfg: WorldConfig, train_requests, eval_questions: set):
    """(sft, sft_eval): worked solutions and good assist answers (a share of them thin), then the direct answers."""
    sft = [
        {"messages": user(p.question) + assistant(p.solution())}
        for p in _problems(rng, cfg, cfg.n_sft_arith, eval_questions)
    ]
    while len(sft) < cfg.n_sft_arith + cfg.n_sft_assist:
        topic, text = rng.choice(train_requests)
        answer = assist.sample_answer(rng, topic, assist.GOOD)
        if assist.gold_assist(answer, topic).reward >= 2.0:
            sft.append({"messages": user(text) + assistant(answer)})
    rng.shuffle(sft)
    if cfg.sft_assist_thin_fraction > 0:
        # Its own generator, replacing answers in place: every other row of every file stays as it was.
        thin_rng = random.Random(f"thin-{cfg.seed}")
        for row in sft:
            topic = _ASSIST_TOPIC.get(row["messages"][0]["content"])
            if topic is not None and thin_rng.random() < cfg.sft_assist_thin_fraction:
                row["messages"] = row["messages"][:1] + assistant(assist.sample_answer(thin_rng, topic, assist.THIN))
    n_sft_eval = max(1, len(sft) // 20)
    # The direct answers draw from their own generator and go to both splits afterwards, so that adding them
    # leaves every other row of every file as it was (and the tokenizer, trained on the other texts, too).
    direct_rng = random.Random(f"direct-{cfg.seed}")
    direct = [
        {"messages": user(p.question) + assistant(p.direct_answer())}
        for p in _problems(direct_rng, cfg, cfg.n_sft_arith_direct, eval_questions)
    ]
    n_direct_eval = len(direct) // 20
    train = sft[n_sft_eval:] + direct[n_direct_eval:]
    direct_rng.shuffle(train)
    return train, sft[:n_sft_eval] + direct[:n_direct_eval]


def _preference_rows(rng: random.Random, cfg: WorldConfig, n: int, requests) -> tuple[list[dict], list[dict]]:
    """n pairs of answers voted on by the panel: the prefs rows, and each pair's votes and golds for the statistics."""
    rows, votes = [], []
    for _ in range(n):
        topic, text = rng.choice(requests)
        answers = [
            assist.sample_answer(rng, topic, assist.GOOD if rng.random() < 0.3 else assist.MIXED) for _ in range(2)
        ]
        while answers[1] == answers[0]:
            answers[1] = assist.sample_answer(rng, topic, assist.MIXED)
        result = _vote(rng, cfg.panel, topic, answers)
        c = result["chosen_index"]
        rows.append(
            {
                "prompt": user(text),
                "chosen": assistant(answers[c]),
                "rejected": assistant(answers[1 - c]),
                "topic": topic,
                "votes": {k: ("chosen" if v == (c == 0) else "rejected") for k, v in result["votes_for_0"].items()},
                "gold_chosen": result["golds"][c].reward,
                "gold_rejected": result["golds"][1 - c].reward,
            }
        )
        votes.append(result)
    return rows, votes


def _ranking_row(rng: random.Random, cfg: WorldConfig, train_requests) -> dict:
    """rank_k answers to one request, each annotator's ranking and their Borda consensus."""
    topic, text = rng.choice(train_requests)
    answers = [assist.sample_answer(rng, topic, assist.MIXED) for _ in range(cfg.rank_k)]
    golds = [assist.gold_assist(a, topic) for a in answers]
    per_annotator = {ann.name: ann.rank(rng, golds) for ann in cfg.panel}
    borda = [0] * cfg.rank_k
    for order in per_annotator.values():
        for place, idx in enumerate(order):
            borda[idx] += cfg.rank_k - 1 - place
    consensus = sorted(range(cfg.rank_k), key=lambda i: (-borda[i], i))
    return {
        "prompt": user(text),
        "responses": [assistant(a) for a in answers],
        "topic": topic,
        "rankings": per_annotator,
        "ranking": consensus,
        "gold": [g.reward for g in golds],
    }


def annotator_statistics(pairs: list[dict], panel) -> dict:
    """Agreement of each annotator with gold and with the majority, κ between them, and the majority's biases."""
    names = [a.name for a in panel]
    decided = [p for p in pairs if p["golds"][0].reward != p["golds"][1].reward]
    gold_first = [p["golds"][0].reward > p["golds"][1].reward for p in decided]
    stats: dict = {"pairs": len(pairs), "pairs_with_gold_preference": len(decided), "per_annotator": {}}
    majority = [p["chosen_index"] == 0 for p in pairs]
    for name in names:
        votes = [p["votes_for_0"][name] for p in pairs]
        stats["per_annotator"][name] = {
            "agreement_with_gold": sum(p["votes_for_0"][name] == g for p, g in zip(decided, gold_first))
            / max(1, len(decided)),
            "agreement_with_majority": sum(v == m for v, m in zip(votes, majority)) / max(1, len(pairs)),
        }
    stats["majority_agreement_with_gold"] = sum(
        (p["chosen_index"] == 0) == g for p, g in zip(decided, gold_first)
    ) / max(1, len(decided))
    kappas = {}
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            kappas[f"{a}~{b}"] = cohen_kappa([p["votes_for_0"][a] for p in pairs], [p["votes_for_0"][b] for p in pairs])
    stats["cohen_kappa"] = kappas
    table = [[sum(p["votes_for_0"].values()), len(names) - sum(p["votes_for_0"].values())] for p in pairs]
    stats["fleiss_kappa"] = fleiss_kappa(table)
    stats["fleiss_reading"] = landis_koch(stats["fleiss_kappa"])
    stats["majority_bias"] = {
        "longer": _bias(pairs, lambda g: g.words),
        "more_confident": _bias(pairs, lambda g: g.confident),
    }
    return stats


def _bias(pairs, feature) -> dict:
    """Among pairs that differ in the feature and where gold prefers one answer: how often the answer with more
    of the feature wins under gold and under the majority vote."""
    rows = [
        p
        for p in pairs
        if feature(p["golds"][0]) != feature(p["golds"][1]) and p["golds"][0].reward != p["golds"][1].reward
    ]
    if not rows:
        return {"pairs": 0}
    more_is_0 = [feature(p["golds"][0]) > feature(p["golds"][1]) for p in rows]
    gold_wins = sum((p["golds"][0].reward > p["golds"][1].reward) == m for p, m in zip(rows, more_is_0)) / len(rows)
    vote_wins = sum((p["chosen_index"] == 0) == m for p, m in zip(rows, more_is_0)) / len(rows)
    return {
        "pairs": len(rows),
        "gold_picks_more": round(gold_wins, 4),
        "majority_picks_more": round(vote_wins, 4),
        "excess": round(vote_wins - gold_wins, 4),
    }
