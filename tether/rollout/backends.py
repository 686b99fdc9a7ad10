"""Generation backends: what samples the online stages' responses, chosen by ``rollout.backend``.

``BACKENDS`` maps each name to its class: ``hf``, the trained policy itself sampled with the KV cache, and ``vllm``, a
vLLM engine per training process (rollout/vllm_backend.py); a new engine is one class and one row in the table.
Every backend returns the same Rollout, cut by the one stop set.
"""

from __future__ import annotations

from typing import Protocol

import torch

from tether.models.cpu import refuse_bf16_attention_where_torch_cannot
from tether.models.lm import DTYPES
from tether.models.vision import join_vision, on_model
from tether.rollout.batch import Rollout, concat_rollouts, left_pad
from tether.rollout.decoding import Sampler, can_compact, decode, seeded_generators
from tether.rollout.decoding import greedy as greedy_choice
from tether.rollout.prompts import response_mask_from_stops, stop_token_ids
from tether.rollout.vllm_backend import VLLMBackend


def response_seeds(seed: int, positions: list[int], samples: int = 1) -> list[int]:
    """One seed per response: prompt ``positions`` (in the run's prompt stream) × ``samples`` answers each."""
    return [(seed * 1_000_003 + p) * 1009 + j for p in positions for j in range(samples)]


class SeededSampler:
    """generate()'s logits processor for per-response seeds: samples each row's next token from
    softmax(top-k/top-p(logits / τ)) with the row's own generator, and returns scores whose argmax is that token
    (generation then runs greedy): a response depends on its seed and its prompt only, not on the batch it is
    generated in nor on the process — so N processes sample what one does. `decode` draws the same tokens with
    decoding.Sampler; this serves the generate() path (compact=False, or a model decode cannot run)."""

    def __init__(self, seeds: list[int], temperature: float, top_p: float, top_k: int, device):
        self.sampler = Sampler(temperature, top_p, top_k, seeded_generators(seeds, device))

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        picked = self.sampler(scores, torch.arange(scores.shape[0]))
        out = torch.full_like(scores, float("-inf"))
        return out.scatter(-1, picked[:, None], 0.0)


@torch.no_grad()
def generate_rollout(
    model,
    tokenizer,
    prompts: list[str],
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    stop_ids: list[int] | None = None,
    seeds: list[int] | None = None,
    compact: bool = True,
    sampler_logprobs: bool = False,
) -> Rollout:
    """Sample one response per prompt with the KV cache; prompts are left-padded, positions come from the mask.
    ``seeds`` (one per prompt): each response is drawn with its own generator instead of the global RNG.
    ``compact``, ``sampler_logprobs``: as in generate_from_ids."""
    ids = tokenizer(prompts, add_special_tokens=False)["input_ids"]
    rollout = generate_from_ids(
        model,
        tokenizer,
        ids,
        max_new_tokens,
        temperature,
        top_p,
        top_k,
        stop_ids,
        seeds,
        compact=compact,
        sampler_logprobs=sampler_logprobs,
    )
    rollout.prompts = list(prompts)
    return rollout


