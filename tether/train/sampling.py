"""The online stages' one sampling path: what PPO and the group family sample with (online DPO samples its pairs
through the same backend table, rollout/backends.py make_backend; with rollout.max_staleness a rollout worker,
rollout/async_worker.py).

Set-up (the backend named by ``rollout.backend``, the rendered prompts checked against the model's context, the one
stop set, the agent sampler for multi-turn episodes), a step's sampling (responses, or whole episodes scored by
their environment) and the periodic evaluation's sampling all go through ``OnlineSampler``; after each optimizer
step the stage calls ``weights_updated`` so a backend holding its own copy of the weights can reload them.
"""

from __future__ import annotations

from tether.agents.episodes import AgentSampler
from tether.agents.worker import serve_episodes
from tether.config import ConfigError
from tether.data.multimodal import encode_prompt
from tether.models.lm import check_prompt_context, model_context
from tether.models.shards import is_sharded
from tether.models.vision import is_vision_language, load_processor
from tether.models.work import phase, section
from tether.rollout.async_worker import AsyncRolloutBackend
from tether.rollout.backends import make_backend, require_sampler_logprobs, response_seeds
from tether.rollout.prompts import render_prompts, stop_token_ids
from tether.train.parallel import DataParallel
from tether.train.sharding import copy_gathered


def sampling_backend(settings, policy, tokenizer, processor=None, dp=None):
    """What an online stage samples with: a rollout worker beside the trainer when rollout.max_staleness ≥ 1 (its
    sampler the backend rollout.backend names; rollout/async_worker.py), else that backend itself
    (rollout/backends.py make_backend). ``dp``: the stage's data parallelism (train/parallel.py), which
    rollout_workers = one hands the rows out through."""
    if getattr(settings, "max_staleness", 0) > 0:
        if processor is not None and dp is not None and dp.active and settings.rollout_workers == "one":
            raise ConfigError(  # process 0 would need every process's pixels
                "a vision-language policy with --max-staleness samples through a rollout worker beside each process; "
                "--rollout-workers one on several processes is not built for it yet: use --rollout-workers per_process"
            )
        if settings.backend == "hf":  # the worker's sampler is a copy: it keeps its log-probs (HFGenerate copy=True)
            require_sampler_logprobs(settings, policy, "--max-staleness with the hf backend")
        return AsyncRolloutBackend(policy, tokenizer, settings, dp, processor)
    return make_backend(settings, policy, tokenizer, processor)


class ImagePrompts:
    """A vision-language model's prompt rows as it samples from them (data/multimodal.py encode_prompt): each row's
    rendered text and prompt length are kept; its token ids and pixel tensors are made again whenever it is sampled,
    so no image is held in memory between steps. Every row is encoded once here: a missing or unreadable image, or a
    placeholder count that does not match, is an error before training, naming the file, row and field."""

    def __init__(self, tokenizer, processor, rows: list[dict], where: str, max_pixels: int):
        self.rows, self.where = rows, where
        self.make = lambda i: encode_prompt(rows[i], tokenizer, processor, f"{where} row {i + 1}", max_pixels)
        self.texts, self.lengths, self.shown = [], [], 0  # shown: rows with at least one image
        for i in range(len(rows)):
            text, ids, _, images = self.make(i)
            self.texts.append(text)
            self.lengths.append(len(ids))
            self.shown += bool(images)

    def encode(self, i: int) -> tuple[list[int], dict | None]:
        """(token ids, pixel tensors or None) of row ``i``."""
        ids, vision, _ = self.encode_with_images(i)
        return ids, vision

    def encode_with_images(self, i: int) -> tuple[list[int], dict | None, list]:
        """(token ids, pixel tensors or None, its PIL images) of row ``i``: an engine that processes the images
        itself (vLLM) is given the images."""
        _, ids, vision, images = self.make(i)
        return ids, vision, images


