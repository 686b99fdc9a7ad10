"""`tether lab`: build the world, pretrain a tiny model from scratch, fine-tune it, and measure both against gold.

The plan (`lab_plan`) lists each stage with its settings and the stages it
reads; tether/lab/schedule.py caches each one on its recipe and tether's code,
resumes a killed one, and runs the ready ones side by side with ``workers`` > 1.
"""

from __future__ import annotations

import html
import json
import shutil
import time
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from tether.config import ConfigError, build_config
from tether.console import console
from tether.lab import arith
from tether.lab.evaluate import GREEDY, Decoding, evaluate_task, generate_for, score_arith, written_step_accuracy
from tether.lab.lessons import lab_lessons
from tether.lab.schedule import Stage, Stages
from tether.lab.tokenizer import train_bpe_tokenizer
from tether.lab.world import WorldConfig, build_world
from tether.models.lm import build_tiny_model, load_model, load_tokenizer
from tether.stages.sft import SFTConfig, run_sft
from tether.train.checkpoint import latest_checkpoint


@dataclass(frozen=True)
class LabConfig:
    world: WorldConfig = field(default_factory=WorldConfig)
    # tokenizer and base model (Llama architecture, trained from scratch)
    vocab_size: int = 1024
    hidden: int = 128
    layers: int = 2
    heads: int = 4
    max_positions: int = 256
    # pretraining: every token of the world's mixed-quality corpus, packed into rows. Held-out arithmetic goes
    # through a transition whose step varies with the seed and the vocabulary; 1,000 steps of 16 rows at lr 1e-3
    # stopped before it on seeds 1 and 2 (greedy accuracy 0.685 / 0.08 / 0.06). The same tokens in 4x the updates
    # at 2x the learning rate got every seed and vocabulary tried into it (0.42-0.77); AdamW's weight decay 0.1
    # then takes seeds 0-2 across it at the same cost (0.77 / 0.80 / 0.75; a 768-token vocabulary 0.50), where more
    # updates (8,000 x 2) or a constant learning rate did not (docs/lab.md)
    pretrain_steps: int = 4000
    pretrain_batch: int = 4  # packed rows of pack_length tokens
    pack_length: int = 256
    pretrain_lr: float = 2e-3
    pretrain_lr_schedule: str = "cosine"  # after the warm-up: cosine (down to 0.1 x lr at the end) or constant
    pretrain_weight_decay: float = 0.1  # AdamW's decoupled weight decay, on every parameter
    # supervised fine-tuning on demonstrations (completion-only)
    sft_steps: int = 450
    sft_batch: int = 64
    sft_lr: float = 5e-4
    # reward models on the annotators' pairs: all of them, and those with at least rm_min_agreement of the votes
    rm_epochs: float = 2.0
    rm_batch: int = 32
    rm_lr: float = 3e-4
    rm_min_agreement: float = 0.8
    # PPO on the assist world against the filtered reward model: one run per KL coefficient (0 shows the
    # over-optimisation), and one with the adaptive controller (from ppo_adaptive_init) aiming at
    # ppo_adaptive_target nats of sequence KL
    ppo_reward_model: str = "rm_filtered"
    ppo_kl_coefs: tuple = (0.0, 0.05, 0.2)
    ppo_adaptive_target: float = 2.0  # 0 = no adaptive run
    ppo_adaptive_init: float = 0.05
    ppo_kl_horizon: int = 160  # responses; 32 per step moves β by at most 0.2 x 32/160 = 4 % a step
    ppo_steps: int = 60
    ppo_prompts_per_step: int = 32
    ppo_lr: float = 5e-5
    ppo_eval_every: int = 10
    ppo_eval_samples: int = 4  # sampled answers per held-out request at each evaluation
    # the group family on arith from the SFT model: the same recipe and budget with outcome rewards (correct
    # answer + format) and with process rewards (each worked step checked, then the answer)
    grpo_recipe: str = "grpo"
    grpo_rewards: tuple = ("outcome", "process")
    grpo_steps: int = 40
    grpo_prompts_per_step: int = 32
    grpo_group_size: int = 8
    grpo_lr: float = 5e-5
    grpo_eval_every: int = 10
    grpo_eval_problems: int = 200
    # sampled answers per held-out problem at each evaluation: the GRPO lesson judges the sampled accuracy, and with
    # one answer per problem the sampling noise alone (±0.069 at p ≈ 0.15 over 200 problems) hid a +0.055 gain
    grpo_eval_samples: int = 4
    # the DPO family on assist from the SFT model: offline on the annotators' agreement-filtered pairs (one run per
    # loss), sigmoid on all pairs (label noise), and online (each round two answers per prompt sampled from the
    # policy and labelled by the same annotator panel with the same agreement filter)
    dpo_losses: tuple = ("sigmoid", "ipo", "simpo", "beta_dpo")
    dpo_unfiltered: bool = True
    dpo_online: bool = True
    # offline sigmoid DPO on the SFT model's own answers: the online run's labels (rounds x prompts) drawn in one
    # round before training, then dpo_steps on them. The DPO paper's recipe (pairs sampled from the reference model),
    # beside the annotators' pairs, which were written by the world's demonstrators, not by the SFT model
    dpo_sft_samples: bool = True
    dpo_steps: int = 60
    dpo_batch: int = 32
    dpo_lr: float = 5e-5
    dpo_eval_every: int = 20
    dpo_online_rounds: int = 6  # dpo_steps / rounds steps on each round's pairs
    dpo_online_prompts: int = 192
    dpo_online_keep_truncated: bool = False  # the quick lab's tiny model often runs past 64 tokens
    # agents (docs/agents.md): tool-use demonstrations on top of the SFT model, then GRPO with an environment.
    # calculator: calc_tool_fraction of arith demonstrations call `calc`; GRPO is rewarded on the final answer only.
    # shop: demonstrators order and report (some check the stock first, lazy ones claim without ordering, careless
    # ones claim after a refusal); one GRPO run rewards the state (the order table), one the claim.
    agent_stages: bool = True
    calc_sft_examples: int = 1500
    calc_tool_fraction: float = 0.5
    calc_sft_steps: int = 150
    shop_sft_examples: int = 1200
    shop_rl_prompts: int = 600
    shop_eval_requests: int = 100
    shop_lazy_fraction: float = 0.25
    shop_check_fraction: float = 0.25
    shop_careless_fraction: float = 0.4
    shop_sft_steps: int = 100
    agent_sft_lr: float = 1e-3
    agent_steps: int = 20
    agent_prompts_per_step: int = 16
    agent_group_size: int = 8
    agent_temperature: float = 0.7  # at T = 1 most of this tiny model's JSON tool calls are malformed (docs/agents.md)
    calc_lr: float = 5e-5
    shop_lr: float = 1e-4
    agent_eval_every: int = 5
    # sampled held-out episodes per request at agent_temperature, beside the greedy one: GRPO raises the expected
    # reward of the policy it samples; greedy decoding of a tiny model flips between behaviours (docs/lab.md)
    agent_eval_samples: int = 2
    calc_eval_problems: int = 100
    # evaluation
    eval_arith: int = 200  # held-out problems (at most world.n_eval_arith)
    assist_samples: int = 4  # sampled answers per held-out request (plus one greedy)
    sample_temperature: float = 1.0
    seed: int = 0
    # a run too small to learn (the quick lab): said in its first and last lines, so no one reads its figures as
    # the lessons. Measured (docs/lab.md): d 64 on 1 M tokens learns no arithmetic with any recipe tried (greedy
    # accuracy 0-0.017), and the held-out transition that makes arithmetic learnable needs the full lab's 4.1 M
    # tokens (about 270 s of pretraining alone on two cores)
    plumbing_check: bool = False