@torch.no_grad()
def generate_from_ids(
    model,
    tokenizer,
    contexts: list[list[int]],
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    stop_ids: list[int] | None = None,
    seeds: list[int] | None = None,
    greedy: bool = False,
    compact: bool = True,
    sampler_logprobs: bool = False,
    vision: list | None = None,
) -> Rollout:
    """generate_rollout from token ids (a multi-turn transcript is continued from the exact tokens it holds, never
    a re-tokenisation of its text). ``greedy``: argmax decoding (evaluation only; training rollouts sample).
    ``compact``: sample with decoding.decode, which stops computing finished rows; False (or a model it cannot
    run) uses Hugging Face's generate(), its naive twin. ``sampler_logprobs``: keep each sampled token's
    log-probability under the distribution it was drawn from (Rollout.sampler_logprobs; decode only): a model
    that is not the trainer's (a bf16 sampling copy) has its gap to the trainer measured and corrected. ``vision``
    (one per context, a dict or None): a vision-language model's pixel tensors of each context (its image tokens
    already widened), given to the prefill; the rollout keeps them for every later forward."""
    if sampler_logprobs and (greedy or not (compact and can_compact(model))):
        raise ValueError("sampler log-probs are kept by decoding.decode only, when sampling (not greedy)")
    if temperature <= 0 and not greedy:
        raise ValueError("rollouts sample: temperature must be > 0 (the log-probs are computed at that temperature)")
    stop_ids = stop_ids or stop_token_ids(tokenizer, model)
    device = next(model.parameters()).device
    input_ids, attention = left_pad(contexts, tokenizer.pad_token_id, device)
    if seeds is not None and len(seeds) != len(contexts):
        raise ValueError(f"{len(seeds)} seeds for {len(contexts)} prompts")
    shown = {}
    if vision is not None:
        offsets = [input_ids.shape[1] - len(c) for c in contexts]
        shown = on_model(model, join_vision(vision, input_ids.shape[1], offsets))
    was_training = model.training
    model.eval()
    if compact and can_compact(model):
        choose = (
            greedy_choice
            if greedy
            else Sampler(temperature, top_p, top_k, seeded_generators(seeds, device) if seeds is not None else None)
        )
        kept = torch.zeros((len(contexts), max_new_tokens), dtype=torch.float32) if sampler_logprobs else None
        response_ids = decode(
            model, input_ids, attention, max_new_tokens, stop_ids, tokenizer.pad_token_id, choose, kept, shown
        )
    else:
        response_ids = _hf_generate(
            model,
            tokenizer,
            input_ids,
            attention,
            max_new_tokens,
            temperature,
            top_p,
            top_k,
            stop_ids,
            seeds,
            greedy,
            shown,
        )
    model.train(was_training)
    mask, truncated = response_mask_from_stops(response_ids, stop_ids)
    response_ids = torch.where(mask.bool(), response_ids, torch.full_like(response_ids, tokenizer.pad_token_id))
    texts = tokenizer.batch_decode(response_ids, skip_special_tokens=True)
    rollout = Rollout(input_ids, attention, response_ids, mask, truncated, [""] * len(contexts), texts)
    rollout.vision = list(vision) if vision is not None else None
    if sampler_logprobs:
        rollout.sampler_logprobs = kept[:, : response_ids.shape[1]].to(device) * mask
    return rollout


def _hf_generate(
    model, tokenizer, input_ids, attention, max_new_tokens, temperature, top_p, top_k, stop_ids, seeds, greedy, shown
) -> torch.Tensor:
    """(B, T) new tokens from Hugging Face's generate(): every row runs until the longest stops."""
    if greedy:
        sampling = dict(do_sample=False, temperature=None, top_p=None, top_k=None)
    elif seeds is None:
        sampling = dict(do_sample=True, temperature=temperature, top_p=top_p, top_k=top_k)
    else:
        from transformers import LogitsProcessorList

        sampler = SeededSampler(seeds, temperature, top_p, top_k, input_ids.device)
        sampling = dict(
            do_sample=False, logits_processor=LogitsProcessorList([sampler]), temperature=None, top_p=None, top_k=None
        )
    out = model.generate(
        input_ids=input_ids,
        attention_mask=attention,
        **sampling,
        max_new_tokens=max_new_tokens,
        eos_token_id=stop_ids,
        pad_token_id=tokenizer.pad_token_id,
        **shown,
    )
    return out[:, input_ids.shape[1] :]


