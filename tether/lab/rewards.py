"""Reward functions for the lab's worlds, in the `--reward module:function` form (docs/rewards.md): arith's checks, the
assist panel as a pair labeller, and assist's gold as an audit.

Rows of arith_rl.jsonl carry `question` and `answer`; each function reads what it needs by name.
"""

from __future__ import annotations

from tether.lab import arith


def arith_correct(completions, question, **_) -> list[float]:
    """1 if the completion ends with `The answer is N.` and N is the true result, else 0."""
    return [float(arith.check_arith(c, arith.parse_question(q)).correct) for c, q in zip(completions, question)]


def arith_format(completions, **_) -> list[float]:
    """1 if the completion is nothing but `a ± b = c.` steps followed by `The answer is N.`, else 0."""
    return [float(bool(arith.FORMAT_RE.match(c.strip()))) for c in completions]


def arith_steps(completions, question, **_) -> list[list[float]]:
    """Process reward: one score per sentence of a worked answer — each expected step (1 if its operands
    continue from the right previous result and its arithmetic is right), then the final answer (1 if correct).

    With the default step pattern (a full stop followed by a space or the end) the k-th score lands on the
    token that ends the k-th sentence.
    """
    out = []
    for c, q in zip(completions, question):
        gold = arith.check_arith(c, arith.parse_question(q))
        out.append([float(s) for s in gold.steps] + [float(gold.correct)])
    return out


def assist_panel_judge(prompts, first, second, topic, min_agreement: float = 0.0, **_) -> list[float]:
    """Online DPO's labeller on the assist world: the world's annotator panel votes on each pair, as it did for
    prefs.jsonl (each sees the two answers in a random order, with their biases and noise). Returns 1 when the
    majority picks `first`, 0 when it picks `second`, and 0.5 (a tie: the pair is dropped) when fewer than
    min_agreement of the votes agree — the same filter as the reward model's filtered data.

    The votes are random but reproducible: the generator is seeded from the texts being judged.
    """
    import hashlib
    import random

    from tether.lab.annotators import DEFAULT_PANEL
    from tether.lab.assist import gold_assist

    out = []
    for a, b, t in zip(first, second, topic):
        rng = random.Random(hashlib.sha256(f"{t}\x00{a}\x00{b}".encode()).digest())
        golds = (gold_assist(a, t), gold_assist(b, t))
        votes = 0
        for annotator in DEFAULT_PANEL:
            shown_first = rng.randrange(2)
            picked_first = annotator.choose_first(rng, golds[shown_first], golds[1 - shown_first])
            votes += (picked_first and shown_first == 0) or (not picked_first and shown_first == 1)
        share = max(votes, len(DEFAULT_PANEL) - votes) / len(DEFAULT_PANEL)
        out.append(0.5 if share < min_agreement else 1.0 if 2 * votes > len(DEFAULT_PANEL) else 0.0)
    return out


def assist_gold(completions, topic, **_) -> list[float]:
    """The assist world's gold reward of each answer (tether.lab.assist.gold_assist): what the lab's evaluations
    measure, here as a reward function — the trusted check of an audit (`--audit tether.lab.rewards:assist_gold`)."""
    from tether.lab.assist import gold_assist

    return [gold_assist(c, t).reward for c, t in zip(completions, topic)]
