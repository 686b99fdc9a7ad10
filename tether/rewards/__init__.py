"""Rewards for the online trainers: finding reward functions by spec (loading), calling them with weights, time
limits and a worker process (functions, worker), built-in rewards (builtin), the sandbox for model-written code
(sandbox), a language model as the judge (judge: its scorer; judge_template: its prompt file, shipped ones in
judge_templates/), and the one scorer of every online stage (score).

May import: algorithms, errors, console, config, sections, models (reward models, the judge's forward), data,
rollout (a judge's greedy text).
"""

from tether.rewards.functions import RewardComponent, RewardSet, parse_reward_specs
from tether.rewards.loading import load_reward_function

__all__ = ["RewardComponent", "RewardSet", "load_reward_function", "parse_reward_specs"]
