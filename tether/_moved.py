"""Import paths of version 0.1 that moved in 0.2 (docs/architecture.md, "Moved modules"). For one release the old
paths keep working, with a DeprecationWarning naming the new one: ``tether.reward_model`` and the other moved
modules through a finder on ``sys.meta_path`` (installed by ``tether/__init__.py``), and names that were imported
from the old ``tether.rollout`` and ``tether.models`` modules, now packages, through their ``__getattr__``."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

MOVED_MODULES = {
    "tether.bench": "tether.diagnostics.bench",
    "tether.monitors": "tether.diagnostics.monitors",
    "tether.report": "tether.diagnostics.report",
    "tether.decoding": "tether.rollout.decoding",
    "tether.generation": "tether.rollout.texts",
    "tether.demo": "tether.lab.demo",
    "tether.tokenizer": "tether.lab.tokenizer",
    "tether.experience": "tether.train.experience",
    "tether.reward_model": "tether.models.reward",
    "tether.packing": "tether.models.packing",
    "tether.recipes": "tether.stages.grpo_recipes",
    "tether.reference_cache": "tether.stages.dpo_reference",
    "tether.value_model": "tether.stages.ppo_critic",
}

# names of the old single-file modules that are packages now: {old module: {name: new module}, or the one module
# that holds all of them}
MOVED_NAMES = {
    "tether.rollout": {
        **dict.fromkeys(("Rollout", "left_pad", "concat_rollouts"), "tether.rollout.batch"),
        **dict.fromkeys(("render_prompts", "stop_token_ids", "response_mask_from_stops"), "tether.rollout.prompts"),
        **dict.fromkeys(
            (
                "response_seeds",
                "SeededSampler",
                "generate_rollout",
                "generate_from_ids",
                "GenerationBackend",
                "HFGenerate",
            ),
            "tether.rollout.backends",
        ),
        **dict.fromkeys(
            ("response_states", "response_logprobs", "response_logprobs_and_values", "reference_logprobs"),
            "tether.rollout.forward",
        ),
        "step_end_tokens": "tether.rollout.texts",
        "end_of_turn_id": "tether.models.lm",
    },
    "tether.models": "tether.models.lm",  # every name of the old module
    "tether.sections": "tether.online_sections",  # the online stages' sections, split off in 0.2
    "tether.diagnostics.monitors": {  # the registry and the live hook, and the agent monitors, split off in 0.2
        **dict.fromkeys(
            sorted(
                {
                    "METRIC_MONITORS",
                    "AlarmWatch",
                    "SAMPLE_MONITORS",
                    "check_all",
                    "read_jsonl",
                    "MONITORS",
                    "RunMonitor",
                    "format_alarm",
                }
            ),
            "tether.diagnostics.watch",
        ),
        **dict.fromkeys(
            sorted({"turn_piling", "tool_dominance", "tool_call_spam", "claimed_without_state"}),
            "tether.diagnostics.agent_monitors",
        ),
    },
}


def _warn(old: str, new: str) -> None:
    warnings.warn(f"{old} moved to {new}; the old path works until tether 0.3", DeprecationWarning, stacklevel=3)


def moved_name(module: str, name: str):
    """``module.name`` for a name of an old module that is a package now (the package's ``__getattr__``)."""
    table = MOVED_NAMES.get(module, {})
    new = table.get(name) if isinstance(table, dict) else table
    if new is None or name.startswith("__") or not hasattr(importlib.import_module(new), name):
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    _warn(f"{module}.{name}", f"{new}.{name}")
    return getattr(importlib.import_module(new), name)


class _MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old module path and hands back the module at its new path (the same module object)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname in MOVED_MODULES:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        _warn(spec.name, MOVED_MODULES[spec.name])
        module = importlib.import_module(MOVED_MODULES[spec.name])
        self.own_spec = module.__spec__
        return module

    def exec_module(self, module):
        # the module at the new path is already executed; the import machinery has just given it the old path's
        # spec, so it gets its own back (reloading and tracebacks keep naming the new path)
        module.__spec__ = self.own_spec


def install() -> None:
    if not any(isinstance(f, _MovedModuleFinder) for f in sys.meta_path):
        sys.meta_path.append(_MovedModuleFinder())