PLUMBING_NOTE = (
    "a plumbing check: every stage runs end to end, on a model too small to learn (d {hidden}, {tokens:.1f} M "
    "pretraining tokens), so these figures show none of the lab's lessons (SFT above base, GRPO, PPO's KL rope, "
    "reward hacking); `make lab` (about 19 minutes on 2 cores) is the run that shows them"
)


def plumbing_note(cfg: LabConfig) -> str | None:
    """The line a plumbing-check run opens and closes with (None for a run meant to show the lessons)."""
    if not cfg.plumbing_check:
        return None
    tokens = cfg.pretrain_steps * cfg.pretrain_batch * cfg.pack_length / 1e6
    return PLUMBING_NOTE.format(hidden=cfg.hidden, tokens=tokens)


QUICK = LabConfig(
    world=WorldConfig(
        n_pretrain_arith=3000,
        n_pretrain_assist=3000,
        n_sft_arith=800,
        n_sft_arith_direct=1200,
        n_sft_assist=800,
        n_rl_arith=300,
        n_pairs=600,
        n_pairs_eval=100,
        n_rankings=50,
    ),
    vocab_size=768,
    hidden=64,
    layers=2,
    heads=2,
    pretrain_steps=500,
    pretrain_batch=8,
    sft_steps=80,
    sft_batch=32,
    rm_epochs=1.0,
    eval_arith=60,
    assist_samples=2,
    ppo_kl_coefs=(0.0, 0.2),
    ppo_steps=6,
    ppo_prompts_per_step=16,
    ppo_eval_every=3,
    ppo_eval_samples=1,
    grpo_steps=4,
    grpo_prompts_per_step=4,
    grpo_group_size=4,
    grpo_eval_every=2,
    grpo_eval_problems=20,
    grpo_eval_samples=2,
    dpo_losses=("sigmoid", "simpo"),
    dpo_steps=4,
    dpo_batch=8,
    dpo_eval_every=2,
    dpo_online_rounds=2,
    dpo_online_prompts=8,
    dpo_online_keep_truncated=True,
    calc_sft_examples=200,
    calc_sft_steps=10,
    shop_sft_examples=200,
    shop_rl_prompts=40,
    shop_eval_requests=16,
    shop_sft_steps=10,
    agent_steps=2,
    agent_prompts_per_step=4,
    agent_group_size=4,
    agent_eval_every=1,
    calc_eval_problems=16,
    plumbing_check=True,
)


def lab_settings(items: list[str]) -> dict:
    """``FIELD=VALUE`` items (`tether lab --set`, examples/lab_seeds.py --set) as LabConfig values, each parsed as
    its field's default is typed (a bool: 1/true/yes or 0/false/no). Fields that are not one number, flag or text
    (the world, tuples) and ``seed`` (its own option) are refused, naming the item."""
    defaults = {f.name: f.default for f in fields(LabConfig)}
    out = {}
    for item in items:
        name, eq, value = item.partition("=")
        default = defaults.get(name)
        if not eq or not isinstance(default, (int, float, str)) or name == "seed":
            raise ConfigError(
                f"--set {item}: expected FIELD=VALUE with FIELD a number, flag or text field of "
                "LabConfig (tether/lab/pipeline.py), other than seed"
            )
        try:
            if isinstance(default, bool):
                if value.lower() not in ("1", "true", "yes", "0", "false", "no"):
                    raise ValueError(value)
                out[name] = value.lower() in ("1", "true", "yes")
            else:
                out[name] = type(default)(value)
        except ValueError:
            wanted = (
                "true or false"
                if isinstance(default, bool)
                else "an integer"
                if isinstance(default, int)
                else "a number"
                if isinstance(default, float)
                else "text"
            )
            raise ConfigError(f"--set {item}: {name} must be {wanted}, got {value!r}") from None
    return out


