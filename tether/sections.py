"""Config sections shared by the stages. Each field is declared and documented once, here; a stage picks the
sections it needs and sets its own defaults by giving a default instance (see tether/config.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

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
    share_prompt: bool = option(
        True,
        "In padding-free rows, lay the responses to one prompt after one copy of it (DPO's and reward models' pairs "
        "and lists; GRPO's and PPO's groups, where it is off by default: it pays there with long prompts only): each "
        "attends to the prompt and to itself, so the log-probs are the same from fewer positions. Not under "
        "--keep-dropout (one copy would give every response the same dropout mask), nor for a model whose attention "
        "takes no 4-D mask or has a sliding window; the plan says which layout a run uses (docs/performance.md).",
    )
    chunked_head: bool = option(
        False,
        "Apply the LM head and its log-softmax a chunk of positions at a time, recomputing each chunk in the "
        "backward, so a micro-batch's logits never exist whole: memory at large vocabularies and long responses, for "
        "one more head product where a micro-batch's trained positions fill more than one chunk (2^24 logits). "
        "tether sft, judge and dpo (offline and online rounds; its reference pass "
        "too); a head that is a plain linear layer with nothing after it (checked at start-up); not with --fsdp.",
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
    lora_target_modules: list = option(
        ["all-linear"],
        "Module names that get adapters, or all-linear (not an embedding tied to the other end: its merge would "
        "change both).",
    )
    train_vision: bool = option(
        False,
        "Vision-language models: train the image encoder too. Off: it is frozen, while the projector that maps its "
        "features into the language model trains with the rest (LoRA: adapters on the language model only).",
    )
    max_image_pixels: int = option(
        16_777_216,
        "Largest image a record or prompt row may carry, in pixels (width x height); a larger one is an error naming it "
        "(a vision-language model's processor resizes what it takes).",
    )
    keep_dropout: bool = option(
        False,
        "Keep the models' dropout active while training. Off by default: every dropout layer of the trained and the "
        "reference model is disabled, so both score a response alike (DPO's loss is log 2 at step 1; PPO's ratio "
        "is 1 on-policy).",
    )

    @property
    def shares_prompts(self) -> bool:
        """Padding-free rows lay a prompt's responses after one copy of it: share_prompt, where it is exact (no
        dropout: one copy would give every response the same mask)."""
        return self.padding_free and self.share_prompt and not self.keep_dropout

    @property
    def forward_rows(self) -> dict:
        """The rollout forwards' row keywords (rollout/forward.py): padding-free, and prompts shared where exact."""
        return {"padding_free": self.padding_free, "share_prompt": self.shares_prompts}

    def refuse_chunked_head(self, stage: str) -> None:
        """Raise where ``stage`` has no offline log-prob objective for --chunked-head to serve."""
        if self.chunked_head:
            raise ConfigError(
                f"model.chunked_head: {stage} does not take it (tether sft, judge and dpo do; the online stages "
                "compute entropies from whole logits, reward models have no LM head)"
            )

    def check(self):
        if self.chunked_head and self.fsdp:
            raise ConfigError("chunked_head with fsdp: not built (the head's weight is a shard outside the forward)")
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
    eval_split: str = option(
        "test", "Split of --eval-data to read when it is a datasets folder that has several (its --split)."
    )
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
        if self.eval_path and Path(self.eval_path) == Path(self.path) and not Path(self.path).is_file():
            # a folder of splits: the same split would score the model on the rows it trains on, unseen (the same
            # file named twice is the user's own choice, in plain sight)
            if self.eval_split == self.split:
                raise ConfigError(
                    f"eval_path={self.eval_path!r} is the training data itself (path, split {self.split!r}): "
                    "evaluation would score the training rows; set eval_split (--eval-split) to another split of "
                    "a datasets folder, or leave eval_path empty to hold out eval_fraction"
                )


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
        for name in ("adam_beta1", "adam_beta2"):  # torch's AdamW refuses them only when the run starts
            if not 0 <= getattr(self, name) < 1:
                raise ConfigError(f"{name}={getattr(self, name)}: must be in [0, 1)")
        for name in ("weight_decay", "max_grad_norm"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name}={getattr(self, name)}: must be >= 0")
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
    alarm_final: str = option(
        "last",
        "With stop_on_alarm, what final/ holds after an alarm: last (the policy at the alarm), before (the last "
        "checkpoint written before the alarm's step; the starting model if none was), best (best/, by best_metric).",
        choices=("last", "before", "best"),
    )
    alarm_stops: str = option(
        "any",
        "With stop_on_alarm, which alarms stop the run: any, or trusted (those that read a trusted check: the audit "
        "(--audit), the environment's state, a held-out task metric, and a generic monitor's alarm the audit "
        "confirmed; the other alarms are still written). trusted needs --audit, an environment or held-out prompts.",
        choices=("any", "trusted"),
    )


@dataclass(frozen=True)
class OnlineRunSection(RunSection, AlarmOptions):
    """Run folder, length of the run, evaluation, best/, samples, alarms, checkpoints and logging."""

    sample_every: int = option(5, "Write the step's responses to samples.jsonl every N steps (the monitors read them).")
    best_metric: str = option(
        "",
        "Keep best/ (HF format) at the evaluation with the best value of this metric, e.g. eval/score_mean or, on "
        "the lab, eval/gold_reward, or with --audit eval/audit_score_mean (the audit since the last evaluation); "
        "empty: no best/.",
    )
    best_mode: str = option("max", "Whether best_metric is better high (max) or low (min).", choices=("max", "min"))

    def check(self):
        super().check()
        if self.max_steps < 1:
            raise ConfigError(f"max_steps={self.max_steps}: an online run needs at least 1 step")
        if self.alarm_final == "best" and not self.best_metric:
            raise ConfigError("alarm_final=best keeps best/ after an alarm: set best_metric (e.g. eval/gold_reward)")


def __getattr__(name: str):
    from tether._moved import moved_name  # tether.sections.SamplingSection and the other online sections of 0.1

    return moved_name(__name__, name)
