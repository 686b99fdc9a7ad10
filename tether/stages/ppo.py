"""`tether ppo`: the actor, the critic, a frozen reward and a frozen reference (docs/algorithms.md §4).

A step: sample responses (generate), score them (score), compute old/reference log-probs and values
(logprobs), build per-token KL-shaped rewards and GAE advantages, then update_epochs passes of the PPO objective
over minibatches (update). The loop around the step (resume, evaluation, best/, samples, alarms, checkpoints) is
tether/train/online.py; the objective is tether/algorithms/objectives.py::ppo_objective (its policy and value terms).

Rewards: a `tether rm` reward model (with its saved normalisation), Python functions (`--reward module:fn`), or
both, summed with their weights (tether/rewards/score.py). The critic is a separate model or a value head on the
policy's backbone (critic.layout).
"""

from __future__ import annotations

import time

import torch

from tether.algorithms.advantages import action_gae, gae_advantages, masked_whiten, turn_rewards
from tether.algorithms.kl import kl_estimate, kl_k2
from tether.algorithms.objectives import ppo_policy_loss, ppo_value_loss
from tether.algorithms.policy import clip_fractions
from tether.algorithms.ppo import adaptive_kl_coef, explained_variance
from tether.algorithms.reductions import aggregate
from tether.algorithms.shaping import kl_penalty_rewards
from tether.models.lm import apply_precision, disable_dropout
from tether.models.work import phase
from tether.online_sections import minibatch_size, updates_per_step
from tether.rewards.score import Scorer
from tether.rollout.backends import response_seeds
from tether.rollout.forward import describe_rows, reference_logprobs, response_logprobs, response_logprobs_and_values
from tether.stages.ppo_config import PPOConfig
from tether.stages.ppo_critic import SharedValueHead, load_value_model
from tether.train.experience import Experience, rollout_metrics, stats
from tether.train.offline import EpochOrder
from tether.train.online import Schedule, run_online, start_rollout_stage
from tether.train.online_setup import Extra, load_online_models
from tether.train.parallel import empty_rollout, gather_rollout, gather_scores
from tether.train.sampling import attach_sampling
from tether.train.schedule import advance_schedule, build_optimizer
from tether.train.sharding import (
    grad_norm_value,
    is_sharded,
    reshard,
    shard_summed,
    sharded_reward_model,
    sharding_line,
)