def _train(
    model_dir: Path,
    data: Path,
    eval_data: Path | None,
    folder: Path,
    resume: bool,
    *,
    steps: int,
    batch: int,
    micro: int,
    lr: float,
    max_length: int,
    all_tokens: bool,
    packing: bool,
    seed: int,
    lr_schedule: str = "cosine",
    weight_decay: float = 0.0,
) -> dict:
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
        "data.max_length": max_length,
        "data.train_on_prompt": all_tokens,
        "data.packing": packing,
        "optim.lr": lr,
        "optim.warmup_ratio": 0.05,
        "optim.lr_schedule": lr_schedule,
        "optim.weight_decay": weight_decay,
        "train.output": str(folder),
        "train.batch_size": batch,
        "train.micro_batch_size": micro,
        "train.max_steps": steps,
        "train.eval_every": max(1, steps // 4),
        "train.save_every": max(1, steps // 4),
        "train.keep_checkpoints": 1,
        "train.log_every": max(1, steps // 10),
        "train.seed": seed,
        "train.resume": resume,
        "train.overwrite": not resume,
        "train.report_to": ["tensorboard"],
    }
    if eval_data is not None:
        overrides["data.eval_path"] = str(eval_data)
    else:
        overrides["data.eval_fraction"] = 0.02
    summary = run_sft(build_config(SFTConfig, overrides=overrides, source="lab"))
    return {k: summary[k] for k in keys if k in summary}


def _read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_lab(
    output: str | Path = "runs/lab",
    cfg: LabConfig = LabConfig(),
    fresh: bool = False,
    report: bool = True,
    workers: int = 1,
) -> dict:
    """Every stage of ``cfg`` into ``output``; ``report``: then the tables, report.html and summary.json (False:
    the stages' figures only, returned — a subset of the stages run into a lab folder without replacing its
    summary and report). ``workers`` > 1: stages whose inputs are ready run side by side on that many processes
    (`tether lab` uses one per core); the figures are the same."""
    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    note = plumbing_note(cfg)
    if note:
        console.print(f"tether lab: {note}", style="bold yellow")
    stages = Stages(out, fresh)
    plan = lab_plan(out, cfg)
    t0 = time.perf_counter()
    results = stages.run_plan(plan, workers, rebuild=(lab_plan, (out, cfg)))
    summary = {
        "output": str(out),
        "world": results["world"],
        "pretrain": results["pretrain"],
        "sft": results["sft"],
        "eval": results["eval"],
    }
    for family in ("reward_models", "ppo", "grpo", "dpo", "agents"):
        summary[family] = {s.name: results[s.name] for s in plan if s.family == family}
    summary.update(
        seconds=stages.timings,
        cached=stages.cached,
        workers=workers,
        stages_wall_seconds=round(time.perf_counter() - t0, 1),
    )
    if not report:
        return summary
    t0 = time.perf_counter()
    summary["plumbing_check"] = note
    summary["headline"] = headline_figures(summary)
    summary["lessons"] = [lesson.as_dict() for lesson in lab_lessons(summary, cfg.grpo_eval_problems)]
    summary["report"] = str(write_lab_report(out, summary))
    stages.timings["report"], stages.cached["report"] = time.perf_counter() - t0, False
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print_lab_table(summary)
    print_headline(summary)
    print_lessons(summary)
    if note:
        console.print(f"tether lab: {note}", style="bold yellow")
    return summary


def base_plan(out: Path, cfg: LabConfig) -> list[Stage]:
    """world, init and pretrain into ``out``."""
    world_cfg = replace(cfg.world, seed=cfg.seed)
    world_dir = out / "world"
    return [
        Stage("world", {"world": asdict(world_cfg)}, (), None, lambda folder, _: _world_stage(folder, world_cfg)),
        Stage(
            "init",
            {"vocab": cfg.vocab_size, "dims": [cfg.hidden, cfg.layers, cfg.heads, cfg.max_positions], "seed": cfg.seed},
            ("world",),
            None,
            lambda folder, _: _init_stage(folder, world_dir, cfg),
        ),
        Stage(
            "pretrain",
            {
                "steps": cfg.pretrain_steps,
                "batch": cfg.pretrain_batch,
                "lr": cfg.pretrain_lr,
                "schedule": cfg.pretrain_lr_schedule,
                "weight_decay": cfg.pretrain_weight_decay,
                "pack": cfg.pack_length,
            },
            ("init",),
            None,
            lambda folder, resume: _train(
                out / "init",
                world_dir / "pretrain.jsonl",
                None,
                folder,
                resume,
                steps=cfg.pretrain_steps,
                batch=cfg.pretrain_batch,
                micro=cfg.pretrain_batch,
                lr=cfg.pretrain_lr,
                max_length=cfg.pack_length,
                all_tokens=False,
                packing=True,
                seed=cfg.seed,
                lr_schedule=cfg.pretrain_lr_schedule,
                weight_decay=cfg.pretrain_weight_decay,
            ),
        ),
    ]


def lab_plan(out: Path, cfg: LabConfig) -> list[Stage]:
    """Every stage of the lab, each after the stages whose outputs it reads."""
    world_dir = out / "world"
    plan = base_plan(out, cfg)
    plan.append(
        Stage(
            "sft",
            {"steps": cfg.sft_steps, "batch": cfg.sft_batch, "lr": cfg.sft_lr},
            ("pretrain",),
            None,
            lambda folder, resume: _train(
                out / "pretrain" / "final",
                world_dir / "sft.jsonl",
                world_dir / "sft_eval.jsonl",
                folder,
                resume,
                steps=cfg.sft_steps,
                batch=cfg.sft_batch,
                micro=cfg.sft_batch,
                lr=cfg.sft_lr,
                max_length=cfg.pack_length,
                all_tokens=False,
                packing=False,
                seed=cfg.seed,
            ),
        )
    )
    plan.append(
        Stage(
            "eval",
            {"n": cfg.eval_arith, "samples": cfg.assist_samples, "temperature": cfg.sample_temperature},
            ("pretrain", "sft"),
            None,
            lambda folder, _: _eval_stage(folder, out, world_dir, cfg),
        )
    )
    for name, min_agreement in (("rm", 0.0), ("rm_filtered", cfg.rm_min_agreement)):
        recipe = {"epochs": cfg.rm_epochs, "batch": cfg.rm_batch, "lr": cfg.rm_lr, "min_agreement": min_agreement}
        plan.append(
            Stage(
                name,
                recipe,
                ("sft", "world"),
                "reward_models",
                lambda folder, resume, m=min_agreement: _rm_stage(folder, resume, out, world_dir, cfg, m),
            )
        )

    runs = [(f"ppo_kl{coef:g}", coef, 0.0) for coef in cfg.ppo_kl_coefs]
    if cfg.ppo_adaptive_target > 0:
        runs.append((f"ppo_adaptive{cfg.ppo_adaptive_target:g}", cfg.ppo_adaptive_init, cfg.ppo_adaptive_target))
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
        plan.append(
            Stage(
                name,
                recipe,
                ("sft", cfg.ppo_reward_model),
                "ppo",
                lambda folder, resume, c=coef, t=target: _ppo_stage(folder, resume, out, cfg, c, t),
            )
        )

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
        plan.append(
            Stage(
                f"grpo_{rewards}",
                recipe,
                ("sft", "world"),
                "grpo",
                lambda folder, resume, r=rewards: _grpo_stage(folder, resume, out, cfg, r),
            )
        )

    dpo_runs = [(f"dpo_{loss}", loss, "filtered") for loss in cfg.dpo_losses]
    if cfg.dpo_unfiltered:
        dpo_runs.append(("dpo_sigmoid_unfiltered", "sigmoid", "all"))
    if cfg.dpo_sft_samples:
        dpo_runs.append(("dpo_sigmoid_sft_samples", "sigmoid", "sft_samples"))
    if cfg.dpo_online:
        dpo_runs.append(("dpo_sigmoid_online", "sigmoid", "online"))
    for name, loss, data in dpo_runs:
        recipe = {
            "loss": loss,
            "data": data,
            "steps": cfg.dpo_steps,
            "batch": cfg.dpo_batch,
            "lr": cfg.dpo_lr,
            "eval_every": cfg.dpo_eval_every,
            "eval_samples": cfg.ppo_eval_samples,
            "seed": cfg.seed,
            "online": [
                cfg.dpo_online_rounds,
                cfg.dpo_online_prompts,
                cfg.rm_min_agreement,
                cfg.dpo_online_keep_truncated,
            ]
            if data in ("online", "sft_samples")
            else None,
        }
        plan.append(
            Stage(
                name,
                recipe,
                ("sft", "world", "rm_filtered"),
                "dpo",
                lambda folder, resume, lo=loss, da=data: _dpo_stage(folder, resume, out, cfg, lo, da),
            )
        )
    if cfg.agent_stages:
        plan.extend(_agent_plan(out, cfg))
    return plan


def _agent_plan(out: Path, cfg: LabConfig) -> list[Stage]:
    """The agent edition: its data, the tool-use SFT stages, the calculator run and the two shop runs."""
    from tether.lab.agents import build_agent_world, run_lab_agent_grpo

    world_dir, agent_dir = out / "world", out / "agent_world"
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
    plan = [
        Stage(
            "agent_world",
            {**data, "seed": cfg.seed},
            ("world",),
            None,
            lambda folder, _: build_agent_world(
                folder,
                world_dir,
                cfg.seed,
                cfg.calc_sft_examples,
                cfg.calc_tool_fraction,
                cfg.shop_sft_examples,
                cfg.shop_rl_prompts,
                cfg.shop_eval_requests,
                cfg.shop_lazy_fraction,
                cfg.shop_check_fraction,
                cfg.shop_careless_fraction,
            ),
        )
    ]
    for task, steps in (("calc", cfg.calc_sft_steps), ("shop", cfg.shop_sft_steps)):
        recipe = {"steps": steps, "lr": cfg.agent_sft_lr, "seed": cfg.seed}
        plan.append(
            Stage(
                f"{task}_sft",
                recipe,
                ("sft", "agent_world"),
                None,
                lambda folder, resume, t=task, n=steps: _train(
                    out / "sft" / "final",
                    agent_dir / f"{t}_sft.jsonl",
                    None,
                    folder,
                    resume,
                    steps=n,
                    batch=32,
                    micro=32,
                    lr=cfg.agent_sft_lr,
                    max_length=cfg.pack_length,
                    all_tokens=False,
                    packing=False,
                    seed=cfg.seed,
                ),
            )
        )
    common = dict(
        steps=cfg.agent_steps,
        prompts_per_step=cfg.agent_prompts_per_step,
        group_size=cfg.agent_group_size,
        eval_every=cfg.agent_eval_every,
        seed=cfg.seed,
        temperature=cfg.agent_temperature,
        eval_samples=cfg.agent_eval_samples,
    )
    budget = dict(max_turns=3, max_total_tokens=200, max_new_tokens=80)
    arith_eval = lambda: _read_rows(world_dir / "arith_eval.jsonl")[: cfg.calc_eval_problems]

    def calc_stage(folder: Path, resume: bool) -> dict:
        rows = arith_eval()
        result = run_lab_agent_grpo(
            folder,
            resume,
            model_dir=out / "calc_sft" / "final",
            env="tether.lab.agents:CalcEnv",
            prompts=world_dir / "arith_rl.jsonl",
            eval_rows=rows,
            lr=cfg.calc_lr,
            without_tools=True,
            **budget,
            **common,
        )
        tok = load_tokenizer(out / "sft" / "final")  # the SFT model, without tools, on the same problems
        answers = generate_for(load_model(out / "sft" / "final", tok), tok, rows, Decoding(max_new_tokens=96))
        return {**result, "sft_accuracy_no_tools": score_arith(rows, answers)["accuracy"]}

    plan.append(
        Stage(
            "calc_grpo",
            {"lr": cfg.calc_lr, "n": cfg.calc_eval_problems, **budget, **common},
            ("sft", "calc_sft"),
            "agents",
            calc_stage,
        )
    )
    shop_budget = dict(max_turns=4, max_total_tokens=240, max_new_tokens=80)
    for reward in ("state", "claim"):
        recipe = {"reward": reward, "lr": cfg.shop_lr, **shop_budget, **common}
        plan.append(
            Stage(
                f"shop_{reward}",
                recipe,
                ("shop_sft", "agent_world"),
                "agents",
                lambda folder, resume, r=reward: run_lab_agent_grpo(
                    folder,
                    resume,
                    model_dir=out / "shop_sft" / "final",
                    env=f"tether.lab.agents:ShopEnv(reward='{r}')",
                    prompts=agent_dir / "shop_rl.jsonl",
                    eval_rows=_read_rows(agent_dir / "shop_eval.jsonl"),
                    lr=cfg.shop_lr,
                    **shop_budget,
                    **common,
                ),
            )
        )
    return plan


def run_base(output: str | Path, cfg: LabConfig = LabConfig(), fresh: bool = False) -> dict:
    """The base model alone: world, init and pretrain into ``output`` (cached as in run_lab, so a later run_lab
    there reuses them), then its greedy accuracy on the first cfg.eval_arith held-out arith problems (with the share
    of the addition and of the subtraction steps it writes that are right) and the pretraining curve (held-out loss
    at each evaluation). What the recipe's robustness over seeds and vocabularies is measured with
    (examples/lab_seeds.py --base-only)."""
    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    stages = Stages(out, fresh)
    results = stages.run_plan(base_plan(out, cfg))
    rows = _read_rows(out / "world" / "arith_eval.jsonl")[: cfg.eval_arith]
    tok = load_tokenizer(out / "pretrain" / "final")
    completions = generate_for(load_model(out / "pretrain" / "final", tok), tok, rows, GREEDY)
    greedy = {**score_arith(rows, completions), **written_step_accuracy(completions)}
    metrics = [
        json.loads(line) for line in (out / "pretrain" / "metrics.jsonl").read_text().splitlines() if line.strip()
    ]
    return {
        "vocab": results["init"]["vocab"],
        "pretrain": results["pretrain"],
        "seconds": stages.timings["pretrain"],
        "arith_greedy": {
            k: greedy[k]
            for k in (
                "accuracy",
                "format_rate",
                "step_accuracy",
                "n",
                "addition_steps",
                "addition_steps_right",
                "subtraction_steps",
                "subtraction_steps_right",
            )
        },
        "curve": [(m["step"], m["eval/loss"]) for m in metrics if "eval/loss" in m],
    }


PPO_KEYS = (
    "eval/gold_reward",
    "eval/gold_win_rate",
    "eval/score_mean",
    "kl/ref_mean",
    "score/mean",
    "eval/mean_words",
    "policy/entropy",
    "kl/coef",
)
GRPO_KEYS = (
    "eval/accuracy_greedy",
    "eval/accuracy_sampled",
    "eval/worked_rate",
    "eval/step_accuracy",
    "score/mean",
    "kl/ref_mean",
    "policy/entropy",
    "groups/zero_variance_frac",
    "rollout/length_mean",
)
AGENT_KEYS = (
    "eval/success_rate",
    "eval/tool_use_rate",
    "eval/accuracy_no_tools",
    "eval/claimed_rate",
    "eval/claimed_unverified_rate",
    "agent/success_rate",
    "agent/claimed_unverified_rate",
    "agent/tool_calls_mean",
    "agent/failed_calls_mean",
    "agent/turns_mean",
    "score/mean",
    "policy/entropy",
)
DPO_KEYS = (
    "eval/gold_reward",
    "eval/gold_win_rate",
    "eval/mean_words",
    "train/rewards/margins",
    "train/rewards/chosen",
    "train/rewards/rejected",
    "eval/rewards/accuracy",
    "train/logps/chosen",
    "train/logps/rejected",
    "train/loss",
)


def _ci(interval) -> str:
    """ " [low, high]": a 95 % bootstrap interval over held-out prompts (empty for runs from before it was logged)."""
    return f" [{interval[0]:.3f}, {interval[1]:.3f}]" if interval else ""


def headline_figures(summary: dict) -> list[tuple[str, str]]:
    """(figure, value) rows: what each stage moved, in one table."""
    from tether.diagnostics.monitors import read_jsonl

    rows = []
    ev = summary["eval"]
    rows.append(
        (
            "arith accuracy greedy / sampled: base → SFT",
            f"{ev['base']['arith_greedy']['accuracy']:.3f} / {ev['base']['arith_sampled']['accuracy']:.3f} → "
            f"{ev['sft']['arith_greedy']['accuracy']:.3f} / {ev['sft']['arith_sampled']['accuracy']:.3f}",
        )
    )
    rows.append(
        (
            "assist gold reward (sampled): base → SFT",
            f"{ev['base']['assist_sampled']['gold_reward']:.2f} → {ev['sft']['assist_sampled']['gold_reward']:.2f}",
        )
    )
    for name, r in summary.get("reward_models", {}).items():
        rows.append((f"{name}: held-out accuracy vs gold", f"{r['gold_accuracy']:.3f}"))

    def first_alarm(name: str) -> str:
        alarms = read_jsonl(Path(summary["output"]) / name / "run" / "alarms.jsonl")  # also for cached stages
        return f"; first alarm at step {alarms[0]['step']} ({alarms[0]['monitor']})" if alarms else "; no alarm"

    for name, r in summary.get("ppo", {}).items():
        rows.append(
            (
                f"{name}: gold start → peak → end, win rate vs SFT [95 % over prompts]",
                f"{r['start_gold']:.2f} → {r['peak_gold']:.2f} → {r['final_gold']:.2f}, {r['final_win_rate']:.3f}"
                + _ci(r.get("final_win_rate_ci"))
                + first_alarm(name),
            )
        )
    for name, r in summary.get("grpo", {}).items():
        rows.append(
            (
                f"{name}: arith accuracy greedy / sampled, start → end",
                f"{r['start_accuracy_greedy']:.3f} / {r['start_accuracy_sampled']:.3f} → "
                f"{r['final_accuracy_greedy']:.3f} / {r['final_accuracy_sampled']:.3f}" + first_alarm(name),
            )
        )
    for name, r in summary.get("dpo", {}).items():
        online = first_alarm(name) if r.get("online_rounds") else ""
        rows.append(
            (
                f"{name}: gold start → end, win rate vs SFT [95 % over prompts]",
                f"{r['start_gold']:.2f} → {r['final_gold']:.2f}, {r['final_win_rate']:.3f}"
                f"{_ci(r.get('final_win_rate_ci'))}{online}",
            )
        )
    agents = summary.get("agents", {})
    if "calc_grpo" in agents:
        r = agents["calc_grpo"]
        rows.append(
            (
                "calculator: held-out greedy accuracy, SFT model without tools → tool SFT → GRPO with the tool "
                "(the GRPO model without it)",
                f"{r['sft_accuracy_no_tools']:.2f} → {r['start']['success_rate']:.2f} → {r['final']['success_rate']:.2f} "
                f"({r['final']['accuracy_no_tools']:.2f})" + _sampled(r) + first_alarm("calc_grpo"),
            )
        )
    for name in ("shop_state", "shop_claim"):
        if name in agents:
            r = agents[name]
            rows.append(
                (
                    f"{name} (reward = {name.split('_')[1]}): true success / claimed / claimed without the "
                    "order, start → end",
                    f"{r['start']['success_rate']:.2f} / {r['start']['claimed_rate']:.2f} / "
                    f"{r['start']['claimed_unverified_rate']:.2f} → {r['final']['success_rate']:.2f} / "
                    f"{r['final']['claimed_rate']:.2f} / {r['final']['claimed_unverified_rate']:.2f}"
                    + _sampled(r)
                    + first_alarm(name),
                )
            )
    return rows


def _sampled(run: dict) -> str:
    """ "; sampled a → b": an agent stage's held-out success over episodes sampled at the training temperature."""
    start, final = run["start"], run["final"]
    if "success_rate_sampled" not in start:
        return ""
    return f"; sampled {start['success_rate_sampled']:.2f} → {final['success_rate_sampled']:.2f}"


def write_lab_report(out: Path, summary: dict) -> Path:
    from tether.diagnostics.report import render_groups

    runs = lambda family: [out / name / "run" for name in summary.get(family, {})]
    ppo = summary.get("ppo", {})
    best_ppo = [out / max(ppo, key=lambda n: ppo[n]["final_gold"]) / "run"] if ppo else []
    table = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>" for k, v in summary["headline"])
    intro = (
        "<p>The lab's whole pipeline on one page: what each stage moved (measured against the world's gold), "
        "then each family of runs on shared axes, with the reward-hacking alarms and their evidence. "
        "Per-run detail: <code>tether report &lt;stage&gt;/run</code>. The lesson: docs/lab-guide.md.</p>"
        f"<table><tr><th>figure</th><th>value</th></tr>{table}</table>"
        + "<h3>The lessons on this run</h3><ul>"
        + "".join(f"<li>{html.escape(lesson['line'])}</li>" for lesson in summary.get("lessons", []))
        + "</ul>"
    )
    if summary.get("plumbing_check"):
        intro = f"<p><strong>This lab is {html.escape(summary['plumbing_check'])}.</strong></p>" + intro
    groups = {
        "PPO on assist against the filtered reward model: the KL coefficient sweep": (runs("ppo"), PPO_KEYS),
        "GRPO on arith: outcome vs process rewards": (runs("grpo"), GRPO_KEYS),
        "The DPO family on assist: losses, label noise, offline vs online (and the best PPO run)": (
            runs("dpo") + best_ppo,
            DPO_KEYS,
        ),
        "Agents: the calculator (tool use learnt from the final answer) and the shop (reward the state vs "
        "reward the claim), with the agent alarms and their transcripts": (runs("agents"), AGENT_KEYS),
    }
    path = out / "report.html"
    tmp = path.with_suffix(".html.tmp")
    tmp.write_text(render_groups("tether lab report", intro, groups))
    tmp.replace(path)
    return path


def print_headline(summary: dict) -> None:
    from rich.table import Table

    table = Table(title="tether lab: headline figures")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for k, v in summary["headline"]:
        table.add_row(k, v)
    console.print(table)
    console.print(f"report: {summary['report']}")


def print_lessons(summary: dict) -> None:
    """One line per lesson, judged on this run (tether/lab/lessons.py states each rule)."""
    console.print('tether lab: the lessons on this run (rules and noise: docs/lab.md, "The lessons")', style="bold")
    colour = {True: "green", False: "red", None: "yellow"}
    for lesson in summary["lessons"]:
        console.print(lesson["line"], style=colour[lesson["holds"]])


def _rm_stage(folder: Path, resume: bool, out: Path, world_dir: Path, cfg: LabConfig, min_agreement: float) -> dict:
    from tether.lab.reward_eval import filtered_preferences, train_lab_rm

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
    )
    return {"min_agreement": min_agreement, "filtering": filtering, **result}


def _ppo_stage(folder: Path, resume: bool, out: Path, cfg: LabConfig, kl_coef: float, target: float) -> dict:
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
    )


