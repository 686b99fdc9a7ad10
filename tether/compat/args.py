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


# A LoraConfig's fields tether reads, and those that change nothing tether builds: peft's bookkeeping, the task
# (tether's model decides it), fan_in_fan_out (peft sets it from each layer's type) and fields read only together
# with one refused here (megatron_core with megatron_config, qalora_group_size with use_qalora). Any other field
# away from LoraConfig()'s default is refused, so a field a new peft adds is refused until it is listed here.
PEFT_READ = ("r", "lora_alpha", "lora_dropout", "target_modules")
PEFT_HARMLESS = (
    "task_type",
    "peft_type",
    "auto_mapping",
    "peft_version",
    "base_model_name_or_path",
    "revision",
    "fan_in_fan_out",
    "megatron_core",
    "qalora_group_size",
)


def peft_settings(config) -> dict:
    """A peft ``LoraConfig`` (TRL's peft_config=) as tether's settings; every field away from LoraConfig()'s default
    that tether's LoRA does not build (rank_pattern, bias, use_dora, ...) is refused by name, all at once."""
    import dataclasses

    if not dataclasses.is_dataclass(config) or getattr(config, "peft_type", None) != "LORA":
        raise ConfigError(f"peft_config: expected a peft LoraConfig, got {type(config).__name__}")
    default = type(config)()
    unbuilt = [
        f"peft_config.{f.name}={getattr(config, f.name)!r}"
        for f in dataclasses.fields(config)
        if f.name not in PEFT_READ + PEFT_HARMLESS and getattr(config, f.name) != getattr(default, f.name)
    ]
    if unbuilt:
        raise ConfigError(f"{', '.join(unbuilt)}: not built in tether's LoRA; leave them at peft's defaults")
    out = {"lora_r": int(config.r), "lora_alpha": float(config.lora_alpha), "lora_dropout": float(config.lora_dropout)}
    targets = config.target_modules
    if targets:
        out["lora_target_modules"] = [targets] if isinstance(targets, str) else sorted(targets)
    return out


def warmup_setting(value) -> tuple[str, object]:
    """transformers 5's warmup_steps as tether's setting: a number strictly between 0 and 1 is a fraction of the run
    (warmup_ratio), anything else a count of updates (warmup_steps, as given). The flat key warmup_steps is also
    tether's own flag name, whose whole numbers keep their meaning: no value tether takes there is read otherwise."""
    if isinstance(value, float) and 0 < value < 1:
        return "warmup_ratio", value
    return "warmup_steps", value


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
        if f.name == "warmup_steps":  # its 0 is no warm-up, where tether's warmup_steps 0 defers to warmup_ratio
            key, value = ("warmup_ratio", 0.0) if value == 0 else warmup_setting(value)
            value = int(value) if key == "warmup_steps" else value
            out[key] = value if mine else TheirDefault(value)
        elif mine:
            out[f.name] = value
        elif f.name in INDEX and any(e.kind in ("same", "values", "derived") for e in INDEX[f.name]):
            out[f.name] = TheirDefault(value)
    return out
