"""Other projects' names for tether's settings, as one table: TRL's (and Hugging Face TrainingArguments') and
LLaMA-Factory's keys, each mapped to the tether setting with the same meaning, with its values translated, derived
with others (the batch sizes), accepted as having no effect here, or refused with what to write instead.

The same table serves a flat YAML file (``learning_rate: 1e-5``), the Python API's keywords
(``tether.grpo(..., learning_rate=1e-5)``) and command-line flags (``--learning_rate 1e-5``): tether/config.py
calls ``translate`` for every key that is not a tether flag name. A name that means something else in tether is
explained, never "did you mean"-ed to the wrong option; every unknown key of a file is reported at once. The
migration tables in docs/python-api.md and docs/data.md are generated from it (``python -m tether.compat``), so the
docs cannot drift from the code.

Where a project's meaning depends on the number of processes (TRL's per-device batch sizes), ``WORLD_SIZE`` (set by
accelerate launch and torchrun) is read when the config is built, in each process alike.
"""

from __future__ import annotations

import enum
import math
import os
import re
from dataclasses import dataclass, field

from tether.errors import ConfigError

HF = "TRL, LLaMA-Factory"  # Hugging Face TrainingArguments' names: both projects write them
TRL = "TRL"
LF = "LLaMA-Factory"
OPENRLHF = "OpenRLHF"
ONLINE = ("grpo", "ppo")


@dataclass(frozen=True)
class Foreign:
    """One of another project's keys. ``to``: the tether flag with the same meaning (or {stage: flag}); ``values``:
    their value -> tether's (a value not listed is refused, naming the ones that are); ``kind``: same (the value as
    given), values, derived (computed with other keys by ``derive``), ignored (no effect in tether: accepted and
    named) or refused (``note`` says what to write instead)."""

    key: str
    project: str
    to: str | dict = ""
    kind: str = "same"
    values: dict = field(default_factory=dict)
    note: str = ""
    stages: tuple = ()  # the stages it applies to (empty: every stage with the target flag)


def _values(key, project, to, values, note="", stages=()):
    return Foreign(key, project, to, "values", values, note, stages)


def _ignored(key, project, note):
    return Foreign(key, project, kind="ignored", note=note)


def _refused(key, project, note, stages=()):
    return Foreign(key, project, kind="refused", note=note, stages=stages)


def _derived(key, project, note, stages=()):
    return Foreign(key, project, kind="derived", note=note, stages=stages)


BATCH_NOTE = (
    "counts completions per process (TRL): with per_device_train_batch_size B, gradient_accumulation_steps A, "
    "steps_per_generation S (default A), num_generations G and N processes, prompts_per_step = B·N·S / G, "
    "minibatch = B·N·A responses per optimizer update (0 when that is the whole rollout), micro_batch_size = B"
)
OFFLINE_BATCH_NOTE = (
    "examples per process per forward: micro_batch_size = B and batch_size = B × gradient_accumulation_steps × "
    "processes (tether's batch_size counts every process)"
)
LOSS_TYPES = {
    "grpo": "seq-mean-token-mean",
    "dr_grpo": "seq-mean-token-sum-norm",
    "dapo": "token-mean",
    "bnpo": "token-mean",
}
# TRL's and LLaMA-Factory's ipo divide each log-ratio by its completion's length: tether's ipo_norm, not its ipo
DPO_LOSSES = {"sigmoid": "sigmoid", "hinge": "hinge", "ipo": "ipo_norm", "robust": "robust"}
PREF_LOSSES = {"sigmoid": "sigmoid", "hinge": "hinge", "ipo": "ipo_norm", "orpo": "orpo", "simpo": "simpo"}
SCALE_REWARDS = {True: "group", "group": "group", False: "group_no_std", "none": "group_no_std"}
SCHEDULES = {"cosine": "cosine", "constant": "constant", "constant_with_warmup": "constant"}
DTYPES = {"bfloat16": "bf16", "bf16": "bf16", "float32": "fp32", "fp32": "fp32", "auto": "fp32", "float16": "fp16"}
LF_STAGES = {"sft": "sft", "pt": "sft", "rm": "rm", "dpo": "dpo", "kto": "dpo", "ppo": "ppo"}

