"""The `assist` task: requests on topics, answers built from phrase banks, and the gold reward.

Gold reward of an answer y to a request on topic T (sentences are matched after
stripping confident and hedging prefixes):

    gold(y) = + 1.0 · min(#distinct true facts about T, 3)
              − 2.0 · #false facts (any topic)
              − 0.5 · #true facts about other topics (off-topic)
              − 0.5 · #unrecognised sentences
              − 0.3 · #filler sentences (and every polite sentence after the first)
              − 0.5 · (1 + 2 + … + r) for r repeated sentences (the k-th repeat costs 0.5 · k)
              − 0.05 · max(0, words − 40)
              − 1.0 if the answer is empty

Confident words, hedges, one polite sentence and sheer length (up to 40
words) are worth nothing to gold; the simulated annotators (annotators.py)
like length and confidence anyway, which is what a reward model learns from them.

Why a repeat costs more each time: a reader forgives one repeated sentence and is worn out by the third. The
world's answers hold at most one repeat (`sample_answer` appends one), so the annotators — and a reward model
trained on their votes — only ever see the first repeat's price; an answer padded with repeats lies outside
everything the reward model was fitted on, and gold charges it in full there. That is Gao et al.'s picture
(docs/lab.md, "Why β = 0 falls"): the proxy is right near the data and wrong far from it.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from dataclasses import dataclass

from tether.lab.phrases import (
    CONFIDENT,
    CONFIDENT_WORDS,
    FILLER,
    HEDGES,
    POLITE,
    REQUEST_MODIFIERS,
    REQUEST_TEMPLATES,
    TOPICS,
)

GOLD_WEIGHTS = {
    "true_fact": 1.0,
    "max_true_facts": 3,
    "false_fact": -2.0,
    "off_topic": -0.5,
    "unknown": -0.5,
    "filler": -0.3,
    "repeat": -0.5,  # the first repeated sentence; the k-th costs k times this
    "per_word_over": -0.05,
    "target_words": 40,
    "empty": -1.0,
}

_PREFIXES = sorted([p + "," for p in CONFIDENT] + HEDGES, key=len, reverse=True)
_SENTENCE_SPLIT = re.compile(r"(?<=[.!?])\s+")


def _key(sentence: str) -> str:
    return " ".join(sentence.lower().split())


def _build_index() -> dict[str, tuple[str, str | None]]:
    index: dict[str, tuple[str, str | None]] = {}
    for topic, facts in TOPICS.items():
        for s in facts["true"]:
            index[_key(s)] = ("true", topic)
        for s in facts["false"]:
            index[_key(s)] = ("false", topic)
    for s in FILLER:
        index[_key(s)] = ("filler", None)
    for s in POLITE:
        index[_key(s)] = ("polite", None)
    return index


SENTENCE_INDEX = _build_index()


def request_text(topic: str, template: int, modifier: int) -> str:
    return REQUEST_MODIFIERS[modifier] + REQUEST_TEMPLATES[template].format(topic=topic)


def all_requests() -> list[tuple[str, str]]:
    """(topic, request text) for every topic x template x modifier."""
    return [
        (topic, request_text(topic, t, m))
        for topic in TOPICS
        for t in range(len(REQUEST_TEMPLATES))
        for m in range(len(REQUEST_MODIFIERS))
    ]


def strip_prefixes(sentence: str) -> tuple[str, int, int]:
    """Remove leading confident/hedge prefixes; return (core sentence, #confident, #hedges)."""
    confident = hedges = 0
    changed = True
    while changed:
        changed = False
        for prefix in _PREFIXES:
            if sentence.lower().startswith(prefix.lower() + " "):
                sentence = sentence[len(prefix) + 1 :]
                sentence = sentence[:1].upper() + sentence[1:]
                if prefix.endswith(","):
                    confident += 1
                else:
                    hedges += 1
                changed = True
    return sentence, confident, hedges


def split_sentences(text: str) -> list[str]:
    return [s for s in _SENTENCE_SPLIT.split(text.strip()) if s]


@dataclass(frozen=True)
class AssistGold:
    reward: float
    true_facts: int  # distinct true facts about the topic
    false_facts: int
    off_topic: int
    unknown: int
    filler: int
    repeats: int
    words: int
    confident: int  # confident words or phrases anywhere in the answer


def count_confident(text: str) -> int:
    lowered = text.lower()
    return sum(lowered.count(w) for w in CONFIDENT_WORDS)


def gold_assist(answer: str, topic: str) -> AssistGold:
    w = GOLD_WEIGHTS
    words = len(answer.split())
    if not answer.strip():
        return AssistGold(w["empty"], 0, 0, 0, 0, 0, 0, 0, 0)
    seen: Counter = Counter()
    true_facts: set[str] = set()
    false = off = unknown = filler = repeats = polite = 0
    for sentence in split_sentences(answer):
        core, _, _ = strip_prefixes(sentence)
        key = _key(core)
        seen[key] += 1
        if seen[key] > 1:
            repeats += 1
            continue
        kind, fact_topic = SENTENCE_INDEX.get(key, ("unknown", None))
        if kind == "true":
            if fact_topic == topic:
                true_facts.add(key)
            else:
                off += 1
        elif kind == "false":
            false += 1
        elif kind == "filler":
            filler += 1
        elif kind == "polite":
            polite += 1
            filler += polite > 1  # one polite sentence is free, more are filler
        else:
            unknown += 1
    reward = (
        w["true_fact"] * min(len(true_facts), w["max_true_facts"])
        + w["false_fact"] * false
        + w["off_topic"] * off
        + w["unknown"] * unknown
        + w["filler"] * filler
        + w["repeat"] * repeats * (repeats + 1) / 2
        + w["per_word_over"] * max(0, words - w["target_words"])
    )
    return AssistGold(
        round(reward, 6), len(true_facts), false, off, unknown, filler, repeats, words, count_confident(answer)
    )


@dataclass(frozen=True)
class ResponseStyle:
    """How a sampled answer is put together (counts are upper bounds drawn uniformly)."""

    max_true: int = 4
    min_true: int = 0
    false_prob: float = 0.3
    off_topic_prob: float = 0.25
    max_filler: int = 2
    min_filler: int = 0
    polite_prob: float = 0.5
    confident_prob: float = 0.2  # per sentence
    hedge_prob: float = 0.1  # per sentence
    repeat_prob: float = 0.15


MIXED = ResponseStyle()
GOOD = ResponseStyle(
    max_true=3,
    min_true=2,
    false_prob=0.0,
    off_topic_prob=0.0,
    max_filler=0,
    polite_prob=0.5,
    confident_prob=0.0,
    hedge_prob=0.0,
    repeat_prob=0.0,
)
# A thin answer: one true fact about the topic behind one or two filler sentences (gold 0.7 or 0.4).
THIN = ResponseStyle(
    max_true=1,
    min_true=1,
    false_prob=0.0,
    off_topic_prob=0.0,
    max_filler=2,
    min_filler=1,
    polite_prob=0.5,
    confident_prob=0.2,
    hedge_prob=0.1,
    repeat_prob=0.0,
)


def sample_answer(rng: random.Random, topic: str, style: ResponseStyle = MIXED) -> str:
    facts = TOPICS[topic]
    n_true = rng.randint(style.min_true, style.max_true)
    body = rng.sample(facts["true"], min(n_true, len(facts["true"])))
    if rng.random() < style.false_prob:
        body.insert(rng.randint(0, len(body)), rng.choice(facts["false"]))
        if rng.random() < 0.3:
            other = rng.choice([t for t in TOPICS if t != topic])
            body.insert(rng.randint(0, len(body)), rng.choice(TOPICS[other]["false"]))
    if rng.random() < style.off_topic_prob:
        other = rng.choice([t for t in TOPICS if t != topic])
        body.insert(rng.randint(0, len(body)), rng.choice(TOPICS[other]["true"]))
    if body and rng.random() < style.repeat_prob:
        body.append(rng.choice(body))
    body = [_decorate(rng, s, style) for s in body]
    head = rng.sample(FILLER, rng.randint(style.min_filler, style.max_filler)) if style.max_filler else []
    tail = [rng.choice(POLITE)] if rng.random() < style.polite_prob else []
    sentences = head + body + tail
    if not sentences:
        sentences = [rng.choice(FILLER)]
    return " ".join(sentences)


def _decorate(rng: random.Random, sentence: str, style: ResponseStyle) -> str:
    r = rng.random()
    if r < style.confident_prob:
        return f"{rng.choice(CONFIDENT)}, {sentence[0].lower()}{sentence[1:]}"
    if r < style.confident_prob + style.hedge_prob:
        return f"{rng.choice(HEDGES)} {sentence[0].lower()}{sentence[1:]}"
    return sentence


def distinct_n(texts: list[str], n: int = 2) -> float:
    """Distinct-n: unique word n-grams ÷ all word n-grams, over all texts (0 when there are none)."""
    grams = [tuple(ws[i : i + n]) for ws in (t.split() for t in texts) for i in range(len(ws) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 0.0
