"""The Python API's side of the table: TRL's trainer arguments (train_dataset=, processing_class=...), a peft
LoraConfig, and TRL's ``args=`` config objects read as settings (their class's defaults read as theirs)."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from tether.compat.table import INDEX, ONLINE
from tether.errors import ConfigError

# The Python API's keyword inputs under TRL's names: {their name: tether's keyword}, and the keyword per stage
API_INPUTS = {
    "train_dataset": "data",
    "eval_dataset": "eval_data",
    "processing_class": "tokenizer",
    "ref_model": "reference",
}


def api_input(stage: str, name: str, online: bool) -> str:
    """tether's keyword for one of TRL's trainer arguments: train_dataset is ``data`` offline, ``prompts`` online."""
    target = API_INPUTS[name]
    if target in ("data", "eval_data") and (stage in ONLINE or online):
        return "prompts" if target == "data" else "eval_prompts"
    return target


def peft_settings(config) -> dict:
    """A peft ``LoraConfig`` (TRL's peft_config=) as tether's settings; anything tether's LoRA does not build is
    refused by name."""
    out = {"lora_r": int(config.r), "lora_alpha": float(config.lora_alpha), "lora_dropout": float(config.lora_dropout)}
    targets = config.target_modules
    if targets:
        out["lora_target_modules"] = [targets] if isinstance(targets, str) else sorted(targets)
    for name, plain in (("use_dora", False), ("use_rslora", False), ("modules_to_save", None)):
        if getattr(config, name, plain) not in (plain, [], ()):
            raise ConfigError(f"peft_config.{name}={getattr(config, name)!r}: not built in tether's LoRA")
    return out


@dataclass(frozen=True)
class TheirDefault:
    """A value another project's config object carries because its class says so, not because its user wrote it
    (``args=DPOConfig(output_dir=...)`` carries TRL's learning_rate 1e-6). It is read as theirs, since a migrant's
    config means their values; where tether has no equivalent, tether's own applies and the run says which."""

    value: object


# Fields whose defaults __post_init__ computes from the machine: copied from the user's object into the instance
# it is compared with, so that a class whose bare defaults do not construct here (TRL's bf16 on a CPU) compares.
MACHINE_FIELDS = ("bf16", "fp16", "use_cpu")


def args_settings(args) -> dict:
    """TRL's ``args=`` (a TrainingArguments or TRL config dataclass, or a dict) as keyword settings: the fields whose
    value differs from a fresh instance of the same class (built with the same output_dir and machine fields, since
    __post_init__ fills some fields in) are the user's; every other field tether has a name for is read as
    ``TheirDefault`` (the class's value, e.g. TRL DPO's learning rate 1e-6). The caller reads the settings before
    it changes any logging verbosity, which some defaults (disable_tqdm) are computed from."""
    import dataclasses

    if isinstance(args, dict):
        return dict(args)
    if not dataclasses.is_dataclass(args):
        raise ConfigError(f"args: expected a TrainingArguments / TRL config or a dict, got {type(args).__name__}")
    names = {f.name for f in dataclasses.fields(args) if f.init}
    same = {k: getattr(args, k) for k in MACHINE_FIELDS if k in names}
    try:
        baseline = type(args)(output_dir=getattr(args, "output_dir", None), **same)
    except (ValueError, TypeError) as exc:  # a class whose defaults do not construct here even so: say which
        raise ConfigError(f"args: cannot build a default {type(args).__name__} to compare with ({exc})") from None
    out = {}
    for f in dataclasses.fields(args):
        value = getattr(args, f.name)
        value = value.value if isinstance(value, enum.Enum) else value  # SchedulerType.LINEAR -> "linear"
        if value is None or (f.name == "max_steps" and value == -1):  # not set (-1: train by epochs, tether's 0)
            continue
        mine = f.name == "output_dir" or value != getattr(baseline, f.name, None) or bool(same.get(f.name))
        if f.name == "warmup_steps":  # transformers 5: a count from 1 up, a fraction of the run below 1
            key, value = ("warmup_steps", int(value)) if value >= 1 else ("warmup_ratio", float(value))
            out[key] = value if mine else TheirDefault(value)
        elif mine:
            out[f.name] = value
        elif f.name in INDEX and any(e.kind in ("same", "values", "derived") for e in INDEX[f.name]):
            out[f.name] = TheirDefault(value)
    return out