NAMES = [
    # ---- Hugging Face TrainingArguments: both projects
    Foreign("model_name_or_path", HF, "--model"),
    Foreign("learning_rate", HF, "--lr"),
    Foreign("output_dir", HF, "--output"),
    Foreign("num_train_epochs", HF, "--epochs"),
    Foreign("warmup_ratio", HF, "--warmup-ratio"),
    Foreign("warmup_steps", HF, "--warmup-steps"),
    Foreign("weight_decay", HF, "--weight-decay"),
    Foreign("max_grad_norm", HF, "--max-grad-norm"),
    Foreign("adam_beta1", HF, "--adam-beta1"),
    Foreign("adam_beta2", HF, "--adam-beta2"),
    Foreign("logging_steps", HF, "--log-every"),
    Foreign("save_steps", HF, "--save-every"),
    Foreign("eval_steps", HF, "--eval-every"),
    Foreign("save_total_limit", HF, "--keep-checkpoints"),
    _values(
        "resume_from_checkpoint",
        HF,
        "--resume",
        {True: True, False: False},
        "a checkpoint path is not read: tether resumes the run in --output from its last checkpoint",
    ),
    Foreign("overwrite_output_dir", HF, "--overwrite"),
    Foreign("trust_remote_code", HF, "--trust-remote-code"),
    _values("bf16", HF, "--mixed-precision", {True: "bf16", False: "no"}),
    _values(
        "fp16", HF, "", {False: None}, "fp16 autocast is not built: --mixed-precision bf16, or --dtype fp16 weights"
    ),
    _values("lr_scheduler_type", HF, "--lr-schedule", SCHEDULES, "linear and the others are not built in tether"),
    _values("torch_dtype", HF, "--dtype", DTYPES),
    _values("dtype", TRL, "--dtype", DTYPES),
    _derived("per_device_train_batch_size", HF, "offline stages: " + OFFLINE_BATCH_NOTE + "; grpo: " + BATCH_NOTE),
    _derived("gradient_accumulation_steps", HF, "with per_device_train_batch_size: see there"),
    _values("use_cpu", HF, "--device", {True: "cpu", False: None}),
    _ignored("disable_tqdm", HF, "tether prints its own progress: a bar in a terminal, a line every log_every steps"),
    _ignored("per_device_eval_batch_size", HF, "held-out data is scored in micro_batch_size rows per forward"),
    _ignored("do_train", HF, "a tether stage always trains"),
    _ignored("ddp_timeout", HF, "no effect on tether's process groups"),
    _ignored("dataloader_num_workers", HF, "tether tokenises once, before training"),
    _ignored("preprocessing_num_workers", HF, "tether tokenises in one process, before training"),
    _ignored("overwrite_cache", HF, "tether keeps no tokenisation cache"),
    _ignored("save_only_model", HF, "tether's checkpoints always hold what an exact resume needs"),
    _ignored("logging_first_step", HF, "tether logs every log_every steps"),
    _values("save_strategy", HF, "--save-every", {"no": 0, "steps": None}, "epoch is not built"),
    _values("eval_strategy", HF, "--eval-every", {"no": 0, "steps": None}, "epoch is not built"),
    _values("push_to_hub", HF, "", {False: None}, "tether never uploads: upload final/ yourself"),
    Foreign("seed", HF, "--seed"),
    Foreign("report_to", HF, "--report-to"),
    Foreign("gradient_checkpointing", HF, "--gradient-checkpointing"),
    _refused("gradient_checkpointing_kwargs", HF, "tether checkpoints every layer; leave it out"),
    # ---- TRL
    Foreign(
        "dataset_name",
        TRL,
        {"sft": "--data", "rm": "--data", "dpo": "--data", "grpo": "--prompts", "ppo": "--prompts"},
        note="a local file or folder (tether reads no hub names)",
    ),
    Foreign("dataset_train_split", TRL, "--split"),
    Foreign("beta", TRL, {"dpo": "--beta", "grpo": "--kl-coef", "ppo": "--kl-coef"}),
    Foreign("num_generations", TRL, "--group-size"),
    Foreign("max_completion_length", TRL, "--max-new-tokens"),
    Foreign("max_length", TRL, "--max-length"),
    Foreign("temperature", TRL, "--temperature"),
    Foreign("top_p", TRL, "--top-p"),
    Foreign("top_k", TRL, "--top-k", note="0 or None: off"),
    Foreign("num_iterations", TRL, "--update-epochs", stages=("grpo",)),
    Foreign("num_ppo_epochs", TRL, "--update-epochs", stages=("ppo",)),
    Foreign("epsilon", TRL, "--clip-low", note="and --clip-high unless epsilon_high is given"),
    Foreign("epsilon_high", TRL, "--clip-high"),
    Foreign("cliprange", TRL, "--clip-low", stages=("ppo",), note="and --clip-high"),
    Foreign("vf_coef", TRL, "--value-loss-coef", stages=("ppo",)),
    Foreign("cliprange_value", TRL, "--value-clip", stages=("ppo",)),
    Foreign("kl_coef", TRL, "--kl-coef"),
    Foreign("gamma", TRL, "--gamma"),
    Foreign("lam", TRL, "--lam"),
    Foreign("mask_truncated_completions", TRL, "--mask-truncated"),
    Foreign("center_rewards_coefficient", TRL, "--center-coef", stages=("rm",)),
    Foreign("label_smoothing", TRL, "--label-smoothing", stages=("dpo",)),
    Foreign("rpo_alpha", TRL, "--sft-coef", stages=("dpo",), note="the NLL term on the chosen response"),
    Foreign("desirable_weight", TRL, "--kto-desirable-weight"),
    Foreign("undesirable_weight", TRL, "--kto-undesirable-weight"),
    Foreign("lora_r", TRL, "--lora-r"),
    Foreign("lora_alpha", HF, "--lora-alpha"),
    Foreign("lora_dropout", HF, "--lora-dropout"),
    Foreign("lora_target_modules", TRL, "--lora-target-modules"),
    _derived(
        "use_peft",
        TRL,
        "true: LoRA with TRL's lora_r 16 and lora_alpha 32 where not given; its lora_dropout 0.05 is not applied, "
        "since tether turns dropout off (--keep-dropout keeps it)",
    ),
    _values(
        "loss_type",
        TRL,
        "--aggregation",
        LOSS_TYPES,
        "TRL's loss_type is the aggregation only (Dr. GRPO's "
        "unscaled advantages are scale_rewards: false; --recipe dr_grpo sets both)",
        stages=("grpo",),
    ),
    _values("loss_type", TRL, "", {"nll": None}, "dft is not built", stages=("sft",)),
    _derived(
        "loss_type",
        TRL,
        "a name or a list (with loss_weights, default 1 each): sigmoid, hinge, robust; ipo → ipo_norm (TRL "
        "divides the log-ratios by the completion's length; tether's ipo does not); sft → --sft-coef (its weight); "
        "one loss at weight 1 → --loss, several → --loss weighted --loss-weights; the other TRL losses are not built",
        stages=("dpo",),
    ),
    _derived("loss_weights", TRL, "with loss_type: see there", stages=("dpo",)),
    _values("scale_rewards", TRL, "--advantage", SCALE_REWARDS, "batch scaling is not built", stages=("grpo",)),
    _derived("steps_per_generation", TRL, "with per_device_train_batch_size: see there", stages=("grpo",)),
    _derived(
        "generation_batch_size",
        TRL,
        "completions generated per step: prompts_per_step = generation_batch_size / "
        "num_generations (tether's --generation-batch is another thing: responses per generate() call)",
        stages=("grpo",),
    ),
    _derived("num_mini_batches", TRL, "minibatch = prompts_per_step / num_mini_batches", stages=("ppo",)),
    _derived("total_episodes", TRL, "max_steps = total_episodes / prompts_per_step", stages=("ppo",)),
    _derived(
        "reward_funcs",
        TRL,
        "--reward, each dotted path module.function as module:function; "
        "reward_weights (a list of numbers) paired with them",
    ),
    _derived(
        "reward_weights",
        TRL,
        "a list of numbers: the weights of reward_funcs, in order (tether's own "
        "reward_weights, HEAD=W,..., weighs a reward model's heads)",
    ),
    Foreign("reward_model_path", TRL, "--reward-model"),
    Foreign("sft_model_path", TRL, "--model", stages=("ppo",)),
    Foreign("use_vllm", TRL, "--rollout-backend", kind="values", values={True: "vllm", False: "hf"}),
    _values("vllm_mode", TRL, "", {"colocate": None}, "server mode is not built: each process runs its own engine"),
    Foreign("vllm_gpu_memory_utilization", TRL, "--vllm-gpu-memory-utilization"),
    _derived(
        "vllm_importance_sampling_correction",
        TRL,
        "with use_vllm: false → --tis-cap 0 (the gap logged, not corrected); true → only with "
        "vllm_importance_sampling_mode token_truncate (token-level truncated importance sampling, --tis-cap C, C = "
        "its clip_max, default 3); TRL's default mode sequence_mask and token_mask, sequence_truncate are not "
        "built. TRL corrects by default whenever use_vllm is on; tether only with --tis-cap (the plan says which)",
        stages=ONLINE,
    ),
    _derived("vllm_importance_sampling_mode", TRL, "see vllm_importance_sampling_correction", stages=ONLINE),
    _derived("vllm_importance_sampling_clip_max", TRL, "C of token_truncate: --tis-cap C", stages=ONLINE),
    _derived(
        "vllm_importance_sampling_cap", TRL, "TRL's older name of vllm_importance_sampling_clip_max", stages=ONLINE
    ),
    _derived(
        "vllm_importance_sampling_clip_min",
        TRL,
        "not built: tether's truncation has no lower bound (leave it out or null)",
        stages=ONLINE,
    ),
    _values(
        "use_bias_correction_kl",
        TRL,
        "",
        {False: None},
        "true (TRL 1.16's default) multiplies the KL term by π_θ/π_old; tether's KL term is the estimator alone, "
        "not weighted (docs/python-api.md)",
        stages=("grpo",),
    ),
    _refused("off_policy_mask_threshold", TRL, "off-policy sequence masking is not built", stages=ONLINE),
    _ignored("log_completions", TRL, "tether writes samples.jsonl every sample_every steps"),
    _ignored("shuffle_dataset", TRL, "tether draws prompts in a seeded shuffled order"),
    _ignored("attn_implementation", TRL, "the model's default attention is used"),
    _ignored("use_liger_kernel", TRL, "tether computes its losses in PyTorch"),
    _refused(
        "max_prompt_length",
        TRL,
        "tether keeps every prompt whole (TRL cuts longer prompts from the left): "
        "leave it out, or shorten the prompts in the file",
    ),
    _refused("repetition_penalty", TRL, "not built: it changes the sampling distribution the log-probs are taken from"),
    _refused("ref_model", TRL, "the reference model is reference= (API) or --reference"),
    _refused("processing_class", TRL, "the tokenizer is tokenizer= (API) or --tokenizer"),
    _refused(
        "args",
        TRL,
        "the Python API only: a TrainingArguments / TRL config object (or a dict), read with its class's "
        "defaults (TRL's values), keywords winning",
    ),
    _refused(
        "tools",
        TRL,
        "tools live in an environment: --env with a tether.agents.tools.ToolEnvironment subclass whose tools are "
        "your functions (env= in the Python API; docs/agents.md)",
    ),
    _refused(
        "environment_factory",
        TRL,
        "an environment is --env module:Class (env= in the Python API: a class or a factory of instances), with "
        "reset/step as docs/agents.md describes",
    ),
    _derived("input_key", OPENRLHF, "the prompt column: --columns prompt=<input_key>"),
    _derived("label_key", OPENRLHF, "the reference answer's column: reward functions get every column by its name"),
    _refused("missing_eos_penalty", TRL, "use --truncation-penalty (a score for responses cut at max_new_tokens)"),
    # ---- LLaMA-Factory
    _derived("stage", LF, "must be the stage run: sft (pt: plain text), rm, dpo (kto: tether dpo --loss kto), ppo"),
    _derived(
        "dataset",
        LF,
        "names in dataset_dir/dataset_info.json: --data dataset_info.json:NAME (ppo: --prompts, "
        "each row's turns before its answer as the prompt, the answer kept as 'completion')",
    ),
    _derived("eval_dataset", LF, "as dataset, for --eval-data (ppo: --eval-prompts)"),
    _derived("dataset_dir", LF, "the folder of dataset_info.json (default data)"),
    _values(
        "finetuning_type",
        LF,
        "",
        {"lora": None, "full": None},
        "freeze is not built (full: no LoRA; lora: lora_rank, 8 when not given)",
    ),
    Foreign("lora_rank", LF, "--lora-r"),
    Foreign("lora_target", LF, "--lora-target-modules", note="all: every linear layer (all-linear)"),
    Foreign(
        "cutoff_len",
        LF,
        kind="ignored",
        stages=ONLINE,
        note="tether keeps every prompt whole (one past the model's context is an error naming its row) and "
        "ends responses at --max-new-tokens",
    ),
    Foreign("cutoff_len", LF, "--max-length", note="longer examples are dropped and counted, never cut"),
    _derived(
        "max_samples",
        LF,
        "the online stages read every prompt of the file: keep the first N rows in a file of their own",
        stages=ONLINE,
    ),
    Foreign("max_samples", LF, "--max-records"),
    _derived(
        "num_train_epochs",
        LF,
        "the online stages count rollout steps: E epochs over N prompts are --max-steps ⌈E·N / prompts_per_step⌉",
        stages=ONLINE,
    ),
    _values(
        "mask_history",
        LF,
        "",
        {False: None},
        "true (train the last turn alone) is not built: tether trains every assistant turn of a conversation; "
        "to train only the last, give the earlier turns as the prompt (prompt/completion rows)",
    ),
    Foreign("val_size", LF, "--eval-fraction"),
    Foreign("pref_beta", LF, {"dpo": "--beta"}),
    _values("pref_loss", LF, "--loss", PREF_LOSSES, stages=("dpo",)),
    Foreign("pref_ftx", LF, "--sft-coef", stages=("dpo",)),
    Foreign("simpo_gamma", LF, "--simpo-gamma", stages=("dpo",)),
    Foreign("kto_chosen_weight", LF, "--kto-desirable-weight"),
    Foreign("kto_rejected_weight", LF, "--kto-undesirable-weight"),
    Foreign("reward_model", LF, "--reward-model", stages=ONLINE),
    _values("reward_model_type", LF, "", {"full": None}, "lora and api reward models are not built", stages=ONLINE),
    Foreign("ppo_epochs", LF, "--update-epochs", stages=("ppo",)),
    Foreign("ppo_target", LF, "--target-kl", stages=("ppo",)),
    _ignored(
        "template",
        LF,
        "tether renders with the tokenizer's own chat template (LLaMA-Factory's template names "
        "its built-in copy of a family's)",
    ),
    Foreign("chat_template_kwargs", TRL, "--chat-template-kwargs"),
    Foreign("step_separator", TRL, "--step-separator", stages=("prm",)),
    _refused(
        "train_on_last_step_only",
        TRL,
        "tether prm trains on every labelled step; give only the last step a label to train on it alone",
    ),
    Foreign("chat_template_path", TRL, "--chat-template"),
    _ignored(
        "plot_loss",
        LF,
        "tether logs every curve to metrics.jsonl (and tensorboard); `tether report RUN --output report.html` "
        "draws them",
    ),
    _ignored("flash_attn", LF, "the model's default attention is used"),
    _refused("quantization_bit", LF, "quantised training is not built"),
    _refused("deepspeed", LF, "pass the DeepSpeed config to accelerate launch (docs/scaling.md)"),
]
_INDEX: dict[str, list[Foreign]] = {}
for _entry in NAMES:
    _INDEX.setdefault(_entry.key, []).append(_entry)

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
        elif f.name in _INDEX and any(e.kind in ("same", "values", "derived") for e in _INDEX[f.name]):
            out[f.name] = TheirDefault(value)
    return out


