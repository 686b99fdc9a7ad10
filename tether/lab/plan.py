"""The lab's plan: which stages run, in which order, with what settings, after which stages.

Each Stage (schedule.py) names its folder, its recipe (the settings it is cached on, beside the recipes of the
stages it ``needs``), the summary table it belongs to and the runner that computes it (runners.py). `lab_plan` is
every stage of the lab in its reading order; `base_plan` the world, the tokenizer and the base model alone.
"""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path

from tether.lab import runners
from tether.lab.schedule import Stage
from tether.lab.settings import LabConfig


def base_plan(out: Path, cfg: LabConfig) -> list[Stage]:
    """world, init and pretrain into ``out``."""
    world_cfg = replace(cfg.world, seed=cfg.seed)
    world_dir = out / "world"
    pretrain = {
        "steps": cfg.pretrain_steps,
        "batch": cfg.pretrain_batch,
        "lr": cfg.pretrain_lr,
        "schedule": cfg.pretrain_lr_schedule,
        "weight_decay": cfg.pretrain_weight_decay,
        "pack": cfg.pack_length,
        "precision": cfg.precision,  # every training stage's, so every later stage's recipe follows through needs
    }
    return [
        Stage(
            "world", {"world": asdict(world_cfg)}, (), None, lambda folder, _: runners.world_stage(folder, world_cfg)
        ),
        Stage(
            "init",
            {"vocab": cfg.vocab_size, "dims": [cfg.hidden, cfg.layers, cfg.heads, cfg.max_positions], "seed": cfg.seed},
            ("world",),
            None,
            lambda folder, _: runners.init_stage(folder, world_dir, cfg),
        ),
        Stage(
            "pretrain",
            pretrain,
            ("init",),
            None,
            lambda folder, resume: runners.train_sft(
                folder,
                resume,
                cfg,
                out / "init",
                world_dir / "pretrain.jsonl",
                steps=cfg.pretrain_steps,
                batch=cfg.pretrain_batch,
                lr=cfg.pretrain_lr,
                packing=True,
                lr_schedule=cfg.pretrain_lr_schedule,
                weight_decay=cfg.pretrain_weight_decay,
            ),
        ),
    ]


def sft_plan(out: Path, cfg: LabConfig) -> list[Stage]:
    """SFT on the world's demonstrations, then the base and the SFT model measured against gold."""
    world_dir = out / "world"
    sft = lambda folder, resume: runners.train_sft(
        folder,
        resume,
        cfg,
        out / "pretrain" / "final",
        world_dir / "sft.jsonl",
        eval_data=world_dir / "sft_eval.jsonl",
        steps=cfg.sft_steps,
        batch=cfg.sft_batch,
        lr=cfg.sft_lr,
    )
    return [
        Stage("sft", {"steps": cfg.sft_steps, "batch": cfg.sft_batch, "lr": cfg.sft_lr}, ("pretrain",), None, sft),
        Stage(
            "eval",
            {"n": cfg.eval_arith, "samples": cfg.assist_samples, "temperature": cfg.sample_temperature},
            ("pretrain", "sft"),
            None,
            lambda folder, _: runners.eval_stage(folder, out, cfg),
        ),
    ]


def reward_model_plan(out: Path, cfg: LabConfig) -> list[Stage]:
    """A reward model on all the annotators' pairs and one on those with cfg.rm_min_agreement of the votes."""
    plan = []
    for name, min_agreement in (("rm", 0.0), ("rm_filtered", cfg.rm_min_agreement)):
        recipe = {"epochs": cfg.rm_epochs, "batch": cfg.rm_batch, "lr": cfg.rm_lr, "min_agreement": min_agreement}
        run = lambda folder, resume, m=min_agreement: runners.rm_stage(folder, resume, out, cfg, m)
        plan.append(Stage(name, recipe, ("sft", "world"), "reward_models", run))
    return plan


def ppo_plan(out: Path, cfg: LabConfig) -> list[Stage]:
    """PPO against the reward model: one run per KL coefficient, and one with the adaptive controller."""
    runs = [(f"ppo_kl{coef:g}", coef, 0.0) for coef in cfg.ppo_kl_coefs]
    if cfg.ppo_adaptive_target > 0:
        runs.append((f"ppo_adaptive{cfg.ppo_adaptive_target:g}", cfg.ppo_adaptive_init, cfg.ppo_adaptive_target))
    plan = []
    for name, coef, target in runs:
        recipe = {
            "reward_model": cfg.ppo_reward_model,
            "kl_coef": coef,
            "adaptive_target": target,
            "horizon": cfg.ppo_kl_horizon if target else None,
            "steps": cfg.ppo_steps,
            "prompts": cfg.ppo_prompts_per_step,
            "lr": cfg.ppo_lr,
            "eval_every": cfg.ppo_eval_every,
            "eval_samples": cfg.ppo_eval_samples,
            "seed": cfg.seed,
        }
        run = lambda folder, resume, c=coef, t=target: runners.ppo_stage(folder, resume, out, cfg, c, t)
        plan.append(Stage(name, recipe, ("sft", cfg.ppo_reward_model), "ppo", run))
    return plan


