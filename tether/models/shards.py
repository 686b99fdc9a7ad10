"""Sharded parameters (FSDP2's DTensors, --fsdp; tether/train/sharding.py shards the models): what a sharded model
is, a sharded tensor's whole value, and freeing what a no-grad forward left gathered."""

from __future__ import annotations

import torch


def is_dtensor(tensor) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(tensor, DTensor)


def is_sharded(model) -> bool:
    """Whether ``model``'s parameters are FSDP2 shards (--fsdp, tether/train/sharding.py)."""
    return any(is_dtensor(q) for q in model.parameters())


@torch.no_grad()
def gathered(tensor):
    """A sharded parameter's whole tensor (a collective: every process gathers the same one), or the tensor."""
    return tensor.full_tensor() if is_dtensor(tensor) else tensor


def reshard(model) -> None:
    """Free the gathered parameters a no-grad forward left behind: FSDP2 keeps the root unit's parameters gathered
    after a forward until the backward, and an evaluation has no backward. Left gathered, the next training step's
    gradients of those parameters would not be reduce-scattered."""
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()
