"""The stages, one module each (sft, rm, dpo, ppo, grpo): thin wiring of data, models, algorithms and a training
loop. A stage's own helpers carry its name (ppo_config, ppo_critic, dpo_config, dpo_reference, grpo_config,
grpo_recipes, rm_config, rm_probes).

May import: every floor below it. Never another stage (tests/test_structure.py).
"""
