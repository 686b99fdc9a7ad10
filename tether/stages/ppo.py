"""`tether ppo`: the actor, the critic, a frozen reward and a frozen reference (ALGORITHMS §4).

A step: sample responses (generate), score them (score), compute old/reference log-probs and values
(logprobs), build per-token KL-shaped rewards and GAE advantages, then `ppo_epochs` passes of clipped
policy and value updates over minibatches (update). Single process for now.

Rewards: a `tether rm` reward model (with its saved normalisation), Python functions (`--reward module:fn`,
tether/rewards/functions.py), or both, summed with their weights. The critic is a separate model or a
value head on the policy's backbone (critic_layout).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from tether.algorithms.kl import kl_estimate, kl_k2
from tether.algorithms.ppo import (adaptive_kl_coef, clipped_policy_loss, clipped_value_loss, explained_variance,
                                   gae_advantages, masked_whiten, shape_token_rewards)
from tether.algorithms.reductions import token_mean
from tether.config import ConfigError, config_to_dict
from tether.data.records import DataError, read_records
from tether.models import apply_lora, load_model, load_tokenizer, save_merged
from tether.reward_model import RewardScorer
from tether.rewards import RewardSet
from tether.rewards.functions import load_reward_set
from tether.rollout import Rollout, generate_rollout, response_logprobs, response_logprobs_and_values, stop_token_ids
from tether.monitors import RunMonitor, read_jsonl
from tether.stages.common import announce, open_online_run, write_json
from tether.stages.ppo_config import PPOConfig
from tether.train.checkpoint import list_checkpoints, rng_state, set_rng_state, write_atomically
from tether.train.logger import MetricsLogger, console
from tether.train.offline import EpochOrder
from tether.value_model import SharedValueHead, load_value_model


def render_prompts(tokenizer, rows: list[dict], where: str) -> list[str]:
    out = []
    for i, row in enumerate(rows):
        prompt = row.get("prompt")
        if isinstance(prompt, list):
            out.append(tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True))
        elif isinstance(prompt, str):
            out.append(prompt)
        else:
            raise DataError(f"{where} row {i + 1}: 'prompt' must be a string or a list of chat messages")
    return out


def rows_of(rollout: Rollout, idx: torch.Tensor) -> Rollout:
    pick = idx.tolist()
    return Rollout(rollout.prompt_ids[idx], rollout.prompt_mask[idx], rollout.response_ids[idx], rollout.response_mask[idx],
                   rollout.truncated[idx], [rollout.prompts[i] for i in pick], [rollout.responses[i] for i in pick])


@dataclass
class Experience:
    rollout: Rollout
    scores: torch.Tensor  # (B,) sequence rewards after truncation penalty and clipping
    old_logprobs: torch.Tensor  # (B, T) under the sampling policy, at the sampling temperature
    ref_logprobs: torch.Tensor  # (B, T) under the reference
    values: torch.Tensor  # (B, T) critic values at rollout time
    kl: torch.Tensor  # (B, T) per-token KL estimate (policy vs reference), 0 on padding
    advantages: torch.Tensor  # (B, T)
    returns: torch.Tensor  # (B, T)


def completion_ids(rollout: Rollout) -> list[list[int]]:
    return [ids[mask.bool()].tolist() for ids, mask in zip(rollout.response_ids, rollout.response_mask)]


def score_rollout(rollout: Rollout, rows: list[dict], rewards: RewardSet | None, rm_scorer, tokenizer,
                  cfg) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(scores (B,) after the truncation penalty and clipping, {component: raw scores (B,)}).

    score = reward_model_weight · RM(prompt + response + EOS) + Σ_i w_i · f_i(...); the reward model sees EOS
    only where the response ended with one, so a truncated answer is scored as the unfinished text it is.
    """
    parts: dict[str, torch.Tensor] = {}
    total = torch.zeros(len(rollout.responses))
    if rm_scorer is not None:
        eos = tokenizer.eos_token or ""
        texts = [p + r + ("" if t else eos) for p, r, t in zip(rollout.prompts, rollout.responses, rollout.truncated.tolist())]
        parts["reward_model"] = torch.tensor(rm_scorer(texts), dtype=torch.float32)
        total = total + cfg.roles.reward_model_weight * parts["reward_model"]
    if rewards is not None:
        values = rewards.score(rows, rollout.responses, completion_ids(rollout), rollout.truncated.tolist())
        parts.update({name: torch.tensor(v, dtype=torch.float32) for name, v in values.items() if not isinstance(v[0], list)})
        total = total + rewards.total(values)
    scores = total
    if cfg.rollout.penalize_truncated:
        scores = torch.where(rollout.truncated, torch.full_like(scores, cfg.rollout.truncation_penalty), scores)
    if cfg.rollout.reward_clip > 0:
        scores = scores.clamp(-cfg.rollout.reward_clip, cfg.rollout.reward_clip)
    return scores, parts