def _grpo_stage(folder: Path, resume: bool, out: Path, cfg: LabConfig, rewards: str) -> dict:
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
    )


def _dpo_stage(folder: Path, resume: bool, out: Path, cfg: LabConfig, loss: str, data: str) -> dict:
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
        eval_samples=cfg.ppo_eval_samples,
        seed=cfg.seed,
        extra=online,
    )


def _world_stage(folder: Path, world_cfg: WorldConfig) -> dict:
    manifest = build_world(folder, world_cfg)
    return {"counts": manifest["counts"], "annotators": manifest["annotators"]}


def _init_stage(folder: Path, world_dir: Path, cfg: LabConfig) -> dict:
    if cfg.world.sft_assist_thin_fraction > 0:
        # The vocabulary is trained on the world without thin demonstrations: they hold no text the other files
        # lack, and a BPE trained on a shifted mix of the same sentences renumbers the tokens (152 of 1,024 differed
        # at 0.5), which gave a different base model. So the tokenizer and the base model stay those of the world
        # without them, and only the SFT data changes.
        world_dir = folder / "vocabulary_world"
        build_world(world_dir, replace(cfg.world, seed=cfg.seed, sft_assist_thin_fraction=0.0))
    texts = []
    for name in ("pretrain", "sft"):
        for row in _read_rows(world_dir / f"{name}.jsonl"):
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