def grpo_plan(out: Path, cfg: LabConfig) -> list[Stage]:
    """The group recipe on arith, once per reward design (outcome, process)."""
    plan = []
    for rewards in cfg.grpo_rewards:
        recipe = {
            "recipe": cfg.grpo_recipe,
            "rewards": rewards,
            "steps": cfg.grpo_steps,
            "prompts": cfg.grpo_prompts_per_step,
            "group": cfg.grpo_group_size,
            "lr": cfg.grpo_lr,
            "eval_every": cfg.grpo_eval_every,
            "eval_problems": cfg.grpo_eval_problems,
            "eval_samples": cfg.grpo_eval_samples,
            "seed": cfg.seed,
        }
        run = lambda folder, resume, r=rewards: runners.grpo_stage(folder, resume, out, cfg, r)
        plan.append(Stage(f"grpo_{rewards}", recipe, ("sft", "world"), "grpo", run))
    return plan


def dpo_runs(cfg: LabConfig) -> list[tuple[str, str, str, float]]:
    """(stage, loss, pairs, NLL weight) of each DPO run: the losses on the filtered pairs, sigmoid with the chosen
    answers' NLL on them, then sigmoid on all pairs, on pairs sampled once from the SFT model and online."""
    runs = [(f"dpo_{loss}", loss, "filtered", 0.0) for loss in cfg.dpo_losses]
    for wanted, name, data, nll in (
        (cfg.dpo_nll_coef > 0, "dpo_sigmoid_nll", "filtered", cfg.dpo_nll_coef),
        (cfg.dpo_unfiltered, "dpo_sigmoid_unfiltered", "all", 0.0),
        (cfg.dpo_sft_samples, "dpo_sigmoid_sft_samples", "sft_samples", 0.0),
        (cfg.dpo_online, "dpo_sigmoid_online", "online", 0.0),
    ):
        if wanted:
            runs.append((name, "sigmoid", data, nll))
    return runs


def dpo_plan(out: Path, cfg: LabConfig) -> list[Stage]:
    """The DPO runs of dpo_runs; the sampled ones (online, sft_samples) also cached on the online settings."""
    plan = []
    for name, loss, data, nll in dpo_runs(cfg):
        sampled = data in ("online", "sft_samples")
        online = [cfg.dpo_online_rounds, cfg.dpo_online_prompts, cfg.rm_min_agreement, cfg.dpo_online_keep_truncated]
        recipe = {
            "loss": loss,
            "data": data,
            "steps": cfg.dpo_steps,
            "batch": cfg.dpo_batch,
            "lr": cfg.dpo_lr,
            "eval_every": cfg.dpo_eval_every,
            "eval_samples": cfg.dpo_eval_samples,
            "seed": cfg.seed,
            "online": online if sampled else None,
            # only where set, so that the other DPO stages' recipes (and their cached runs) stay as they were
            **({"nll_coef": nll} if nll else {}),
        }
        run = lambda folder, resume, lo=loss, da=data, c=nll: runners.dpo_stage(folder, resume, out, cfg, lo, da, c)
        plan.append(Stage(name, recipe, ("sft", "world", "rm_filtered"), "dpo", run))
    return plan


def agent_plan(out: Path, cfg: LabConfig) -> list[Stage]:
    """The agent edition: its data, the tool-use SFT stages, the calculator run and the two shop runs."""
    data = {
        "calc_sft": cfg.calc_sft_examples,
        "calc_tool_fraction": cfg.calc_tool_fraction,
        "shop_sft": cfg.shop_sft_examples,
        "shop_rl": cfg.shop_rl_prompts,
        "shop_eval": cfg.shop_eval_requests,
        "lazy": cfg.shop_lazy_fraction,
        "check": cfg.shop_check_fraction,
        "careless": cfg.shop_careless_fraction,
    }
    world = lambda folder, _: runners.agent_world_stage(folder, out, cfg)
    plan = [Stage("agent_world", {**data, "seed": cfg.seed}, ("world",), None, world)]
    for task, steps in (("calc", cfg.calc_sft_steps), ("shop", cfg.shop_sft_steps)):
        recipe = {"steps": steps, "lr": cfg.agent_sft_lr, "seed": cfg.seed}
        run = lambda folder, resume, t=task, n=steps: runners.train_sft(
            folder,
            resume,
            cfg,
            out / "sft" / "final",
            out / "agent_world" / f"{t}_sft.jsonl",
            steps=n,
            batch=32,
            lr=cfg.agent_sft_lr,
        )
        plan.append(Stage(f"{task}_sft", recipe, ("sft", "agent_world"), None, run))
    common = runners.agent_settings(cfg)
    calc = {"lr": cfg.calc_lr, "n": cfg.calc_eval_problems, **runners.CALC_BUDGET, **common}
    calc_run = lambda folder, resume: runners.calc_stage(folder, resume, out, cfg)
    plan.append(Stage("calc_grpo", calc, ("sft", "calc_sft"), "agents", calc_run))
    for reward in ("state", "claim"):
        recipe = {"reward": reward, "lr": cfg.shop_lr, **runners.SHOP_BUDGET, **common}
        run = lambda folder, resume, r=reward: runners.shop_stage(folder, resume, out, cfg, r)
        plan.append(Stage(f"shop_{reward}", recipe, ("shop_sft", "agent_world"), "agents", run))
    return plan


def lab_plan(out: Path, cfg: LabConfig) -> list[Stage]:
    """Every stage of the lab, each after the stages whose outputs it reads."""
    plan = base_plan(out, cfg) + sft_plan(out, cfg) + reward_model_plan(out, cfg)
    plan += ppo_plan(out, cfg) + grpo_plan(out, cfg) + dpo_plan(out, cfg)
    if cfg.agent_stages:
        plan += agent_plan(out, cfg)
    return plan