class GenerationBackend(Protocol):
    """What samples the online stages' responses (docs/scaling.md, "Generation backends"). The stages call
    generate() for every rollout and evaluation, and weights_updated() after each step's optimizer updates; they
    never look inside. A backend returns the sampled token ids right-padded after the stop token, the response
    mask and truncation flags of the one stop set (response_mask_from_stops) and the decoded text; log-probs are
    always recomputed by the trainer's own forward, so a backend's numerics never enter the loss unseen. A backend
    that is not the trained model itself also returns its own log-prob of every sampled token
    (Rollout.sampler_logprobs): the stages log the gap and can weight the loss by it (rollout.off_policy_correction)."""

    samples_trainer_weights: bool  # samples with the trained model's own weights (nothing to copy, no sampler gap)
    # takes each prompt's PIL images in generate_ids (``images``) and processes them itself (a vLLM engine); False:
    # it is given the processor's pixel tensors (``vision``) alone
    reads_images: bool
    # an unseeded draw (seeds None) comes from an RNG of the backend's own process, which the trainer's
    # torch.manual_seed does not reach (a rollout worker); False: from the trainer's torch RNG (hf, vLLM in-process)
    draws_from_own_rng: bool

    def generate(self, prompts: list[str], sampling, stop_ids: list[int], seeds: list[int] | None = None) -> Rollout:
        """One response per prompt, sampled with ``sampling``'s max_new_tokens, temperature, top_p and top_k;
        ``seeds``: one per prompt (rollout.response_seeds) or None for the backend's own RNG."""

    def weights_updated(self, policy) -> None:
        """The policy's weights changed: a backend holding its own copy (a vLLM engine) loads them here."""

    def generate_ids(
        self,
        contexts: list[list[int]],
        sampling,
        stop_ids: list[int],
        seeds: list[int] | None = None,
        max_new_tokens: int | None = None,
        greedy: bool = False,
        vision: list | None = None,
    ) -> Rollout:
        """Continue token-id contexts (multi-turn transcripts, tether/agents); as generate() otherwise.
        ``max_new_tokens`` overrides sampling's; ``greedy``: argmax (evaluation); ``vision``: a vision-language
        model's pixel tensors per context (generate_from_ids; a backend that cannot take them refuses by name)."""


class HFGenerate:
    """The trained policy itself, sampled with the KV cache (decoding.decode, finished rows dropped; generate()
    when sampling.drop_finished_rows is off): it samples from the weights being trained, so there is nothing to
    copy after an update.

    With rollout.sampling_dtype (bf16 under an fp32 policy) it samples from a copy of the policy in that dtype
    instead, refreshed after each update (``weights_updated``), and keeps each sampled token's log-prob under the
    copy (Rollout.sampler_logprobs), so the stages measure and can correct the gap, as with a vLLM engine."""

    samples_trainer_weights = True
    draws_from_own_rng = False
    reads_images = False  # the policy's own forward takes the processor's pixel tensors

    def __init__(self, model, tokenizer, settings=None, copy: bool = False):
        """``copy``: ``model`` is not the trained policy but a copy of some version of it (the rollout worker's,
        rollout/async_worker.py): it samples, keeping each sampled token's log-prob as a sampling copy does."""
        self.model, self.tokenizer = model, tokenizer
        self.sampler = model  # what samples: the policy itself, or its copy in the sampling dtype
        self.samples_trainer_weights = not copy
        wanted = getattr(settings, "sampling_dtype", "")
        if wanted and DTYPES[wanted] != next(model.parameters()).dtype:
            self.sampler = _sampling_copy(model, DTYPES[wanted], settings)
            self.samples_trainer_weights = False

    def weights_updated(self, policy) -> None:
        """A sampling copy takes the updated weights, cast to its dtype (nothing to do when the policy samples)."""
        self.model = policy
        if self.sampler is not policy and not self.samples_trainer_weights:
            self.sampler.load_state_dict(policy.state_dict())

    def describe(self) -> str:
        if self.samples_trainer_weights:
            return "the trained policy (Hugging Face model, KV cache)"
        dtype = str(next(self.sampler.parameters()).dtype).removeprefix("torch.")
        return f"a {dtype} copy of the trained policy (Hugging Face model, KV cache; refreshed after each update)"

    def generate(self, prompts: list[str], sampling, stop_ids: list[int], seeds: list[int] | None = None) -> Rollout:
        return self._in_parts(
            sampling,
            len(prompts),
            lambda part: generate_rollout(
                self.sampler,
                self.tokenizer,
                prompts[part],
                sampling.max_new_tokens,
                sampling.temperature,
                sampling.top_p,
                sampling.top_k,
                stop_ids,
                seeds=_part_of(seeds, part),
                compact=getattr(sampling, "drop_finished_rows", True),
                sampler_logprobs=not self.samples_trainer_weights,
            ),
        )

    def generate_ids(
        self,
        contexts: list[list[int]],
        sampling,
        stop_ids: list[int],
        seeds: list[int] | None = None,
        max_new_tokens: int | None = None,
        greedy: bool = False,
        vision: list | None = None,
    ) -> Rollout:
        return self._in_parts(
            sampling,
            len(contexts),
            lambda part: generate_from_ids(
                self.sampler,
                self.tokenizer,
                contexts[part],
                max_new_tokens or sampling.max_new_tokens,
                sampling.temperature,
                sampling.top_p,
                sampling.top_k,
                stop_ids,
                _part_of(seeds, part),
                greedy=greedy,
                compact=getattr(sampling, "drop_finished_rows", True),
                sampler_logprobs=not (greedy or self.samples_trainer_weights),
                vision=_part_of(vision, part),
            ),
        )

    def _in_parts(self, sampling, rows: int, draw) -> Rollout:
        """``draw(slice)`` over consecutive parts of sampling.generation_batch rows (0: all at once), joined."""
        size = getattr(sampling, "generation_batch", 0) or rows
        parts = [draw(slice(i, i + size)) for i in range(0, rows, size)]
        return concat_rollouts(parts, self.tokenizer.pad_token_id)


