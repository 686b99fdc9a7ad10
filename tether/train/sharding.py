"""Sharded training: FSDP2 (torch.distributed.fsdp.fully_shard) for the offline stages (SFT, reward model, DPO),
on GPUs (nccl) and on CPUs (gloo) alike, under any launcher that starts N processes (accelerate launch
--multi_gpu, torchrun).

Each decoder layer (the model's own ``_no_split_modules`` classes) is one shard unit, the rest of the model the
root unit: every process keeps 1/N of the parameters, gradients and AdamW states, and gathers one layer's
parameters at a time for its forward and backward. Gradients are reduce-scattered as averages, the same
convention as DDP, so the offline loop's loss normalisation (tether/train/offline.py) holds unchanged and N
sharded processes train what one process does (tests/test_sharding.py).

Checkpoints stay plain: the model's full state dict is gathered to process 0 and saved as a Hugging Face folder,
and the optimizer's full state (keyed by parameter name) as tensors and JSON. A sharded checkpoint is therefore
loadable by any number of processes, sharded or not.
"""

from __future__ import annotations

import torch

from tether.config import ConfigError
from tether.models.shards import gathered
from tether.models.shards import is_dtensor as is_dtensor  # the stages' and loops' names for them
from tether.models.shards import is_sharded as is_sharded
from tether.models.shards import reshard as reshard


