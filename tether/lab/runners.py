"""The lab's stage runners: what each stage of the plan (plan.py) computes in its folder, ``run(folder, resume) ->
figures``. Each reads the folders of the stages it needs under the lab's output folder and the lab's settings
(settings.py); the stages that train go through tether's own stages (SFT, reward model, PPO, GRPO, DPO), the rest
build the world, the tokenizer and the base model, or measure against gold (evaluate.py)."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

from tether.config import build_config
from tether.lab import arith
from tether.lab.evaluate import Decoding, evaluate_task, generate_for, score_arith
from tether.lab.rl import train_settings
from tether.lab.settings import LabConfig, precision_settings
from tether.lab.tokenizer import train_bpe_tokenizer
from tether.lab.world import WorldConfig, build_world
from tether.models.lm import build_tiny_model, load_model, load_tokenizer
from tether.stages.sft import SFTConfig, run_sft
from tether.train.checkpoint import latest_checkpoint

CALC_BUDGET = dict(max_turns=3, max_total_tokens=200, max_new_tokens=80)  # a calculator episode's turns and tokens
SHOP_BUDGET = dict(max_turns=4, max_total_tokens=240, max_new_tokens=80)  # a shop episode's


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def train_sft(
    folder: Path,
    resume: bool,
    cfg: LabConfig,
    model_dir: Path,
    data: Path,
    *,
    steps: int,
    batch: int,
    lr: float,
    eval_data: Path | None = None,
    packing: bool = False,
    lr_schedule: str = "cosine",
    weight_decay: float = 0.0,
) -> dict:
    """`tether sft` from ``model_dir`` on ``data`` (completions only, rows of cfg.pack_length tokens at most;
    ``packing``: the rows packed, as pretraining reads its corpus); held out: ``eval_data`` or 2 % of ``data``."""
    keys = ("eval/loss", "eval/ppl", "steps")
    if resume:
        if (folder / "summary.json").is_file():  # killed after finishing, before stage.json
            summary = json.loads((folder / "summary.json").read_text())
            return {k: summary[k] for k in keys if k in summary}
        found = latest_checkpoint(folder)
        if found and found[0] >= steps:  # killed between the last checkpoint and final/: nothing left to resume
            resume = False
    overrides = {
        "model.path": str(model_dir),
        "data.path": str(data),
        "data.max_length": cfg.pack_length,
        "data.train_on_prompt": False,
        "data.packing": packing,
        "optim.lr": lr,
        "optim.warmup_ratio": 0.05,
        "optim.lr_schedule": lr_schedule,
        "optim.weight_decay": weight_decay,
        **train_settings(
            folder,
            resume,
            steps,
            max(1, steps // 4),
            cfg.seed,
            log_every=max(1, steps // 10),
            batch_size=batch,
            micro_batch_size=batch,
            keep_checkpoints=1,
        ),
    }
    overrides.update(precision_settings(cfg.precision))
    if eval_data is not None:
        overrides["data.eval_path"] = str(eval_data)
    else:
        overrides["data.eval_fraction"] = 0.02
    summary = run_sft(build_config(SFTConfig, overrides=overrides, source="lab"))
    return {k: summary[k] for k in keys if k in summary}


def world_stage(folder: Path, world_cfg: WorldConfig) -> dict:
    manifest = build_world(folder, world_cfg)
    return {"counts": manifest["counts"], "annotators": manifest["annotators"]}


def init_stage(folder: Path, world_dir: Path, cfg: LabConfig) -> dict:
    """The lab's BPE tokenizer, trained on the world's texts, and a randomly initialised Llama of cfg's shape."""
    if cfg.world.sft_assist_thin_fraction > 0:
        # The vocabulary is trained on the world without thin demonstrations: they hold no text the other files
        # lack, and a BPE trained on a shifted mix of the same sentences renumbers the tokens (152 of 1,024 differed
        # at 0.5), which gave a different base model. So the tokenizer and the base model stay those of the world
        # without them, and only the SFT data changes.
        world_dir = folder / "vocabulary_world"
        build_world(world_dir, replace(cfg.world, seed=cfg.seed, sft_assist_thin_fraction=0.0))
    texts = []
    for name in ("pretrain", "sft"):
        for row in read_rows(world_dir / f"{name}.jsonl"):
            if name == "sft" and arith.ANSWER_ONLY_RE.match(row["messages"][-1]["content"]):
                continue  # the lazy demonstrations add no new text, and leaving them out keeps the vocabulary as it was
            texts.extend(m["content"] for m in row["messages"])
    shutil.rmtree(folder / "vocabulary_world", ignore_errors=True)
    tokenizer = train_bpe_tokenizer(texts, vocab_size=cfg.vocab_size)
    build_tiny_model(
        "llama",
        tokenizer,
        folder,
        seed=cfg.seed,
        hidden=cfg.hidden,
        layers=cfg.layers,
        heads=cfg.heads,
        max_positions=cfg.max_positions,
    )
    model = load_model(folder)
    return {"parameters": sum(p.numel() for p in model.parameters()), "vocab": len(tokenizer)}