def knows(key: str) -> bool:
    return key in _INDEX


def _entry(stage: str, key: str, flags: dict) -> Foreign | None:
    """The entry for ``key`` in this stage: the first that names this stage among its stages, else the first for
    every stage (whose target, when it has one per stage, this stage has)."""
    entries = _INDEX.get(key, ())
    for entry in [e for e in entries if stage in e.stages] + [e for e in entries if not e.stages]:
        if isinstance(entry.to, dict) and stage not in entry.to:
            continue
        return entry
    return None


def _target(entry: Foreign, stage: str) -> str:
    return entry.to.get(stage, "") if isinstance(entry.to, dict) else entry.to


def _world() -> int:
    return max(1, int(os.environ.get("WORLD_SIZE", "1") or 1))


def _number(values: dict, key: str, default):
    value = values.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ConfigError(f"{key} must be a number, got {value!r}")
    try:
        number = float(value)
    except ValueError:
        raise ConfigError(f"{key} must be a number, got {value!r}") from None
    if number != int(number) or number < 1:
        raise ConfigError(f"{key} must be a whole number >= 1, got {value!r}")
    return int(number)


def _finite(value, key: str) -> float:
    """A number of another project's list (reward_weights, loss_weights), or a ConfigError naming the key."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{key}: {value!r} is not a number") from None
    if isinstance(value, bool) or not math.isfinite(number):
        raise ConfigError(f"{key}: {value!r} is not a finite number")
    return number


def _reward_spec(name: str) -> str:
    """TRL names a reward function by its dotted path (``my_rewards.accuracy``); tether by module:function."""
    name = str(name)
    if ":" in name or "." not in name:
        return name
    module, _, function = name.rpartition(".")
    return f"{module}:{function}"


def _dpo_losses(given: dict, notes: list[str]) -> dict[str, object]:
    """TRL's DPO loss_type (a name or a list) with loss_weights as tether's --loss, --loss-weights and --sft-coef:
    the weighted sum of losses, composed (tether's loss weighted), or a refusal saying which loss is not built."""
    names = given["loss_type"]
    names = [names] if isinstance(names, str) else names
    if not isinstance(names, (list, tuple)) or not names or not all(isinstance(n, str) for n in names):
        raise ConfigError(f"loss_type: {given['loss_type']!r}: expected a loss name or a list of them")
    weights = given.get("loss_weights")
    weights = [1.0] * len(names) if weights is None else weights
    weights = [_finite(w, "loss_weights") for w in (weights if isinstance(weights, (list, tuple)) else [weights])]
    if len(weights) != len(names):
        raise ConfigError(f"loss_weights has {len(weights)} weights for {len(names)} loss_type entries")
    unbuilt = [n for n in names if n not in DPO_LOSSES and n != "sft"]
    if unbuilt:
        raise ConfigError(
            f"loss_type: {', '.join(unbuilt)} not built in tether; TRL's losses read here are "
            f"{', '.join([*DPO_LOSSES, 'sft'])} (summed with loss_weights)"
        )
    parts = {DPO_LOSSES[n]: w for n, w in zip(names, weights) if n != "sft"}
    out: dict[str, object] = {}
    if "sft" in names:
        if given.get("rpo_alpha") is not None:
            raise ConfigError("loss_type's sft and rpo_alpha both weigh the chosen answer's NLL: give one")
        out["dpo.sft_coef"] = weights[names.index("sft")]
        notes.append(
            f"loss_type sft at weight {out['dpo.sft_coef']:g}: --sft-coef (the chosen answer's token-mean NLL, "
            "averaged over pairs; TRL averages over the batch's chosen tokens)"
        )
    if not parts:
        raise ConfigError("loss_type: sft alone trains no preference: that is tether sft on the chosen answers")
    if len(parts) == 1 and next(iter(parts.values())) == 1.0:
        out["dpo.loss"] = next(iter(parts))
    else:
        out |= {"dpo.loss": "weighted", "dpo.loss_weights": parts}
    if "ipo_norm" in parts:
        notes.append("loss_type ipo: tether's ipo_norm (length-normalised, as TRL computes it), not its ipo (sums)")
    return out


IS_KEYS = (
    "vllm_importance_sampling_correction",
    "vllm_importance_sampling_mode",
    "vllm_importance_sampling_clip_max",
    "vllm_importance_sampling_cap",
    "vllm_importance_sampling_clip_min",
)


def _truthy(value) -> bool:
    return value is True or (isinstance(value, str) and value.lower() == "true")


def _sampler_correction(given: dict, implied: set, notes: list[str]) -> dict[str, object]:
    """TRL's correction of the vLLM sampler gap as tether's --tis-cap: only its token_truncate mode is built
    (min(π_train/π_sampler, C) per token, no lower bound). TRL's own defaults (args=) that ask for another mode
    leave the correction off, said; a mode the user named that tether has not built is refused, naming the one
    that exists."""
    named = [k for k in IS_KEYS if k in given and given[k] is not None]
    if not named:
        return {}
    explicit = [k for k in named if k not in implied]
    on_vllm = _truthy(given.get("use_vllm")) or given.get("rollout_backend") == "vllm"
    if not on_vllm:
        if explicit:
            notes.append(f"no effect without use_vllm (TRL corrects only the vLLM sampler): {', '.join(explicit)}")
        return {}
    correction = given.get("vllm_importance_sampling_correction", True)
    if correction is False or (isinstance(correction, str) and correction.lower() == "false"):
        return {"rollout.tis_cap": 0.0}
    mode = given.get("vllm_importance_sampling_mode", "sequence_mask")
    if mode != "token_truncate" or given.get("vllm_importance_sampling_clip_min") not in (None, 0):
        what = f"mode {mode!r}" if mode != "token_truncate" else "clip_min (a lower bound)"
        if not explicit:
            notes.append(
                f"TRL's default vLLM correction ({what}, cap 3) is not built: tether samples with vLLM and "
                "logs the sampler gap without correcting it (--tis-cap C: token-level truncated importance sampling)"
            )
            return {}
        raise ConfigError(
            f"vllm_importance_sampling: {what} is not built (TRL's default mode is sequence_mask); tether has "
            "token-level truncated importance sampling, TRL's token_truncate without a lower bound: "
            "vllm_importance_sampling_mode: token_truncate (C = vllm_importance_sampling_clip_max, default 3), "
            "or --tis-cap C; vllm_importance_sampling_correction: false turns it off"
        )
    cap = given.get("vllm_importance_sampling_clip_max", given.get("vllm_importance_sampling_cap", 3.0))
    cap = _finite(3.0 if cap is None else cap, "vllm_importance_sampling_clip_max")
    if cap <= 0:
        raise ConfigError(f"vllm_importance_sampling_clip_max: {cap:g}: the cap C must be > 0")
    return {"rollout.tis_cap": cap}


def _online_length(given: dict, implied: set, notes: list[str]) -> None:
    """LLaMA-Factory's run length in epochs over a sample of the data, refused in an online stage with the tether
    settings that say it (computed where the YAML gives the numbers); an args= object's default is noted."""
    problems = []
    if "num_train_epochs" in implied:
        notes.append(
            f"num_train_epochs={given['num_train_epochs']} (their default) has no effect: max_steps sets the run"
        )
    elif "num_train_epochs" in given:
        epochs, n = given["num_train_epochs"], given.get("max_samples")
        prompts = _number(given, "per_device_train_batch_size", 8) * _number(given, "gradient_accumulation_steps", 1)
        prompts *= _world()
        steps = f"{math.ceil(float(epochs) * int(n) / prompts)}" if n else f"⌈{epochs}·N / {prompts}⌉"
        problems.append(
            f"num_train_epochs: {epochs}: the online stages count rollout steps of prompts_per_step prompts; "
            f"{epochs} epochs over {f'{n} (max_samples)' if n else 'N, the prompts in your file'} at {prompts} "
            f"prompts per step is max_steps {steps}: give max_steps instead"
        )
    if "max_samples" in given:
        problems.append(
            f"max_samples: {given['max_samples']}: the online stages read every prompt of the file (in a seeded "
            "shuffled order); keep the first rows in a file of their own, or leave max_samples out"
        )
    if problems:
        raise ConfigError(problem_report("", problems).removeprefix(": "))


def _openrlhf_keys(stage: str, given: dict, flags: dict) -> None:
    """OpenRLHF's column keys, refused with the tether setting that does the same."""
    column = "--prompt-columns" if stage in ONLINE else "--columns"
    if "input_key" in given:
        raise ConfigError(
            f"input_key: {given['input_key']}: tether reads the prompt column as 'prompt'; rename yours with "
            f"{column} prompt={given['input_key']} (YAML columns: prompt={given['input_key']})"
        )
    if "label_key" in given:
        raise ConfigError(
            f"label_key: {given['label_key']}: reward functions get every column of a prompt row under its own "
            f"name (here {given['label_key']}=...); leave label_key out, or rename the column with {column}"
        )


BATCH_KEYS = (
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "steps_per_generation",
    "generation_batch_size",
    "num_mini_batches",
    "total_episodes",
)


def _batch_sizes(stage: str, given: dict, notes: list[str]) -> dict[str, object]:
    """TRL's and LLaMA-Factory's batch sizes (per device, accumulation, generations) as tether's."""
    out: dict[str, object] = {}
    world = _world()
    b = _number(given, "per_device_train_batch_size", 8)  # TrainingArguments' default
    a = _number(given, "gradient_accumulation_steps", 1)
    if stage == "grpo":
        g = _number(given, "num_generations", _number(given, "group_size", 8))  # TRL's default G is 8
        s = _number(given, "steps_per_generation", a)
        generated = _number(given, "generation_batch_size", b * world * s)
        if generated % g:
            raise ConfigError(
                f"TRL's generation batch ({generated} completions) is not a multiple of num_generations={g}"
            )
        update = b * world * a
        out |= {
            "rollout.group_size": g,
            "rollout.prompts_per_step": generated // g,
            "algo.minibatch": 0 if update >= generated else update,
            "algo.micro_batch_size": b,
        }
        updates = max(1, generated // update) * _number(given, "num_iterations", 1)
        notes.append(
            f"TRL's batch sizes read as tether's: {b} completions per device x {world} process(es) x "
            f"{s} step(s) per generation / {g} per prompt = prompts_per_step {generated // g}; "
            f"minibatch {out['algo.minibatch'] or 'the whole rollout'}; micro_batch_size {b}"
        )
        if "max_steps" in given and updates > 1:
            steps = math.ceil(_number(given, "max_steps", 1) / updates)
            out["train.max_steps"] = steps
            notes.append(f"TRL's max_steps counts optimizer updates ({updates} per rollout here): max_steps {steps}")
    elif stage == "ppo":
        prompts = b * a * world
        minis = _number(given, "num_mini_batches", 1)
        if prompts % minis:
            raise ConfigError(f"num_mini_batches={minis} does not divide the batch of {prompts} prompts")
        out |= {"rollout.prompts_per_step": prompts, "algo.minibatch": 0 if minis == 1 else prompts // minis}
        if "total_episodes" in given:
            out["train.max_steps"] = math.ceil(_number(given, "total_episodes", 1) / prompts)
        notes.append(
            f"TRL's batch sizes read as tether's: prompts_per_step {prompts}, minibatch {out['algo.minibatch'] or 'whole'}"
        )
    else:
        stated = given.get("batch_size")  # tether's own name, stated too: per_device is the micro-batch
        if stated is not None and "gradient_accumulation_steps" in given and int(stated) != b * a * world:
            raise ConfigError(
                f"batch_size {stated} and per_device_train_batch_size {b} x gradient_accumulation_steps {a} x "
                f"{world} process(es) = {b * a * world} disagree; give one of them"
            )
        out |= {"train.micro_batch_size": b, "train.batch_size": stated if stated is not None else b * a * world}
        if stage == "dpo" and given.get("online"):
            out["rollout.prompts_per_step"] = b * a * world
        notes.append(
            f"per_device_train_batch_size {b} x accumulation {a} x {world} process(es) = batch_size {b * a * world}"
        )
    return out


def _derive(stage: str, given: dict, flags: dict, notes: list[str], implied: set = frozenset()) -> dict[str, object]:
    """The settings derived from several keys at once: batch sizes, LoRA switches, reward functions and weights,
    LLaMA-Factory's stage and datasets, the vLLM sampler's correction. ``given``: the flat keys as written;
    ``implied``: those that are a config object's defaults (args=), not the user's."""
    out: dict[str, object] = {}
    if any(k in given for k in BATCH_KEYS):
        out.update(_batch_sizes(stage, given, notes))
    if given.get("use_peft") or given.get("finetuning_type") == "lora":
        peft = {"lora_r": 16, "lora_alpha": 32.0} if given.get("use_peft") else {"lora_r": 8}
        for key, value in peft.items():
            if key not in given and not (key == "lora_r" and "lora_rank" in given):
                out[flags["--" + key.replace("_", "-")]] = value
    if "reward_funcs" in given:
        funcs = given["reward_funcs"]
        funcs = [funcs] if isinstance(funcs, str) else funcs
        if not isinstance(funcs, (list, tuple)) or not all(isinstance(f, str) for f in funcs):
            raise ConfigError(
                f"reward_funcs: {given['reward_funcs']!r}: expected a reward function's dotted path "
                "(my_rewards.accuracy) or a list of them"
            )
        weights = given.get("reward_weights")
        if weights is not None:
            if isinstance(weights, str):
                weights = [w for w in re.split(r"[,\s]+", weights.strip("[] ")) if w]
            weights = [
                _finite(w, "reward_weights") for w in (weights if isinstance(weights, (list, tuple)) else [weights])
            ]
            if len(weights) != len(funcs):
                raise ConfigError(f"reward_weights has {len(weights)} weights for {len(funcs)} reward_funcs")
        specs = [_reward_spec(f) for f in funcs]
        out["rewards.reward"] = [f"{s}={w:g}" for s, w in zip(specs, weights)] if weights is not None else specs
    elif isinstance(given.get("reward_weights"), (list, tuple)):
        raise ConfigError(
            "reward_weights as a list weighs TRL's reward_funcs, which are not given; tether's reward_weights "
            "(HEAD=W,...) weighs a reward model's heads"
        )
    if stage in ONLINE:
        out.update(_sampler_correction(given, implied, notes))
        _online_length(given, implied, notes)
    _openrlhf_keys(stage, given, flags)
    if stage == "dpo" and "loss_type" in given:
        out.update(_dpo_losses(given, notes))
    elif stage == "dpo" and isinstance(given.get("loss_weights"), (list, tuple)):
        raise ConfigError("loss_weights weigh TRL's loss_type list, which is not given")
    if "stage" in given:  # the stage itself was checked by translate
        if given["stage"] == "kto":
            out["dpo.loss"] = "kto"
        if "val_size" not in given and "data.eval_fraction" in flags.values():
            out["data.eval_fraction"] = 0.0  # LLaMA-Factory holds nothing out unless val_size says so
            notes.append("no val_size: nothing held out (LLaMA-Factory's default), eval_fraction 0")
    folder = str(given.get("dataset_dir", "data"))
    for key, option in (("dataset", "path"), ("eval_dataset", "eval")):
        if key in given:
            names = given[key]
            names = ",".join(names) if isinstance(names, (list, tuple)) else str(names)
            target = {"path": ("--data", "--prompts"), "eval": ("--eval-data", "--eval-prompts")}[option]
            flag = target[1] if stage in ONLINE else target[0]
            out[flags[flag]] = f"{folder}/dataset_info.json:{names.replace(' ', '')}"
    return out


def translate(
    stage: str,
    values: dict,
    flags: dict[str, str],
    source: str,
    problems: list[str] | None = None,
    written: dict[str, str] | None = None,
    say: bool = True,
) -> dict[str, object]:
    """{dotted tether key: value} for a stage from flat keys written in tether's flag names or another project's
    (NAMES). ``flags``: the stage's {flag: dotted key}. Every key that cannot be read is reported at once: raised,
    or added to ``problems`` when given (the caller adds its own and raises). ``written``, when given, gets
    {dotted key: the key as the file wrote it}, so that a later error about the value names the file's key.
    A ``TheirDefault`` value (args=) is read the same way, before the keys the user wrote (which win); one tether
    cannot read leaves tether's own setting, named in a note."""
    out: dict[str, object] = {}
    written = {} if written is None else written
    collect = problems is not None
    problems = problems if collect else []
    implied = {k for k, v in values.items() if isinstance(v, TheirDefault)}
    values = {k: v.value if isinstance(v, TheirDefault) else v for k, v in values.items()}
    ignored, notes, unheld = [], [], []
    theirs = values.get("stage")
    if theirs is not None and LF_STAGES.get(str(theirs)) != stage:  # the one problem worth naming: the command
        command = f"tether {LF_STAGES[str(theirs)]}" if str(theirs) in LF_STAGES else "no tether stage"
        raise ConfigError(f"{source}: stage: {theirs}: this config is for {command}, not tether {stage}")
    for key in sorted(values, key=lambda k: k not in implied):  # their defaults first: the user's keys win
        settings, problem, no_effect = translate_key(stage, key, values[key], values, flags)
        if problem and key in implied:
            unheld.append(f"{key}={values[key]!r}")
        elif problem:
            problems.append(problem)
        elif no_effect and key not in implied:
            ignored.append(no_effect)
        for dotted, value in settings.items():
            out[dotted], written[dotted] = value, key
    if problems:
        if collect:
            return out
        raise ConfigError(problem_report(source, problems))
    try:
        out.update(_derive(stage, values, flags, notes, implied))
    except ConfigError as err:
        raise ConfigError(f"{source}: {err}") from None  # name the file (or the call) the keys came from
    if ignored:
        notes.append("no effect in tether: " + "; ".join(ignored))
    if unheld:
        notes.append(
            "their config's defaults with no tether equivalent, tether's own setting kept: " + ", ".join(unheld)
        )
    if say:
        _say(source, notes)
    return out


def translate_key(stage: str, key: str, value, values: dict, flags: dict) -> tuple[dict, str, str]:
    """One flat key: ({dotted: value} it sets, the problem if it cannot be read, the no-effect note if accepted)."""
    own = flags.get("--" + str(key).replace("_", "-"))
    partner = {"reward_weights": "reward_funcs", "loss_weights": "loss_type"}.get(key)  # TRL's lists of weights
    trl_weights = partner is not None and (isinstance(value, (list, tuple)) or partner in values)
    if own is not None and not trl_weights:
        return {own: value}, "", ""
    if value is None and knows(key):
        return {}, "", ""  # TRL and LLaMA-Factory write null for "not set"
    entry = _entry(stage, key, flags)
    if entry is None:
        return {}, _unknown(stage, key, flags), ""
    if entry.kind == "ignored":
        return {}, "", f"{key} ({entry.note})"
    if entry.kind == "refused":
        return {}, f"{key}: {entry.note}", ""
    if entry.kind not in ("same", "values"):
        return {}, "", ""  # derived: read with the others by _derive
    target = _target(entry, stage)
    if entry.kind == "values":
        lookup = value.lower() if isinstance(value, str) and value.lower() in ("true", "false") else value
        lookup = {"true": True, "false": False}.get(lookup, lookup) if isinstance(lookup, str) else lookup
        try:
            known = lookup in entry.values
        except TypeError:  # a list or a mapping where a value is expected
            known = False
        if not known:
            accepted = ", ".join(str(k) for k in entry.values)
            return {}, f"{key}: {value!r} has no tether equivalent (accepted: {accepted})" + _also(entry.note), ""
        value = entry.values[lookup]
        if value is None:
            return {}, "", ""  # a value that is tether's behaviour already
    if not target or target not in flags:
        return (
            {},
            f"{key}: no {target or 'equivalent'} in tether {stage}" + (f" ({entry.note})" if entry.note else ""),
            "",
        )
    if key == "lora_target" or key == "lora_target_modules":
        value = ["all-linear" if v == "all" else v for v in (value.split(",") if isinstance(value, str) else value)]
    out = {flags[target]: value}
    if key in ("epsilon", "cliprange") and "epsilon_high" not in values:
        out[flags["--clip-high"]] = value
    return out, "", ""


def _also(note: str) -> str:
    return f"; {note}" if note else ""


def problem_report(source: str, problems: list[str]) -> str:
    if len(problems) == 1:
        return f"{source}: {problems[0]}"
    return f"{source}: {len(problems)} key(s) cannot be read:\n  " + "\n  ".join(problems)


def _unknown(stage: str, key: str, flags: dict) -> str:
    """An unknown key's line: another stage's key, or a close tether flag name (never a foreign false friend)."""
    import difflib

    if key in _INDEX:
        where = sorted({s for e in _INDEX[key] for s in (e.stages or (e.to if isinstance(e.to, dict) else ()))})
        return f"{key}: not a setting of tether {stage}" + (f" (it applies to {', '.join(where)})" if where else "")
    names = sorted(
        {f[2:].replace("-", "_") for f in flags}
        | {k for k in _INDEX if (e := _entry(stage, k, flags)) and e.kind in ("same", "values")}
    )
    close = difflib.get_close_matches(str(key), names, n=1, cutoff=0.7)
    return f"unknown key {key!r}" + (f" (did you mean {close[0]!r}?)" if close else "")


_SAID: set[str] = set()


def _say(source: str, notes: list[str]) -> None:
    """Each translation note once per process, from process 0 only."""
    if os.environ.get("RANK", "0") != "0":
        return
    from tether.console import console

    for note in notes:
        if note not in _SAID:
            _SAID.add(note)
            console.print(f"{source}: {note}")


def migration_table(projects: tuple[str, ...]) -> str:
    """The markdown table of one project's names (docs/python-api.md, docs/data.md), from NAMES."""
    rows = ["| their name | project | in tether | note |", "|---|---|---|---|"]
    for entry in NAMES:
        if not any(p in entry.project for p in projects):
            continue
        if entry.kind in ("same", "values"):
            to = entry.to if isinstance(entry.to, str) else ", ".join(f"{s}: `{f}`" for s, f in entry.to.items())
            target = f"`{to}`" if isinstance(entry.to, str) and to else to or "(tether's behaviour)"
            if entry.values:
                target += (
                    " ("
                    + ", ".join(f"{k} → {v if v is not None else 'as tether does'}" for k, v in entry.values.items())
                    + ")"
                )
        else:
            target = {"derived": "derived", "ignored": "no effect", "refused": "refused"}[entry.kind]
        stages = f" ({', '.join(entry.stages)} only)" if entry.stages else ""
        rows.append(f"| `{entry.key}` | {entry.project} | {target}{stages} | {entry.note} |")
    return "\n".join(rows)


DOCS = {"docs/python-api.md": (TRL, OPENRLHF), "docs/data.md": (LF,)}
MARK = "<!-- generated by python -m tether.compat: edit tether/compat.py, not this table -->"


def docs_with_tables(root) -> dict[str, str]:
    """{doc path: its text with the generated table between the markers}."""
    from pathlib import Path

    out = {}
    for path, projects in DOCS.items():
        text = (Path(root) / path).read_text()
        out[path] = replace_between(text, MARK, migration_table(projects))
    return out


def replace_between(text: str, mark: str, table: str) -> str:
    start = text.index(mark) + len(mark)
    end = text.index(mark, start)
    return text[:start] + "\n" + table + "\n" + text[end:]


if __name__ == "__main__":
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    for path, text in docs_with_tables(root).items():
        (root / path).write_text(text)
        print(f"wrote the table in {path}")
    print("(the table of TRL's other defaults: python -m tether.api)")
