"""The over-fitting detector: validation accuracy fallen below its best for several evaluations."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class OverfitDetector:
    """Fires when accuracy has been more than ``drop`` below its best for ``patience`` evaluations in a row.

    Reward-model validation accuracy typically rises, then falls as the model
    memorises its training pairs (docs/algorithms.md §2); the pairwise loss keeps
    falling on the training set, so only held-out accuracy shows it.
    """

    drop: float = 0.02
    patience: int = 3
    best: float = float("-inf")
    best_step: int = 0
    below: int = 0
    fired_at: int | None = None
    history: list = field(default_factory=list)

    def update(self, step: int, accuracy: float) -> bool:
        """Record one evaluation; True exactly when the detector fires."""
        self.history.append((step, accuracy))
        if accuracy > self.best:
            self.best, self.best_step, self.below = accuracy, step, 0
            return False
        self.below = self.below + 1 if accuracy < self.best - self.drop else 0
        if self.below >= self.patience and self.fired_at is None:
            self.fired_at = step
            return True
        return False
