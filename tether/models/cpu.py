"""What torch can run on this CPU, found out once where it differs between CPUs and kernel paths."""

from __future__ import annotations

import functools
import os

import torch

from tether.config import ConfigError


@functools.cache
def bf16_attention_runs_here() -> bool:
    """Whether torch's bf16 attention runs on this CPU under the kernel path this process runs: with
    ATEN_CPU_CAPABILITY=default or =avx2 on a CPU with AMX, torch 2.13 still picks its AMX flash-attention kernel,
    whose packing needs AVX-512 ("pack_vnni2 is only supported when avx512 is supported"; measured on an Intel Xeon
    with AMX from 64 positions on, under both; an AMD EPYC without AMX ran it). Probed once, on whatever path."""
    q = torch.zeros(1, 1, 64, 16, dtype=torch.bfloat16)
    try:
        torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
    except RuntimeError as err:
        if "pack_vnni2" not in str(err):
            raise
        return False
    return True


def refuse_bf16_attention_where_torch_cannot(model, setting: str) -> None:
    """A clear error before the first forward where a CPU model would run bf16 attention that torch cannot run here
    (bf16_attention_runs_here: a narrowed kernel path on a CPU with AMX), instead of a RuntimeError from inside the
    attention kernel at the first sequence of 64 positions."""
    if next(model.parameters()).device.type == "cpu" and not bf16_attention_runs_here():
        path = os.environ.get("ATEN_CPU_CAPABILITY", "")
        raise ConfigError(
            f"{setting} on this CPU{f' under ATEN_CPU_CAPABILITY={path}' if path else ''}: torch's bf16 attention "
            "picks the AMX kernel, which needs AVX-512; unset ATEN_CPU_CAPABILITY, or train in float32"
        )