def reference_logprobs(reference, policy, rollout, temperature: float) -> torch.Tensor:
    """Reference log-probs: from the frozen copy, or (LoRA, reference None) from the policy with its adapter off."""
    if reference is not None:
        return response_logprobs(reference, rollout, temperature)
    with policy.disable_adapter():
        return response_logprobs(policy, rollout, temperature)


@torch.no_grad()
def make_experience(rollout, scores, policy, reference, critic, cfg, kl_coef: float) -> Experience:
    p = cfg.ppo
    if isinstance(critic, SharedValueHead):  # one forward gives the old log-probs and the values
        old, _, values = response_logprobs_and_values(policy, critic.head, rollout, cfg.rollout.temperature)
    else:
        old = response_logprobs(policy, rollout, cfg.rollout.temperature)
        values = critic(rollout)
    ref = reference_logprobs(reference, policy, rollout, cfg.rollout.temperature)
    mask = rollout.response_mask
    kl = kl_estimate(old, ref, p.kl_estimator) * mask
    token_rewards = shape_token_rewards(scores, kl, mask, kl_coef)
    advantages, returns = gae_advantages(token_rewards, values, mask, p.gamma, p.lam)
    if p.whiten_advantages:
        advantages = masked_whiten(advantages, mask)
    return Experience(rollout, scores, old, ref, values, kl, advantages, returns)