class PPOStage:
    """PPO's step on the online loop: policy, critic, reference, scorer and the adaptive β."""

    name = "ppo"

    def __init__(
        self,
        cfg: PPOConfig,
        tokenizer,
        policy,
        reference,
        critic,
        scorer: Scorer,
        start,
        backend=None,
        sampling_copy=None,
    ):
        self.cfg, self.tokenizer, self.policy, self.reference, self.critic, self.scorer = (
            cfg,
            tokenizer,
            policy,
            reference,
            critic,
            scorer,
        )
        attach_sampling(self, cfg, tokenizer, policy, start, backend, sampling_copy)
        self.updates_per_step = updates_per_step(cfg.algo, cfg.rollout)
        updates = cfg.train.max_steps * self.updates_per_step
        self.optimizer, self.scheduler = build_optimizer(policy.parameters(), cfg.optim, updates)
        self.critic_optimizer, self.critic_scheduler = build_optimizer(
            critic.parameters(), cfg.optim, updates, lr=cfg.critic.lr
        )
        self.kl_coef = cfg.algo.kl_coef
        self.order = EpochOrder(len(self.prompts), cfg.train.seed)
        self.queued = 0  # steps whose prompts are queued with a rollout worker (rollout.max_staleness)

    @property
    def sampling_policy(self):
        return self.sampler.sampling_policy

    def extra_parts(self) -> dict:
        return {"critic": (self.critic, self.critic_optimizer, self.critic_scheduler)}

    def state(self) -> dict:
        return {"kl_coef": self.kl_coef}

    def load_state(self, state: dict) -> None:
        self.kl_coef = state["kl_coef"]

    def summary(self) -> dict:
        return {"final_kl_coef": self.kl_coef}

    def plan(self) -> dict:
        cfg = self.cfg
        mb = minibatch_size(cfg.algo, cfg.rollout)
        return {
            "prompts (train / eval)": f"{len(self.prompts)} / {len(self.eval_prompts)}",
            "responses per step": f"{cfg.rollout.prompts_per_step} prompts x {cfg.rollout.group_size}",
            "minibatches x passes": f"{-(-cfg.rollout.rollout_size // mb)} x {cfg.algo.update_epochs} ({mb} responses each)",
            "optimizer updates per step": updates_per_step(cfg.algo, cfg.rollout),
            "KL": f"{cfg.algo.kl_estimator} x {cfg.algo.kl_coef:g} in the reward"
            + (f", adapted towards {cfg.algo.target_kl:g} nats" if cfg.algo.adaptive_kl else ""),
            "critic": "value head on the policy backbone"
            if cfg.critic.layout == "shared"
            else f"separate ({cfg.critic.path or cfg.rewards.reward_model or cfg.model.path})",
            "reference": "frozen copy" if self.reference is not None else "policy with the LoRA adapter disabled",
            "forwards per step (each process)": f"1 no-grad (old log-probs{', values' if cfg.critic.layout == 'shared' else ''}), 1 reference, "
            f"{updates_per_step(cfg.algo, cfg.rollout)} with gradients (one per minibatch)"
            + ("" if cfg.critic.layout == "shared" else f"; the critic 1 + {updates_per_step(cfg.algo, cfg.rollout)}"),
            "log-prob rows": describe_rows(self.policy, cfg.model),
            "reward": self.scorer.describe(),
            "stop tokens": ", ".join(
                self.tokenizer.convert_ids_to_tokens(self.agent.stops if self.agent else self.stops)
            ),
            "generation": self.sampler.describe(),
            **(self.agent.plan() if self.agent else {}),
            "learning rate": f"{cfg.optim.lr:g} policy, {cfg.critic.lr:g} critic ({cfg.optim.lr_schedule})",
            "memory estimate (weights + AdamW)": _memory_estimate(self.policy, self.reference, self.critic),
            **(
                {
                    "sharding": sharding_line(
                        self.dp.world,
                        True,
                        cfg.model.offload_frozen,
                        self.sampler.sampling_copy is not None,
                        self.critic_layout_sharded,
                        sharded_reward_model(self.scorer, cfg.model.offload_frozen),
                    )
                }
                if self.sharded
                else {}
            ),
        }

    @property
    def critic_layout_sharded(self) -> str:
        return "" if isinstance(self.critic, SharedValueHead) else "the critic"

    def evaluate(self) -> dict:
        return self.sampler.evaluate(self.eval_rows, self.scorer, self.cfg.train.seed, self.dp)

    def step(self, step: int) -> tuple[dict, list]:
        ro, g, dp = self.cfg.rollout, self.cfg.rollout.group_size, self.dp
        for scheduler in (self.scheduler, self.critic_scheduler):  # a step stopped early moved them on as planned
            advance_schedule(scheduler, step * self.updates_per_step)
        t0 = time.perf_counter()
        indices, picked, seeds = self.share(step)
        self.queue_ahead(step)
        # ── sample and score this process's share (episodes: both together, turn by turn); gather ──
        if self.agent is not None:  # episodes: sampled and scored together, turn by turn
            with phase("sample"):
                rollout, scores = dp.all_or_none(
                    lambda: self.agent([self.rows[i] for i in picked], seeds) if picked else (empty_rollout(), None)
                )
            t1 = time.perf_counter()
        else:
            rollout = self.sampler.generate(picked, seeds) if picked else empty_rollout()
            t1 = time.perf_counter()
            scores = dp.all_or_none(
                lambda: self.scorer(rollout, [self.rows[i] for i in picked]) if picked else self.scorer.join_idle()
            )
        rollout, scores = gather_rollout(dp, rollout, self.tokenizer.pad_token_id), gather_scores(dp, scores)
        rows = [self.rows[i] for i in indices for _ in range(g)]
        drawn = self.sampler.async_figures(rollout)  # the responses' staleness, before this update
        t2 = time.perf_counter()
        # ── old and reference log-probs, values, KL-shaped rewards, GAE ──
        with phase("logprobs"):
            exp = self.make_experience(Experience(rollout, rows, scores))
        t3 = time.perf_counter()
        # ── the update's minibatches (policy and critic), then the new weights to the sampler ──
        generator = torch.Generator().manual_seed(self.cfg.train.seed * 7919 + step)  # a function of the step alone
        with phase("update"):
            update = self.update(exp, generator)
        self.sampler.weights_updated(self.policy)
        t4 = time.perf_counter()
        # ── metrics, then the adaptive KL coefficient for the next step ──
        sequence_kl = float(exp.kl.sum(-1).mean())
        mask = rollout.response_mask.bool()
        metrics = {
            **rollout_metrics(exp),
            "kl/ref_mean": sequence_kl,
            "kl/coef": self.kl_coef,
            "value/explained_variance": explained_variance(exp.values, exp.returns, rollout.response_mask),
            **stats("advantage", exp.advantages[mask]),
            **stats("return", exp.returns[mask]),
            **update,
            "lr": self.scheduler.get_last_lr()[0],
            "time/generate_s": t1 - t0,
            "time/score_s": t2 - t1,
            "time/logprobs_s": t3 - t2,
            "time/update_s": t4 - t3,
            "perf/tokens_per_s": float(rollout.lengths.sum()) / (t4 - t0),
            **drawn,
        }
        if self.cfg.algo.adaptive_kl:
            a = self.cfg.algo
            self.kl_coef = adaptive_kl_coef(self.kl_coef, sequence_kl, a.target_kl, a.kl_horizon, ro.rollout_size)
        return metrics, exp.samples(step + 1)

    def share(self, step: int) -> tuple[list[int], list[int], list[int] | None]:
        """Step ``step``'s prompts (all processes'), and this process's share as sampled: each prompt index repeated
        group_size times, with the responses' seeds (rollout.response_seeds) or None."""
        ro, g = self.cfg.rollout, self.cfg.rollout.group_size
        indices = self.order.batch(step, ro.prompts_per_step)
        positions = self.dp.shard(list(range(step * ro.prompts_per_step, (step + 1) * ro.prompts_per_step)))
        mine = [indices[p - step * ro.prompts_per_step] for p in positions]
        seeds = response_seeds(self.cfg.train.seed, positions, g) if ro.response_seeds else None
        return indices, [i for i in mine for _ in range(g)], seeds

    def queue_ahead(self, step: int) -> None:
        """With rollout.max_staleness K: the prompts of steps ``step`` … ``step`` + K (the run's own order) queued with
        the rollout worker, each after the weights of every update before it were pushed, so the responses trained
        on at update u were drawn by a version ≥ u − K (rollout/async_worker.py). None past the last step, and none
        kept over a resume: a resumed run queues again from its step."""
        ro = self.cfg.rollout
        for ahead in range(step, min(step + ro.max_staleness + 1, self.cfg.train.max_steps) if ro.max_staleness else 0):
            if ahead >= self.queued:
                _, picked, seeds = self.share(ahead)
                if picked:
                    self.sampler.ahead(picked, seeds)
                self.queued = ahead + 1

    @torch.no_grad()
    def make_experience(self, exp: Experience) -> Experience:
        """Old and reference log-probs, values (forwards split by rows over the processes), the per-token KL,
        KL-shaped rewards, GAE advantages and returns (whole, on every process)."""
        a, rollout, temperature, dp = self.cfg.algo, exp.rollout, self.cfg.rollout.temperature, self.dp
        rows = self.cfg.model.forward_rows
        if isinstance(self.critic, SharedValueHead):  # one forward gives the old log-probs and the values
            exp.old_logprobs, _, exp.values = dp.map_rows(
                lambda r: response_logprobs_and_values(self.policy, self.critic.head, r, temperature, **rows), rollout
            )
        else:
            exp.old_logprobs = dp.map_rows(lambda r: response_logprobs(self.policy, r, temperature, **rows), rollout)
            exp.values = dp.map_rows(lambda r: self.critic(r, **rows), rollout)
        exp.ref_logprobs = dp.map_rows(
            lambda r: reference_logprobs(self.reference, self.policy, r, temperature, **rows), rollout
        )
        mask = rollout.response_mask
        exp.measure_sampler(exp.old_logprobs, self.cfg.rollout)
        exp.kl = kl_estimate(exp.old_logprobs, exp.ref_logprobs, a.kl_estimator) * mask
        # scores are computed on the CPU, the rollout lives on the device
        token_rewards = kl_penalty_rewards(exp.scores.total.to(mask.device), exp.kl, mask, self.kl_coef)
        if rollout.response_attention is None:
            exp.advantages, exp.returns = gae_advantages(token_rewards, exp.values, mask, a.gamma, a.lam)
        else:  # multi-turn: each turn's reward on its last token; GAE over the policy's tokens, run together
            if exp.scores.step_scores is not None:
                token_rewards = token_rewards + turn_rewards(
                    exp.scores.step_scores, exp.scores.step_ends, mask.shape[1]
                ).to(mask.device)
            exp.advantages, exp.returns = action_gae(token_rewards, exp.values, mask, a.gamma, a.lam)
        if a.whiten_advantages:
            exp.advantages = masked_whiten(exp.advantages, mask)
        if self.sharded:  # free the layers these no-grad forwards left gathered (train/sharding.py reshard)
            for model in (self.policy, self.reference, self.critic):
                if model is not None and is_sharded(model):
                    reshard(model)
        return exp

    def update(self, exp: Experience, generator: torch.Generator) -> dict:
        """update_epochs passes of minibatch updates; token-weighted means of the update statistics. A pass whose
        approx KL to the sampling policy exceeds target_approx_kl ends the step's updates."""
        a = self.cfg.algo
        n, mb = exp.scores.total.shape[0], minibatch_size(a, self.cfg.rollout)
        sums: dict[str, float] = {}
        tokens, stopped_early = 0.0, 0.0
        for _ in range(a.update_epochs):
            order = torch.randperm(n, generator=generator)
            pass_kl, pass_tokens = 0.0, 0.0
            for start in range(0, n, mb):
                idx = order[start : start + mb]
                figures = self._update_minibatch(exp, idx)
                for name, value in figures.items():
                    sums[name] = sums.get(name, 0.0) + value
                k = float(exp.rollout.response_mask[idx].sum())
                tokens, pass_tokens = tokens + k, pass_tokens + k
                pass_kl += figures["policy/approx_kl"]  # already weighted by the minibatch's tokens
            if a.target_approx_kl and pass_kl / max(pass_tokens, 1.0) > a.target_approx_kl:
                stopped_early = 1.0
                break
        return {**{k: v / max(tokens, 1.0) for k, v in sums.items()}, "policy/early_stopped": stopped_early}

    def _update_minibatch(self, exp: Experience, idx: torch.Tensor) -> dict:
        """One optimizer update of policy and critic over the minibatch ``idx`` (this process: its contiguous part,
        the loss normalised by the whole minibatch's tokens, the gradients summed over processes); returns
        token-weighted statistics of the whole minibatch (Σ value · tokens), equal on every process.

        A separate critic shares no parameter with the policy, so the two updates are independent: the policy's
        loss is backpropagated and applied before the critic's forward, and only one model's activations and
        gradients are alive at a time (at 29 M parameters the update's peak falls by the critic's activations).
        A critic on the policy's backbone takes one joint loss, as its gradients meet there."""
        dp = self.dp
        n_tokens = float(exp.rollout.response_mask[idx].sum())
        local = dp.local_part(idx)
        # a sharded model's forward and backward are collective: a process without rows runs the minibatch's first
        # row, its loss multiplied by 0 (nothing learned, no statistics)
        filler = self.sharded and len(local) == 0
        local, weight = (idx[:1], 0.0) if filler else (local, 1.0)
        sub = exp.rollout.select(local) if len(local) else None
        figures = {name: 0.0 for name in self.STATISTICS}
        self.optimizer.zero_grad(set_to_none=True)  # already freed after each step; cheap insurance
        self.critic_optimizer.zero_grad(set_to_none=True)
        policy_params = [q for q in self.policy.parameters() if q.requires_grad]
        critic_params = [q for q in self.critic.parameters() if q.requires_grad]
        rows = self.cfg.model.forward_rows
        if isinstance(self.critic, SharedValueHead):
            if sub is not None:
                logp, entropy, values = response_logprobs_and_values(
                    self.policy, self.critic.head, sub, self.cfg.rollout.temperature, **rows
                )
                policy_loss, policy_parts = self._policy_loss(exp, local, logp, entropy, n_tokens)
                value_loss, value_parts = self._value_loss(exp, local, values, n_tokens)
                joint = policy_loss + self.cfg.critic.value_loss_coef * value_loss  # both reach the backbone
                (joint * weight).backward()
                if not filler:
                    figures = self._statistics(
                        exp, local, logp, entropy, policy_loss, policy_parts, value_loss, value_parts, n_tokens
                    )
            dp.sum_gradients(policy_params + [q for q in critic_params if all(q is not p for p in policy_params)])
            gn_pi = self._clip_and_step(policy_params, self.optimizer, self.scheduler)
            gn_v = self._clip_and_step(critic_params, self.critic_optimizer, self.critic_scheduler)
        else:
            if sub is not None:
                logp, entropy = response_logprobs(
                    self.policy, sub, self.cfg.rollout.temperature, with_entropy=True, **rows
                )
                policy_loss, policy_parts = self._policy_loss(exp, local, logp, entropy, n_tokens)
                (policy_loss * weight).backward()
                logp, entropy = logp.detach(), entropy.detach()
            dp.sum_gradients(policy_params)
            gn_pi = self._clip_and_step(policy_params, self.optimizer, self.scheduler)
            if sub is not None:
                values = self.critic(sub, **rows)
                value_loss, value_parts = self._value_loss(exp, local, values, n_tokens)
                (self.cfg.critic.value_loss_coef * value_loss * weight).backward()
                if not filler:
                    figures = self._statistics(
                        exp, local, logp, entropy, policy_loss, policy_parts, value_loss, value_parts, n_tokens
                    )
            dp.sum_gradients(critic_params)
            gn_v = self._clip_and_step(critic_params, self.critic_optimizer, self.critic_scheduler)
        return {**dp.sum_dict(figures), "policy/grad_norm": gn_pi * n_tokens, "value/grad_norm": gn_v * n_tokens}

    def _clip_and_step(self, params: list, optimizer, scheduler) -> float:
        """Clip one role's summed gradients to max_grad_norm, step its optimizer and scheduler, and free the
        gradients now, not at the next update (a model's worth of them would otherwise stay allocated through the
        next rollout and the checkpoint save). Returns the norm before clipping."""
        cap = self.cfg.optim.max_grad_norm if self.cfg.optim.max_grad_norm > 0 else float("inf")
        norm = grad_norm_value(torch.nn.utils.clip_grad_norm_(params, cap))
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        return norm

    STATISTICS = (
        "policy/loss",
        "policy/clip_frac",
        "policy/clip_frac_low",
        "policy/clip_frac_high",
        "policy/approx_kl",
        "policy/entropy",
        "value/loss",
        "value/clip_frac",
    )

    def _policy_loss(
        self, exp: Experience, local: torch.Tensor, logp: torch.Tensor, entropy: torch.Tensor, n_tokens: float
    ) -> tuple[torch.Tensor, dict]:
        a = self.cfg.algo
        return ppo_policy_loss(
            logp,
            exp.old_logprobs[local],
            exp.advantages[local],
            entropy,
            exp.rollout.response_mask[local],
            clip_low=a.clip_low,
            clip_high=a.clip_high,
            dual_clip=a.dual_clip,
            entropy_coef=a.entropy_coef,
            n_tokens=n_tokens,
            token_weights=exp.is_weights[local] if exp.is_weights is not None else None,
        )

    def _value_loss(
        self, exp: Experience, local: torch.Tensor, values: torch.Tensor, n_tokens: float
    ) -> tuple[torch.Tensor, dict]:
        return ppo_value_loss(
            values,
            exp.values[local],
            exp.returns[local],
            exp.rollout.response_mask[local],
            value_clip=self.cfg.critic.value_clip,
            n_tokens=n_tokens,
        )

    def _statistics(
        self,
        exp: Experience,
        local: torch.Tensor,
        logp: torch.Tensor,
        entropy: torch.Tensor,
        policy_loss: torch.Tensor,
        policy_parts: dict,
        value_loss: torch.Tensor,
        value_parts: dict,
        n_tokens: float,
    ) -> dict:
        """Σ over this process's tokens of each statistic, later summed over processes and divided by n_tokens."""
        mask = exp.rollout.response_mask[local]
        k = float(mask.sum())
        per_token = {
            **clip_fractions(policy_parts["clipped_low"], policy_parts["clipped_high"], mask),
            "policy/approx_kl": aggregate(kl_k2(logp.detach(), exp.old_logprobs[local]), mask),  # ½ (Δ logp)²
            "policy/entropy": aggregate(entropy.detach(), mask),
            "value/clip_frac": aggregate(value_parts["value_clipped"].float(), mask),
        }
        out = {name: float(torch.as_tensor(value).detach()) * k for name, value in per_token.items()}
        # the loss parts are already shares of the minibatch's token-mean: weight by the minibatch's tokens
        out["policy/loss"] = float(policy_loss.detach()) * n_tokens
        out["value/loss"] = float(value_loss.detach()) * n_tokens
        return out


