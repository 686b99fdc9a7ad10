"""Asynchronous rollouts (--max-staleness K) against the synchronous loop on the lab's GRPO and PPO stages: step
time, and what the lab's lessons say at each K.

    .venv/bin/python bench/async_rollouts.py --lab runs/lab                          # speed: K = 0 and 1, 3 repeats
    .venv/bin/python bench/async_rollouts.py --lab runs/lab --mode learn --ks 0,1,2 --seeds 0,1
    .venv/bin/python bench/async_rollouts.py --lab runs/lab --mode learn --ks 8,8tis --seeds 0
    .venv/bin/python bench/async_rollouts.py --lab runs/lab --workload 29m     # speed on bench/stages.py's 29.9 M model
    .venv/bin/python bench/async_rollouts.py --lab runs/lab --backend vllm     # the vLLM engine: in the trainer at K = 0,
                                                                               # in the rollout worker at K = 1
    .venv/bin/python bench/async_rollouts.py --lab runs/lab --workload ppo     # speed on the lab's PPO stage
    .venv/bin/python bench/async_rollouts.py --lab runs/lab --workload ppo --mode learn --ks 0,1 --seeds 0,1
    .venv/bin/python bench/async_rollouts.py --lab runs/lab --workload shop    # speed on the lab's shop agent (--env)
    .venv/bin/python bench/async_rollouts.py --lab runs/lab --workload shop --mode learn --ks 0,1 --seeds 0,1

Every run is the lab's own grpo_outcome stage (tether.lab.rl.run_lab_grpo: the lab's SFT model, 32 prompts × 8
responses a step, 48 new tokens, lr 5e-5, the outcome rewards), each a fresh process with the machine's default
threads and no pinning, so every arm has the same cores: K = 0 samples in the trainer; K ≥ 1 adds the rollout
worker process (rollout.async_threads, by default half the cores) beside the trainer. An arm named ``<K>tis`` adds
the off-policy correction token_truncate at 2.

- ``--mode speed`` (``--steps`` steps, 20 held-out problems at the start and the end): the arms run interleaved
  (0, 1, 0, 1, …) ``--repeats`` times; printed per arm is the median over steps 3 and later of the trainer's step
  time (the sum of its logged phases: with a worker, time/generate_score_s is the wait for the rollout), its ratio
  to the K = 0 run of the same repeat (median and range), and the worker's figures (async/trainer_wait_s,
  async/rollout_busy_s, async/weight_sync_s). The overlap's bound is max(sample, update) / (sample + update) of
  the K = 0 arm's phases, printed beside it.
- ``--workload 29m`` (speed only): the GRPO workload of bench/sampling_dtype.py instead — `tether grpo` on the 29.9 M
  Llama of bench/stages.py (random weights, the lab's tokenizer), 8 prompts × 4 responses of 48 tokens a step.
- ``--workload ppo``: the lab's PPO stage instead (tether.lab.rl.run_lab_ppo: the SFT policy against rm_filtered,
  32 prompts a step, lr 5e-5, the lab's β); in learn mode each arm and seed runs β = 0 and β = 0.2 (the lab's
  ppo_kl0 and ppo_kl0.2 at 60 steps), judged by the lab's two PPO rules (kl_rope: β = 0.2 beats the SFT model on
  gold; overoptimisation: β = 0's late gold below its peak and below β = 0.2's), with the gold curves.
- ``--workload shop``: the lab's shop agent instead (tether.lab.runners.shop_stage's run: GRPO with the shop
  environment, multi-turn episodes, which the worker draws whole with environments of its own); in speed mode
  rewarded on the order's state with 20 held-out requests; in learn mode each arm and seed runs both rewards (the
  lab's shop_state and shop_claim stages), judged by the lab's two shop rules.
- ``--mode learn`` (the lab's steps and evaluation, LabConfig): per arm and seed, the lab's grpo_outcome rule
  (tether/lab/lessons.py) on the run's figures, the sampled and greedy accuracy at each evaluation, the staleness and
  the importance ratio's spread (rollout/is_ratio_p1 … p99) where a correction ran.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

BACKEND = {"name": "hf", "dynamic": False}  # --backend and --dynamic-sampling, every arm's of one invocation


def arm_settings(arm: str) -> dict:
    k = int(arm.removesuffix("tis"))
    extra: dict = {"rollout.max_staleness": k} if k else {}
    if BACKEND["name"] == "vllm":  # the engine in the trainer (K = 0) or in the rollout worker (K ≥ 1)
        extra |= {"rollout.backend": "vllm", "rollout.vllm_kv_cache_gib": 0.25}
    if BACKEND["dynamic"]:  # DAPO's dynamic sampling on the lab's GRPO stage (its binary outcome reward)
        extra |= {"algo.dynamic_sampling": True}
    if arm.endswith("tis"):
        extra |= {"rollout.off_policy_correction": "token_truncate", "rollout.is_ratio_max": 2.0}
    return extra


def run_one(lab: Path, folder: Path, arm: str, seed: int, mode: str, steps: int) -> None:
    """One run in this process (called through ``--one``); writes result.json into folder."""
    from tether.lab.lessons import grpo_outcome
    from tether.lab.rl import run_lab_grpo
    from tether.lab.settings import LabConfig

    cfg = LabConfig()
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    speed = mode == "speed"
    problems = 20 if speed else cfg.grpo_eval_problems
    t0 = time.perf_counter()
    figures = run_lab_grpo(
        folder,
        False,
        lab=lab,
        recipe=cfg.grpo_recipe,
        rewards="outcome",
        steps=steps if speed else cfg.grpo_steps,
        prompts_per_step=cfg.grpo_prompts_per_step,
        group_size=cfg.grpo_group_size,
        lr=cfg.grpo_lr,
        eval_every=steps if speed else cfg.grpo_eval_every,
        eval_problems=problems,
        eval_samples=1 if speed else cfg.grpo_eval_samples,
        seed=seed,
        extra=arm_settings(arm),
    )
    result = {
        "wall_s": time.perf_counter() - t0,
        **step_figures(folder / "run" / "metrics.jsonl"),
        "curve": [
            {k: c[k] for k in ("step", "accuracy_sampled", "accuracy_greedy", "accuracy_sampled_se")}
            for c in figures["curve"]
        ],
        "lesson": grpo_outcome({"grpo": {"grpo_outcome": figures}}, problems).as_dict(),
    }
    (folder / "result.json").write_text(json.dumps(result))


def run_ppo(lab: Path, folder: Path, arm: str, seed: int, mode: str, steps: int, beta: float) -> None:
    """One run of the lab's PPO stage at β = ``beta`` in this process; writes result.json as run_one does, with the
    stage's figures whole (``figures``: what the lab's PPO rules read)."""
    from tether.lab.rl import run_lab_ppo
    from tether.lab.settings import LabConfig

    cfg = LabConfig()
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    speed = mode == "speed"
    t0 = time.perf_counter()
    figures = run_lab_ppo(
        folder,
        False,
        lab=lab,
        reward_model=cfg.ppo_reward_model,
        kl_coef=beta,
        adaptive_target=0.0,
        steps=steps if speed else cfg.ppo_steps,
        prompts_per_step=cfg.ppo_prompts_per_step,
        lr=cfg.ppo_lr,
        eval_every=steps if speed else cfg.ppo_eval_every,
        eval_samples=1 if speed else cfg.ppo_eval_samples,
        seed=seed,
        extra=arm_settings(arm),
    )
    result = {"wall_s": time.perf_counter() - t0, **step_figures(folder / "run" / "metrics.jsonl"), "figures": figures}
    (folder / "result.json").write_text(json.dumps(result))


def run_shop(lab: Path, folder: Path, arm: str, seed: int, mode: str, steps: int, reward: str) -> None:
    """One run of the lab's shop stage rewarded on ``reward`` (state or claim) in this process; writes result.json
    as run_ppo does (``figures``: what the lab's shop rules read)."""
    from tether.lab.agents import run_lab_agent_grpo
    from tether.lab.runners import SHOP_BUDGET, agent_settings, read_rows
    from tether.lab.settings import LabConfig

    cfg = LabConfig(seed=seed)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    speed = mode == "speed"
    settings = agent_settings(cfg) | ({"steps": steps, "eval_every": steps, "eval_samples": 1} if speed else {})
    eval_rows = read_rows(lab / "agent_world" / "shop_eval.jsonl")
    t0 = time.perf_counter()
    figures = run_lab_agent_grpo(
        folder,
        False,
        model_dir=lab / "shop_sft" / "final",
        env=f"tether.lab.agents:ShopEnv(reward='{reward}')",
        prompts=lab / "agent_world" / "shop_rl.jsonl",
        eval_rows=eval_rows[:20] if speed else eval_rows,
        lr=cfg.shop_lr,
        **SHOP_BUDGET,
        **settings,
        extra=arm_settings(arm),
    )
    result = {"wall_s": time.perf_counter() - t0, **step_figures(folder / "run" / "metrics.jsonl"), "figures": figures}
    (folder / "result.json").write_text(json.dumps(result))


def step_figures(metrics: Path) -> dict:
    """The trainer's step time (median over steps 3 and later of the sum of its logged phases), each phase's and
    each async/* figure's median, the largest staleness and the importance ratio's spread by step."""
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    later = [r for r in rows if r.get("step", 0) >= 3]
    return {
        "step_s": statistics.median(sum(v for k, v in r.items() if k.startswith("time/")) for r in later),
        "phases": {
            k: statistics.median(r.get(k, 0.0) for r in later)
            for k in later[0]
            if k.startswith("time/") or k.startswith("async/")
        },
        "staleness_max": max((r.get("async/staleness_max", 0.0) for r in rows), default=0.0),
        "ratio_spread": [[r.get("rollout/is_ratio_p1"), r.get("rollout/is_ratio_p99")] for r in rows],
        "dropped": rows[-1].get("async/dropped", 0.0),  # a running count
    }


def run_29m(lab: Path, folder: Path, arm: str, steps: int) -> None:
    """The 29.9 M workload through the command line; writes result.json as run_one does (speed figures only)."""
    import importlib.util

    from tether.cli import main as tether_main

    spec = importlib.util.spec_from_file_location("bench_sampling_dtype", Path(__file__).parent / "sampling_dtype.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    model = module.stages.build_model(lab, folder.parent / "model-29m")
    settings = arm_settings(arm).items()
    extra = [f"--{k.split('.')[1].replace('_', '-')}={v}" for k, v in settings if k != "rollout.backend"]
    t0 = time.perf_counter()
    if tether_main([*module.grpo_args(lab, model, folder / "run", BACKEND["name"], steps), *extra]) != 0:
        raise SystemExit(f"tether grpo failed for arm {arm}")
    result = {"wall_s": time.perf_counter() - t0, **step_figures(folder / "run" / "metrics.jsonl")}
    (folder / "result.json").write_text(json.dumps(result))


def launch(
    lab: Path, folder: Path, arm: str, seed: int, mode: str, steps: int, beta: float = 0.2, reward: str = "state"
) -> dict:
    command = [sys.executable, __file__, "--one", arm, str(seed), mode, str(steps), "--lab", str(lab)]
    command += ["--beta", str(beta), "--reward", reward, "--backend", BACKEND["name"]]
    command += ["--dynamic-sampling"] if BACKEND["dynamic"] else []
    folder.parent.mkdir(parents=True, exist_ok=True)
    log_path = folder.parent / f"{folder.name}.log"  # not with_suffix: "kl0.2-K1" has a dot
    with open(log_path, "w") as log:
        code = subprocess.call([*command, "--out", str(folder)], stdout=subprocess.DEVNULL, stderr=log)
    if code != 0:
        raise SystemExit(f"arm {arm} seed {seed} failed ({code}): see {log_path}")
    return json.loads((folder / "result.json").read_text())


def print_speed(results: dict, arms: list[str], steps: int) -> None:
    base = results[arms[0]]
    print(
        f"\ntrainer step seconds, median over steps 3–{steps} ({len(base)} interleaved repeats, {os.cpu_count()} cores)"
    )
    for arm in arms:
        runs = results[arm]
        ratios = [r["step_s"] / b["step_s"] for r, b in zip(runs, base)]
        step = statistics.median(r["step_s"] for r in runs)
        line = f"K={arm:5s} step {step:6.3f} s  ratio {statistics.median(ratios):.2f} [{min(ratios):.2f}, {max(ratios):.2f}]"
        phases = {k: statistics.median(r["phases"][k] for r in runs) for k in runs[0]["phases"]}
        line += "  " + ", ".join(f"{k.split('/')[1]} {v:.3f}" for k, v in sorted(phases.items()))
        print(line)
    sync = {k: statistics.median(r["phases"][k] for r in base) for k in base[0]["phases"]}
    sample = sync.get("time/generate_score_s", sync.get("time/generate_s", 0.0) + sync.get("time/score_s", 0.0))
    update = sync.get("time/logprobs_s", 0.0) + sync.get("time/update_s", 0.0)
    if sample + update > 0:
        print(
            f"overlap bound max(sample, update)/(sample + update) on K={arms[0]}'s phases: "
            f"{max(sample, update) / (sample + update):.2f} (sample {sample:.3f} s, update {update:.3f} s)"
        )


def print_learn(results: dict, arms: list[str], seeds: list[int]) -> None:
    print("\nthe lab's grpo_outcome rule per arm and seed (accuracy sampled at the training temperature)")
    for arm in arms:
        for seed, r in zip(seeds, results[arm]):
            lesson = r["lesson"]
            verdict = {True: "holds", False: "does NOT hold", None: "not measured"}[lesson["holds"]]
            curve = " ".join(f"{c['step']}:{c['accuracy_sampled']:.3f}/{c['accuracy_greedy']:.3f}" for c in r["curve"])
            print(f"K={arm:5s} seed {seed}: {lesson['evidence']} — {verdict}")
            print(
                f"    sampled/greedy by step {curve}; staleness max {r['staleness_max']:.0f}, dropped {r['dropped']:.0f}"
            )
            spread = [s for s in r["ratio_spread"] if s[0] is not None]
            if spread:
                marks = spread[:: max(1, len(spread) // 8)]
                print("    is_ratio p1–p99 " + " ".join(f"{a:.3f}–{b:.3f}" for a, b in marks))


def print_pair_rules(results: dict, arms: list[str], seeds: list[int], title: str, summary_of, rules, curve) -> None:
    """Per arm and seed, the lab's rules over a pair of runs (``summary_of(pair)``: the lab summary they read) and
    each run's curve line (``curve(i, run)``)."""
    print(title)
    for arm in arms:
        for seed, pair in zip(seeds, results[arm]):
            summary = summary_of(pair)
            for lesson in (rule(summary) for rule in rules):
                verdict = {True: "holds", False: "does NOT hold", None: "not measured"}[lesson.holds]
                print(f"K={arm:5s} seed {seed} {lesson.name}: {lesson.evidence} — {verdict}")
            for i, r in enumerate(pair):
                print(f"    {curve(i, r)}; staleness max {r['staleness_max']:.0f}")


def print_learn_ppo(results: dict, arms: list[str], seeds: list[int]) -> None:
    from tether.lab.lessons import kl_rope, overoptimisation

    print_pair_rules(
        results,
        arms,
        seeds,
        "\nthe lab's PPO rules per arm and seed (β = 0 and β = 0.2 at each K)",
        lambda pair: {"ppo": {f"ppo_kl{beta:g}": r["figures"] for beta, r in zip(PPO_BETAS, pair)}},
        (kl_rope, overoptimisation),
        lambda i, r: (
            f"β={PPO_BETAS[i]:g} gold by step "
            + " ".join(f"{c['step']}:{c['gold']:.2f}" for c in r["figures"]["curve"])
        ),
    )


def print_learn_shop(results: dict, arms: list[str], seeds: list[int]) -> None:
    from tether.lab.lessons import shop_claim, shop_state

    print_pair_rules(
        results,
        arms,
        seeds,
        "\nthe lab's shop rules per arm and seed (rewarded on the order's state and on the claim at each K)",
        lambda pair: {"agents": {f"shop_{reward}": r["figures"] for reward, r in zip(SHOP_REWARDS, pair)}},
        (shop_state, shop_claim),
        lambda i, r: (
            f"{SHOP_REWARDS[i]}: true success (sampled) by step "
            + " ".join(
                f"{c['step']}:{c.get('success_rate_sampled', c['success_rate']):.2f}" for c in r["figures"]["curve"]
            )
        ),
    )


SHOP_REWARDS = ("state", "claim")  # the lab's shop_state and shop_claim, the runs its shop rules read
PPO_BETAS = (0.0, 0.2)  # the lab's ppo_kl0 and ppo_kl0.2, the two runs its PPO rules compare


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lab", default="runs/lab", help="A finished `tether lab` folder.")
    parser.add_argument("--mode", choices=("speed", "learn"), default="speed")
    parser.add_argument("--ks", default="0,1", help="arms: staleness bounds, '<K>tis' adds token_truncate at 2")
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8, help="speed mode: steps per run")
    parser.add_argument(
        "--workload", choices=("lab", "29m", "ppo", "shop"), default="lab", help="lab: GRPO; 29m: speed mode only"
    )
    parser.add_argument(
        "--backend",
        choices=("hf", "vllm"),
        default="hf",
        help="every arm's sampler (vllm: K ≥ 1 runs it in the worker)",
    )
    parser.add_argument("--dynamic-sampling", action="store_true", help="every arm with DAPO's dynamic sampling")
    parser.add_argument("--out", default="runs/bench-async-rollouts")
    parser.add_argument("--json", default="")
    parser.add_argument("--beta", type=float, default=0.2, help=argparse.SUPPRESS)  # a PPO run's (--one)
    parser.add_argument("--reward", default="state", help=argparse.SUPPRESS)  # a shop run's (--one)
    parser.add_argument("--one", nargs=4, metavar=("ARM", "SEED", "MODE", "STEPS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    BACKEND["name"], BACKEND["dynamic"] = args.backend, args.dynamic_sampling
    lab, out = Path(args.lab).resolve(), Path(args.out).resolve()
    if args.one:
        arm, seed, mode, steps = args.one
        if mode == "speed-29m":
            run_29m(lab, out, arm, int(steps))
        elif mode.endswith("-shop"):
            run_shop(lab, out, arm, int(seed), mode.removesuffix("-shop"), int(steps), args.reward)
        elif mode.endswith("-ppo"):
            run_ppo(lab, out, arm, int(seed), mode.removesuffix("-ppo"), int(steps), args.beta)
        else:
            run_one(lab, out, arm, int(seed), mode, int(steps))
        return
    arms, seeds = args.ks.split(","), [int(s) for s in args.seeds.split(",")]
    for arm in arms:
        arm_settings(arm)  # a malformed arm fails before any run
    results: dict = {arm: [] for arm in arms}
    if args.mode == "speed":
        for repeat in range(args.repeats):
            for arm in arms:
                folder = out / f"speed-{args.workload}-K{arm}-{repeat}"
                mode = {"lab": "speed", "29m": "speed-29m", "ppo": "speed-ppo", "shop": "speed-shop"}[args.workload]
                results[arm].append(launch(lab, folder, arm, seeds[0], mode, args.steps))
    elif args.workload == "ppo":
        for seed in seeds:
            for arm in arms:
                runs = [
                    launch(lab, out / f"learn-ppo-kl{beta:g}-K{arm}-seed{seed}", arm, seed, "learn-ppo", 0, beta)
                    for beta in PPO_BETAS
                ]
                results[arm].append(runs)
    elif args.workload == "shop":
        for seed in seeds:
            for arm in arms:
                runs = [
                    launch(lab, out / f"learn-shop-{r}-K{arm}-seed{seed}", arm, seed, "learn-shop", 0, reward=r)
                    for r in SHOP_REWARDS
                ]
                results[arm].append(runs)
    else:
        for seed in seeds:
            for arm in arms:
                results[arm].append(launch(lab, out / f"learn-K{arm}-seed{seed}", arm, seed, "learn", 0))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    if args.mode == "speed":
        print_speed(results, arms, args.steps)
    else:
        printer = {"ppo": print_learn_ppo, "shop": print_learn_shop}.get(args.workload, print_learn)
        printer(results, arms, seeds)


if __name__ == "__main__":
    main()