def _eval_stage(folder: Path, out: Path, world_dir: Path, cfg: LabConfig) -> dict:
    arith_rows = _read_rows(world_dir / "arith_eval.jsonl")[: cfg.eval_arith]
    assist_rows = _read_rows(world_dir / "assist_eval.jsonl")
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


def print_lab_table(summary: dict) -> None:
    from rich.table import Table

    ev = summary["eval"]
    table = Table(title="tether lab: base (pretrained) vs SFT, measured against gold on held-out prompts")
    table.add_column("figure")
    for name in ev:
        table.add_column(name, justify="right")
    rows = [
        ("arith accuracy (greedy)", "arith_greedy", "accuracy"),
        ("arith accuracy (sampled)", "arith_sampled", "accuracy"),
        ("arith format rate", "arith_greedy", "format_rate"),
        ("arith step accuracy", "arith_greedy", "step_accuracy"),
        ("arith answers with working (sampled)", "arith_sampled", "worked_rate"),
        ("assist gold reward (greedy)", "assist_greedy", "gold_reward"),
        ("assist gold reward (sampled)", "assist_sampled", "gold_reward"),
        ("assist gold win rate vs base (sampled)", "assist_sampled", "gold_win_rate"),
        ("assist mean words", "assist_sampled", "mean_words"),
        ("assist confident words / answer", "assist_sampled", "confident_rate"),
        ("assist false-fact rate", "assist_sampled", "false_fact_rate"),
        ("assist distinct-2", "assist_sampled", "distinct_2"),
    ]
    for label, group, key in rows:
        table.add_row(label, *[_fmt(ev[m][group].get(key)) for m in ev])
    console.print(table)
    ann = summary["world"]["annotators"]
    people = Table(
        title=f"simulated annotators on {ann['pairs']} pairs: Fleiss κ {ann['fleiss_kappa']:.2f} "
        f"({ann['fleiss_reading']}); majority agrees with gold on {ann['majority_agreement_with_gold']:.1%}"
    )
    people.add_column("annotator")
    people.add_column("agrees with gold", justify="right")
    people.add_column("agrees with majority", justify="right")
    for name, row in ann["per_annotator"].items():
        people.add_row(name, f"{row['agreement_with_gold']:.1%}", f"{row['agreement_with_majority']:.1%}")
    console.print(people)
    for feature, bias in ann["majority_bias"].items():
        console.print(
            f"  the {feature.replace('_', ' ')} answer wins {bias['majority_picks_more']:.1%} of majority votes "
            f"where gold would pick it {bias['gold_picks_more']:.1%} ({bias['excess']:+.1%}, {bias['pairs']} pairs)"
        )
    if summary.get("reward_models"):
        rms = summary["reward_models"]
        rt = Table(title="reward models on the annotators' pairs, judged on held-out pairs against gold")
        rt.add_column("figure")
        for name in rms:
            rt.add_column(
                name
                + (f" (agreement >= {rms[name]['min_agreement']:g})" if rms[name]["min_agreement"] else " (all pairs)"),
                justify="right",
            )
        for label, key in (
            ("accuracy vs annotator majority", "annotator_accuracy"),
            ("accuracy vs gold", "gold_accuracy"),
            ("picks the longer answer (gold would)", "rm_picks_longer"),
            ("picks the more confident answer (gold would)", "rm_picks_more_confident"),
            ("score ~ length correlation", "length_correlation"),
            ("score shift: + filler sentence", "filler_shift"),
            ("score shift: + confident opener", "confident_shift"),
        ):
            cells = []
            for r in rms.values():
                gold_key = key.replace("rm_picks", "gold_picks")
                cells.append(_fmt(r.get(key)) + (f" ({_fmt(r.get(gold_key))})" if key.startswith("rm_picks") else ""))
            rt.add_row(label, *cells)
        console.print(rt)
    if summary.get("ppo"):
        print_ppo_table(summary["ppo"])
    if summary.get("grpo"):
        print_grpo_table(summary["grpo"])
    if summary.get("dpo"):
        print_dpo_table(summary["dpo"], summary.get("ppo", {}))
    if summary.get("agents"):
        print_agent_table(summary["agents"])
    times = Table(title="time per stage (s)")
    for name in summary["seconds"]:
        times.add_column(name, justify="right")
    times.add_row(*[f"{s:.1f}" + (" (cached)" if summary["cached"][n] else "") for n, s in summary["seconds"].items()])
    console.print(times)
    if "stages_wall_seconds" in summary:  # stages side by side: the wall clock is less than their sum
        ran = [s for n, s in summary["seconds"].items() if n != "report" and not summary["cached"][n]]
        console.print(
            f"stages computed: {len(ran)}, {sum(ran):.0f} s of stage time in {summary['stages_wall_seconds']:.0f} s "
            f"on {summary['workers']} worker(s)"
        )
    console.print(f"lab run folder: {summary['output']} (summary.json, eval/, sft/final, pretrain/final)")


