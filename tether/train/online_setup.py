"""The online stages' one set-up: the models an online stage trains and reads, loaded once and, with --fsdp on
several processes, sharded once — the trained policy (and the ordinary copy the hf backend samples from), the
reference, a stage's own extra model (PPO's critic), the reward model and the process reward model.

Whether a run is sharded is decided here (``online_sharded``), once: every stage and the loop read it from the
``OnlineModels`` they are given, or from the models themselves (tether/models/shards.py is_sharded).

Order, as every stage had it: the tokenizer and the start-up episode check; the policy and the reference loaded in
CPU memory when sharding (fully_shard moves each process's shards to the device, so no device holds a whole model
beside its copy), else on the device; the extra model; the padding-free check of each model that runs padding-free
forwards; then the sharding, the reward models last.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from tether.agents.episodes import check_episodes
from tether.models.checks import check_position_restarts, check_prompt_sharing
from tether.models.lm import frozen_dtype, load_reference, load_stage_tokenizer, load_trainable_model
from tether.models.packing import prompt_sharing
from tether.models.vision import is_vision_language, never_sample_placeholders
from tether.rewards.judge import load_judge
from tether.rewards.score import Scorer, load_process_reward_scorer, load_reward_model_scorer
from tether.rollout.backends import BACKENDS
from tether.train.sharding import shard_frozen, shard_reward_model, shard_trained_online


def online_sharded(model_cfg, accelerator) -> bool:
    """--fsdp on more than one process: every forward and backward of the trained models is collective."""
    return bool(model_cfg.fsdp) and accelerator.num_processes > 1


@dataclass
class OnlineModels:
    """What ``load_online_models`` gives a stage. ``sampling_copy``: the sharded policy's ordinary copy that the hf
    backend samples from (None when not sharded, or when an engine is pushed the gathered weights); ``reward_model``
    and ``process_model``: the scorer's models (None without them, or with an environment, which scores episodes)."""

    tokenizer: object
    policy: object
    sampling_copy: object
    reference: object
    extra: object
    reward_model: object
    process_model: object
    sharded: bool
    judge: object = None  # a language model read as the reward (rewards/judge.py), whole on every process

    def scorer(self, cfg, start, allow_process: bool = True):
        """The one scorer (tether/rewards/score.py) over the reward models and the run's reward functions; None with
        an environment, which scores its episodes itself (tether/agents)."""
        if cfg.agent.env:
            return None
        return Scorer(
            cfg.rewards,
            cfg.rollout.max_new_tokens,
            self.tokenizer,
            start.reward_set,
            self.reward_model,
            allow_process=allow_process,
            process_model=self.process_model,
            judge=self.judge,
            audit=start.audit_set,
        )


@dataclass(frozen=True)
class Extra:
    """A stage's own model, loaded after the policy and sharded with it (PPO's critic): ``load(tokenizer, policy)``,
    ``shard(model, accelerator)`` (None: never sharded), ``restarts``: the model and folder a padding-free check
    runs on (None: none of its own)."""

    load: Callable
    shard: Callable | None = None
    restarts: Callable | None = None
    moves: Callable | None = None  # whether it goes to the device when sharded too (a small head: yes)


def load_online_models(cfg, start, needs_reference: bool, scorer=None, extra: Extra | None = None) -> OnlineModels:
    """Load (and, with --fsdp, shard) an online stage's models. ``scorer(texts) -> scores`` stands in for the reward
    model (a stand-in is never sharded); ``start`` is the OnlineStart of tether/train/online.py."""
    accelerator, device = start.accelerator, start.accelerator.device
    tokenizer = load_stage_tokenizer(cfg.model)
    check_episodes(cfg.agent, tokenizer, start.prompt_rows)
    sharded = online_sharded(cfg.model, accelerator)
    policy = load_trainable_model(cfg.model, tokenizer, start.checkpoint)
    policy = policy if sharded else policy.to(device)
    reference = load_reference(cfg.model, tokenizer, None if sharded else device) if needs_reference else None
    own = extra.load(tokenizer, policy) if extra is not None else None
    if own is not None and (not sharded or (extra.moves is not None and extra.moves(own))):
        own = own.to(device)
    vision = is_vision_language(cfg.model.path)
    if vision:  # a response never holds an image placeholder (models/vision.py)
        for model in (policy, reference):
            if model is not None:
                never_sample_placeholders(model)
    # the log-prob (and value) forwards lay the rollout's rows end to end; a vision-language model's rows, padded,
    # keep their images (rollout/forward.py)
    if cfg.model.padding_free and not vision:
        check_position_restarts(policy, cfg.model.path)
        if reference is not None and cfg.model.reference:
            check_position_restarts(reference, cfg.model.reference)
        if own is not None and extra.restarts is not None and extra.restarts(own) is not None:
            check_position_restarts(*extra.restarts(own))
        for model, where in ((policy, cfg.model.path), (reference, cfg.model.reference)):
            if model is not None and where and prompt_sharing(cfg.model, model)[0]:  # a group after one prompt copy
                check_prompt_sharing(model, where)
    sampling_copy = None
    if sharded:
        # a whole copy where the hf backend samples in the trainer, or where a rollout worker is written whole
        # weights after each update (either engine); an engine in the trainer is pushed them gathered instead
        whole = BACKENDS[cfg.rollout.backend].samples_trainer_weights or cfg.rollout.max_staleness > 0
        policy, sampling_copy = shard_trained_online(policy, accelerator, whole)
        sampling_copy = sampling_copy.to(device) if sampling_copy is not None else None
        reference = shard_frozen(reference, accelerator, cfg.model.offload_frozen)
        if own is not None and extra.shard is not None:
            own = extra.shard(own, accelerator)
    reward_model = process_model = judge = None
    if not cfg.agent.env:  # with an environment, the episodes are scored by it (tether/agents)
        # --fsdp: loaded in CPU memory and sharded like the reference (a stand-in scorer is not sharded)
        reward_model = scorer or load_reward_model_scorer(
            cfg.rewards, "cpu" if sharded else device, frozen_dtype(cfg.model)
        )
        if sharded:
            reward_model = shard_reward_model(reward_model, accelerator, cfg.model.offload_frozen)
        process_model = load_process_reward_scorer(cfg.rewards, device, frozen_dtype(cfg.model))
        # frozen and read without collectives: whole on every process, even with --fsdp
        judge = load_judge(cfg.judge, device, frozen_dtype(cfg.model), cfg.rollout.group_size)
    return OnlineModels(tokenizer, policy, sampling_copy, reference, own, reward_model, process_model, sharded, judge)
