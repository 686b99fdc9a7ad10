"""Config sections shared by the training stages. Each field is documented once, here."""
from __future__ import annotations

import math
from dataclasses import dataclass

from tether.config import ConfigError, choice, option


@dataclass(frozen=True)
class ModelSection:
    """The model being trained."""

    path: str = option("", "Local Hugging Face model folder (config.json, weights, tokenizer).", flag="--model")
    tokenizer: str = option("", "Tokenizer folder, if not the model folder.")
    dtype: str = option("float32", "Weights dtype: float32, bfloat16, float16 or auto (as saved).",
                        choices=("float32", "bfloat16", "float16", "auto"))
    device: str = option("auto", "auto (GPU if present), cpu or cuda.", choices=("auto", "cpu", "cuda"))
    trust_remote_code: bool = option(False, "Run model code shipped inside the model folder. Off unless you trust it.")
    lora_r: int = option(0, "LoRA rank; 0 trains every weight. Typical 8-64.")
    lora_alpha: float = option(16.0, "LoRA scaling alpha (update scaled by alpha/r). Typical 2*r.")
    lora_dropout: float = option(0.0, "Dropout on the LoRA input. Typical 0-0.1.")
    lora_target_modules: list = option(["all-linear"], "Module names that get adapters, or all-linear.")

    def __post_init__(self):
        if self.lora_r < 0:
            raise ConfigError(f"lora_r={self.lora_r}: must be >= 0 (0 disables LoRA)")
        if not 0 <= self.lora_dropout < 1:
            raise ConfigError(f"lora_dropout={self.lora_dropout}: must be in [0, 1)")


@dataclass(frozen=True)
class SFTDataSection:
    """Training data (docs/data.md lists the formats)."""

    path: str = option("", "Training data: .jsonl, .json, .parquet or a datasets save_to_disk folder.", flag="--data")
    eval_path: str = option("", "Held-out data in the same format; if empty, eval_fraction of the training data is held out.", flag="--eval-data")
    eval_fraction: float = option(0.05, "Fraction of training records held out for evaluation when no --eval-data; 0 disables eval.")
    split: str = option("train", "Split to read from a datasets folder that has several.")
    columns: str = option("", "Rename columns, NAME=SOURCE,..., e.g. prompt=question,completion=answer.")
    max_length: int = option(1024, "Longest example in tokens; longer ones are dropped and counted (errors with --strict). Never truncated.")
    train_on_prompt: bool = option(False, "Also train on prompt tokens (default: completion-only loss).")
    packing: bool = option(False, "Pack several examples per row of max_length tokens, without attention across examples.")
    strict: bool = option(False, "Make dropped examples (empty completion, too long) errors.")

    def __post_init__(self):
        if not 0 <= self.eval_fraction < 1:
            raise ConfigError(f"eval_fraction={self.eval_fraction}: must be in [0, 1)")
        if self.max_length < 2:
            raise ConfigError(f"max_length={self.max_length}: must be >= 2")


@dataclass(frozen=True)
class PreferenceDataSection:
    """Preference data: prompt/chosen/rejected pairs or prompt/responses/ranking lists (docs/data.md)."""

    path: str = option("", "Training preferences: .jsonl, .json, .parquet or a datasets folder.", flag="--data")
    eval_path: str = option("", "Held-out preferences; if empty, eval_fraction of the training rows is held out.",
                            flag="--eval-data")
    eval_fraction: float = option(0.05, "Fraction of rows held out when no --eval-data; 0 disables the held-out pairs.")
    split: str = option("train", "Split of a datasets folder.")
    columns: str = option("", "Rename columns, NAME=SOURCE,..., e.g. chosen=better,rejected=worse.")
    max_length: int = option(1024, "Longest prompt+response in tokens; longer pairs are dropped and counted (--strict: error).")
    strict: bool = option(False, "Make dropped rows errors.")

    def __post_init__(self):
        if not 0 <= self.eval_fraction < 1:
            raise ConfigError(f"eval_fraction={self.eval_fraction}: must be in [0, 1)")


