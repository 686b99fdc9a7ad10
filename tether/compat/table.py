"""The table: every other project's key (TRL's, Hugging Face TrainingArguments', LLaMA-Factory's, OpenRLHF's) as a
``Foreign`` entry — the tether flag with the same meaning, its values translated, derived with other keys, accepted as
having no effect here, or refused with what to write instead — and ``INDEX``: key -> its entries."""

from __future__ import annotations

from dataclasses import dataclass, field

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
    Foreign(
        "warmup_steps",
        HF,
        "--warmup-steps",
        note="a number between 0 and 1 is transformers 5's fraction of the run: --warmup-ratio",
    ),
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
    _values(
        "lr_scheduler_type",
        HF,
        "--lr-schedule",
        SCHEDULES,
        "cosine decays to 0, as in transformers (min_lr_ratio 0 unless given); for cosine_with_min_lr write "
        "lr_scheduler_type: cosine and min_lr_ratio: R (R = min_lr_rate, or min_lr / learning_rate); linear and the "
        "others are not built in tether",
    ),
    _refused(
        "lr_scheduler_kwargs",
        HF,
        "tether's cosine is transformers' half cycle (num_cycles 0.5); its floor is min_lr_ratio (transformers' "
        "min_lr_rate, or min_lr / learning_rate)",
    ),
    _values("torch_dtype", HF, "--dtype", DTYPES),
    _values("dtype", TRL, "--dtype", DTYPES),
    _derived(
        "per_device_train_batch_size",
        HF,
        "offline stages: " + OFFLINE_BATCH_NOTE + "; grpo: " + BATCH_NOTE + "; ppo: see num_mini_batches",
    ),
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
    _derived(
        "num_mini_batches",
        TRL,
        "TRL's PPO: B·A·N prompts per optimizer update (B per device, A accumulation, N processes): minibatch = B·A·N "
        "(0, the whole rollout, when num_mini_batches is 1) and prompts_per_step = B·A·N · num_mini_batches",
        stages=("ppo",),
    ),
    _derived("total_episodes", TRL, "max_steps = ⌈total_episodes / prompts_per_step⌉", stages=("ppo",)),
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
        "with use_vllm: false → no correction (the gap logged); true (TRL's default) → "
        "--off-policy-correction MODE with MODE = vllm_importance_sampling_mode (TRL's default sequence_mask)",
        stages=ONLINE,
    ),
    _derived("vllm_importance_sampling_mode", TRL, "--off-policy-correction of the same name", stages=ONLINE),
    _derived("vllm_importance_sampling_clip_max", TRL, "--is-ratio-max (null: no upper bound)", stages=ONLINE),
    _derived(
        "vllm_importance_sampling_cap", TRL, "TRL's older name of vllm_importance_sampling_clip_max", stages=ONLINE
    ),
    _derived("vllm_importance_sampling_clip_min", TRL, "--is-ratio-min", stages=ONLINE),
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
        "freeze is not built (full: no LoRA; lora: lora_rank, 8 when not given, lora_alpha twice the rank)",
    ),
    Foreign("lora_rank", LF, "--lora-r", note="lora_alpha 2 · lora_rank when not given, as LLaMA-Factory sets it"),
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
    Foreign(
        "pref_beta",
        LF,
        {"dpo": "--beta"},
        note="with pref_loss orpo: --orpo-lambda (LLaMA-Factory's ORPO is sft_loss + pref_beta · odds-ratio loss)",
    ),
    _values("pref_loss", LF, "--loss", PREF_LOSSES, stages=("dpo",)),
    Foreign("pref_ftx", LF, "--sft-coef", stages=("dpo",)),
    Foreign("simpo_gamma", LF, "--simpo-gamma", stages=("dpo",)),
    Foreign("kto_chosen_weight", LF, "--kto-desirable-weight"),
    Foreign("kto_rejected_weight", LF, "--kto-undesirable-weight"),
    Foreign("reward_model", LF, "--reward-model", stages=ONLINE),
    _values("reward_model_type", LF, "", {"full": None}, "lora and api reward models are not built", stages=ONLINE),
    Foreign("ppo_epochs", LF, "--update-epochs", stages=("ppo",)),
    Foreign(
        "ppo_target",
        LF,
        "--target-kl",
        stages=("ppo",),
        note="with --adaptive-kl, which LLaMA-Factory's PPO (stage ppo, or ppo_target) turns on unless given",
    ),
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
INDEX: dict[str, list[Foreign]] = {}
for _one in NAMES:
    INDEX.setdefault(_one.key, []).append(_one)
