"""The settings derived from several keys at once, one small function each in ``DERIVATIONS``: batch sizes, LoRA
switches, reward functions and weights, the online stages' sampler correction and lengths, OpenRLHF's keys, DPO's
loss lists, LLaMA-Factory's stage and datasets."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from tether.compat.lookup import _finite, _number, _reward_spec, _world, problem_report
from tether.compat.table import DPO_LOSSES, ONLINE
from tether.errors import ConfigError


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


TRL_CORRECTIONS = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")  # tether's geo_mask: none
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
    """TRL's correction of the vLLM sampler gap as tether's: each of its vllm_importance_sampling_mode values is
    tether's rule of the same name (rollout.off_policy_correction), clip_max and clip_min its bounds (clip_max null:
    no upper bound). TRL corrects whenever use_vllm is on (sequence_mask, clip_max 3, unless told otherwise), so an
    args= object's defaults translate to the same; without use_vllm the keys do nothing, in TRL as here."""
    named = [k for k in IS_KEYS if k in given]
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
        return {"rollout.off_policy_correction": ""}
    mode = given.get("vllm_importance_sampling_mode", "sequence_mask")
    if mode not in TRL_CORRECTIONS:
        raise ConfigError(
            f"vllm_importance_sampling_mode: {mode!r}: TRL's modes are {', '.join(TRL_CORRECTIONS)} (each is "
            "tether's --off-policy-correction of that name)"
        )
    high = given.get("vllm_importance_sampling_clip_max", given.get("vllm_importance_sampling_cap", 3.0))
    high = 0.0 if high is None else _finite(high, "vllm_importance_sampling_clip_max")
    low = given.get("vllm_importance_sampling_clip_min")
    low = 0.0 if low is None else _finite(low, "vllm_importance_sampling_clip_min")
    if not explicit:
        notes.append(f"TRL's default vLLM correction kept: {mode}, ratio bounds [{low:g}, {high or math.inf:g}]")
    return {"rollout.off_policy_correction": mode, "rollout.is_ratio_max": high, "rollout.is_ratio_min": low}


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
    elif stage == "ppo":  # TRL's PPOTrainer: mini_batch_size = B·A·N, batch_size = mini_batch_size·num_mini_batches
        minis = _number(given, "num_mini_batches", 1)
        minibatch = b * a * world
        prompts = minibatch * minis
        out |= {"rollout.prompts_per_step": prompts, "algo.minibatch": 0 if minis == 1 else minibatch}
        if "total_episodes" in given:
            out["train.max_steps"] = math.ceil(_number(given, "total_episodes", 1) / prompts)
        notes.append(
            f"TRL's batch sizes read as tether's: {b} per device x accumulation {a} x {world} process(es) = minibatch "
            f"{minibatch}, x {minis} mini-batch(es) = prompts_per_step {prompts}"
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


@dataclass(frozen=True)
class Keys:
    """What a derivation reads: the stage, the flat keys as written (``given``), the stage's {flag: dotted key}, the
    notes to say, and ``implied``: the keys that are a config object's defaults (args=), not the user's."""

    stage: str
    given: dict
    flags: dict
    notes: list
    implied: frozenset


def _batches(k: Keys) -> dict:
    return _batch_sizes(k.stage, k.given, k.notes) if any(key in k.given for key in BATCH_KEYS) else {}


def _lora_switch(k: Keys) -> dict:
    """TRL's use_peft and LLaMA-Factory's LoRA keys turn LoRA on at each project's defaults: TRL's lora_r 16 and
    lora_alpha 32; LLaMA-Factory's lora_rank 8 (finetuning_type lora, its default, or a lora_rank given) and
    lora_alpha = 2 · lora_rank (its FinetuningArguments.__post_init__)."""
    given = k.given
    if given.get("use_peft"):
        peft = {"lora_r": 16, "lora_alpha": 32.0}
    elif given.get("finetuning_type") == "lora" or (
        given.get("finetuning_type") is None and given.get("lora_rank") is not None
    ):
        rank = _number(given, "lora_rank", _number(given, "lora_r", 8))
        peft = {"lora_r": 8, "lora_alpha": 2.0 * rank}
    else:
        return {}
    return {
        k.flags["--" + key.replace("_", "-")]: value
        for key, value in peft.items()
        if given.get(key) is None and not (key == "lora_r" and given.get("lora_rank") is not None)
    }


def _reward_functions(k: Keys) -> dict:
    """TRL's reward_funcs (dotted paths) and reward_weights as --reward module:function=W."""
    given = k.given
    if "reward_funcs" not in given:
        if isinstance(given.get("reward_weights"), (list, tuple)):
            raise ConfigError(
                "reward_weights as a list weighs TRL's reward_funcs, which are not given; tether's reward_weights "
                "(HEAD=W,...) weighs a reward model's heads"
            )
        return {}
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
        weights = [_finite(w, "reward_weights") for w in (weights if isinstance(weights, (list, tuple)) else [weights])]
        if len(weights) != len(funcs):
            raise ConfigError(f"reward_weights has {len(weights)} weights for {len(funcs)} reward_funcs")
    specs = [_reward_spec(f) for f in funcs]
    return {"rewards.reward": [f"{s}={w:g}" for s, w in zip(specs, weights)] if weights is not None else specs}


def _online(k: Keys) -> dict:
    if k.stage not in ONLINE:
        return {}
    out = _sampler_correction(k.given, k.implied, k.notes)
    _online_length(k.given, k.implied, k.notes)
    return out


def _openrlhf(k: Keys) -> dict:
    _openrlhf_keys(k.stage, k.given, k.flags)  # refusals naming the replacement; nothing derived
    return {}


def _dpo_loss_list(k: Keys) -> dict:
    if k.stage == "dpo" and "loss_type" in k.given:
        return _dpo_losses(k.given, k.notes)
    if k.stage == "dpo" and isinstance(k.given.get("loss_weights"), (list, tuple)):
        raise ConfigError("loss_weights weigh TRL's loss_type list, which is not given")
    return {}


def _llamafactory_stage(k: Keys) -> dict:
    """LLaMA-Factory's stage (checked by translate): kto is DPO's KTO loss; nothing is held out without val_size."""
    if "stage" not in k.given:
        return {}
    out: dict[str, object] = {"dpo.loss": "kto"} if k.given["stage"] == "kto" else {}
    if "val_size" not in k.given and "data.eval_fraction" in k.flags.values():
        out["data.eval_fraction"] = 0.0  # LLaMA-Factory holds nothing out unless val_size says so
        k.notes.append("no val_size: nothing held out (LLaMA-Factory's default), eval_fraction 0")
    return out


def _llamafactory_ppo(k: Keys) -> dict:
    """LLaMA-Factory's PPO (its stage ppo, or its ppo_target) is TRL's old PPOConfig(target=ppo_target), whose
    adaptive KL controller (adap_kl_ctrl) is on by default: β adapts towards ppo_target (6 nats unless given).
    tether's adaptive_kl is off by default, so it is turned on, unless given."""
    lf_ppo = k.given.get("stage") == "ppo" or k.given.get("ppo_target") is not None
    if k.stage != "ppo" or not lf_ppo or k.given.get("adaptive_kl") is not None:
        return {}
    k.notes.append(
        "LLaMA-Factory's PPO adapts β towards ppo_target (TRL's adap_kl_ctrl, on by default): adaptive_kl on"
    )
    return {k.flags["--adaptive-kl"]: True}


def _cosine_floor(k: Keys) -> dict:
    """transformers' cosine decays to 0 (0.5 · (1 + cos(π · progress)) at progress 1), tether's to lr · min_lr_ratio
    (0.1 by default): 0 when the schedule is lr_scheduler_type's, unless min_lr_ratio is given."""
    if k.given.get("lr_scheduler_type") != "cosine" or k.given.get("min_lr_ratio") is not None:
        return {}
    k.notes.append("lr_scheduler_type cosine decays to 0, as in transformers: min_lr_ratio 0")
    return {k.flags["--min-lr-ratio"]: 0.0}


def _llamafactory_datasets(k: Keys) -> dict:
    """dataset / eval_dataset: names in dataset_dir's dataset_info.json, read as that registry's entries."""
    out: dict[str, object] = {}
    folder = str(k.given.get("dataset_dir", "data"))
    for key, option in (("dataset", "path"), ("eval_dataset", "eval")):
        if key in k.given:
            names = k.given[key]
            names = ",".join(names) if isinstance(names, (list, tuple)) else str(names)
            target = {"path": ("--data", "--prompts"), "eval": ("--eval-data", "--eval-prompts")}[option]
            flag = target[1] if k.stage in ONLINE else target[0]
            out[k.flags[flag]] = f"{folder}/dataset_info.json:{names.replace(' ', '')}"
    return out


# the derivations, in the order they apply: each reads the keys and returns the settings it derives
DERIVATIONS = (
    _batches,
    _lora_switch,
    _reward_functions,
    _online,
    _openrlhf,
    _dpo_loss_list,
    _llamafactory_stage,
    _llamafactory_ppo,
    _llamafactory_datasets,
    _cosine_floor,
)


def derive(stage: str, given: dict, flags: dict, notes: list[str], implied=frozenset()) -> dict[str, object]:
    """The settings derived from several keys at once (``DERIVATIONS``)."""
    keys = Keys(stage, given, flags, notes, frozenset(implied))
    out: dict[str, object] = {}
    for derivation in DERIVATIONS:
        out.update(derivation(keys))
    return out
