"""`tether grpo`: critic-free policy optimisation with group baselines (ALGORITHMS §5), one trainer for the family.

A step: draw prompts_per_step prompts, sample group_size responses each (generate), score them with the
reward functions and/or a reward model (score), keep or re-sample groups (dynamic sampling), compute old and
reference log-probs when they are needed (logprobs), then inner_iterations passes of clipped-surrogate updates
(update). Which advantage, ratio, clip and aggregation are used is the recipe's choice (stages/grpo_config.py),
each a pure function in tether/algorithms/group.py.
"""
from __future__ import annotations

import json
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from tether.algorithms.group import (aggregate, clipped_surrogate, group_advantages, gspo_ratio, overlong_penalty,
                                     process_advantages, reinforce_pp_advantages, rloo_advantages, token_ratio,
                                     zero_variance_groups)
from tether.algorithms.kl import kl_estimate
from tether.config import ConfigError, config_to_dict
from tether.data.records import read_records
from tether.models import load_tokenizer, save_merged
from tether.reward_model import RewardScorer
from tether.rewards import RewardSet
from tether.rewards.functions import load_reward_set
from tether.rollout import (Rollout, concat_rollouts, generate_rollout, response_logprobs, step_end_tokens,
                            stop_token_ids)
from tether.monitors import RunMonitor, read_jsonl
from tether.stages.common import announce, open_online_run, write_json
from tether.stages.grpo_config import RECIPES, GRPOConfig
from tether.stages.ppo import (_improves, check_lora_reference, completion_ids, load_policy_and_reference,
                               reference_logprobs, render_prompts, rows_of)
from tether.train.checkpoint import list_checkpoints, rng_state, set_rng_state, write_atomically
from tether.train.logger import MetricsLogger, console
from tether.train.offline import EpochOrder


@dataclass
class Batch:
    """The groups one step trains on. B = groups × G rows, prompt-major."""

    rollout: Rollout
    rows: list[dict]  # (B,) the prompt file's row of each response
    scores: torch.Tensor  # (B,) total outcome score (weighted components + overlong shaping)
    parts: dict[str, torch.Tensor]  # component → (B,) raw outcome scores
    steps: list[list[float]] | None  # (B,) step scores of the process reward, if there is one
    has_outcome: bool  # some component other than the process reward scores whole responses
    groups_sampled: int
    groups_zero_variance: int
    rounds: int


def needs_reference(a) -> bool:
    return a.kl_coef > 0 or (a.advantage == "reinforce_pp" and a.kl_in_reward > 0)


class Scorer:
    """Reward functions + reward model + overlong shaping → outcome scores, components and process step scores."""

    def __init__(self, cfg, tokenizer, rewards: RewardSet | None, rm_scorer):
        self.cfg, self.tokenizer, self.rewards, self.rm = cfg, tokenizer, rewards, rm_scorer
        cache = cfg.algo.overlong_cache
        self.overlong_cache = cfg.rollout.max_new_tokens // 4 if cache < 0 else cache
        self.has_outcome = True  # until a process reward shows up without any outcome component beside it

    def __call__(self, rollout: Rollout, rows: list[dict]):
        parts: dict[str, torch.Tensor] = {}
        steps = None
        total = torch.zeros(len(rollout.responses))
        if self.rm is not None:
            eos = self.tokenizer.eos_token or ""
            texts = [p + r + ("" if t else eos) for p, r, t in zip(rollout.prompts, rollout.responses, rollout.truncated.tolist())]
            parts["reward_model"] = torch.tensor(self.rm(texts), dtype=torch.float32)
            total += self.cfg.rewards.reward_model_weight * parts["reward_model"]
        if self.rewards is not None:
            values = self.rewards.score(rows, rollout.responses, completion_ids(rollout), rollout.truncated.tolist())
            for c in self.rewards.components:
                v = values[c.name]
                if v and isinstance(v[0], list):
                    if steps is not None:
                        raise ConfigError("more than one process reward (functions returning step scores); combine them into one")
                    steps = [[c.weight * x for x in row] for row in v]
                    parts[c.name] = torch.tensor([sum(row) for row in v], dtype=torch.float32)  # logged as the step sum
                else:
                    parts[c.name] = torch.tensor(v, dtype=torch.float32)
                    total += c.weight * parts[c.name]
        if self.overlong_cache:
            parts["overlong"] = overlong_penalty(rollout.lengths, self.cfg.rollout.max_new_tokens, self.overlong_cache)
            total += parts["overlong"]
        if steps is not None:
            self.has_outcome = len(parts) > 1
        return total, parts, steps