def ppo_update(exp: Experience, policy, critic, opt_pi, opt_v, cfg, generator: torch.Generator) -> dict:
    # generator: minibatch order, seeded per step by the caller so a resumed run shuffles identically
    """ppo_epochs passes of minibatch updates; returns token-weighted means of the update statistics."""
    p = cfg.ppo
    n = exp.scores.shape[0]
    sums: dict[str, float] = {}
    tokens = 0.0
    stopped_early = 0.0
    for _ in range(p.ppo_epochs):
        order = torch.randperm(n, generator=generator)
        for start in range(0, n, p.minibatch):
            idx = order[start : start + p.minibatch]
            sub = rows_of(exp.rollout, idx)
            mask = sub.response_mask
            if isinstance(critic, SharedValueHead):
                logp, entropy, values = response_logprobs_and_values(policy, critic.head, sub, cfg.rollout.temperature)
            else:
                logp, entropy = response_logprobs(policy, sub, cfg.rollout.temperature, with_entropy=True)
                values = critic(sub)
            pl, clipped = clipped_policy_loss(logp, exp.old_logprobs[idx], exp.advantages[idx], mask, p.clip_low,
                                              p.clip_high, p.dual_clip or None)
            loss_pi = token_mean(pl, mask) - p.entropy_coef * token_mean(entropy, mask)
            vl, vclipped = clipped_value_loss(values, exp.values[idx], exp.returns[idx], mask, p.value_clip)
            loss_v = token_mean(vl, mask)
            opt_pi.zero_grad(set_to_none=True)
            opt_v.zero_grad(set_to_none=True)
            # separate layout: each loss reaches only its own model; shared: both reach the backbone
            (loss_pi + p.value_loss_coef * loss_v).backward()
            norm = p.max_grad_norm if p.max_grad_norm > 0 else float("inf")
            gn_pi = torch.nn.utils.clip_grad_norm_([q for q in policy.parameters() if q.requires_grad], norm)
            gn_v = torch.nn.utils.clip_grad_norm_([q for q in critic.parameters() if q.requires_grad], norm)
            opt_pi.step()
            opt_v.step()
            k = float(mask.sum())
            tokens += k
            approx_kl = token_mean(kl_k2(logp.detach(), exp.old_logprobs[idx]), mask)  # ½ (logp − old_logp)²
            for name, value in (("policy/loss", loss_pi), ("policy/clip_frac", token_mean(clipped.float(), mask)),
                                ("policy/approx_kl", approx_kl), ("policy/entropy", token_mean(entropy.detach(), mask)),
                                ("value/loss", loss_v), ("value/clip_frac", token_mean(vclipped.float(), mask)),
                                ("policy/grad_norm", gn_pi), ("value/grad_norm", gn_v)):
                sums[name] = sums.get(name, 0.0) + float(torch.as_tensor(value).detach()) * k
        if p.target_approx_kl and sums["policy/approx_kl"] / tokens > p.target_approx_kl:
            stopped_early = 1.0
            break
    out = {k: v / max(tokens, 1.0) for k, v in sums.items()}
    out["policy/early_stopped"] = stopped_early
    return out


def _stats(area: str, x: torch.Tensor) -> dict:
    return {f"{area}/mean": float(x.mean()), f"{area}/std": float(x.std(unbiased=False)),
            f"{area}/min": float(x.min()), f"{area}/max": float(x.max())}


def step_metrics(exp: Experience, kl_coef: float) -> dict:
    mask = exp.rollout.response_mask.bool()
    return {"score/mean": float(exp.scores.mean()), "score/std": float(exp.scores.std(unbiased=False)),
            "kl/ref_mean": float(exp.kl.sum(-1).mean()), "kl/coef": kl_coef,
            "value/explained_variance": explained_variance(exp.values, exp.returns, exp.rollout.response_mask),
            "rollout/length_mean": float(exp.rollout.lengths.float().mean()),
            "rollout/truncated_frac": float(exp.rollout.truncated.float().mean()),
            **_stats("advantage", exp.advantages[mask]), **_stats("return", exp.returns[mask])}


def _save(folder: Path, policy, critic, tokenizer, opt_pi, opt_v, step: int, trainer_state: dict, keep: int) -> None:
    def save(tmp: Path) -> None:
        policy.save_pretrained(str(tmp / "policy"))
        tokenizer.save_pretrained(str(tmp / "policy"))
        critic.save_pretrained(str(tmp / "critic"))
        torch.save({"opt_pi": opt_pi.state_dict(), "opt_v": opt_v.state_dict(), "rng": rng_state()}, tmp / "state.pt")
        (tmp / "trainer_state.json").write_text(json.dumps({"step": step, **trainer_state}))

    write_atomically(save, folder / f"checkpoint-{step}")
    if keep > 0:
        import shutil

        for _, old in list_checkpoints(folder)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)


def check_lora_reference(r) -> None:
    if r.lora_r > 0 and not r.reference and (Path(r.policy) / "adapter_config.json").is_file():
        raise ConfigError(f"--policy {r.policy} is a LoRA adapter folder: with --lora-r the reference would be the policy "
                          "with adapters disabled, i.e. the adapter's base model, not your SFT model. Merge the adapter "
                          "first (tether writes merged final/ folders) or pass --reference")


