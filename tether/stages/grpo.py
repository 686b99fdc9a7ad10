"""`tether grpo`: critic-free policy optimisation with group baselines (docs/algorithms.md §5), one stage for the
family.

A step: draw prompts_per_step prompts, sample group_size responses each (generate), score them (score), keep or
re-sample groups (dynamic sampling), compute old and reference log-probs when they are needed (logprobs), then
update_epochs passes of the group objective (update). Which advantage estimator, ratio, clip, aggregation and KL
placement are used is the recipe's choice (tether/stages/grpo_recipes.py), each a pure function in tether/algorithms/; the
loop around the step is tether/train/online.py.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

import torch

from tether.algorithms.advantages import groups_without_signal, process_advantages, token_advantages
from tether.algorithms.kl import kl_estimate
from tether.algorithms.objectives import group_objective
from tether.algorithms.policy import clip_fractions
from tether.console import console
from tether.models.work import phase
from tether.online_sections import minibatch_size, updates_per_step
from tether.rewards.score import Scorer, Scores
from tether.rollout.backends import response_seeds
from tether.rollout.batch import concat_rollouts
from tether.rollout.forward import describe_rows, reference_logprobs, response_logprobs
from tether.rollout.texts import step_end_tokens
from tether.stages.grpo_config import GRPOConfig
from tether.stages.grpo_recipes import RECIPES
from tether.train.experience import Experience, correction_weights, rollout_metrics, stats
from tether.train.offline import EpochOrder
from tether.train.online import Schedule, run_online, start_rollout_stage
from tether.train.online_setup import load_online_models
from tether.train.parallel import empty_rollout, gather_rollout, gather_scores
from tether.train.sampling import attach_sampling
from tether.train.schedule import advance_schedule, build_optimizer
from tether.train.sharding import grad_norm_value, reshard, sharded_reward_model, sharding_line

# dynamic sampling's top-up stream (with a rollout worker): its prompts' stream positions, which seed their responses
# (rollout.response_seeds), start here, far past any main-stream position a run reaches
TOPUP_POSITIONS = 1 << 40


def process_token_advantages(exp: Experience, tokenizer, pattern: str, group_size: int) -> torch.Tensor:
    """Step scores → token advantages (docs/algorithms.md §5, process supervision): step k ends where the k-th match
    of `pattern` in the response text ends; extra scores beyond the matches end at the last token. Agent episodes
    know their steps' ends (each policy turn's last token) and use them."""
    ids = exp.rollout.completion_ids()
    ends = exp.scores.step_ends
    if ends is None:
        regex = re.compile(pattern)
        ends = []
        for text, token_ids, scores in zip(exp.rollout.responses, ids, exp.scores.step_scores):
            char_ends = [m.end() for m in regex.finditer(text)][: len(scores)]
            char_ends += [len(text)] * (len(scores) - len(char_ends))
            ends.append(step_end_tokens(tokenizer, token_ids, char_ends))
    n = len(ids) // group_size
    grouped = lambda xs: [xs[i * group_size : (i + 1) * group_size] for i in range(n)]
    return process_advantages(grouped(exp.scores.step_scores), grouped(ends), exp.rollout.response_ids.shape[1])


@dataclass(frozen=True)
class GroupCounts:
    """What one step's sampling did: generation rounds, groups sampled, groups whose scores were all equal, kept."""

    rounds: int
    sampled: int
    zero_variance: int
    kept: int

    @property
    def zero_variance_frac(self) -> float:
        return self.zero_variance / max(self.sampled, 1)

    def metrics(self) -> dict:
        return {
            "groups/zero_variance_frac": self.zero_variance_frac,
            "sampling/rounds": self.rounds,
            "sampling/groups_sampled": self.sampled,
            "sampling/groups_kept": self.kept,
        }