def eval_stage(folder: Path, out: Path, cfg: LabConfig) -> dict:
    """The base and the SFT model on the held-out arith problems and assist requests, greedy and sampled (assist's
    win rate against the base model's answers)."""
    world_dir = out / "world"
    arith_rows = read_rows(world_dir / "arith_eval.jsonl")[: cfg.eval_arith]
    assist_rows = read_rows(world_dir / "assist_eval.jsonl")
    sampled = Decoding(temperature=cfg.sample_temperature, samples=cfg.assist_samples, seed=cfg.seed)
    models = {}
    for name, path in (("base", out / "pretrain" / "final"), ("sft", out / "sft" / "final")):
        tok = load_tokenizer(path)
        models[name] = (load_model(path, tok), tok)
    figures: dict = {}
    for name, (model, tok) in models.items():
        ref_model, ref_tok = models["base"] if name != "base" else (None, None)
        figures[name] = {
            "arith_greedy": evaluate_task(model, tok, "lab-arith", arith_rows),
            "arith_sampled": evaluate_task(model, tok, "lab-arith", arith_rows, replace(sampled, samples=1)),
            "assist_greedy": evaluate_task(
                model, tok, "lab-assist", assist_rows, reference_model=ref_model, reference_tokenizer=ref_tok
            ),
            "assist_sampled": evaluate_task(
                model, tok, "lab-assist", assist_rows, sampled, reference_model=ref_model, reference_tokenizer=ref_tok
            ),
        }
        (folder / f"{name}.json").write_text(json.dumps(figures[name], indent=2))
    return figures


def rm_stage(folder: Path, resume: bool, out: Path, cfg: LabConfig, min_agreement: float) -> dict:
    from tether.lab.reward_eval import filtered_preferences, train_lab_rm

    world_dir = out / "world"
    pairs = world_dir / "prefs.jsonl"
    filtering = None
    if min_agreement > 0:
        pairs = folder / "prefs_filtered.jsonl"
        filtering = filtered_preferences(world_dir / "prefs.jsonl", pairs, min_agreement)
    result = train_lab_rm(
        folder,
        resume,
        sft_dir=out / "sft" / "final",
        pairs=pairs,
        eval_pairs=world_dir / "prefs_eval.jsonl",
        epochs=cfg.rm_epochs,
        batch=cfg.rm_batch,
        lr=cfg.rm_lr,
        seed=cfg.seed,
        extra=precision_settings(cfg.precision),
    )
    return {"min_agreement": min_agreement, "filtering": filtering, **result}


def ppo_stage(folder: Path, resume: bool, out: Path, cfg: LabConfig, kl_coef: float, target: float) -> dict:
    from tether.lab.rl import run_lab_ppo

    return run_lab_ppo(
        folder,
        resume,
        lab=out,
        reward_model=cfg.ppo_reward_model,
        kl_coef=kl_coef,
        adaptive_target=target,
        steps=cfg.ppo_steps,
        prompts_per_step=cfg.ppo_prompts_per_step,
        lr=cfg.ppo_lr,
        eval_every=cfg.ppo_eval_every,
        eval_samples=cfg.ppo_eval_samples,
        seed=cfg.seed,
        kl_horizon=cfg.ppo_kl_horizon,
        extra=precision_settings(cfg.precision, samples=True, policy_gradient=True),
    )


def grpo_stage(folder: Path, resume: bool, out: Path, cfg: LabConfig, rewards: str) -> dict:
    from tether.lab.rl import run_lab_grpo

    return run_lab_grpo(
        folder,
        resume,
        lab=out,
        recipe=cfg.grpo_recipe,
        rewards=rewards,
        steps=cfg.grpo_steps,
        prompts_per_step=cfg.grpo_prompts_per_step,
        group_size=cfg.grpo_group_size,
        lr=cfg.grpo_lr,
        eval_every=cfg.grpo_eval_every,
        eval_problems=cfg.grpo_eval_problems,
        eval_samples=cfg.grpo_eval_samples,
        seed=cfg.seed,
        extra=precision_settings(cfg.precision, samples=True, policy_gradient=True),
    )