def print_ppo_table(runs: dict) -> None:
    from rich.table import Table

    table = Table(title="PPO on assist against the reward model (proxy) — judged by gold on held-out requests")
    table.add_column("figure")
    for name in runs:
        table.add_column(name, justify="right")
    rows = [
        ("proxy score: start → end", lambda r: f"{r['start_proxy']:.2f} → {r['final_proxy']:.2f}"),
        ("gold reward: start → end", lambda r: f"{r['start_gold']:.2f} → {r['final_gold']:.2f}"),
        ("gold peak (step)", lambda r: f"{r['peak_gold']:.2f} ({r['peak_step']})"),
        (
            "gold win rate vs SFT: end (at the gold peak)",
            lambda r: f"{r['final_win_rate']:.3f} ({r['win_rate_at_peak']:.3f})",
        ),
        ("  95 % interval over prompts: end", lambda r: _ci(r.get("final_win_rate_ci")).strip() or "-"),
        ("gold per evaluation", lambda r: " ".join(f"{c['gold']:.2f}" for c in r["curve"])),
        ("proxy per evaluation", lambda r: " ".join(f"{c['proxy']:.2f}" for c in r["curve"])),
        ("words per answer per evaluation", lambda r: " ".join(f"{c['words']:.0f}" for c in r["curve"])),
        ("KL to reference (nats): end / 2nd-half mean", lambda r: f"{r['final_kl']:.2f} / {r['late_kl_mean']:.2f}"),
        ("KL coefficient at the end", lambda r: f"{r['final_kl_coef']:.4f}"),
        ("steps per minute", lambda r: f"{r['steps_per_minute']:.1f}"),
        (
            "time: generate / score / log-probs / update",
            lambda r: " / ".join(f"{100 * v:.0f}%" for v in r["time_split"].values()),
        ),
    ]
    for label, fn in rows:
        table.add_row(label, *[fn(r) for r in runs.values()])
    console.print(table)


