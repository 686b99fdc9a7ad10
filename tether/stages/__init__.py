"""The stages, one module each (sft, rm, prm, judge, dpo, ppo, grpo): thin wiring of data, models, algorithms and a
training loop. A stage's own helpers carry its name (sft_config, rm_config, rm_probes, prm_config, prm_labels,
judge_config, dpo_config, dpo_objective, dpo_setup, dpo_online, dpo_reference, ppo_config, ppo_critic, grpo_config,
grpo_recipes).

May import: every floor below it. Never another stage (tests/test_structure.py).
"""