def shard_model(model, accelerator, **options):
    """fully_shard every decoder layer, then the whole model; returns it (on one process: unchanged). ``options``
    go to every fully_shard call (an offload policy)."""
    if accelerator.num_processes == 1:
        return model
    from torch.distributed.fsdp import fully_shard

    from tether.models.lm import is_peft, transformers_model

    if is_peft(model):
        raise ConfigError(
            "--fsdp with LoRA is not built: the adapters are small, so data parallelism (without "
            "--fsdp) already fits them; shard the base model with full fine-tuning"
        )
    units = set(getattr(transformers_model(model), "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in units]
    if not layers:
        raise ConfigError(
            f"--fsdp: {type(transformers_model(model)).__name__} names no decoder-layer class "
            "(_no_split_modules) to shard by"
        )
    for layer in layers:
        fully_shard(layer, **options)
    fully_shard(model, **options)
    return model


def _options():
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=True)


def full_model_state(model) -> dict:
    """The full state dict on process 0 (empty elsewhere); every process must call it."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(model, options=_options())


def full_optimizer_state(model, optimizer) -> dict:
    """The optimizer's full state, keyed by parameter name, on process 0; every process must call it."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizer, options=_options())


def load_optimizer_state(model, optimizer, state: dict) -> None:
    """Load a full optimizer state (as full_optimizer_state wrote it) into a sharded model's optimizer."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    if not any(isinstance(k, str) for k in state.get("state", {})) and state.get("state"):
        raise ConfigError(
            "this checkpoint's optimizer state was written without --fsdp (indexed, not named, "
            "parameters); resume it without --fsdp (on any number of processes)"
        )
    set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))


def full_state_of(model, inner: str = "") -> dict:
    """The full state dict (process 0; every process calls it) of ``model`` — or of its submodule ``inner`` (a
    reward model's Hugging Face model: "model") with the names that submodule gives them. A tied weight
    (lm_head = embeddings) is one parameter under two names: only the name the model keeps is written."""
    state = full_model_state(model)
    tied = {n for n, _ in model.named_parameters(remove_duplicate=False)} - {n for n, _ in model.named_parameters()}
    prefix = f"{inner}." if inner else ""
    return {k[len(prefix) :]: v for k, v in state.items() if k not in tied and k.startswith(prefix)}


def save_full_model(model, tokenizer, out_dir, accelerator) -> None:
    """A sharded model as a plain Hugging Face folder (every process calls it; process 0 writes). A wrapper of a
    Hugging Face model (tether's reward model) is written as the model it wraps."""
    from transformers import PreTrainedModel

    # the Hugging Face model's place inside a wrapper: "model" in a reward model, "rm.model" in PPO's value model
    inner = next(name for name, module in model.named_modules() if isinstance(module, PreTrainedModel))
    state = full_state_of(model, inner)
    if accelerator.is_main_process:
        model.get_submodule(inner).save_pretrained(str(out_dir), state_dict=state)
        if tokenizer is not None:
            tokenizer.save_pretrained(str(out_dir))


def unsharded_on_main(model, build, accelerator):
    """An ordinary copy of a sharded model on process 0 (``build()`` makes the architecture, the gathered state
    fills it), for work process 0 does alone (a reward model's probes); None on the other processes."""
    state = full_model_state(model)
    if not accelerator.is_main_process:
        return None
    plain = build()
    missing, unexpected = plain.load_state_dict(state, strict=False)
    if unexpected or [k for k in missing if not k.endswith("lm_head.weight")]:
        raise RuntimeError(f"gathered state does not fit: missing {missing[:3]}, unexpected {unexpected[:3]}")
    return plain


def grad_norm_value(norm) -> float:
    """clip_grad_norm_'s total norm as a float (a DTensor when the gradients are sharded)."""
    if hasattr(norm, "full_tensor"):
        norm = norm.full_tensor()
    return float(torch.as_tensor(norm))


# ------------------------------------------------------------------------------------------ the online stages


def shard_trained_online(model, accelerator, gathered_copy: bool = True):
    """(the policy sharded, an ordinary copy of it that samples, or None) for the online stages' --fsdp.

    The online loop sums gradients over processes under a loss normalised by the whole minibatch's counts
    (tether/train/parallel.py), so the reduce-scatter sums too (divide factor 1), where the offline stages average.
    ``gathered_copy`` (the hf backend, which samples with the trainer's own model): the copy is taken before
    sharding, so it keeps whatever the model was loaded with (dtype, precision, dropout off); it holds the whole
    weights on every process for generation, refreshed by ``copy_gathered`` after each update (docs/scaling.md:
    what it costs and why generation is not sharded). An engine (vllm) holds its own weights and is pushed the
    sharded ones gathered a parameter at a time (rollout/vllm_backend.py), so no copy is kept."""
    plain = sampling_copy_of(model) if gathered_copy else None
    return shard_summed(model, accelerator), plain


def sampling_copy_of(model):
    """An ordinary, frozen copy of a model about to be sharded, for sampling (refreshed by ``copy_gathered``)."""
    import copy

    plain = copy.deepcopy(model)
    for q in plain.parameters():
        q.requires_grad_(False)
    return plain


def shard_summed(model, accelerator):
    """shard_model with gradients reduce-scattered as sums (the online loop's contract), not averages."""
    from torch.distributed.fsdp import FSDPModule

    model = shard_model(model, accelerator)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)  # a plain SUM: gloo has no pre-multiplied sum
    return model


def shard_frozen(model, accelerator, offload: bool = False):
    """A frozen model (the reference) sharded like the policy: 1/N of its weights per process, one layer gathered at
    a time for its forwards; ``offload`` (--offload-frozen): its shards kept in CPU memory and copied to the device
    for each layer's forward (FSDP2's CPUOffloadPolicy). None stays None."""
    if model is None:
        return None
    if not offload:
        return shard_model(model, accelerator)
    from torch.distributed.fsdp import CPUOffloadPolicy

    # pinned host memory speeds the copies on a GPU; a CPU run has no device to copy to
    policy = CPUOffloadPolicy(pin_memory=torch.cuda.is_available())
    return shard_model(model, accelerator, offload_policy=policy)


def shard_reward_model(scorer, accelerator, offload: bool = False):
    """--fsdp: a reward model loaded from its folder (models/reward.py RewardScorer, loaded in CPU memory) sharded
    like the reference; its forwards then run in step on every process (score_token_ids). A stand-in callable (the
    lab's, a test's) stays as it is."""
    from tether.models.reward import RewardScorer

    if isinstance(scorer, RewardScorer):
        scorer.model = shard_frozen(scorer.model, accelerator, offload)
    return scorer


def sharded_reward_model(scorer, offloaded: bool) -> str:
    """The plan's name for a stage's sharded reward model ("" when there is none: a stand-in, or none at all)."""
    if not getattr(getattr(scorer, "reward_model", None), "in_step", False):
        return ""
    return "the reward model" + (" (its shards in CPU memory)" if offloaded else "")


@torch.no_grad()
def copy_gathered(sharded, plain) -> None:
    """Write a sharded model's current weights into its ordinary copy, one parameter gathered at a time (every
    process calls it; at most one parameter's whole tensor is in flight beyond the copy itself)."""
    target = dict(plain.named_parameters())
    for name, q in sharded.named_parameters():
        target[name].copy_(gathered(q))


def sharding_line(processes: int, reference: bool, offloaded: bool, copy: bool, *others: str) -> str:
    """The plan's line for a sharded online stage: the policy, the reference if any (offloaded or not), ``others``
    by name, and what samples (a gathered ``copy``, or an engine pushed the gathered weights)."""
    frozen = ["the reference" + (" (its shards in CPU memory)" if offloaded else "")] if reference else []
    parts = ["the policy"] + frozen + [o for o in others if o]
    return (
        f"FSDP2 over {processes} processes: {', '.join(parts)} (parameters, gradients, AdamW states: 1/{processes} "
        "each); "
        + (
            "every process samples from a gathered copy of the policy's weights"
            if copy
            else "every process's engine is pushed the policy's weights gathered one parameter at a time"
        )
    )
