"""Learning-rate schedule."""
from __future__ import annotations

import math


def warmup_cosine(step: int, total_steps: int, warmup_steps: int, min_ratio: float) -> float:
    """LR multiplier at optimizer step ``step`` (0-based).

    Linear warm-up (step+1)/warmup over the first ``warmup_steps``; then cosine
    from 1 to ``min_ratio``: min + (1 - min) * ½ (1 + cos(π p)), p the fraction
    of the decay phase done, reaching min_ratio at the last step.
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    decay_steps = max(1, total_steps - warmup_steps - 1)
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