def load_policy_and_reference(r, tokenizer, checkpoint: Path | None, with_reference: bool = True):
    """(policy, reference). With LoRA and no --reference, reference is None: the adapter-disabled policy.
    with_reference False (no KL term anywhere) loads no reference at all.

    That shortcut is only right when disabling the adapter gives the SFT model. A --policy folder that is itself
    a LoRA adapter (adapter_config.json) would fall back to its *base* model, so it is refused.
    """
    if r.lora_r <= 0:
        policy = load_model(checkpoint or r.policy, tokenizer, r.dtype)
        reference = load_model(r.reference or r.policy, tokenizer, r.dtype) if with_reference else None
        return policy, reference
    check_lora_reference(r)
    base = load_model(r.policy, tokenizer, r.dtype)
    if checkpoint is not None:
        from peft import PeftModel

        policy = PeftModel.from_pretrained(base, str(checkpoint), is_trainable=True)
    else:
        policy = apply_lora(base, r.lora_r, r.lora_alpha, r.lora_dropout, list(r.lora_target_modules))
    reference = load_model(r.reference, tokenizer, r.dtype) if (r.reference and with_reference) else None
    return policy, reference


def run_ppo(cfg: PPOConfig, scorer=None, evaluate_fn=None) -> dict:
    """Train; ``scorer(texts) -> list[float]`` overrides --reward-model; ``evaluate_fn(policy, tokenizer) -> dict``
    adds task metrics (on the lab: gold reward and win rate) to the periodic evaluation."""
    t_start = time.perf_counter()
    r, ro, p, run = cfg.roles, cfg.rollout, cfg.ppo, cfg.run
    check_lora_reference(r)  # before anything is written
    out, found, device = open_online_run("ppo", run.output, run.resume, run.overwrite, p.steps, r.device, run.seed,
                                         {"--policy": r.policy, "--prompts": ro.prompts, "--output": run.output},
                                         scorer is not None or bool(r.reward_model or r.reward))
    tokenizer = load_tokenizer(r.policy)
    policy, reference = load_policy_and_reference(r, tokenizer, found[1] / "policy" if found else None)
    policy.to(device)
    if reference is not None:
        reference.to(device).eval()
        for q in reference.parameters():
            q.requires_grad_(False)
    if r.critic_layout == "shared":
        critic = SharedValueHead.load(policy, found[1] / "critic" if found else None).to(device)
    else:
        critic_source = found[1] / "critic" if found else (r.critic or r.reward_model or r.policy)
        critic = load_value_model(critic_source, tokenizer, r.dtype).to(device)
    if scorer is None and r.reward_model:
        weights = dict((kv.split("=")[0], float(kv.split("=")[1])) for kv in r.reward_weights.split(",") if kv) or None
        scorer = RewardScorer(r.reward_model, weights, r.normalize_reward, device)
    prompt_rows = [rec.fields for rec in read_records(ro.prompts)]
    eval_rows = [x.fields for x in read_records(ro.eval_prompts)] if ro.eval_prompts else []
    rewards = load_reward_set(r, prompt_rows)  # checked before any training
    opt_pi = torch.optim.AdamW([q for q in policy.parameters() if q.requires_grad], lr=p.policy_lr)
    opt_v = torch.optim.AdamW([q for q in critic.parameters() if q.requires_grad], lr=p.critic_lr)
    start_step, kl_coef = 0, p.kl_coef
    best = {"value": None, "step": None}
    history: list[dict] = []  # every evaluation, restored on resume
    if found:
        state = torch.load(found[1] / "state.pt", weights_only=False)
        opt_pi.load_state_dict(state["opt_pi"])
        opt_v.load_state_dict(state["opt_v"])
        set_rng_state(state["rng"])
        saved = json.loads((found[1] / "trainer_state.json").read_text())
        start_step, kl_coef = saved["step"], saved["kl_coef"]
        best.update(saved.get("best", {}))
        history.extend(h for h in saved.get("eval_history", []) if h["step"] <= start_step)
        for c in rewards.components if rewards else []:
            c.errors = saved.get("reward_errors", {}).get(c.name, 0)
    if run.best_metric and not eval_rows:
        raise ConfigError("--best-metric needs --eval-prompts: best/ is chosen at the periodic evaluations")
    prompts = render_prompts(tokenizer, prompt_rows, ro.prompts)
    eval_prompts = render_prompts(tokenizer, eval_rows, ro.eval_prompts) if eval_rows else []
    stops = stop_token_ids(tokenizer, policy)
    config = config_to_dict(cfg)
    updates = p.ppo_epochs * -(-ro.prompts_per_step // p.minibatch)
    plan = {"prompts (train / eval)": f"{len(prompts)} / {len(eval_prompts)}",
            "responses per step": ro.prompts_per_step, "minibatches x passes": f"{-(-ro.prompts_per_step // p.minibatch)} x {p.ppo_epochs}",
            "optimizer updates per step": updates, "steps": p.steps, "start step": start_step,
            "critic": "value head on the policy backbone" if r.critic_layout == "shared" else f"separate ({r.critic or r.reward_model or r.policy})",
            "reference": "frozen copy" if reference is not None else "policy with the LoRA adapter disabled",
            "reward": " + ".join(([f"{r.reward_model_weight:g} x reward model"] if scorer is not None else [])
                                 + [f"{c.weight:g} x {c.name}" for c in (rewards.components if rewards else [])]),
            "memory estimate (weights + AdamW)": _memory_estimate(policy, reference, critic)}
    announce("tether ppo", plan, config, out)
    logger = MetricsLogger(out, run.report_to, config, start_step, p.steps, log_every=run.log_every, run_name="ppo")
    order = EpochOrder(len(prompts), run.seed)

    def evaluate(step: int) -> dict:
        if not eval_prompts:
            return {}
        torch_state = torch.get_rng_state()
        torch.manual_seed(run.seed + 12345)  # the same sampling noise at every evaluation
        rollout = generate_rollout(policy, tokenizer, eval_prompts, ro.max_new_tokens, ro.temperature, ro.top_p, ro.top_k, stops)
        torch.set_rng_state(torch_state)
        scores, parts = score_rollout(rollout, eval_rows, rewards, scorer, tokenizer, cfg)
        res = {"eval/score_mean": float(scores.mean()), "eval/length_mean": float(rollout.lengths.float().mean()),
               **{f"eval/reward/{name}": float(v.mean()) for name, v in parts.items() if len(parts) > 1}}
        if evaluate_fn is not None:
            res.update({f"eval/{k}": v for k, v in evaluate_fn(policy, tokenizer).items()})
        history.append({"step": step, **res})
        if run.best_metric and _improves(res, run.best_metric, run.best_mode, best["value"]):
            best.update(value=res[run.best_metric], step=step)  # step 0: nothing trained has beaten the start yet
            def save_best(tmp: Path) -> None:
                save_merged(policy, tokenizer, tmp)
                (tmp / "best.json").write_text(json.dumps({"metric": run.best_metric, **best}))

            write_atomically(save_best, out / "best")
        return res

    baseline = evaluate(0) if start_step == 0 else {}
    monitor, stopped_at = RunMonitor(out, run.stop_on_alarm), None
    try:
        for step in range(start_step, p.steps):
            t0 = time.perf_counter()
            rows = order.batch(step, ro.prompts_per_step)
            rollout = generate_rollout(policy, tokenizer, [prompts[i] for i in rows], ro.max_new_tokens,
                                       ro.temperature, ro.top_p, ro.top_k, stops)
            t1 = time.perf_counter()
            scores, parts = score_rollout(rollout, [prompt_rows[i] for i in rows], rewards, scorer, tokenizer, cfg)
            t2 = time.perf_counter()
            exp = make_experience(rollout, scores, policy, reference, critic, cfg, kl_coef)
            t3 = time.perf_counter()
            generator = torch.Generator().manual_seed(run.seed * 7919 + step)  # a function of the step alone
            update_stats = ppo_update(exp, policy, critic, opt_pi, opt_v, cfg, generator)
            t4 = time.perf_counter()
            done = step + 1
            metrics = {"step": done, **step_metrics(exp, kl_coef), **update_stats,
                       "time/generate_s": t1 - t0, "time/score_s": t2 - t1, "time/logprobs_s": t3 - t2,
                       "time/update_s": t4 - t3, "perf/tokens_per_s": float(rollout.lengths.sum()) / (t4 - t0)}
            for name, v in parts.items():
                metrics[f"reward/{name}/mean"], metrics[f"reward/{name}/std"] = float(v.mean()), float(v.std(unbiased=False))
            for c in rewards.components if rewards else []:
                metrics[f"reward/{c.name}/errors"] = c.errors
            if p.adaptive_kl:
                kl_coef = adaptive_kl_coef(kl_coef, metrics["kl/ref_mean"], p.target_kl, p.kl_horizon, len(rows))
            if step == start_step and baseline:
                metrics.update({k.replace("eval/", "eval0/"): v for k, v in baseline.items()})
            if (run.eval_every and done % run.eval_every == 0) or done == p.steps:
                metrics.update(evaluate(done))
            logger.log(metrics)
            if run.sample_every and done % run.sample_every == 0:
                with (out / "samples.jsonl").open("a") as f:
                    for i in range(len(rows)):
                        f.write(json.dumps({"step": done, "prompt": rollout.prompts[i], "response": rollout.responses[i],
                                            "score": float(exp.scores[i]), "kl": float(exp.kl[i].sum()),
                                            "parts": {k: float(v[i]) for k, v in parts.items()},
                                            "length": int(rollout.lengths[i]), "truncated": bool(rollout.truncated[i])}) + "\n")
            stop = monitor.check()  # reward-hacking alarms on everything written so far
            if (run.save_every and done % run.save_every == 0) or done == p.steps or stop:
                state = {"kl_coef": kl_coef, "best": best, "eval_history": history,
                         "reward_errors": {c.name: c.errors for c in (rewards.components if rewards else [])}}
                _save(out, policy, critic, tokenizer, opt_pi, opt_v, done, state, run.keep_checkpoints)
            if stop:
                console.print(f"[bold red]stopping at step {done}: --stop-on-alarm[/]")
                stopped_at = done
                break
    finally:
        logger.close()
    write_atomically(lambda tmp: save_merged(policy, tokenizer, tmp), out / "final")  # LoRA merged into the weights
    summary = {"stage": "ppo", "steps": p.steps, "resumed_from": start_step or None, "final_kl_coef": kl_coef,
               "alarms": read_jsonl(out / "alarms.jsonl"), "stopped_at": stopped_at,
               "eval_history": history, "wall_s": round(time.perf_counter() - t_start, 2)}
    if run.best_metric:
        summary["best"] = {"metric": run.best_metric, **best}
    write_json(out / "summary.json", summary)
    return summary


def _improves(figures: dict, metric: str, mode: str, best) -> bool:
    if metric not in figures:
        raise ConfigError(f"--best-metric {metric}: the evaluation reports {sorted(figures)}")
    value = figures[metric]
    return best is None or (value > best if mode == "max" else value < best)


def _memory_estimate(policy, reference, critic) -> str:
    def mb(model, trainable_copies: int) -> float:
        n = sum(q.numel() * q.element_size() for q in model.parameters())
        return n * (1 + trainable_copies) / 2**20
    # trained models: weights + gradients + two AdamW moments; frozen: weights only (activations not included)
    total = mb(policy, 3) + mb(critic, 3) + (mb(reference, 0) if reference is not None else 0.0)
    return f"{total:.1f} MiB before activations"