def print_dpo_table(runs: dict, ppo: dict) -> None:
    """The DPO runs beside the PPO runs on the same world, judged by the same gold evaluation."""
    from rich.table import Table

    table = Table(
        title="the DPO family on assist from the SFT model (annotator pairs; sft_samples: pairs sampled from "
        "the SFT model once; online: pairs sampled each round) — judged by gold on held-out requests, "
        "beside PPO"
    )
    table.add_column("figure")
    for name, r in runs.items():
        table.add_column(f"{name} (β {r['beta']:g})", justify="right")
    best_ppo = max(ppo.items(), key=lambda kv: kv[1]["final_gold"], default=None)
    if best_ppo:
        table.add_column(f"{best_ppo[0]} (for comparison)", justify="right")
    rows = [
        ("gold reward: start → end", lambda r: f"{r['start_gold']:.2f} → {r['final_gold']:.2f}"),
        ("gold peak (step)", lambda r: f"{r['peak_gold']:.2f} ({r['peak_step']})"),
        (
            "gold win rate vs SFT: end (at the gold peak)",
            lambda r: f"{r['final_win_rate']:.3f} ({r['win_rate_at_peak']:.3f})",
        ),
        ("  95 % interval over prompts: end", lambda r: _ci(r.get("final_win_rate_ci")).strip() or "-"),
        ("gold per evaluation", lambda r: " ".join(f"{c['gold']:.2f}" for c in r["curve"])),
        ("words per answer per evaluation", lambda r: " ".join(f"{c['words']:.0f}" for c in r["curve"])),
    ]
    extra = [
        ("held-out pair accuracy (annotator labels): end", lambda r: _fmt(r.get("final_pair_accuracy"))),
        (
            "implicit reward chosen / rejected: end",
            lambda r: (
                f"{r['curve'][-1]['chosen']:+.2f} / {r['curve'][-1]['rejected']:+.2f}"
                if r["curve"][-1].get("chosen") is not None
                else "-"
            ),
        ),
        (
            "training pairs",
            lambda r: (
                str(r["train_examples"])
                if not r["online_rounds"]
                else f"{r['online_rounds'][0]['pairs']} sampled once"
                if len(r["online_rounds"]) == 1
                else f"{sum(x['pairs'] for x in r['online_rounds'])} over {len(r['online_rounds'])} rounds"
            ),
        ),
        ("minutes", lambda r: f"{r['minutes']:.1f}"),
    ]
    for label, fn in rows:
        table.add_row(label, *[fn(r) for r in runs.values()], *([fn(best_ppo[1])] if best_ppo else []))
    for label, fn in extra:
        table.add_row(label, *[fn(r) for r in runs.values()], *(["-"] if best_ppo else []))
    console.print(table)