class GroupStage:
    """The group family's step on the online loop."""

    name = "grpo"

    def __init__(
        self, cfg: GRPOConfig, tokenizer, policy, reference, scorer: Scorer, start, backend=None, sampling_copy=None
    ):
        self.cfg, self.tokenizer, self.policy, self.reference, self.scorer = cfg, tokenizer, policy, reference, scorer
        attach_sampling(self, cfg, tokenizer, policy, start, backend, sampling_copy)
        self.params = [q for q in policy.parameters() if q.requires_grad]
        self.updates_per_step = updates_per_step(cfg.algo, cfg.rollout)
        self.optimizer, self.scheduler = build_optimizer(
            self.params, cfg.optim, cfg.train.max_steps * self.updates_per_step
        )
        self.order = EpochOrder(len(self.prompts), cfg.train.seed)
        self.cursor = 0  # prompts drawn so far: dynamic sampling draws a varying number per step
        self.warned_until = 0
        self.queued = 0  # prompts queued with a rollout worker (rollout.max_staleness); none after a resume
        # dynamic sampling's later rounds beside a rollout worker: a stream of their own (another order of the same
        # prompts), so the main stream's cursor moves one step's prompts a step and its steps can be queued ahead
        self.topup, self.topup_cursor = EpochOrder(len(self.prompts), cfg.train.seed + 1), 0

    @property
    def sampling_policy(self):
        return self.sampler.sampling_policy

    def extra_parts(self) -> dict:
        return {}

    def state(self) -> dict:
        return {"cursor": self.cursor, "topup_cursor": self.topup_cursor}

    def load_state(self, state: dict) -> None:
        self.cursor = state["cursor"]
        self.topup_cursor = state.get("topup_cursor", 0)  # checkpoints before the top-up stream have none

    def summary(self) -> dict:
        return {"recipe": self.cfg.algo.recipe}

    @property
    def keep_old(self) -> bool:
        """With one update per rollout the ratio is exactly 1: the old log-probs are the current ones, detached."""
        return updates_per_step(self.cfg.algo, self.cfg.rollout) > 1

    def plan(self) -> dict:
        cfg, a = self.cfg, self.cfg.algo
        recipe = RECIPES[a.recipe]
        overridden = sorted(k for k, v in recipe.settings.items() if _value(cfg, k) != v)
        kl = (
            (f"{a.kl_estimator} x {a.kl_coef:g} in the loss" if a.kl_coef else "none in the loss")
            + (f"; {a.kl_estimator} x {a.kl_in_reward:g} in the reward" if a.kl_in_reward else "")
            + (" (reference: adapter-disabled policy)" if self.reference is None and cfg.needs_reference() else "")
        )
        return {
            "recipe": a.recipe + (f" (overridden: {', '.join(overridden)})" if overridden else ""),
            "prompts (train / eval)": f"{len(self.prompts)} / {len(self.eval_prompts)}",
            "responses per step": f"{cfg.rollout.prompts_per_step} prompts x {cfg.rollout.group_size}",
            "optimizer updates per step": f"{updates_per_step(a, cfg.rollout) // a.update_epochs} x {a.update_epochs} "
            f"pass(es) of {minibatch_size(a, cfg.rollout)} responses",
            "advantage / ratio / aggregation": f"{a.advantage} / {a.ratio} / {a.aggregation}"
            + (f" (L = {cfg.norm_length})" if a.aggregation == "seq-mean-token-sum-norm" else ""),
            "KL": kl,
            "forwards per step (each process)": self._forwards_line(),
            "log-prob rows": describe_rows(self.policy, cfg.model),
            "reward": self.scorer.describe(),
            "stop tokens": ", ".join(
                self.tokenizer.convert_ids_to_tokens(self.agent.stops if self.agent else self.stops)
            ),
            "generation": self.sampler.describe(),
            **(self.agent.plan() if self.agent else {}),
            "trainable parameters": f"{sum(q.numel() for q in self.params):,} of "
            f"{sum(q.numel() for q in self.policy.parameters()):,}",
            **(
                {
                    "sharding": sharding_line(
                        self.dp.world,
                        self.reference is not None,
                        cfg.model.offload_frozen,
                        self.sampler.sampling_copy is not None,
                        sharded_reward_model(self.scorer, cfg.model.offload_frozen),
                    )
                }
                if self.sharded
                else {}
            ),
        }

    def _forwards_line(self) -> str:
        """The plan's count of the step's no-grad and grad forwards over the rollout (forwards/* in metrics.jsonl)."""
        a, ro, world = self.cfg.algo, self.cfg.rollout, self.dp.world
        local = -(-minibatch_size(a, ro) // world)  # the most rows of one update a process takes
        micro = -(-local // a.micro_batch_size)
        why = (
            "old log-probs"
            if self.keep_old
            else "log-probs at sampling time, for the in-reward KL"
            if a.kl_in_reward
            else ""
        )
        return ", ".join(
            ([f"1 no-grad ({why})"] if why else [])
            + (["1 reference"] if self.cfg.needs_reference() else [])
            + [f"{updates_per_step(a, ro)} x {micro} with gradients (updates x micro-batches)"]
        )

    def evaluate(self) -> dict:
        return self.sampler.evaluate(self.eval_rows, self.scorer, self.cfg.train.seed, self.dp)

    def collect(self) -> tuple[Experience | None, "GroupCounts"]:
        """prompts_per_step groups; with dynamic sampling, groups whose scores are all equal are dropped and more
        prompts drawn, for at most max_sampling_rounds generation rounds. On N processes each samples and scores a
        contiguous share of a round's prompts (whole groups); the round is then gathered, so what follows is the
        one-process computation on every process (tether/train/parallel.py)."""
        ro, a, g, dp = self.cfg.rollout, self.cfg.algo, self.cfg.rollout.group_size, self.dp
        kept_rollouts, kept_rows, kept_scores = [], [], []
        needed, rounds, sampled, zero = ro.prompts_per_step, 0, 0, 0
        while needed > 0 and rounds < (a.max_sampling_rounds if a.dynamic_sampling else 1):
            # ── a round: each process samples and scores its share of the prompts; the round is gathered. With a
            # rollout worker a later round draws from the top-up stream, so every step's first round is the step's
            # own prompts, known (and queued) steps ahead ──
            if rounds and ro.max_staleness:
                indices = self.topup.slice(self.topup_cursor, needed)
                start = TOPUP_POSITIONS + self.topup_cursor  # stream positions (response seeds) of its own
                self.topup_cursor += needed
            else:
                indices, start = self.order.slice(self.cursor, needed), self.cursor
                self.cursor += needed
            mine = dp.shard(list(zip(indices, range(start, start + needed))))  # (prompt, stream position)
            local = dp.all_or_none(lambda: self.sample([i for i, _ in mine], [p for _, p in mine]))
            rollout = gather_rollout(dp, local[0], self.tokenizer.pad_token_id)
            scores = gather_scores(dp, local[1])
            # ── keep the groups whose scores vary (all, without dynamic sampling) ──
            rows = [self.rows[i] for i in indices for _ in range(g)]
            flat_zero = groups_without_signal(
                a.advantage,
                scores.total.view(-1, g) if scores.has_outcome else None,
                [scores.step_scores[i : i + g] for i in range(0, len(rows), g)]
                if scores.step_scores is not None
                else None,
            )
            sampled, zero, rounds = sampled + len(indices), zero + int(flat_zero.sum()), rounds + 1
            keep = (~flat_zero).nonzero().flatten() if a.dynamic_sampling else torch.arange(len(indices))
            keep = keep[:needed]
            if len(keep) == 0:
                continue
            idx = (keep[:, None] * g + torch.arange(g)).flatten()
            kept_rollouts.append(rollout.select(idx))
            kept_rows += [rows[i] for i in idx.tolist()]
            kept_scores.append(scores.select(idx))
            needed -= len(keep)
        counts = GroupCounts(rounds, sampled, zero, len(kept_rows) // g)
        if not kept_rollouts:
            return None, counts
        return Experience(
            concat_rollouts(kept_rollouts, self.tokenizer.pad_token_id), kept_rows, Scores.cat(kept_scores)
        ), counts

    def sample(self, prompt_indices: list[int], positions: list[int]):
        """(rollout, scores) of group_size responses to each prompt (positions: their places in the prompt stream)."""
        ro, g = self.cfg.rollout, self.cfg.rollout.group_size
        if not prompt_indices:
            if self.scorer is not None:
                self.scorer.join_idle()
            return empty_rollout(), None
        picked = [i for i in prompt_indices for _ in range(g)]
        seeds = response_seeds(self.cfg.train.seed, positions, g) if ro.response_seeds else None
        return self.sampler.sample(self.rows, picked, seeds, self.scorer, g)

    def queue_ahead(self, after_rounds: bool = False) -> None:
        """With rollout.max_staleness K: the prompts of this step and the K after it queued with the rollout worker,
        each step's after the weights of every update before it was pushed (rollout/async_worker.py), so the
        responses trained on at update u were drawn by a version ≥ u − K; none past the last step. On N processes each
        queues its own share with its own worker, the share ``collect`` will ask it for. (Dynamic sampling's later
        rounds come from the top-up stream, drawn when asked, so each step's first round is known ahead.)
        ``after_rounds``: called after this step's rounds (the cursor already past its prompts): the K steps after it."""
        ro, g = self.cfg.rollout, self.cfg.rollout.group_size
        end = self.cfg.train.max_steps * ro.prompts_per_step
        for later in range(ro.max_staleness + (0 if after_rounds else 1) if ro.max_staleness else 0):
            start = self.cursor + later * ro.prompts_per_step
            if self.queued <= start < end:
                indices = self.order.slice(start, ro.prompts_per_step)
                mine = self.dp.shard(list(zip(indices, range(start, start + ro.prompts_per_step))))
                picked = [i for i, _ in mine for _ in range(g)]
                seeds = response_seeds(self.cfg.train.seed, [p for _, p in mine], g) if ro.response_seeds else None
                if picked:
                    self.sampler.ahead(picked, seeds)
                self.queued = start + ro.prompts_per_step

    def step(self, step: int) -> tuple[dict, list]:
        advance_schedule(self.scheduler, step * self.updates_per_step)  # a short step before moved it on as planned
        # ── sample and score the step's groups (dynamic sampling: rounds until enough vary); with a rollout worker
        # the later steps' prompts are queued first, so it samples them while this step updates — after this step's
        # rounds with dynamic sampling, whose top-up rounds would otherwise wait behind the next step's prompts ──
        t0 = time.perf_counter()
        topping_up = self.cfg.algo.dynamic_sampling
        if not topping_up:
            self.queue_ahead()
        exp, counts = self.collect()
        if topping_up:
            self.queue_ahead(after_rounds=True)
        t1 = time.perf_counter()
        self._warn_if_flat(step, counts.zero_variance_frac)
        metrics = counts.metrics()
        if exp is None:
            console.print(
                f"step {step + 1}: every sampled group had equal scores after {counts.rounds} rounds; no update",
                style="yellow",
            )
            return {
                **metrics,
                "time/generate_score_s": t1 - t0,
                "time/logprobs_s": 0.0,
                "time/update_s": 0.0,
                "perf/tokens_per_s": 0.0,
            }, []
        # ── old and reference log-probs, token advantages ──
        with phase("logprobs"):
            self.prepare(exp)
        t2 = time.perf_counter()
        # ── the update's passes, then the new weights to the sampler ──
        metrics.update(self.sampler.async_figures(exp.rollout))  # the responses' staleness, before this update
        generator = torch.Generator().manual_seed(self.cfg.train.seed * 7919 + step)
        with phase("update"):
            update = self.update(exp, generator)
        self.sampler.weights_updated(self.policy)
        t3 = time.perf_counter()
        # ── metrics and the samples ──
        mask = exp.rollout.response_mask.bool()
        metrics.update(
            {
                **rollout_metrics(exp),
                **update,
                **stats("advantage", exp.advantages[mask]),
                "lr": self.scheduler.get_last_lr()[0],
                "time/generate_score_s": t1 - t0,
                "time/logprobs_s": t2 - t1,
                "time/update_s": t3 - t2,
                "perf/tokens_per_s": float(exp.rollout.lengths.sum()) / (t3 - t0),
            }
        )
        return metrics, exp.samples(step + 1, self.cfg.rollout.group_size)

    def _warn_if_flat(self, step: int, zero_variance_frac: float) -> None:
        if zero_variance_frac > 0.5 and not self.cfg.algo.dynamic_sampling and step >= self.warned_until:
            console.print(
                f"step {step + 1}: {zero_variance_frac:.0%} of groups scored all their responses "
                "equally; their advantages are 0, so the loss and the update are mostly 0. Raise group_size "
                "or temperature, use a finer reward, or --dynamic-sampling.",
                style="yellow",
            )
            self.warned_until = step + 10  # at most one warning per 10 steps

    @torch.no_grad()
    def prepare(self, exp: Experience) -> None:
        """Old and reference log-probs where they can differ from the current ones, and the token advantages.
        The forwards are split by rows over the processes; the advantages are computed whole on each."""
        a, rollout, temperature, dp = self.cfg.algo, exp.rollout, self.cfg.rollout.temperature, self.dp
        mask = rollout.response_mask.float()
        rows = self.cfg.model.forward_rows
        current = lambda r: response_logprobs(self.policy, r, temperature, **rows)
        exp.old_logprobs = dp.map_rows(current, rollout) if self.keep_old else None
        if self.cfg.needs_reference():
            exp.ref_logprobs = dp.map_rows(
                lambda r: reference_logprobs(self.reference, self.policy, r, temperature, **rows), rollout
            )
        kl_reward, now = None, exp.old_logprobs
        if now is None and a.kl_in_reward > 0:  # the log-probs at sampling time, which the ratio does not need
            now = dp.map_rows(current, rollout)
        if a.kl_in_reward > 0:
            kl_reward = kl_estimate(now, exp.ref_logprobs, a.kl_estimator) * mask
        if now is not None:
            exp.measure_sampler(now, self.cfg.rollout)
        # else on policy (one update, one minibatch): the update's own forward gives the log-probs at sampling time,
        # and the sampler gap and the importance weights are taken from it there (update), with no forward of its own
        if self.sharded:  # free the layers these no-grad forwards left gathered (train/sharding.py reshard)
            for model in (self.policy, self.reference):
                if model is not None:
                    reshard(model)
        advantages = token_advantages(
            a.advantage,
            exp.scores.total.to(mask.device),  # scores are computed on the CPU, the rollout lives on the device
            mask,
            self.cfg.rollout.group_size,
            kl_reward,
            a.kl_in_reward,
            a.gamma,
            a.std_eps,
        )
        if exp.scores.step_scores is not None:  # process reward: its token advantages, plus the outcome part if any
            process = (
                process_token_advantages(
                    exp, self.tokenizer, self.cfg.rewards.step_pattern, self.cfg.rollout.group_size
                ).to(mask.device)
                * mask
            )
            advantages = advantages + process if exp.scores.has_outcome else process
        exp.advantages = advantages

    def update(self, exp: Experience, generator: torch.Generator) -> dict:
        """update_epochs passes; each optimizer update's loss uses the update's own token and sequence counts, so
        splitting it into micro-batches — or over processes, each taking a contiguous part of the minibatch and
        the gradients summed — changes nothing (tests/test_objectives.py, tests/test_online_parallel.py)."""
        a, rollout, dp = self.cfg.algo, exp.rollout, self.dp
        mask = rollout.response_mask.float()
        loss_mask = mask * (~rollout.truncated).float()[:, None] if a.mask_truncated else mask
        n, mb = rollout.response_ids.shape[0], minibatch_size(a, self.cfg.rollout)
        sums: dict[str, float] = {name: 0.0 for name in self.STATISTICS}
        tokens, sequences, grad_norms = 0.0, 0.0, 0.0
        # a sampler's gap not yet measured (prepare): this single on-policy update's forwards are at sampling time
        at_sampling = (
            torch.zeros(rollout.response_ids.shape, dtype=torch.float64, device=mask.device)
            if rollout.sampler_logprobs is not None and exp.sampler_gap is None
            else None
        )
        # the importance weights that update applies, every process's rows, for the step's statistics
        applied = (
            torch.zeros_like(at_sampling)
            if at_sampling is not None and bool(self.cfg.rollout.off_policy_correction)
            else None
        )
        for _ in range(a.update_epochs):
            order = torch.randperm(n, generator=generator) if mb < n else torch.arange(n)
            for start in range(0, n, mb):
                idx = order[start : start + mb]
                self.optimizer.zero_grad(set_to_none=True)
                n_tokens, n_seq = float(loss_mask[idx].sum()), len(idx)
                for micro, real in dp.micro_batches(idx, a.micro_batch_size, lockstep=self.sharded):
                    figures = self._micro_batch(
                        exp,
                        micro,
                        loss_mask[micro],
                        n_tokens,
                        n_seq,
                        1.0 if real else 0.0,
                        at_sampling if real else None,
                        applied if real else None,
                    )
                    for name, value in figures.items():
                        sums[name] += value if real else 0.0
                dp.sum_gradients(self.params)
                norm = torch.nn.utils.clip_grad_norm_(
                    self.params, self.cfg.optim.max_grad_norm if self.cfg.optim.max_grad_norm > 0 else float("inf")
                )
                self.optimizer.step()
                self.scheduler.step()
                self.optimizer.zero_grad(set_to_none=True)  # not held through the next rollout and the save
                tokens, sequences = tokens + n_tokens, sequences + n_seq
                grad_norms += grad_norm_value(norm) * n_tokens
        if at_sampling is not None:  # the on-policy update's log-probs, every process's rows: the sampler gap's
            weights = dp.sum(applied).to(applied.device) if applied is not None else None
            exp.measure_sampler(dp.sum(at_sampling).to(at_sampling.device), self.cfg.rollout, weights)
        summed = dp.sum_dict(sums)
        out = {k: v / max(tokens, 1.0) for k, v in summed.items()}
        out["kl/ref_mean"] = summed["kl/ref_mean"] / max(sequences, 1.0)  # Σ_t KL per response, mean over responses
        out["policy/grad_norm"] = grad_norms / max(tokens, 1.0)
        if exp.ref_logprobs is None:
            out.pop("kl/ref_mean", None)
        return out

    STATISTICS = (
        "policy/clip_frac",
        "policy/clip_frac_low",
        "policy/clip_frac_high",
        "policy/entropy",
        "policy/ratio_mean",
        "kl/ref_mean",
        "policy/loss",
    )

    def _micro_batch(
        self,
        exp: Experience,
        micro: torch.Tensor,
        lm: torch.Tensor,
        n_tokens: float,
        n_seq: int,
        weight: float = 1.0,
        at_sampling: torch.Tensor | None = None,
        applied: torch.Tensor | None = None,
    ) -> dict:
        """Forward and backward of one micro-batch (its loss times ``weight``: 0 for a lock-step filler); returns
        token-weighted statistics (Σ value · tokens). ``at_sampling`` (B, T): the on-policy update's log-probs are
        recorded there, and the importance weights computed from them (rollout.off_policy_correction) recorded in
        ``applied``."""
        a = self.cfg.algo
        sub = exp.rollout.select(micro)
        logp, entropy = response_logprobs(
            self.policy, sub, self.cfg.rollout.temperature, with_entropy=True, **self.cfg.model.forward_rows
        )
        tis = exp.is_weights[micro] if exp.is_weights is not None else None
        if at_sampling is not None:
            at_sampling[micro] = logp.detach().to(at_sampling.dtype)
            if applied is not None:
                tis = correction_weights(logp.detach(), sub.sampler_logprobs, sub.response_mask, self.cfg.rollout)
                applied[micro] = tis.to(applied.dtype)
        old = exp.old_logprobs[micro] if exp.old_logprobs is not None else logp.detach()
        ref = exp.ref_logprobs[micro] if exp.ref_logprobs is not None else None
        loss, parts = group_objective(
            logp,
            old,
            exp.advantages[micro],
            lm,
            sub.response_mask,
            ratio=a.ratio,
            clip_low=a.clip_low,
            clip_high=a.clip_high,
            dual_clip=a.dual_clip,
            ref_logprobs=ref,
            kl_coef=a.kl_coef,
            kl_estimator=a.kl_estimator,
            aggregation=a.aggregation,
            n_tokens=n_tokens,
            n_sequences=n_seq,
            norm_length=self.cfg.norm_length,
            token_weights=tis,
        )
        (loss * weight if weight != 1.0 else loss).backward()
        k = float(lm.sum())
        rmask = sub.response_mask.bool()
        count = int(rmask.sum())
        # sum / count, not .mean(): CUDA's mean multiplies by 1/count, so the on-policy ratio's mean of ones would
        # read 0.99999994 there
        figures = {
            **clip_fractions(parts["clipped_low"], parts["clipped_high"], lm),
            "policy/entropy": float(entropy.detach()[rmask].sum()) / count if count else 0.0,
            "policy/ratio_mean": float(parts["ratio"].detach()[rmask].sum()) / count if count else 1.0,
        }
        out = {name: float(value) * k for name, value in figures.items()}
        out["kl/ref_mean"] = float((parts["kl"].detach() * sub.response_mask).sum())  # Σ over the responses
        out["policy/loss"] = float(loss.detach()) * n_tokens
        return out


def _value(cfg: GRPOConfig, dotted: str):
    section, key = dotted.split(".", 1)
    return getattr(getattr(cfg, section), key)


def run_grpo(cfg: GRPOConfig, scorer=None, evaluate_fn=None, backend=None) -> dict:
    """Train. ``scorer(texts) -> list[float]`` stands in for --reward-model; ``evaluate_fn(policy, tokenizer, step) ->
    dict`` adds task metrics (on the lab: held-out accuracy) to every evaluation; ``backend(policy, tokenizer) ->
    GenerationBackend`` replaces Hugging Face generate (tether/rollout/)."""
    start = start_rollout_stage(cfg, scorer)
    models = load_online_models(cfg, start, cfg.needs_reference(), scorer)
    stage = GroupStage(
        cfg,
        models.tokenizer,
        models.policy,
        models.reference,
        models.scorer(cfg, start),
        start,
        backend(models.sampling_copy or models.policy, models.tokenizer) if backend else None,
        models.sampling_copy,
    )
    try:
        return run_online(stage, Schedule.of(cfg.train, cfg.train.max_steps), start, "tether grpo", evaluate_fn)
    finally:  # a rollout worker (rollout.max_staleness) ends with the run, its weight files with it
        close = getattr(stage.sampler.backend, "close", None)
        if close is not None:
            close()
