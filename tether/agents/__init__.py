"""Agents: multi-turn episodes against environments and tools (docs/agents.md).

environment.py  the protocol a user implements (reset, step, outcome), loading by spec, time limits and faults
tools.py        tool calling as one kind of environment: Python functions (async too) with JSON schemas
formats.py      each model family's tool-call format (hermes, llama3_json, mistral, deepseek, a user's own)
transcripts.py  the chat template in episodes: the transcript continued by appending tokens, call turns and results
                as the template takes them, and the start-up check of the template and the parser
episodes.py     batched multi-turn rollouts on the online loop: the transcript's tokens, the action mask, per-turn
                rewards, the episode records the agent monitors read, their scores and the audit of them
metrics.py      the agent/* figures of a step's episode records
worker.py       episodes drawn by a rollout worker beside the trainer: its own sampler, what travels back

May import: algorithms, errors, console, config, sections, models, data, rollout, rewards.
"""