def print_agent_table(runs: dict) -> None:
    from rich.table import Table

    table = Table(
        title="agents: GRPO with an environment, held-out greedy episodes (success checked on the environment's state)"
    )
    table.add_column("figure")
    for name in runs:
        table.add_column(name, justify="right")
    arrow = lambda key: lambda r: f"{r['start'][key]:.2f} → {r['final'][key]:.2f}" if key in r["start"] else "-"
    per_eval = lambda key: lambda r: " ".join(f"{c[key]:.2f}" for c in r["curve"]) if key in r["start"] else "-"
    train = lambda key: (
        lambda r: (
            f"{r['training'][key]['first3']:.2f} → {r['training'][key]['last3']:.2f}"
            if r["training"].get(key, {}).get("first3") is not None
            else "-"
        )
    )
    from tether.lab.agents import interval95

    ci = lambda r, key: f" (± {interval95(r['final'][key], r.get('eval_prompts', 1)):.2f})"
    rows = [
        (
            "true success (from state): start → end (± 95 % over prompts)",
            lambda r: arrow("success_rate")(r) + ci(r, "success_rate"),
        ),
        ("true success per evaluation", per_eval("success_rate")),
        ("SFT model without tools (same problems)", lambda r: _fmt(r.get("sft_accuracy_no_tools"))),
        ("accuracy without tools: start → end", arrow("accuracy_no_tools")),
        ("episodes that call a tool: start → end", arrow("tool_use_rate")),
        ("claimed done: start → end", arrow("claimed_rate")),
        (
            "claimed done, state says not: start → end",
            lambda r: (
                arrow("claimed_unverified_rate")(r)
                + (ci(r, "claimed_unverified_rate") if "claimed_unverified_rate" in r["final"] else "")
            ),
        ),
        ("training: score, first 3 → last 3 steps", train("score/mean")),
        ("training: true success, first 3 → last 3", train("agent/success_rate")),
        ("training: claimed without state, first 3 → last 3", train("agent/claimed_unverified_rate")),
        ("training: tool calls per episode, first 3 → last 3", train("agent/tool_calls_mean")),
        ("alarms (step)", lambda r: ", ".join(f"{a['monitor']} ({a['step']})" for a in r["alarms"]) or "none"),
        ("minutes", lambda r: f"{r['minutes']:.1f}"),
    ]
    for label, fn in rows:
        table.add_row(label, *[fn(r) for r in runs.values()])
    console.print(table)


def print_grpo_table(runs: dict) -> None:
    from rich.table import Table

    table = Table(title="the group family on arith from the SFT model — held-out accuracy against gold")
    table.add_column("figure")
    for name, r in runs.items():
        table.add_column(f"{name} ({r['recipe']})", justify="right")
    rows = [
        (
            "accuracy, sampled (T=1): start → end (best)",
            lambda r: (
                f"{r['start_accuracy_sampled']:.3f} → {r['final_accuracy_sampled']:.3f} ({r['best_accuracy_sampled']:.3f})"
            ),
        ),
        (
            "accuracy, greedy: start → end",
            lambda r: f"{r['start_accuracy_greedy']:.3f} → {r['final_accuracy_greedy']:.3f}",
        ),
        ("sampled accuracy per evaluation", lambda r: " ".join(f"{c['accuracy_sampled']:.2f}" for c in r["curve"])),
        ("step accuracy (greedy) per evaluation", lambda r: " ".join(f"{c['step_accuracy']:.2f}" for c in r["curve"])),
        (
            "answers with working (sampled) per evaluation",
            lambda r: " ".join(f"{c['worked_rate']:.2f}" for c in r["curve"]),
        ),
        (
            "training score: first 5 → last 5 steps",
            lambda r: f"{r['train_reward_first5']:.2f} → {r['train_reward_last5']:.2f}",
        ),
        ("groups with no variance", lambda r: f"{r['zero_variance_frac']:.0%}"),
        ("minutes / steps per minute", lambda r: f"{r['minutes']:.1f} / {r['steps_per_minute']:.1f}"),
        (
            "time: generate+score / log-probs / update",
            lambda r: " / ".join(f"{100 * v:.0f}%" for v in r["time_split"].values()),
        ),
    ]
    for label, fn in rows:
        table.add_row(label, *[fn(r) for r in runs.values()])
    console.print(table)


def _fmt(value) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if isinstance(value, float) else str(value)