def _memory_estimate(policy, reference, critic) -> str:
    def mb(model, trainable_copies: int) -> float:
        n = sum(q.numel() * q.element_size() for q in model.parameters())
        return n * (1 + trainable_copies) / 2**20

    # trained models: weights + gradients + two AdamW moments; frozen: weights only (activations not included)
    total = mb(policy, 3) + mb(critic, 3) + (mb(reference, 0) if reference is not None else 0.0)
    return f"{total:.1f} MiB before activations"


def load_critic(cfg: PPOConfig, tokenizer, policy, checkpoint):
    if cfg.critic.layout == "shared":
        return SharedValueHead.load(policy, checkpoint / "critic" if checkpoint else None)
    source = checkpoint / "critic" if checkpoint else (cfg.critic.path or cfg.rewards.reward_model or cfg.model.path)
    from tether.console import loading

    loading(f"the critic from {source}")
    critic = load_value_model(source, tokenizer, cfg.model.dtype)
    if not cfg.model.keep_dropout:
        disable_dropout(critic)
    return apply_precision(critic, cfg.model)


def run_ppo(cfg: PPOConfig, scorer=None, evaluate_fn=None, backend=None) -> dict:
    """Train; ``scorer(texts) -> list[float]`` stands in for --reward-model; ``evaluate_fn(policy, tokenizer, step)
    -> dict`` adds task metrics (on the lab: gold reward and win rate) to the periodic evaluation; ``backend(policy,
    tokenizer) -> GenerationBackend`` replaces Hugging Face generate (tether/rollout/)."""
    start = start_rollout_stage(cfg, scorer)
    critic = Extra(
        load=lambda tokenizer, policy: load_critic(cfg, tokenizer, policy, start.checkpoint),
        shard=lambda critic, accelerator: (
            critic if isinstance(critic, SharedValueHead) else shard_summed(critic, accelerator)
        ),
        # a shared head is one vector: whole on every process, on the device
        moves=lambda critic: isinstance(critic, SharedValueHead),
        restarts=lambda critic: (
            None
            if isinstance(critic, SharedValueHead)
            else (critic.rm, cfg.critic.path or cfg.rewards.reward_model or cfg.model.path)
        ),
    )
    models = load_online_models(cfg, start, True, scorer, critic)
    stage = PPOStage(
        cfg,
        models.tokenizer,
        models.policy,
        models.reference,
        models.extra,
        models.scorer(cfg, start, allow_process=False),
        start,
        backend(models.sampling_copy or models.policy, models.tokenizer) if backend else None,
        models.sampling_copy,
    )
    return run_online(stage, Schedule.of(cfg.train, cfg.train.max_steps), start, "tether ppo", evaluate_fn)
