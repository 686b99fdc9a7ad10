"""tether: post-training language models with human feedback, with a ground-truth lab.

The Python API (docs/python-api.md): ``tether.sft``, ``tether.rm``, ``tether.prm``, ``tether.dpo``, ``tether.ppo``, ``tether.grpo``
and the stage configs (``tether.SFTConfig``...). They are imported on first use, so that ``import tether`` (and the
command line's ``--help``) stays free of torch and transformers.
"""

__version__ = "0.1.0"

_LAZY = {
    "sft": "tether.api",
    "rm": "tether.api",
    "prm": "tether.api",
    "dpo": "tether.api",
    "ppo": "tether.api",
    "grpo": "tether.api",
    "RunResult": "tether.api",
    "TrainerState": "tether.rewards.loading",
    "SFTConfig": "tether.stages.sft_config",
    "RMConfig": "tether.stages.rm_config",
    "PRMConfig": "tether.stages.prm_config",
    "DPOConfig": "tether.stages.dpo_config",
    "PPOConfig": "tether.stages.ppo_config",
    "GRPOConfig": "tether.stages.grpo_config",
    "ConfigError": "tether.errors",
    "DataError": "tether.errors",
}

__all__ = sorted(_LAZY)

from tether import _moved  # noqa: E402 - after the version: the old (0.1) module paths, deprecated

_moved.install()


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'tether' has no attribute {name!r}")
