"""Rewards for the online trainers: Python functions you write (and built-in ones), and the reward-model scorer."""

from tether.rewards.functions import RewardComponent, RewardSet, parse_reward_specs
from tether.rewards.loading import load_reward_function

__all__ = ["RewardComponent", "RewardSet", "load_reward_function", "parse_reward_specs"]
