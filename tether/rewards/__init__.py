"""Rewards for the online trainers: finding reward functions by spec (loading), calling them with weights, time
limits and a worker process (functions, worker), built-in rewards (builtin), the sandbox for model-written code
(sandbox), a language model as the judge (judge: its scorer; judge_template: its prompt file, shipped ones in
judge_templates/), and the one scorer of every online stage (score).

May import: algorithms, errors, console, config, sections, models (reward models, the judge's forward), data,
rollout (a judge's greedy text).
"""

import importlib

# where each public name lives, imported on first use: the reward worker's process (worker.py) imports this package
# on its way to loading.py, and importing functions.py here would cost it torch's import (about 2 s of a CPU)
_NAMES = {
    "RewardComponent": "tether.rewards.functions",
    "RewardSet": "tether.rewards.functions",
    "parse_reward_specs": "tether.rewards.functions",
    "load_reward_function": "tether.rewards.loading",
}
__all__ = sorted(_NAMES)


def __getattr__(name: str):
    if name not in _NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_NAMES[name]), name)