class OnlineSampler:
    """One stage's sampling: ``backend`` (rollout.backend, or a stand-in given to run_ppo / run_grpo), ``prompts``
    and ``eval_prompts`` (the rendered prompt rows), ``stops`` (the one stop set) and ``agent`` (an AgentSampler
    when agent.env names an environment, else None)."""

    def __init__(
        self,
        cfg,
        tokenizer,
        policy,
        rows: list[dict],
        eval_rows: list[dict],
        backend=None,
        reward_set=None,
        sampling_copy=None,
        dp=None,
        audit=None,
    ):
        ro, agent_cfg = cfg.rollout, getattr(cfg, "agent", None)
        self.rollout_cfg = ro
        self.rows = rows
        # a sharded policy (--fsdp) samples through its ordinary copy with the hf backend, or is pushed into the
        # engine gathered (train/sharding.py shard_trained_online)
        self.sampling_copy = sampling_copy
        self.sampling_policy = sampling_copy if sampling_copy is not None else policy
        policy = self.sampling_policy
        self.images = self.eval_images = None  # a vision-language model's prompts: ImagePrompts
        self.processor = None  # a vision-language model's: saved with its checkpoints and final/ (train/online.py)
        if is_vision_language(cfg.model.path):
            self.processor = load_processor(cfg.model.path, tokenizer, cfg.model.trust_remote_code)
        self.backend = backend or sampling_backend(ro, policy, tokenizer, self.processor, dp)
        if self.processor is not None:
            processor = self.processor
            pixels = cfg.model.max_image_pixels
            self.images = ImagePrompts(tokenizer, processor, rows, ro.prompts, pixels)
            self.eval_images = ImagePrompts(tokenizer, processor, eval_rows, ro.eval_prompts, pixels)
            self.prompts, self.eval_prompts = self.images.texts, self.eval_images.texts
            lengths = self.images.lengths
        else:
            self.prompts = render_prompts(tokenizer, rows, ro.prompts)
            self.eval_prompts = render_prompts(tokenizer, eval_rows, ro.eval_prompts) if eval_rows else []
            lengths = [len(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in self.prompts]
        episodes = agent_cfg is not None and bool(agent_cfg.env)
        if not episodes:  # each prompt and its response budget fit the model's positions
            check_prompt_context(lengths, ro.max_new_tokens, model_context(policy), ro.prompts)
        self.stops = stop_token_ids(tokenizer, policy)
        if getattr(self.backend, "one_worker", False):  # every process asks the one worker in step, so each has rows
            fewest = min(ro.prompts_per_step, len(self.eval_prompts) if self.eval_prompts else ro.prompts_per_step)
            if fewest < dp.world:
                raise ConfigError(
                    f"--rollout-workers one on {dp.world} processes: every process must sample in every step and "
                    f"evaluation, so prompts_per_step ({ro.prompts_per_step}) and the held-out prompts "
                    f"({len(self.eval_prompts)}) must be at least {dp.world}"
                )
        self.agent = (
            AgentSampler(
                agent_cfg, tokenizer, self.backend, ro, self.stops, rows, reward_set, audit, cfg.rewards.audit_share
            )
            if episodes
            else None
        )
        if self.agent is not None:  # a rollout worker draws the episodes with a sampler built as this one
            serve_episodes(self.agent, self.backend)

    @classmethod
    def of_stage(cls, cfg, tokenizer, policy, start, backend=None, sampling_copy=None, dp=None) -> "OnlineSampler":
        """The sampler of a PPO or group-family stage opened by ``start`` (train/online.py OnlineStart)."""
        reward_set = start.reward_set if cfg.agent.env else None  # an environment's episodes, scored beside it
        audit = start.audit_set if cfg.agent.env else None  # else the Scorer audits the responses
        rows, eval_rows = start.prompt_rows, start.eval_rows
        return cls(cfg, tokenizer, policy, rows, eval_rows, backend, reward_set, sampling_copy, dp, audit)

    def generate(self, prompt_indices: list[int], seeds: list[int] | None):
        """One response per entry of ``prompt_indices`` (repeat an index for a group)."""
        with phase("sample"):
            return self._generate(self.images, self.prompts, prompt_indices, seeds)

    def _generate(self, images, prompts: list[str], indices: list[int], seeds: list[int] | None):
        """The backend's responses to ``prompts[i]`` for each i of ``indices``: as text, or (a vision-language model,
        ``images``) as the processor's token ids with each prompt's pixel tensors."""
        if images is None:
            return self.backend.generate([prompts[i] for i in indices], self.rollout_cfg, self.stops, seeds)
        contexts, vision, pictures = self._with_images(images, prompts, indices)
        rollout = self.backend.generate_ids(contexts, self.rollout_cfg, self.stops, seeds, vision=vision, **pictures)
        rollout.prompts = [prompts[i] for i in indices]
        return rollout

    def _with_images(self, images, prompts: list[str], indices: list[int]) -> tuple[list, list, dict]:
        """(token ids, pixel tensors, and for an engine that processes the images itself — vLLM, in the trainer or
        in a rollout worker — the images and texts: its prompt ids are checked against these) of each index."""
        encoded = {i: images.encode_with_images(i) for i in set(indices)}  # a group's prompt once
        pictures = (
            {"images": [encoded[i][2] for i in indices], "texts": [prompts[i] for i in indices]}
            if self.backend.reads_images
            else {}
        )
        return [encoded[i][0] for i in indices], [encoded[i][1] for i in indices], pictures

    def sample(self, rows: list[dict], prompt_indices: list[int], seeds: list[int] | None, scorer, group_size=1):
        """(rollout, scores): episodes scored by their environment, or responses scored by ``scorer``
        (``prompt_indices`` in contiguous groups of ``group_size``: a judge may compare a group's answers)."""
        if self.agent is not None:
            with phase("sample"):
                return self.agent([rows[i] for i in prompt_indices], seeds)
        rollout = self.generate(prompt_indices, seeds)
        return rollout, scorer(rollout, [rows[i] for i in prompt_indices], group_size)

    def ahead(self, prompt_indices: list[int], seeds: list[int] | None) -> None:
        """A later step's request, queued now with a backend that samples beside the trainer (rollout.max_staleness:
        rollout/async_worker.py); nothing with any other backend."""
        if self.agent is not None:  # episodes: the worker draws them whole, environments and all
            self.agent.ahead([self.rows[i] for i in prompt_indices], seeds)
            return
        prefetch = getattr(self.backend, "prefetch", None)
        if prefetch is None:
            return
        if self.images is None:
            prefetch([self.prompts[i] for i in prompt_indices], self.stops, seeds)
            return
        contexts, vision, pictures = self._with_images(self.images, self.prompts, prompt_indices)
        self.backend.prefetch_ids(contexts, self.stops, seeds, vision, **pictures)

    def async_figures(self, rollout) -> dict:
        """The rollout worker's figures of a step's responses (async/*, docs/metrics.md); {} without one."""
        figures = getattr(self.backend, "step_figures", None)
        return figures(rollout) if figures is not None else {}

    def weights_updated(self, policy) -> None:
        """After an update (every process calls it): see ``weights_updated``."""
        weights_updated(self.backend, policy, self.sampling_copy)

    def describe(self) -> str:
        """The plan's line: which backend samples, and with what (a stand-in backend may not say)."""
        describe = getattr(self.backend, "describe", None)
        text = describe() if describe is not None else type(self.backend).__name__
        if self.images is not None:
            text += (
                f"; {self.images.shown} of {len(self.prompts)} prompts show images, given to every forward of their "
                "responses (sampling, log-probs, reference, critic) in padded rows"
            )
        return text + sampler_correction_line(self.rollout_cfg)

    def evaluate(self, rows: list[dict], scorer, seed: int, dp=None) -> dict:
        """eval/* of one sampled response per held-out prompt, with the same sampling noise at every evaluation.
        On N processes (``dp``) each samples and scores a contiguous share of the prompts; the means are global.
        With an environment (``agent``): one episode per prompt instead, with its agent/* figures. A judge that
        compares a group's answers (``scorer.evaluation_group`` > 1) gets that many answers per prompt, and every
        figure is their mean."""
        import torch

        from tether.train.parallel import DataParallel, shard_bounds

        dp = dp or DataParallel()
        prompts, sampling, agent = self.eval_prompts, self.rollout_cfg, self.agent
        if not prompts:
            return {}
        start, stop = shard_bounds(len(prompts), dp.world, dp.rank)
        per = getattr(scorer, "evaluation_group", 1) if agent is None else 1

        def sample_and_score() -> dict:
            if stop == start:
                if agent is None:  # a sharded reward model scores in step on every process
                    scorer.join_idle()
                return {}
            # the evaluation draws from a seed of its own, and every generator the reseed touches is put back after
            # (the CPU's, and a GPU's: manual_seed reseeds those too, and HF sampling there draws from them), so
            # training draws what it would without evaluations
            gpus = range(torch.cuda.device_count()) if torch.cuda.is_available() and torch.cuda.is_initialized() else []
            with torch.random.fork_rng(devices=gpus):
                torch.manual_seed(seed + 12345)
                # a rollout worker's unseeded draws come from its own RNG, which the reseed does not reach: its
                # evaluations are seeded per response, so each is drawn alike and none moves the training samples
                seeded = sampling.response_seeds or self.backend.draws_from_own_rng
                seeds = response_seeds(seed + 12345, list(range(start, stop)), per) if seeded else None
                if agent is not None:
                    rollout, scores = agent(rows[start:stop], seeds)
                else:
                    asked = [i for i in range(start, stop) for _ in range(per)]
                    rollout = self._generate(self.eval_images, prompts, asked, seeds)
            figures = {}
            if agent is None:
                asked_rows = [r for r in rows[start:stop] for _ in range(per)]
                scores = scorer(rollout, asked_rows, per)
                shift = getattr(scorer, "image_shift", None)  # a vision-language reward model's image probe
                value = shift(asked_rows, rollout.responses) if shift is not None else None
                if value is not None:
                    figures["eval/reward/image_shift"] = value * (stop - start)  # a sum over this share, as the rest
            if scores.records is not None:  # sums over this share, like the rest
                figures |= agent_eval_sums(scores.records)
            return {
                "eval/score_mean": float(scores.total.sum()) / per,
                "eval/length_mean": float(rollout.lengths.float().sum()) / per,
                **{f"eval/reward/{name}": float(v.sum()) / per for name, v in scores.parts.items()},
                **figures,
            }

        with section("eval"), phase("sample"):  # the scorer's reward-model forwards name their own phase
            sums = dp.all_or_none(sample_and_score)
        names = dp.gather_json(sorted(sums))
        sums = dp.sum_dict({k: sums.get(k, 0.0) for k in sorted(set(names))})
        return eval_figures(sums, len(prompts))


RATE_PARTS = ("#judged", "#of")  # a rate's numerator and denominator, summed over the processes' shares


def agent_eval_sums(records: list[dict]) -> dict:
    """The evaluation's agent figures of one share of the episodes, as sums: the per-episode means times the share's
    episodes, and each rate's numerator and denominator (success over the judged episodes, claims over the episodes
    that say), which the processes' shares judge in different numbers, so a rate is their sums' ratio."""
    figures = {
        "eval/agent/turns_mean": sum(r["turns"] for r in records),
        "eval/agent/tool_calls_mean": sum(sum(r["calls"].values()) for r in records),
    }
    for rate, field in (("eval/agent/success_rate", "success"), ("eval/agent/claimed_rate", "claimed")):
        judged = [r[field] for r in records if r[field] is not None]
        figures[rate + "#judged"] = float(sum(bool(v) for v in judged))
        figures[rate + "#of"] = float(len(judged))
    return {k: float(v) for k, v in figures.items()}


def eval_figures(sums: dict, prompts: int) -> dict:
    """eval/* from the processes' summed figures: means over the prompts, and each agent rate the ratio of its summed
    numerator and denominator (agent_eval_sums); a rate no episode was judged for is left out."""
    rates = {}
    for key in sums:
        if key.endswith("#of") and sums[key] > 0:
            rate = key.removesuffix("#of")
            rates[rate] = sums[rate + "#judged"] / sums[key]
    return {k: v / prompts for k, v in sums.items() if not k.endswith(RATE_PARTS)} | rates


def attach_sampling(stage, cfg, tokenizer, policy, start, backend=None, sampling_copy=None) -> None:
    """What PPO's and the group family's steps read of their sampling, set on ``stage`` once: ``rows`` and
    ``eval_rows`` (the prompt files' rows), ``dp`` (data parallelism), ``sharded`` (--fsdp: every forward and backward
    of the policy is collective), ``sampler`` (this module's OnlineSampler), ``prompts``, ``eval_prompts``, ``stops``,
    ``agent``; and, with an environment, ``scorer`` becomes the agent sampler (the environment scores the episodes;
    the loop counts its faults)."""
    stage.rows, stage.eval_rows = start.prompt_rows, start.eval_rows
    stage.dp = DataParallel(start.accelerator)
    stage.sharded = is_sharded(policy)
    stage.sampler = OnlineSampler.of_stage(cfg, tokenizer, policy, start, backend, sampling_copy, stage.dp)
    stage.prompts, stage.eval_prompts = stage.sampler.prompts, stage.sampler.eval_prompts
    stage.stops, stage.agent = stage.sampler.stops, stage.sampler.agent
    if stage.agent is not None:
        stage.scorer = stage.agent


def weights_updated(backend, policy, sampling_copy=None) -> None:
    """After an update (every process calls it, in step): a sharded policy's weights are gathered into the copy that
    samples (the hf backend), and the backend told (an engine is pushed the weights; a sharded policy's are gathered
    a parameter at a time as they are written, rollout/vllm_backend.py)."""
    if sampling_copy is not None:
        copy_gathered(policy, sampling_copy)
    backend.weights_updated(sampling_copy if sampling_copy is not None else policy)


def sampler_correction_line(ro) -> str:
    """The plan's word on the sampler gap: corrected (rollout.off_policy_correction) or only logged, and how that
    differs from TRL, which corrects a vLLM sampler by default (sequence_mask, cap 3)."""
    if ro.off_policy_correction:
        bounds = f"[{ro.is_ratio_min:g}, {ro.is_ratio_max:g}]" if ro.is_ratio_max else f"[{ro.is_ratio_min:g}, inf)"
        return f"; off-policy correction {ro.off_policy_correction}, ratio bounds {bounds}"
    if ro.backend == "vllm" or ro.sampling_dtype:
        return (
            "; the sampler gap is logged (rollout/sampler_*), not corrected: --off-policy-correction corrects it "
            "(TRL's use_vllm corrects by default: sequence_mask, cap 3)"
        )
    return ""
