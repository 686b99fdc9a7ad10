"""Counting the work: every forward of a transformers backbone, and the positions it computed, under the phase that
ran it — so a forward computed twice shows in metrics.jsonl and fails a test, instead of hiding in the step time.

The online loop counts (``counting()``) and the code that runs a forward names its phase (``phase("update")``):
sampling, the old and the reference log-probs, the update, the critic, the reward models. The innermost phase names
a forward; inside ``section("eval")`` the names are prefixed (``eval_sample``), so an evaluation's forwards are
counted apart from the step's. A forward outside any phase is counted as ``other``, which a test keeps at zero.

What is counted is each call of a model's backbone (the module a causal LM, a reward model or a critic runs its
layers in: ``model.base_model is model``), wherever it comes from — tether's own forwards, a generation step of
the KV-cache sampler or of ``generate()``, a call inside the library. Positions are the rows × columns the call
computed (padding included). A vLLM engine runs in its own processes: its sampling is not counted here.
"""

from __future__ import annotations

import contextvars
from contextlib import contextmanager

import torch

_PHASE: contextvars.ContextVar[str | None] = contextvars.ContextVar("tether_phase", default=None)
_SECTION: contextvars.ContextVar[str | None] = contextvars.ContextVar("tether_section", default=None)


@contextmanager
def _inside(variable: contextvars.ContextVar, name: str):
    token = variable.set(name)
    try:
        yield
    finally:
        variable.reset(token)


def phase(name: str):
    """The forwards run inside are counted under ``name`` (an inner phase names its own)."""
    return _inside(_PHASE, name)


def section(name: str):
    """Every phase inside is counted as ``<name>_<phase>`` (the evaluation's sampling is ``eval_sample``)."""
    return _inside(_SECTION, name)


def _is_backbone(module: torch.nn.Module) -> bool:
    from transformers import PreTrainedModel

    return isinstance(module, PreTrainedModel) and module.base_model is module


class ForwardCounter:
    """Forwards and positions per phase since the last ``take()``."""

    def __init__(self):
        self.counts: dict[str, list[int]] = {}

    def __call__(self, module, inputs, output) -> None:  # a global forward hook: every module call comes here
        if not _is_backbone(module):
            return
        hidden = getattr(output, "last_hidden_state", None)
        if hidden is None and isinstance(output, tuple) and output and isinstance(output[0], torch.Tensor):
            hidden = output[0]
        positions = int(hidden.shape[0] * hidden.shape[1]) if hidden is not None and hidden.dim() >= 2 else 0
        name = _PHASE.get() or "other"
        name = f"{_SECTION.get()}_{name}" if _SECTION.get() else name
        count = self.counts.setdefault(name, [0, 0])
        count[0] += 1
        count[1] += positions

    def take(self) -> dict:
        """{forwards/<phase>: calls, positions/<phase>: rows × columns} since the last take (docs/metrics.md)."""
        out = {}
        for name, (calls, positions) in sorted(self.counts.items()):
            out[f"forwards/{name}"] = calls
            out[f"positions/{name}"] = positions
        self.counts = {}
        return out


@contextmanager
def counting():
    """Count every backbone forward in this process while inside; yields the ForwardCounter."""
    counter = ForwardCounter()
    handle = torch.nn.modules.module.register_module_forward_hook(counter)
    try:
        yield counter
    finally:
        handle.remove()


def current_section() -> str | None:
    """The section a forward (or a scorer's figures) is in now: ``eval`` inside the evaluation, else None."""
    return _SECTION.get()
