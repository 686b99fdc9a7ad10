"""`tether dpo`: the direct-preference family, offline and online (ALGORITHMS §6, docs/dpo.md).

Offline: preference pairs (or ranked lists) → reference log-probs in one cached no-grad pass → the shared
offline loop with DPOObjective (all responses of a batch in one forward). Online: each round samples two
answers per prompt from the current policy, labels them (a judge function, a reward model or reward
functions), and trains steps_per_round steps on those pairs against the fixed reference.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from tether.algorithms.logprobs import token_logprobs
from tether.algorithms.preference import REFERENCE_FREE, beta_dpo_beta, beta_dpo_pair_weights, preference_loss
from tether.config import ConfigError, config_to_dict
from tether.data.dpo import collate_policy_preferences, tokenize_policy_preferences
from tether.data.records import read_records
from tether.models import load_model, save_merged
from tether.monitors import RunMonitor, read_jsonl
from tether.reference_cache import (ReferenceCache, attach_reference_logps, cache_key, model_fingerprint,
                                    sequence_logps, tokenizer_fingerprint)
from tether.rewards.functions import load_reward_function, load_reward_set
from tether.stages import common
from tether.stages.dpo_config import DPOConfig
from tether.stages.sft import split_records
from tether.train.checkpoint import STATE_FILE, load_training_state, write_atomically
from tether.train.logger import MetricsLogger, console
from tether.train.offline import EpochOrder, LoopSettings, train_offline


class DPOObjective:
    """Σ over preference examples of the chosen loss (+ sft_coef × the chosen answer's mean token NLL).

    One forward scores every response of the micro-batch (collate puts the K responses of each example in
    K row blocks); the loop divides by the step's example count, so accumulation and processes do not change
    the gradient. Statistics (summed here, averaged by the loop) are the glossary's train/rewards/*,
    train/logps/*, train/accuracy, train/beta.
    """

    unit = "pairs"

    def __init__(self, d, beta_state: dict | None = None):
        self.d = d
        self.beta = d.effective_beta
        self.needs_reference = d.loss not in REFERENCE_FREE
        # β-DPO's running margin statistics (M_0, σ), restored on resume
        self.state = beta_state or {"mean": None, "std": 1.0}
        self._weight_norm = None  # the step's mean pair weight (β-DPO weighting)

    def count(self, batch: dict) -> int:
        return int(batch["list_mask"].shape[0])

    def sequence_logps(self, model, batch: dict):
        """(B, K) Σ log π over each response's tokens and (B, K) token counts."""
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False).logits
        mask = batch["loss_mask"][:, 1:].float()
        per_row = (token_logprobs(logits[:, :-1], batch["input_ids"][:, 1:]) * mask).sum(-1)  # (K·B,)
        b, k = batch["list_mask"].shape
        return per_row.view(k, b).T, mask.sum(-1).view(k, b).T

    def _margins(self, logps, ref) -> torch.Tensor:
        """M_i = β_0 (u_w − u_l): the implicit-reward margin at the base β (β-DPO's batch statistic)."""
        u = logps - ref
        return self.d.effective_beta * (u[:, 0] - u[:, -1])

    @torch.no_grad()
    def begin_step(self, model, micro_batches: list[dict], reduce) -> None:
        """β-DPO only: β for this step from the whole step batch's mean margin; the running M_0 and σ move after."""
        if self.d.loss != "beta_dpo":
            return
        total = torch.zeros(4, dtype=torch.float64)  # Σ M, Σ M², Σ w, n
        old_mean = self.state["mean"]
        for batch in micro_batches:
            logps, _ = self.sequence_logps(model, batch)
            m = self._margins(logps, batch["reference_logps"]).double().cpu()
            w = beta_dpo_pair_weights(m, old_mean, self.state["std"]) if old_mean is not None else torch.ones_like(m)
            total += torch.stack([m.sum(), (m * m).sum(), w.sum(), torch.tensor(float(len(m)), dtype=torch.float64)])
        total = reduce(total).cpu()
        n = float(total[3])
        batch_mean = float(total[0]) / n
        batch_std = max(float(total[1]) / n - batch_mean ** 2, 0.0) ** 0.5
        reference_margin = batch_mean if old_mean is None else old_mean
        self.beta = beta_dpo_beta(torch.tensor([batch_mean]), self.d.effective_beta, self.d.beta_dpo_alpha, reference_margin)
        self._weight_norm = float(total[2]) / n
        mom = self.d.beta_dpo_momentum
        self.state = {"mean": batch_mean if old_mean is None else mom * old_mean + (1 - mom) * batch_mean,
                      "std": batch_std if old_mean is None else mom * self.state["std"] + (1 - mom) * batch_std,
                      "old_mean": old_mean}

    def loss_sum(self, model, batch: dict):
        d = self.d
        logps, tokens = self.sequence_logps(model, batch)
        ref = batch.get("reference_logps")
        if self.needs_reference and ref is None:
            raise RuntimeError("reference log-probabilities are missing from the batch")
        losses = preference_loss(d.loss, logps, ref if self.needs_reference else None, tokens, self.beta,
                                 d.label_smoothing, d.simpo_gamma, d.orpo_lambda, batch["list_mask"])
        # Weighting needs a running σ from earlier steps; when every weight underflows (σ far smaller than the
        # spread of this step's margins) the step falls back to equal weights rather than dividing by zero.
        if (d.loss == "beta_dpo" and d.beta_dpo_weighting and model.training and self.state.get("old_mean") is not None
                and self._weight_norm and self._weight_norm > 1e-12):
            m = self._margins(logps.detach(), ref)
            losses = losses * beta_dpo_pair_weights(m, self.state["old_mean"], self.state["std"]) / self._weight_norm
        chosen_nll = -logps[:, 0] / tokens[:, 0].clamp(min=1)
        if d.sft_coef:
            losses = losses + d.sft_coef * chosen_nll
        last = batch["list_mask"].sum(-1) - 1  # the worst-ranked real response
        worst = logps.gather(1, last[:, None]).squeeze(1)
        with torch.no_grad():
            if self.needs_reference:
                r_chosen = self.beta * (logps[:, 0] - ref[:, 0])
                r_rejected = self.beta * (worst - ref.gather(1, last[:, None]).squeeze(1))
            else:  # the reference-free losses' own implicit reward: (β/|y|) log π(y)
                r_chosen = self.beta * logps[:, 0] / tokens[:, 0].clamp(min=1)
                r_rejected = self.beta * worst / tokens.gather(1, last[:, None]).squeeze(1).clamp(min=1)
            margins = r_chosen - r_rejected
            stats = {"rewards/chosen": r_chosen.sum(), "rewards/rejected": r_rejected.sum(),
                     "rewards/margins": margins.sum(), "rewards/accuracy": (margins > 0).float().sum(),
                     "logps/chosen": logps[:, 0].detach().sum(), "logps/rejected": worst.detach().sum(),
                     "nll/chosen": chosen_nll.detach().sum(),
                     "beta": torch.tensor(self.beta * len(losses))}
        return losses.sum(), stats


# ----------------------------------------------------------------------------------------------- reference


def check_lora_reference(cfg: DPOConfig) -> None:
    m, d = cfg.model, cfg.dpo
    if m.lora_r > 0 and not d.reference and m.path and (Path(m.path) / "adapter_config.json").is_file():
        raise ConfigError(f"--model {m.path} is a LoRA adapter folder: with --lora-r the reference would be the model "
                          "with adapters disabled, i.e. the adapter's base model, not your SFT model. Merge the adapter "
                          "first (tether writes merged final/ folders) or pass --reference")


class ReferenceLogps:
    """log π_ref for preference examples: from the cache, or computed with the reference — the --reference model,
    the policy itself before training (same weights), or with LoRA the adapter-disabled policy."""

    def __init__(self, cfg: DPOConfig, tokenizer, policy, device, fresh_policy: bool):
        self.cfg, self.tokenizer, self.policy, self.device = cfg, tokenizer, policy, device
        d, m = cfg.dpo, cfg.model
        self.lora = m.lora_r > 0 and not d.reference
        source = d.reference or m.path
        self.fingerprint = model_fingerprint(source) + (":adapter-disabled" if self.lora else "")
        self.source = source
        self.fresh_policy = fresh_policy  # the policy still has the reference's weights
        self._model = None
        folder = d.reference_cache or str(Path(cfg.train.output) / "reference_cache")
        self.cache = ReferenceCache(folder)
        self.tokenizer_fp = tokenizer_fingerprint(tokenizer)
        self.computed = 0  # examples scored (0 when everything came from the cache)

    def _score(self, examples):
        batch_size, pad = self.cfg.dpo.reference_batch_size, self.tokenizer.pad_token_id
        if self.lora:
            with self.policy.disable_adapter():
                return sequence_logps(self.policy, examples, pad, batch_size, self.device)
        if self.fresh_policy and not self.cfg.dpo.reference:
            return sequence_logps(self.policy, examples, pad, batch_size, self.device)
        if self._model is None:
            self._model = load_model(self.source, self.tokenizer, self.cfg.model.dtype).to(self.device).eval()
        return sequence_logps(self._model, examples, pad, batch_size, self.device)

    def attach(self, examples, use_cache: bool = True) -> str:
        """Fill ex.reference_logps; returns where they came from (for the plan)."""
        if not examples:
            return "none"
        key = cache_key(examples, self.fingerprint, self.tokenizer_fp)
        cached = self.cache.load(key) if use_cache else None
        if cached is not None:
            attach_reference_logps(examples, cached)
            return f"cache {self.cache.path(key)}"
        logps = self._score(examples)
        self.computed += len(examples)
        attach_reference_logps(examples, logps)
        if use_cache:
            self.cache.save(key, logps)
            return f"computed, cached in {self.cache.path(key)}"
        return "computed"


# ------------------------------------------------------------------------------------------------- online


class PairLabeller:
    """Which of two answers is better: a judge function, or the higher score of a reward model and reward functions."""

    def __init__(self, cfg: DPOConfig, prompt_rows: list[dict], device):
        o = cfg.online
        self.judge = load_reward_function(o.judge) if o.judge else None
        self.rewards = load_reward_set(o, prompt_rows)
        self.rm = None
        if o.reward_model:
            from tether.reward_model import RewardScorer

            self.rm = RewardScorer(o.reward_model, None, True, device)
        if not (self.judge or self.rewards or self.rm):
            raise ConfigError("--online needs a labeller: --judge module:function, --reward-model or --reward")
        self.cfg = cfg

    def scores(self, rows, prompts_text, answers, tokenizer) -> list[float]:
        total = [0.0] * len(answers)
        if self.rm is not None:
            eos = tokenizer.eos_token or ""
            values = self.rm([p + a + eos for p, a in zip(prompts_text, answers)])
            total = [t + self.cfg.online.reward_model_weight * v for t, v in zip(total, values)]
        if self.rewards is not None:
            ids = [tokenizer(a, add_special_tokens=False)["input_ids"] for a in answers]
            parts = self.rewards.score(rows, answers, ids, [False] * len(answers))
            for c in self.rewards.components:
                total = [t + c.weight * float(sum(v) if isinstance(v, list) else v) for t, v in zip(total, parts[c.name])]
        return total

    def __call__(self, rows, prompts_text, first, second, tokenizer):
        """(P(first is better) per pair: 1, 0 or 0.5 — a tie, dropped; each answer's score: the labeller's score,
        or with a judge the answer's side of the verdict)."""
        if self.judge is not None:
            columns = {k: [r.get(k) for r in rows] for k in rows[0] if k != "prompt"}
            values = self.judge(prompts=[r.get("prompt") for r in rows], first=first, second=second, **columns)
            if len(values) != len(first):
                raise ConfigError(f"--judge {self.cfg.online.judge} returned {len(values)} values for {len(first)} pairs")
            preference = [float(v) for v in values]
            return preference, preference, [1.0 - p for p in preference]
        a = self.scores(rows, prompts_text, first, tokenizer)
        b = self.scores(rows, prompts_text, second, tokenizer)
        return [1.0 if x > y else 0.0 if x < y else 0.5 for x, y in zip(a, b)], a, b


def _prompt_text(tokenizer, prompt) -> str:
    return tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True) if isinstance(prompt, list) else prompt


def sample_round_pairs(policy, tokenizer, rows: list[dict], labeller: PairLabeller, o, seed: int):
    """Two answers per prompt from the current policy, labelled; ties and truncated answers dropped and counted.
    Returns (pairs, counts, samples): samples are every answer with its score, for the monitors."""
    from tether.rollout import generate_rollout

    torch.manual_seed(seed)
    texts = [_prompt_text(tokenizer, r["prompt"]) for r in rows]
    rollout = generate_rollout(policy, tokenizer, [t for t in texts for _ in range(2)], o.max_new_tokens, o.temperature)
    answers, truncated = rollout.responses, rollout.truncated.tolist()
    first, second = answers[0::2], answers[1::2]
    preference, score_first, score_second = labeller(rows, texts, first, second, tokenizer)
    lengths = rollout.lengths.tolist()
    samples = [{"prompt": texts[i // 2], "response": answers[i], "length": int(lengths[i]), "truncated": bool(truncated[i]),
                "score": float((score_first if i % 2 == 0 else score_second)[i // 2])} for i in range(len(answers))]
    pairs, counts = [], {"prompts": len(rows), "ties": 0, "truncated": 0, "identical": 0}
    for i, row in enumerate(rows):
        if not o.keep_truncated and (truncated[2 * i] or truncated[2 * i + 1]):
            counts["truncated"] += 1
            continue
        if first[i].strip() == second[i].strip():
            counts["identical"] += 1
            continue
        if preference[i] == 0.5:
            counts["ties"] += 1
            continue
        chosen, rejected = (first[i], second[i]) if preference[i] > 0.5 else (second[i], first[i])
        wrap = (lambda a: [{"role": "assistant", "content": a}]) if isinstance(row["prompt"], list) else (lambda a: a)
        pairs.append({**{k: v for k, v in row.items() if k not in ("chosen", "rejected")},
                      "chosen": wrap(chosen), "rejected": wrap(rejected)})
    counts["pairs"] = len(pairs)
    return pairs, counts, samples


# ---------------------------------------------------------------------------------------------------- run


def _load_offline(cfg: DPOConfig, tokenizer):
    """Training and held-out examples; online runs may have held-out pairs only (--eval-data without --data)."""
    d = cfg.data
    records = read_records(d.path, d.columns, d.split) if d.path else []
    train_recs, eval_recs = ((records, read_records(d.eval_path, d.columns, d.split)) if d.eval_path
                             else split_records(records, d.eval_fraction, cfg.train.seed))
    train, reports, evals = [], [], []
    if train_recs:
        train, report = tokenize_policy_preferences(train_recs, tokenizer, d.max_length, d.strict, d.path)
        reports.append(report)
    if eval_recs:
        evals, eval_report = tokenize_policy_preferences(eval_recs, tokenizer, d.max_length, d.strict,
                                                         d.eval_path or f"{d.path} (held out)")
        reports.append(eval_report)
    return train, evals, reports


def _check(cfg: DPOConfig) -> None:
    o = cfg.online
    required = [(cfg.model.path, "--model"), (cfg.train.output, "--output")]
    required.append((o.prompts, "--online-prompts") if o.online else (cfg.data.path, "--data"))
    for value, flag in required:
        if not value:
            raise ConfigError(f"{flag} is required")
    if o.online and cfg.dpo.loss == "listwise":
        raise ConfigError("online rounds make pairs; use a pairwise loss (listwise needs ranked lists in --data)")
    check_lora_reference(cfg)


def run_dpo(cfg: DPOConfig, evaluate_fn=None) -> dict:
    """Train; ``evaluate_fn(policy, tokenizer) -> dict`` adds task metrics (on the lab: gold win rate) to every
    evaluation, including one before the first step."""
    t_start = time.perf_counter()
    _check(cfg)
    d, o = cfg.dpo, cfg.online
    accelerator = common.make_accelerator(cfg.model.device)
    if o.online and accelerator.num_processes > 1:
        raise ConfigError("tether dpo --online runs on one process for now; launch it without accelerate's "
                          "--num_processes (offline DPO runs on several)")
    config = config_to_dict(cfg)
    start_step, checkpoint = common.prepare_output(accelerator, cfg.train.output, cfg.train.resume, cfg.train.overwrite, config)
    out = Path(cfg.train.output)
    torch.manual_seed(cfg.train.seed)
    tokenizer = common.load_stage_tokenizer(cfg.model)
    train, evals, reports = _load_offline(cfg, tokenizer) if (cfg.data.path or cfg.data.eval_path) else ([], [], [])
    longest = max((len(e.responses) for e in train + evals), default=2)
    if longest > 2 and d.loss != "listwise":
        raise ConfigError(f"{cfg.data.path} holds ranked lists of up to {longest} responses; loss {d.loss} compares "
                          "pairs — use --loss listwise (Plackett–Luce), or pairs data")
    if o.online:
        prompt_rows = [r.fields for r in read_records(o.prompts)]
        total_steps = o.rounds * o.steps_per_round
    else:
        prompt_rows = []
        total_steps = cfg.train.total_steps(len(train))
    accum = cfg.train.grad_accum(accelerator.num_processes)
    if start_step >= total_steps:
        raise ConfigError(f"--resume: {checkpoint.name} is already at step {start_step} of {total_steps}; nothing left to train")
    model = common.load_trainable_model(cfg.model, tokenizer, checkpoint).to(accelerator.device)
    state = json.loads((checkpoint / STATE_FILE).read_text()) if checkpoint else {}  # β-DPO statistics, history
    objective = DPOObjective(d, state.get("beta_dpo"))
    reference = ReferenceLogps(cfg, tokenizer, model, accelerator.device, fresh_policy=checkpoint is None) \
        if objective.needs_reference else None
    reference_source = "not used (reference-free loss)" if reference is None else \
        f"computed each round from {'the adapter-disabled policy' if reference.lora else reference.source}"
    if reference is not None and (train or evals):
        if accelerator.is_main_process:  # one process scores and caches, the others read the cache
            reference_source = reference.attach(train + evals)
        accelerator.wait_for_everyone()
        if not accelerator.is_main_process:
            reference.attach(train + evals)
    labeller = PairLabeller(cfg, prompt_rows, accelerator.device) if o.online else None
    optimizer, scheduler = common.build_optimizer(model, cfg.optim, total_steps)
    if checkpoint is not None:
        load_training_state(checkpoint, optimizer, scheduler, accelerator.process_index)
    model, optimizer = accelerator.prepare(model, optimizer)
    unwrapped = accelerator.unwrap_model(model)
    plan = {"loss": f"{d.loss} (β {d.effective_beta:g}" + (f", ε {d.label_smoothing:g}" if d.label_smoothing else "")
                    + (f", SFT term {d.sft_coef:g}" if d.sft_coef else "") + ")",
            "examples (train / eval)": f"{len(train)} / {len(evals)}" + (f" {reports[0].format}" if reports else ""),
            "online": f"{o.rounds} rounds x {o.prompts_per_round} prompts x 2 answers, {o.steps_per_round} steps each"
                      if o.online else "no",
            "reference log-probs": reference_source if reference else "not used (reference-free loss)",
            "batch per optimizer step": cfg.train.batch_size,
            "processes x micro-batch x accumulation": f"{accelerator.num_processes} x {cfg.train.micro_batch_size} x {accum}",
            "optimizer steps": total_steps, "start step": start_step, "model": common.parameter_summary(model)}
    if accelerator.is_main_process:
        common.announce("tether dpo", plan, config, out, reports, checkpoint)

    history: list[dict] = list(state.get("eval_history", []))
    collate = lambda exs: collate_policy_preferences(exs, tokenizer.pad_token_id)

    def evaluate(eval_examples):
        from tether.train.offline import evaluate as held_out

        metrics = held_out(accelerator, model, eval_examples, collate, objective, cfg.train.micro_batch_size) \
            if eval_examples else {}
        if evaluate_fn is not None and accelerator.is_main_process:
            metrics.update({f"eval/{k}": v for k, v in evaluate_fn(unwrapped, tokenizer).items()})
        return metrics

    def on_eval(step: int, metrics: dict) -> bool:
        history.append({"step": step, **metrics})
        return False

    logger = MetricsLogger(out, cfg.train.report_to, config, start_step, total_steps,
                           enabled=accelerator.is_main_process, log_every=cfg.train.log_every, run_name="dpo")
    if start_step == 0 and (evals or evaluate_fn is not None):
        baseline = evaluate(evals)
        history.append({"step": 0, **baseline})
        logger.log({"step": 0, **{k.replace("eval/", "eval0/", 1): v for k, v in baseline.items()}})
    checkpoint_state = lambda: {"beta_dpo": objective.state, "eval_history": history}
    # The loop evaluates only when it has held-out examples; with none but a task evaluation, a stand-in list
    # makes it call evaluate() (which then reports the task metrics alone).
    eval_marker = evals or ([None] if evaluate_fn is not None else [])
    online_counts: list[dict] = list(state.get("online_rounds", []))
    last_eval: dict = {}
    stopped_at = None
    try:
        if not o.online:
            settings = LoopSettings(cfg.train.batch_size, cfg.train.micro_batch_size, total_steps, cfg.optim.max_grad_norm,
                                    cfg.train.eval_every, cfg.train.save_every, cfg.train.keep_checkpoints, cfg.train.seed)
            last_eval, _ = train_offline(
                accelerator=accelerator, model=model, optimizer=optimizer, scheduler=scheduler, train_examples=train,
                eval_examples=eval_marker, collate_fn=collate, objective=objective, settings=settings,
                start_step=start_step, output=out, tokenizer=tokenizer, logger=logger, on_eval=on_eval,
                checkpoint_state=checkpoint_state, evaluate_fn=lambda: evaluate(evals))
        else:
            order = EpochOrder(len(prompt_rows), cfg.train.seed)
            monitor = RunMonitor(out, o.stop_on_alarm)
            for rnd in range(start_step // o.steps_per_round, o.rounds):
                pairs_path = out / "rounds" / f"round-{rnd}.jsonl"
                if not pairs_path.is_file():  # a resumed round reuses its pairs
                    rows = [prompt_rows[i] for i in order.slice(rnd * o.prompts_per_round, o.prompts_per_round)]
                    pairs, counts, samples = sample_round_pairs(unwrapped, tokenizer, rows, labeller, o,
                                                                cfg.train.seed * 1000 + rnd)
                    if not pairs:
                        raise ConfigError(f"online round {rnd}: no usable pair ({counts}); raise max_new_tokens or "
                                          "the temperature, or check the labeller")
                    pairs_path.parent.mkdir(exist_ok=True)
                    tmp = pairs_path.with_suffix(".tmp")
                    tmp.write_text("".join(json.dumps(p) + "\n" for p in pairs))
                    tmp.replace(pairs_path)
                    with (out / "samples.jsonl").open("a") as handle:  # sampled by the policy of step rnd * S
                        handle.write("".join(json.dumps({"step": rnd * o.steps_per_round, **x}) + "\n" for x in samples))
                    online_counts.append({"round": rnd, **counts})
                    console.print(f"online round {rnd}: {counts['pairs']} pairs from {counts['prompts']} prompts "
                                  f"(dropped: {counts['ties']} ties, {counts['identical']} identical, "
                                  f"{counts['truncated']} truncated)")
                round_examples, _ = tokenize_policy_preferences(read_records(pairs_path), tokenizer,
                                                                cfg.data.max_length, False, str(pairs_path))
                if reference is not None:
                    reference.fresh_policy = False
                    reference.attach(round_examples, use_cache=False)
                settings = LoopSettings(cfg.train.batch_size, cfg.train.micro_batch_size, (rnd + 1) * o.steps_per_round,
                                        cfg.optim.max_grad_norm, cfg.train.eval_every, cfg.train.save_every,
                                        cfg.train.keep_checkpoints, cfg.train.seed + rnd)
                last_eval, _ = train_offline(
                    accelerator=accelerator, model=model, optimizer=optimizer, scheduler=scheduler,
                    train_examples=round_examples, eval_examples=eval_marker, collate_fn=collate, objective=objective,
                    settings=settings, start_step=max(start_step, rnd * o.steps_per_round), output=out,
                    tokenizer=tokenizer, logger=logger, on_eval=on_eval,
                    checkpoint_state=lambda: {**checkpoint_state(), "online_rounds": online_counts},
                    evaluate_fn=lambda: evaluate(evals))
                if monitor.check():  # reward-hacking alarms on the rounds so far (the round's checkpoint is written)
                    console.print(f"[bold red]stopping after round {rnd}: --stop-on-alarm[/]")
                    stopped_at = (rnd + 1) * o.steps_per_round
                    break
    finally:
        logger.close()
    summary = {"stage": "dpo", "loss": d.loss, "beta": d.effective_beta, "steps": total_steps,
               "resumed_from": start_step or None, "train_examples": len(train), "eval_examples": len(evals),
               **last_eval, "eval_history": history, "online_rounds": online_counts,
               "alarms": read_jsonl(out / "alarms.jsonl"), "stopped_at": stopped_at,
               "reference_examples_computed": reference.computed if reference else 0,
               "data": [r.summary() for r in reports], "wall_s": round(time.perf_counter() - t_start, 2)}
    if accelerator.is_main_process:
        write_atomically(lambda tmp: save_merged(unwrapped, tokenizer, tmp), out / "final")
        common.write_json(out / "summary.json", summary)
        console.print(f"final model: {out / 'final'}  " + "  ".join(
            f"{k} {v:.4g}" for k, v in last_eval.items() if isinstance(v, float)))
    accelerator.wait_for_everyone()
    return summary

