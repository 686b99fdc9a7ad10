"""Simulated annotators: Bradley–Terry choosers on the gold reward, each with its own noise and biases.

Annotator j sees answers A (shown first) and B and perceives

    u_j(y) = gold(y) + length_bias · words(y) + confident_bias · confident(y)   (+ position_bias for A)

then picks A with probability σ((u_j(A) − u_j(B)) / noise); a careless
annotator instead answers at random with probability `careless`. Rankings of K
answers sort u_j(y) + noise · Gumbel noise, which is a Plackett–Luce sample.

The default panel likes length and confidence on top of gold, so the majority
vote — and a reward model trained on it — prefers longer, more confident
answers than gold says it should: the seed of reward hacking.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from tether.lab.assist import AssistGold


@dataclass(frozen=True)
class Annotator:
    name: str
    noise: float = 1.0  # BT temperature on perceived utility; larger = noisier
    length_bias: float = 0.0  # perceived utility per word
    confident_bias: float = 0.0  # perceived utility per confident word
    position_bias: float = 0.0  # perceived utility added to the answer shown first
    careless: float = 0.0  # probability of a uniformly random choice

    def perceived(self, gold: AssistGold) -> float:
        return gold.reward + self.length_bias * gold.words + self.confident_bias * gold.confident

    def prob_first(self, first: AssistGold, second: AssistGold) -> float:
        """P(this annotator picks the answer shown first)."""
        margin = self.perceived(first) + self.position_bias - self.perceived(second)
        p = 1.0 / (1.0 + math.exp(-margin / self.noise))
        return self.careless * 0.5 + (1 - self.careless) * p

    def choose_first(self, rng: random.Random, first: AssistGold, second: AssistGold) -> bool:
        return rng.random() < self.prob_first(first, second)

    def rank(self, rng: random.Random, golds: list[AssistGold]) -> list[int]:
        """Indices best to worst: a Plackett–Luce sample (Gumbel-perturbed utilities), random if careless."""
        if rng.random() < self.careless:
            order = list(range(len(golds)))
            rng.shuffle(order)
            return order
        keys = [self.perceived(g) / self.noise - math.log(-math.log(rng.random() or 1e-12)) for g in golds]
        return sorted(range(len(golds)), key=lambda i: -keys[i])


DEFAULT_PANEL = (
    Annotator("careful", noise=0.5, length_bias=0.02, confident_bias=0.2),
    Annotator("verbose", noise=1.0, length_bias=0.10, confident_bias=0.3),
    Annotator("swayed", noise=1.0, length_bias=0.04, confident_bias=1.2),
    Annotator("first", noise=1.0, length_bias=0.05, confident_bias=0.4, position_bias=0.8),
    Annotator("careless", noise=1.0, length_bias=0.05, confident_bias=0.4, careless=0.5),
)