def dpo_stage(
    folder: Path, resume: bool, out: Path, cfg: LabConfig, loss: str, data: str, nll_coef: float = 0.0
) -> dict:
    from tether.lab.rl import run_lab_dpo

    pairs = {
        "filtered": out / "rm_filtered" / "prefs_filtered.jsonl",
        "all": out / "world" / "prefs.jsonl",
        "online": None,
        "sft_samples": None,
    }[data]
    online = {}
    if data in ("online", "sft_samples"):
        # sft_samples is the online loop with one round: every label drawn from the SFT model before the first step
        rounds = cfg.dpo_online_rounds if data == "online" else 1
        online = {
            "online.rounds": rounds,
            "rollout.prompts_per_step": cfg.dpo_online_rounds * cfg.dpo_online_prompts // rounds,
            "online.steps_per_round": max(1, cfg.dpo_steps // rounds),
            "online.keep_truncated": cfg.dpo_online_keep_truncated,
            "online.judge": f"tether.lab.rewards:assist_panel_judge(min_agreement={cfg.rm_min_agreement})",
        }
    return run_lab_dpo(
        folder,
        resume,
        lab=out,
        pairs=pairs,
        loss=loss,
        beta=0.0,
        steps=cfg.dpo_steps,
        batch=cfg.dpo_batch,
        lr=cfg.dpo_lr,
        eval_every=cfg.dpo_eval_every,
        eval_samples=cfg.dpo_eval_samples,
        seed=cfg.seed,
        extra={
            **online,
            **({"dpo.sft_coef": nll_coef} if nll_coef else {}),
            **precision_settings(cfg.precision, samples=bool(online)),
        },
    )


def agent_world_stage(folder: Path, out: Path, cfg: LabConfig) -> dict:
    from tether.lab.agents import build_agent_world

    return build_agent_world(
        folder,
        out / "world",
        cfg.seed,
        cfg.calc_sft_examples,
        cfg.calc_tool_fraction,
        cfg.shop_sft_examples,
        cfg.shop_rl_prompts,
        cfg.shop_eval_requests,
        cfg.shop_lazy_fraction,
        cfg.shop_check_fraction,
        cfg.shop_careless_fraction,
    )


def agent_settings(cfg: LabConfig) -> dict:
    """The settings every agent GRPO run shares (part of each one's recipe)."""
    return dict(
        steps=cfg.agent_steps,
        prompts_per_step=cfg.agent_prompts_per_step,
        group_size=cfg.agent_group_size,
        eval_every=cfg.agent_eval_every,
        seed=cfg.seed,
        temperature=cfg.agent_temperature,
        eval_samples=cfg.agent_eval_samples,
    )


def calc_stage(folder: Path, resume: bool, out: Path, cfg: LabConfig) -> dict:
    """GRPO with the calculator on arith, and the SFT model without tools on the same held-out problems."""
    from tether.lab.agents import run_lab_agent_grpo

    world_dir = out / "world"
    rows = read_rows(world_dir / "arith_eval.jsonl")[: cfg.calc_eval_problems]
    result = run_lab_agent_grpo(
        folder,
        resume,
        model_dir=out / "calc_sft" / "final",
        env="tether.lab.agents:CalcEnv",
        prompts=world_dir / "arith_rl.jsonl",
        eval_rows=rows,
        lr=cfg.calc_lr,
        without_tools=True,
        **CALC_BUDGET,
        **agent_settings(cfg),
        extra=precision_settings(cfg.precision, samples=True, policy_gradient=True),
    )
    tok = load_tokenizer(out / "sft" / "final")  # the SFT model, without tools, on the same problems
    answers = generate_for(load_model(out / "sft" / "final", tok), tok, rows, Decoding(max_new_tokens=96))
    return {**result, "sft_accuracy_no_tools": score_arith(rows, answers)["accuracy"]}


def shop_stage(folder: Path, resume: bool, out: Path, cfg: LabConfig, reward: str) -> dict:
    """GRPO in the shop, rewarded on ``reward``: the order table's state or the reply's claim."""
    from tether.lab.agents import run_lab_agent_grpo

    agent_dir = out / "agent_world"
    return run_lab_agent_grpo(
        folder,
        resume,
        model_dir=out / "shop_sft" / "final",
        env=f"tether.lab.agents:ShopEnv(reward='{reward}')",
        prompts=agent_dir / "shop_rl.jsonl",
        eval_rows=read_rows(agent_dir / "shop_eval.jsonl"),
        lr=cfg.shop_lr,
        **SHOP_BUDGET,
        **agent_settings(cfg),
        extra=precision_settings(cfg.precision, samples=True, policy_gradient=True),
    )