@dataclass(frozen=True)
class OptimSection:
    """AdamW with linear warm-up and cosine decay."""

    lr: float = option(2e-5, "Peak learning rate. Typical 1e-5-5e-5 for full fine-tuning, 1e-4-3e-4 for LoRA.")
    weight_decay: float = option(0.0, "AdamW decoupled weight decay.")
    adam_beta1: float = option(0.9, "AdamW beta1.")
    adam_beta2: float = option(0.999, "AdamW beta2.")
    warmup_ratio: float = option(0.05, "Fraction of steps of linear warm-up from 0 to lr.")
    min_lr_ratio: float = option(0.1, "Cosine decays to lr * min_lr_ratio at the last step.")
    max_grad_norm: float = option(1.0, "Clip the global gradient norm to this; 0 disables clipping.")

    def __post_init__(self):
        if self.lr <= 0:
            raise ConfigError(f"lr={self.lr}: must be > 0")
        if not 0 <= self.warmup_ratio < 1 or not 0 <= self.min_lr_ratio <= 1:
            raise ConfigError("warmup_ratio must be in [0, 1) and min_lr_ratio in [0, 1]")


@dataclass(frozen=True)
class TrainSection:
    """Batching, length of the run, evaluation, checkpoints and logging."""

    output: str = option("", "Run folder: config.yaml, metrics.jsonl, checkpoint-<step>/, final/.")
    batch_size: int = option(32, "Examples (or packed rows) per optimizer step, over all processes.")
    micro_batch_size: int = option(8, "Examples per forward pass on each process; gradient accumulation covers the rest.")
    max_steps: int = option(0, "Optimizer steps; 0 means derive from --epochs.")
    epochs: float = option(1.0, "Passes over the training data, used when max_steps is 0.")
    eval_every: int = option(50, "Evaluate every N steps (and at the end); 0 only at the end.")
    save_every: int = option(100, "Write checkpoint-<step>/ every N steps; 0 only final/.")
    keep_checkpoints: int = option(2, "Keep the newest N checkpoints; 0 keeps all.")
    log_every: int = option(10, "Console line every N steps (metrics.jsonl gets every step).")
    seed: int = option(0, "Seed for data order, held-out split and initialisation.")
    resume: bool = option(False, "Continue from the newest checkpoint-<step>/ in --output.")
    overwrite: bool = option(False, "Start afresh in an --output that already holds a run (deletes its metrics and checkpoints).")
    report_to: list = option(["tensorboard"], "Extra loggers: tensorboard, wandb, mlflow, or none. metrics.jsonl is always written.")

    def __post_init__(self):
        if self.batch_size < 1 or self.micro_batch_size < 1:
            raise ConfigError("batch_size and micro_batch_size must be >= 1")
        if self.max_steps < 0 or self.epochs <= 0:
            raise ConfigError("max_steps must be >= 0 and epochs > 0")
        if self.resume and self.overwrite:
            raise ConfigError("--resume and --overwrite contradict each other; choose one")
        for name in self.report_to:
            choice(name, ("tensorboard", "wandb", "mlflow", "none"), "report_to")

    def grad_accum(self, world_size: int) -> int:
        """Micro-batches per optimizer step on each process."""
        per_step = self.micro_batch_size * world_size
        if self.batch_size % per_step:
            raise ConfigError(
                f"batch_size={self.batch_size} is not a multiple of micro_batch_size={self.micro_batch_size} x "
                f"{world_size} process(es) = {per_step}; use batch_size={max(per_step, self.batch_size // per_step * per_step)} "
                f"or a micro_batch_size that divides {self.batch_size // world_size if self.batch_size % world_size == 0 else self.batch_size}")
        return self.batch_size // per_step

    def total_steps(self, num_examples: int) -> int:
        return self.max_steps or max(1, math.ceil(self.epochs * num_examples / self.batch_size))


@dataclass(frozen=True)
class RewardFunctionOptions:
    """Python reward functions (docs/rewards.md); the online stages' reward sections extend this."""

    reward: list = option([], "Reward functions, module:function[(k=v,...)][=weight] or file.py:function, comma-separated; "
                              "added to the reward model's score when there is one. A function that returns step scores "
                              "is a process reward (tether grpo).", flag="--reward")
    reward_on_error: str = option("raise", "A reward function that raises or times out: raise (stop, naming it and the "
                                           "sample) or score (reward_error_score, counted in reward/<name>/errors).",
                                  choices=("raise", "score"))
    reward_error_score: float = option(0.0, "Score given when a reward function failed and reward_on_error=score.")
    reward_timeout: float = option(60.0, "Seconds a reward function may take per batch (then it counts as failed); 0 = no limit.")
    reward_model_weight: float = option(1.0, "Weight of the reward model's score in the total reward.")
