"""tether: post-training language models with human feedback, with a ground-truth lab.

The Python API (docs/python-api.md): ``tether.sft``, ``tether.rm``, ``tether.prm``, ``tether.judge``, ``tether.dpo``, ``tether.ppo``, ``tether.grpo``
and the stage configs (``tether.SFTConfig``...), one of each per row of the stage table (``tether.config.STAGES``).
They are imported on first use, so that ``import tether`` (and the command line's ``--help``) stays free of torch
and transformers.
"""

__version__ = "0.1.0"

from tether.config import STAGES  # noqa: E402 - the stage table: names and paths, no stage imported

_LAZY = {
    **{row.name: "tether.api" for row in STAGES},  # tether.sft(), tether.grpo(), ...
    **{row.config_name: row.config_module for row in STAGES},  # tether.SFTConfig, ...
    "RunResult": "tether.api",
    "TrainerState": "tether.rewards.loading",
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
