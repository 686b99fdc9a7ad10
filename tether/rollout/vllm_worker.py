"""What tether adds to the vLLM engine's worker process: the permission to use the CPU's AMX tiles.

Linux hands a process the AMX tile registers only after the process asks for them (arch_prctl
ARCH_REQ_XCOMP_PERM); an AMX instruction before that is an illegal instruction. torch's own CPU kernels ask when they
first need them, but vLLM's CPU attention kernel runs bfloat16 through AMX on a CPU that has it without asking, so a
bf16 engine's worker died at its first forward on such a CPU (measured on an Intel Xeon with amx_bf16: "Fatal Python
error: Illegal instruction" in cpu_attention_with_kv_cache; fp32 engines did not reach it). vLLM imports the module of
its ``worker_extension_cls`` in the worker before the model loads, so asking here, when this module is imported,
comes first. ``torch._C._cpu._init_amx`` asks and returns False where the CPU or the kernel has no AMX, which changes
nothing.
"""

import torch

AMX_GRANTED = bool(torch._C._cpu._init_amx())


class AMXPermission:
    """The engine's ``worker_extension_cls``: no methods; importing its module asked for the AMX tiles."""