def process_token_advantages(batch: Batch, tokenizer, pattern: str, group_size: int) -> torch.Tensor:
    """Step scores → token advantages (ALGORITHMS §5, process supervision): step k ends where the k-th match of
    `pattern` in the response text ends; extra scores beyond the matches end at the last token."""
    regex = re.compile(pattern)
    ids = completion_ids(batch.rollout)
    ends = []
    for text, token_ids, scores in zip(batch.rollout.responses, ids, batch.steps):
        char_ends = [m.end() for m in regex.finditer(text)][: len(scores)]
        char_ends += [len(text)] * (len(scores) - len(char_ends))
        ends.append(step_end_tokens(tokenizer, token_ids, char_ends))
    n = len(ids) // group_size
    length = batch.rollout.response_ids.shape[1]
    grouped = lambda xs: [xs[i * group_size : (i + 1) * group_size] for i in range(n)]
    return process_advantages(grouped(batch.steps), grouped(ends), length)


def token_advantages(batch: Batch, a, group_size: int, kl: torch.Tensor | None, tokenizer, step_pattern: str) -> torch.Tensor:
    """(B, T) advantages for the recipe's advantage estimator (0 on padding)."""
    mask = batch.rollout.response_mask.float()
    grouped = batch.scores.view(-1, group_size)
    if a.advantage == "reinforce_pp":
        return reinforce_pp_advantages(batch.scores, kl if kl is not None else torch.zeros_like(mask), mask,
                                       a.kl_in_reward, a.gamma)
    if a.advantage == "rloo":
        seq = rloo_advantages(grouped)
    else:
        seq = group_advantages(grouped, scale_by_std=a.advantage == "group", eps=a.std_eps)
    adv = seq.reshape(-1, 1) * mask
    if batch.steps is not None:  # process reward: its token advantages, plus the outcome part when there is one
        process = process_token_advantages(batch, tokenizer, step_pattern, group_size) * mask
        adv = adv + process if batch.has_outcome else process
    return adv


