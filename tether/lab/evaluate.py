"""Measure a model on the lab's tasks against gold (`tether eval`).

Generation settings are explicit and reported with the figures: greedy
decoding, and sampling at a stated temperature with several samples per prompt.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from tether.lab import arith, assist
from tether.lab.stats import bootstrap_interval
from tether.rollout.prompts import render_prompts
from tether.rollout.texts import generate_texts


@dataclass(frozen=True)
class Decoding:
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    samples: int = 1  # completions per prompt
    max_new_tokens: int = 96
    seed: int = 0


GREEDY = Decoding()


def chat_prompts(tokenizer, rows: list[dict], where: str = "eval rows") -> list[str]:
    """Each row's prompt as the online stages sample it (rollout/prompts.py): a string as it is, chat messages
    through the chat template with a generation prompt."""
    return render_prompts(tokenizer, rows, where)


def generate_for(model, tokenizer, rows: list[dict], decoding: Decoding) -> list[list[str]]:
    """completions[i] = the decoding.samples completions of rows[i]."""
    prompts = [p for p in chat_prompts(tokenizer, rows) for _ in range(decoding.samples)]
    flat = generate_texts(
        model,
        tokenizer,
        prompts,
        max_new_tokens=decoding.max_new_tokens,
        temperature=decoding.temperature,
        top_p=decoding.top_p,
        seed=decoding.seed,
        batch_size=64,
    )
    return [flat[i * decoding.samples : (i + 1) * decoding.samples] for i in range(len(rows))]


def score_arith(rows: list[dict], completions: list[list[str]]) -> dict:
    golds = [arith.check_arith(c, arith.parse_question(r["question"])) for r, cs in zip(rows, completions) for c in cs]
    n = len(golds)
    return {
        "accuracy": sum(g.correct for g in golds) / n,
        "format_rate": sum(g.format_ok for g in golds) / n,
        "step_accuracy": sum(g.step_accuracy for g in golds) / n,
        "worked_rate": sum(g.worked for g in golds) / n,
        "n": n,
    }


def written_step_accuracy(completions: list[list[str]]) -> dict:
    """Of the addition and the subtraction steps the answers write, how many and the share whose result is right for
    their own operands (0.0 when none): which operation a model has not learned yet (docs/lab.md, the base model)."""
    steps = [s for cs in completions for c in cs for s in arith.written_steps(c)]
    out = {}
    for name, op in (("addition", "+"), ("subtraction", "-")):
        right = [ok for got, ok in steps if got == op]
        out[f"{name}_steps"] = len(right)
        out[f"{name}_steps_right"] = sum(right) / len(right) if right else 0.0
    return out


def score_assist(rows: list[dict], completions: list[list[str]], reference: list[list[str]] | None = None) -> dict:
    golds = [assist.gold_assist(c, r["topic"]) for r, cs in zip(rows, completions) for c in cs]
    texts = [c for cs in completions for c in cs]
    n = len(golds)
    out = {
        "gold_reward": sum(g.reward for g in golds) / n,
        "mean_words": sum(g.words for g in golds) / n,
        "confident_rate": sum(g.confident for g in golds) / n,
        "false_fact_rate": sum(g.false_facts > 0 for g in golds) / n,
        "true_facts": sum(g.true_facts for g in golds) / n,
        "distinct_2": assist.distinct_n(texts, 2),
        "n": n,
    }
    if reference is not None:
        ref = [assist.gold_assist(c, r["topic"]).reward for r, cs in zip(rows, reference) for c in cs]
        wins = [1.0 if g.reward > x else 0.5 if g.reward == x else 0.0 for g, x in zip(golds, ref)]
        out["gold_win_rate"] = sum(wins) / n
        out["gold_win_rate_low"], out["gold_win_rate_high"] = bootstrap_interval(_by_prompt(wins, completions))
    out["gold_by_prompt"] = _by_prompt([g.reward for g in golds], completions)
    out["gold_reward_low"], out["gold_reward_high"] = bootstrap_interval(out["gold_by_prompt"])
    return out


def _shown(prompt) -> str:
    """A prompt as the figures' examples show it: a string itself, chat messages their last turn's content."""
    return prompt if isinstance(prompt, str) else str(prompt[-1].get("content", ""))


def _by_prompt(flat: list[float], completions: list[list[str]]) -> list[list[float]]:
    """A flat list over all answers split back into one list per prompt."""
    it = iter(flat)
    return [[next(it) for _ in cs] for cs in completions]


def evaluate_task(
    model,
    tokenizer,
    task: str,
    rows: list[dict],
    decoding: Decoding = GREEDY,
    reference_model=None,
    reference_tokenizer=None,
) -> dict:
    """Figures for one task and one decoding; with a reference model, assist also gets the gold win rate."""
    completions = generate_for(model, tokenizer, rows, decoding)
    if task == "lab-arith":
        figures = score_arith(rows, completions)
    elif task == "lab-assist":
        reference = None
        if reference_model is not None:
            reference = generate_for(reference_model, reference_tokenizer or tokenizer, rows, decoding)
        figures = score_assist(rows, completions, reference)
        del figures["gold_by_prompt"]  # the figures are the means; the answers' gold stays with the lab's runs
    else:
        raise ValueError(f"unknown task {task!r}; choose lab-arith or lab-assist")
    samples = [{"prompt": _shown(r["prompt"]), "completion": c} for r, cs in zip(rows, completions) for c in cs[:1]]
    return {
        "task": task,
        "decoding": asdict(decoding),
        **{k: round(v, 4) if isinstance(v, float) else v for k, v in figures.items()},
        "examples": samples[:5],
    }