def _part_of(values: list | None, part: slice) -> list | None:
    return values[part] if values is not None else None


def require_sampler_logprobs(settings, policy, wanted: str) -> None:
    """A sampler that is not the trained weights keeps its log-prob of every sampled token, which decoding.decode
    does with drop_finished_rows for a model whose cache can drop rows: anything else is refused, naming ``wanted``."""
    from tether.config import ConfigError

    if not getattr(settings, "drop_finished_rows", True):
        raise ConfigError(f"{wanted} keeps the sampler's log-probs in decoding.decode: needs --drop-finished-rows")
    if not can_compact(policy):
        raise ConfigError(
            f"{wanted} keeps the sampler's log-probs in decoding.decode, which cannot run {type(policy).__name__} "
            "(its cache cannot drop rows): use --rollout-backend vllm"
        )


def _sampling_copy(policy, dtype: torch.dtype, settings):
    """The policy rebuilt from its config in ``dtype`` with its weights cast (a plain Hugging Face causal LM, or
    image-text-to-text model with the policy's image placeholders never sampled): what rollout.sampling_dtype samples
    from on the hf backend. A LoRA or sharded policy, or one decoding.decode cannot run, is refused by name: vLLM
    serves those in the sampling dtype (--rollout-backend vllm)."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    from tether.config import ConfigError
    from tether.models.shards import is_sharded
    from tether.models.vision import never_sample_placeholders

    wanted = f"--sampling-dtype {settings.sampling_dtype}"
    if hasattr(policy, "get_base_model") or is_sharded(policy):
        raise ConfigError(f"{wanted} with the hf backend copies a plain model: not a LoRA or --fsdp policy (use vllm)")
    require_sampler_logprobs(settings, policy, wanted)
    config = policy.config
    vision = hasattr(config, "vision_config")
    auto = AutoModelForImageTextToText if vision else AutoModelForCausalLM
    copy = auto.from_config(config, dtype=dtype, attn_implementation=config._attn_implementation)
    copy.load_state_dict(policy.state_dict())
    if vision:  # the policy's forwards hide its placeholders (models/vision.py): so do the copy's
        never_sample_placeholders(copy)
    copy.generation_config = policy.generation_config
    copy = copy.to(next(policy.parameters()).device).eval()
    if dtype == torch.bfloat16:
        refuse_bf16_attention_where_torch_cannot(copy, wanted)
    return copy


# rollout.backend's choices (tether/online_sections.py ROLLOUT_BACKENDS names the same keys; a test checks they agree)
BACKENDS = {"hf": HFGenerate, "vllm": VLLMBackend}


def make_backend(settings, policy, tokenizer, processor=None) -> GenerationBackend:
    """The backend ``settings.backend`` names (a SamplingSection: rollout.backend), sampling from ``policy``. (With
    rollout.max_staleness ≥ 1 the online stages sample through a rollout worker instead:
    train/sampling.py sampling_backend.) A vision-language policy's ``processor`` goes to a backend that
    processes the images itself (``reads_images``: vLLM's engine)."""
    backend = BACKENDS[settings.backend]
    if processor is not None and backend.reads_images:
        return backend(policy, tokenizer, settings, processor=processor)
    return backend(policy, tokenizer, settings)