def run_grpo(cfg: GRPOConfig, scorer=None, evaluate_fn=None) -> dict:
    """Train. ``scorer(texts) -> list[float]`` stands in for --reward-model; ``evaluate_fn(policy, tokenizer) ->
    dict`` adds task metrics (on the lab: held-out accuracy) to every evaluation."""
    t_start = time.perf_counter()
    m, rw, ro, a, run = cfg.model, cfg.rewards, cfg.rollout, cfg.algo, cfg.run
    check_lora_reference(m)  # before anything is written
    out, found, device = open_online_run("grpo", run.output, run.resume, run.overwrite, run.steps, m.device, run.seed,
                                         {"--policy": m.policy, "--prompts": ro.prompts, "--output": run.output},
                                         scorer is not None or bool(rw.reward_model or rw.reward))

    prompt_rows = [rec.fields for rec in read_records(ro.prompts)]
    eval_rows = [x.fields for x in read_records(ro.eval_prompts)] if ro.eval_prompts else []
    if run.best_metric and not eval_rows:
        raise ConfigError("--best-metric needs --eval-prompts: best/ is chosen at the periodic evaluations")
    rewards = load_reward_set(rw, prompt_rows)  # checked before any model is loaded
    tokenizer = load_tokenizer(m.policy)
    policy, reference = load_policy_and_reference(m, tokenizer, found[1] / "policy" if found else None,
                                                  with_reference=needs_reference(a))
    policy.to(device)
    if m.trainable_params:
        if m.lora_r > 0:
            raise ConfigError("--trainable-params selects weights to train; with --lora-r the adapters are what trains")
        chosen = [n for n, q in policy.named_parameters() if q.requires_grad_(bool(re.search(m.trainable_params, n))).requires_grad]
        if not chosen:
            raise ConfigError(f"--trainable-params {m.trainable_params!r} matches no parameter; names look like "
                              f"{[n for n, _ in policy.named_parameters()][:4]}")
    if reference is not None:
        reference.to(device).eval()
        for q in reference.parameters():
            q.requires_grad_(False)
    if scorer is None and rw.reward_model:
        scorer = RewardScorer(rw.reward_model, None, True, device)
    score = Scorer(cfg, tokenizer, rewards, scorer)
    params = [q for q in policy.parameters() if q.requires_grad]
    opt = torch.optim.AdamW(params, lr=a.lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda u: min(1.0, (u + 1) / (a.warmup_steps + 1)) if a.warmup_steps else 1.0)
    state = {"step": 0, "cursor": 0, "best": {"value": None, "step": None}, "eval_history": []}
    if found:
        saved = torch.load(found[1] / "state.pt", weights_only=False)
        opt.load_state_dict(saved["opt"])
        sched.load_state_dict(saved["sched"])
        set_rng_state(saved["rng"])
        state.update(json.loads((found[1] / "trainer_state.json").read_text()))
        for c in rewards.components if rewards else []:
            c.errors = state.get("reward_errors", {}).get(c.name, 0)
    start_step = state["step"]
    history = state["eval_history"]

    prompts = render_prompts(tokenizer, prompt_rows, ro.prompts)
    eval_prompts = render_prompts(tokenizer, eval_rows, ro.eval_prompts) if eval_rows else []
    stops = stop_token_ids(tokenizer, policy)
    g = ro.group_size
    rollout_size = ro.prompts_per_step * g
    minibatch = a.minibatch or rollout_size
    updates_per_pass = -(-rollout_size // minibatch)
    keep_old = a.inner_iterations > 1 or updates_per_pass > 1  # else the ratio is exactly 1: old = current, detached
    norm_length = a.norm_length or ro.max_new_tokens
    recipe = RECIPES[a.recipe]
    overridden = sorted(k for k, v in recipe.settings.items() if getattr(a, k) != v and not (k == "overlong_cache" and v == -1))
    plan = {"recipe": a.recipe + (f" (overridden: {', '.join(overridden)})" if overridden else ""),
            "prompts (train / eval)": f"{len(prompts)} / {len(eval_prompts)}",
            "responses per step": f"{ro.prompts_per_step} prompts x {g}",
            "optimizer updates per step": f"{updates_per_pass} x {a.inner_iterations} pass(es)",
            "advantage / ratio / aggregation": f"{a.advantage} / {a.ratio} / {a.aggregation}",
            "KL": (f"{a.kl_estimator} x {a.kl_coef:g} in the loss" if a.kl_coef else "none in the loss")
                  + (f"; {a.kl_in_reward:g} x k1 in the reward" if a.advantage == "reinforce_pp" and a.kl_in_reward else "")
                  + ("" if reference is not None or not needs_reference(a) else " (reference: adapter-disabled policy)"),
            "reward": " + ".join(([f"{rw.reward_model_weight:g} x reward model"] if scorer is not None else [])
                                 + [f"{c.weight:g} x {c.name}" for c in (rewards.components if rewards else [])]
                                 + (["overlong"] if score.overlong_cache else [])),
            "trainable parameters": f"{sum(q.numel() for q in params):,} of {sum(q.numel() for q in policy.parameters()):,}",
            "steps": run.steps, "start step": start_step}
    config = config_to_dict(cfg)
    announce("tether grpo", plan, config, out)
    logger = MetricsLogger(out, run.report_to, config, start_step, run.steps, log_every=run.log_every, run_name="grpo")
    order = EpochOrder(len(prompts), run.seed)

    def sample(indices: list[int], n_per_prompt: int, source_rows: list[dict], source_texts: list[str]):
        rows = [source_rows[i] for i in indices for _ in range(n_per_prompt)]
        texts = [source_texts[i] for i in indices for _ in range(n_per_prompt)]
        return generate_rollout(policy, tokenizer, texts, ro.max_new_tokens, ro.temperature, ro.top_p, ro.top_k, stops), rows

    def collect() -> Batch:
        parts_r, rows_r, scores_r, comps_r, steps_r = [], [], [], [], []
        needed, rounds, sampled, zero = ro.prompts_per_step, 0, 0, 0
        max_rounds = a.max_sampling_rounds if a.dynamic_sampling else 1
        while needed > 0 and rounds < max_rounds:
            indices = order.slice(state["cursor"], needed)
            state["cursor"] += needed
            rollout, rows = sample(indices, g, prompt_rows, prompts)
            scores, comps, steps = score(rollout, rows)
            flat = scores if steps is None else scores + torch.tensor([sum(s) for s in steps])
            zv = zero_variance_groups(flat.view(-1, g))
            sampled, zero, rounds = sampled + len(indices), zero + int(zv.sum()), rounds + 1
            keep = torch.arange(len(indices)) if not a.dynamic_sampling else (~zv).nonzero().flatten()
            keep = keep[:needed]
            if len(keep) == 0:
                continue
            idx = (keep[:, None] * g + torch.arange(g)).flatten()
            parts_r.append(rows_of(rollout, idx))
            rows_r += [rows[i] for i in idx.tolist()]
            scores_r.append(scores[idx])
            comps_r.append({k: v[idx] for k, v in comps.items()})
            if steps is not None:
                steps_r += [steps[i] for i in idx.tolist()]
            needed -= len(keep)
        if not parts_r:
            return Batch(None, [], torch.zeros(0), {}, None, True, sampled, zero, rounds)
        comps = {k: torch.cat([c[k] for c in comps_r]) for k in comps_r[0]}
        return Batch(concat_rollouts(parts_r, tokenizer.pad_token_id), rows_r, torch.cat(scores_r), comps,
                     steps_r or None, score.has_outcome, sampled, zero, rounds)

    def evaluate(step: int) -> dict:
        if not eval_prompts:
            return {}
        torch_state = torch.get_rng_state()
        torch.manual_seed(run.seed + 12345)  # the same sampling noise at every evaluation
        rollout, rows = sample(list(range(len(eval_prompts))), 1, eval_rows, eval_prompts)
        torch.set_rng_state(torch_state)
        scores, comps, _ = score(rollout, rows)
        res = {"eval/score_mean": float(scores.mean()), "eval/length_mean": float(rollout.lengths.float().mean()),
               **{f"eval/reward/{k}": float(v.mean()) for k, v in comps.items()}}
        if evaluate_fn is not None:
            res.update({f"eval/{k}": v for k, v in evaluate_fn(policy, tokenizer).items()})
        history.append({"step": step, **res})
        if run.best_metric and _improves(res, run.best_metric, run.best_mode, state["best"]["value"]):
            state["best"] = {"value": res[run.best_metric], "step": step}

            def save_best(tmp: Path) -> None:
                save_merged(policy, tokenizer, tmp)
                (tmp / "best.json").write_text(json.dumps({"metric": run.best_metric, **state["best"]}))

            write_atomically(save_best, out / "best")
        return res

    baseline = evaluate(0) if start_step == 0 else {}
    low_variance_warned = 0
    monitor, stopped_at = RunMonitor(out, run.stop_on_alarm), None
    try:
        for step in range(start_step, run.steps):
            t0 = time.perf_counter()
            batch = collect()
            t1 = time.perf_counter()
            metrics = {"step": step + 1, **_batch_metrics(batch, g)}
            if batch.rollout is None:
                console.print(f"[yellow]step {step + 1}: every sampled group had equal scores after "
                              f"{batch.rounds} rounds; no update[/]")
                stats, t2, t3 = {}, t1, t1
            else:
                rollout = batch.rollout
                mask = rollout.response_mask.float()
                loss_mask = mask * (~rollout.truncated).float()[:, None] if a.mask_truncated else mask
                with torch.no_grad():
                    old = response_logprobs(policy, rollout, ro.temperature) if keep_old else None
                    ref = reference_logprobs(reference, policy, rollout, ro.temperature) if needs_reference(a) else None
                kl_reward = None
                if a.advantage == "reinforce_pp" and a.kl_in_reward > 0:
                    base = old if old is not None else response_logprobs(policy, rollout, ro.temperature).detach()
                    kl_reward = kl_estimate(base, ref, a.kl_estimator) * mask
                advantages = token_advantages(batch, a, g, kl_reward, tokenizer, rw.step_pattern)
                t2 = time.perf_counter()
                generator = torch.Generator().manual_seed(run.seed * 7919 + step)
                stats = _update(policy, opt, sched, params, rollout, advantages, loss_mask, old, ref, cfg, minibatch,
                                norm_length, generator)
                t3 = time.perf_counter()
                metrics.update({**stats, **_stats("advantage", advantages[mask.bool()])})
                metrics["lr"] = sched.get_last_lr()[0]
            metrics.update({"time/generate_score_s": t1 - t0, "time/logprobs_s": t2 - t1, "time/update_s": t3 - t2,
                            "perf/tokens_per_s": float(batch.rollout.lengths.sum()) / (t3 - t0) if batch.rollout is not None else 0.0})
            for c in rewards.components if rewards else []:
                metrics[f"reward/{c.name}/errors"] = c.errors
            if metrics["groups/zero_variance_frac"] > 0.5 and not a.dynamic_sampling and step >= low_variance_warned:
                console.print(f"[yellow]step {step + 1}: {metrics['groups/zero_variance_frac']:.0%} of groups scored all "
                              "their responses equally; their advantages are 0, so the loss and the update are mostly "
                              "0. Raise group_size or temperature, use a finer reward, or --dynamic-sampling.[/]")
                low_variance_warned = step + 10  # at most one warning per 10 steps
            done = step + 1
            if step == start_step and baseline:
                metrics.update({k.replace("eval/", "eval0/"): v for k, v in baseline.items()})
            if (run.eval_every and done % run.eval_every == 0) or done == run.steps:
                metrics.update(evaluate(done))
            logger.log(metrics)
            if run.sample_every and done % run.sample_every == 0 and batch.rollout is not None:
                seq_adv = (advantages * mask).sum(-1) / mask.sum(-1).clamp(min=1)
                with (out / "samples.jsonl").open("a") as f:
                    for i in range(len(batch.rows)):
                        f.write(json.dumps({"step": done, "group": i // g, "prompt": batch.rollout.prompts[i],
                                            "response": batch.rollout.responses[i], "score": float(batch.scores[i]),
                                            "parts": {k: float(v[i]) for k, v in batch.parts.items()},
                                            "steps": batch.steps[i] if batch.steps else None,
                                            "advantage": float(seq_adv[i]), "length": int(batch.rollout.lengths[i]),
                                            "truncated": bool(batch.rollout.truncated[i])}) + "\n")
            state["step"] = done
            stop = monitor.check()  # reward-hacking alarms on everything written so far
            if (run.save_every and done % run.save_every == 0) or done == run.steps or stop:
                state["reward_errors"] = {c.name: c.errors for c in (rewards.components if rewards else [])}
                _save(out, policy, tokenizer, opt, sched, state, run.keep_checkpoints)
            if stop:
                console.print(f"[bold red]stopping at step {done}: --stop-on-alarm[/]")
                stopped_at = done
                break
    finally:
        logger.close()
    write_atomically(lambda tmp: save_merged(policy, tokenizer, tmp), out / "final")
    summary = {"stage": "grpo", "recipe": a.recipe, "steps": run.steps, "resumed_from": start_step or None,
               "alarms": read_jsonl(out / "alarms.jsonl"), "stopped_at": stopped_at,
               "eval_history": history, "wall_s": round(time.perf_counter() - t_start, 2)}
    if run.best_metric:
        summary["best"] = {"metric": run.best_metric, **state["best"]}
    write_json(out / "summary.json", summary)
    return summary


def _update(policy, opt, sched, params, rollout: Rollout, advantages, loss_mask, old, ref, cfg, minibatch: int,
            norm_length: int, generator: torch.Generator) -> dict:
    """inner_iterations passes; each optimizer update's loss uses the update's own token and sequence counts,
    so splitting it into micro-batches changes nothing (tests/test_group_algorithms.py)."""
    a, ro = cfg.algo, cfg.rollout
    n = rollout.response_ids.shape[0]
    sums: dict[str, float] = {}
    tokens_seen = 0.0
    for _ in range(a.inner_iterations):
        order = torch.randperm(n, generator=generator) if minibatch < n else torch.arange(n)
        for start in range(0, n, minibatch):
            idx = order[start : start + minibatch]
            n_tokens, n_seq = float(loss_mask[idx].sum()), len(idx)
            opt.zero_grad(set_to_none=True)
            for mstart in range(0, len(idx), a.micro_batch):
                micro = idx[mstart : mstart + a.micro_batch]
                sub = rows_of(rollout, micro)
                lm = loss_mask[micro]
                logp, entropy = response_logprobs(policy, sub, ro.temperature, with_entropy=True)
                old_lp = old[micro] if old is not None else logp.detach()
                if a.ratio == "token":
                    ratio = token_ratio(logp, old_lp)
                else:
                    ratio = gspo_ratio(logp, old_lp, sub.response_mask, token_level=a.ratio == "sequence_token")
                terms, low, high = clipped_surrogate(ratio, advantages[micro], lm, a.clip_low, a.clip_high)
                kl = kl_estimate(logp, ref[micro], a.kl_estimator) if ref is not None else torch.zeros_like(logp)
                if a.kl_coef > 0:
                    terms = terms + a.kl_coef * kl
                loss = aggregate(terms, lm, a.aggregation, n_tokens, n_seq, norm_length)
                loss.backward()
                k = float(lm.sum())
                tokens_seen += k
                rmask = sub.response_mask.bool()
                for name, value in (("policy/clip_frac_low", low.float().sum() / max(k, 1)),
                                    ("policy/clip_frac_high", high.float().sum() / max(k, 1)),
                                    ("policy/entropy", entropy.detach()[rmask].mean() if rmask.any() else 0.0),
                                    ("policy/ratio_mean", ratio.detach()[rmask].mean() if rmask.any() else 1.0),
                                    ("kl/ref_mean", (kl.detach() * sub.response_mask).sum(-1).mean())):
                    sums[name] = sums.get(name, 0.0) + float(value) * k
                sums["policy/loss"] = sums.get("policy/loss", 0.0) + float(loss.detach()) * n_tokens
            norm = torch.nn.utils.clip_grad_norm_(params, a.max_grad_norm if a.max_grad_norm > 0 else float("inf"))
            opt.step()
            sched.step()
            sums["policy/grad_norm"] = sums.get("policy/grad_norm", 0.0) + float(norm) * n_tokens
    out = {k: v / max(tokens_seen, 1.0) for k, v in sums.items()}
    if ref is None:
        out.pop("kl/ref_mean", None)
    return out


def _stats(area: str, x: torch.Tensor) -> dict:
    if x.numel() == 0:
        return {}
    return {f"{area}/mean": float(x.mean()), f"{area}/std": float(x.std(unbiased=False)),
            f"{area}/min": float(x.min()), f"{area}/max": float(x.max())}


def _batch_metrics(batch: Batch, g: int) -> dict:
    out = {"groups/zero_variance_frac": batch.groups_zero_variance / max(batch.groups_sampled, 1),
           "sampling/rounds": batch.rounds, "sampling/groups_sampled": batch.groups_sampled,
           "sampling/groups_kept": 0 if batch.rollout is None else len(batch.rows) // g}
    if batch.rollout is None:
        return out
    lengths = batch.rollout.lengths.float()
    done = ~batch.rollout.truncated
    out.update({"score/mean": float(batch.scores.mean()), "score/std": float(batch.scores.std(unbiased=False)),
                "rollout/length_mean": float(lengths.mean()),
                "rollout/terminated_length_mean": float(lengths[done].mean()) if done.any() else 0.0,
                "rollout/truncated_frac": float(batch.rollout.truncated.float().mean())})
    for name, v in batch.parts.items():
        out[f"reward/{name}/mean"], out[f"reward/{name}/std"] = float(v.mean()), float(v.std(unbiased=False))
    return out


def _save(folder: Path, policy, tokenizer, opt, sched, state: dict, keep: int) -> None:
    def save(tmp: Path) -> None:
        policy.save_pretrained(str(tmp / "policy"))
        tokenizer.save_pretrained(str(tmp / "policy"))
        torch.save({"opt": opt.state_dict(), "sched": sched.state_dict(), "rng": rng_state()}, tmp / "state.pt")
        (tmp / "trainer_state.json").write_text(json.dumps(state))

    write_atomically(save, folder / f"checkpoint-{state['step']}")
    if keep > 0:
        for _, old in list_checkpoints(folder)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
