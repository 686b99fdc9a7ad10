"""The lab's lessons over draws: chosen stages rerun from a finished lab over seeds × threads per stage.

A lab run is one draw. The same code gives other figures with another seed, and on CPU with another number of
threads (a reduction split over threads adds in another order), so a lesson that holds on one machine can fail on
another (docs/lab.md, "The lessons over draws"). This reruns the stages a lesson rests on — by default PPO at
β = 0 and β = 0.2 and the shop's SFT and state-rewarded run — from a finished lab's inputs (its SFT model, reward
models and worlds), for each seed and thread count, and judges every lesson on each draw with the rules `make lab`
prints (tether/lab/lessons.py).

    .venv/bin/python examples/lab_spread.py --lab runs/lab --seeds 0,1,2 --threads 1,2
    .venv/bin/python examples/lab_spread.py --lab runs/lab --seeds 0,1 --threads 2 --kernels native,avx2,default

``--kernels`` adds the CPU's kernel paths as draws: each draw's worker starts with ATEN_CPU_CAPABILITY set to the
path named (``native``: unset, the best this CPU has; ``avx2``, ``default``: what an older CPU would run), the
nearest this machine comes to another machine's arithmetic.

Each draw is a folder <output>/seed<S>-t<T> holding links to the lab's other stages and its own runs of the chosen
ones (the stage's seed is S; the stages it reads are the lab's). Draws run side by side, as many as the cores allow
at their thread count; a finished stage is reused on a rerun (the lab's cache: same recipe, same code). Prints one
row per draw and the lesson verdicts, and writes <output>/spread.json.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from tether.lab.lessons import OFFLINE_DPO, ON_POLICY_DPO, dpo_pairs, kl_rope, overoptimisation, shop_claim, shop_state
from tether.lab.plan import lab_plan
from tether.lab.schedule import code_fingerprint, run_in_worker, usable_cores, worker_init
from tether.lab.settings import QUICK, LabConfig

STAGES = ("ppo_kl0", "ppo_kl0.2", "shop_sft", "shop_state")
FAMILY = {
    "ppo_kl0": "ppo",
    "ppo_kl0.2": "ppo",
    "shop_state": "agents",
    "shop_claim": "agents",
    "dpo_sigmoid": "dpo",
    OFFLINE_DPO: "dpo",
    **{name: "dpo" for name in ON_POLICY_DPO},
}


def draw_name(seed: int, threads: int, kernels: str = "native") -> str:
    return f"seed{seed}-t{threads}" + ("" if kernels == "native" else f"-{kernels}")


def draw_folder(lab: Path, output: Path, stages: list[str], seed: int, threads: int, kernels: str = "native") -> Path:
    """<output>/seed<S>-t<T>[-<kernels>]: links to every finished stage of the lab except the ones this draw
    computes."""
    folder = output / draw_name(seed, threads, kernels)
    folder.mkdir(parents=True, exist_ok=True)
    for child in sorted(lab.iterdir()):
        link = folder / child.name
        if not child.is_dir() or child.name in stages or child.name == "logs":
            continue
        if link.is_symlink() and link.resolve() != child.resolve():  # a link into another lab, from an earlier call
            link.unlink()
        if not link.exists():
            link.symlink_to(child.resolve(), target_is_directory=True)
    return folder


def needs_hashes(folder: Path, names: tuple) -> dict[str, str]:
    """The recipe hash of each stage a draw's stage reads (the lab's, through a link, or the draw's own), so a draw
    cached from one lab is not reused for another (the lab's own plan keys a stage on its inputs the same way)."""
    out = {}
    for name in names:
        done = folder / name / "stage.json"
        if not done.is_file():
            raise SystemExit(f"{folder / name}: the stage is not finished in the lab; run the lab (make lab) first")
        out[name] = json.loads(done.read_text())["recipe_hash"]
    return out


def run_draw(
    lab: str, output: str, stages: list[str], seed: int, threads: int, quick: bool = False, kernels: str = "native"
) -> dict:
    """Every chosen stage of one draw, in the plan's order, on `threads` threads: {stage: figures}."""
    folder = draw_folder(Path(lab), Path(output), stages, seed, threads, kernels)
    cfg = replace(QUICK if quick else LabConfig(), seed=seed)
    plan = [s for s in lab_plan(folder, cfg) if s.name in stages]
    (folder / "logs").mkdir(exist_ok=True)
    code, results = code_fingerprint(), {}
    for stage in plan:
        recipe = {**stage.recipe, "seed": seed, "threads": threads, "needs": needs_hashes(folder, stage.needs)}
        log = str(folder / "logs" / f"{stage.name}.log")
        _, results[stage.name] = run_in_worker(
            (lab_plan, (folder, cfg)), str(folder), stage.name, recipe, False, code, threads, log
        )
    return results


def judge(results: dict) -> dict:
    """The lessons these stages decide, on one draw's figures."""
    summary: dict = {"ppo": {}, "agents": {}, "dpo": {}}
    for name, figures in results.items():
        if name in FAMILY:
            summary[FAMILY[name]][name] = figures
    return {
        lesson.name: lesson
        for lesson in (
            kl_rope(summary),
            overoptimisation(summary),
            shop_state(summary),
            shop_claim(summary),
            dpo_pairs(summary),
        )
        if lesson.holds is not None
    }


def row(results: dict) -> dict:
    """The figures a reader compares across draws."""
    out = {}
    for name in ("ppo_kl0", "ppo_kl0.2"):
        if name in results:
            r = results[name]
            out[f"{name} gold start/peak/end"] = [
                round(r["start_gold"], 3),
                round(r["peak_gold"], 3),
                round(r["final_gold"], 3),
            ]
            out[f"{name} win rate"] = round(r["final_win_rate"], 3)
            out[f"{name} proxy start/end"] = [round(r["start_proxy"], 3), round(r["final_proxy"], 3)]
            alarm = min(r["alarms"], key=lambda a: a["step"]) if r["alarms"] else None
            out[f"{name} first alarm"] = f"{alarm['monitor']} ({alarm['step']})" if alarm else "none"
            late = r.get("late")
            if late is not None:
                out[f"{name} late gold [interval]"] = [round(late["gold"], 3), [round(x, 3) for x in late["gold_ci"]]]
            peak = max(r["curve"], key=lambda c: c["gold"])
            if name == "ppo_kl0" and late is not None and peak["step"] not in late["steps"]:
                # the lesson's margin: how far the late gold interval lies below the peak's (negative: they overlap)
                out["ppo_kl0 fall beyond the noise"] = round(peak["gold_ci"][0] - late["gold_ci"][1], 3)
    for name in ("dpo_sigmoid", OFFLINE_DPO, *ON_POLICY_DPO):
        if name in results:
            r = results[name]
            out[f"{name} gold end [interval]"] = [round(r["final_gold"], 3), [round(x, 3) for x in r["final_gold_ci"]]]
            if name in ("dpo_sigmoid", OFFLINE_DPO):
                out[f"{name} win rate"] = round(r["final_win_rate"], 3)
                out[f"{name} win rate interval"] = [round(x, 3) for x in r["final_win_rate_ci"]]
    if "shop_state" in results:
        r = results["shop_state"]
        out["shop_state success start/end"] = [r["start"]["success_rate"], r["final"]["success_rate"]]
        if "success_rate_sampled" in r["start"]:
            out["shop_state sampled success start/end"] = [
                r["start"]["success_rate_sampled"],
                r["final"]["success_rate_sampled"],
            ]
        training = r["training"]["agent/success_rate"]
        out["shop_state training success first/last 3 steps"] = [
            round(training["first3"], 3),
            round(training["last3"], 3),
        ]
    return out


KERNELS = ("native", "avx512", "avx2", "default")  # ATEN_CPU_CAPABILITY's values; native: left unset


@contextmanager
def kernel_path(kernel: str):
    """ATEN_CPU_CAPABILITY set to ``kernel`` (unset for native) while the pools it covers spawn their workers."""
    before = os.environ.pop("ATEN_CPU_CAPABILITY", None)
    if kernel != "native":
        os.environ["ATEN_CPU_CAPABILITY"] = kernel
    try:
        yield
    finally:
        os.environ.pop("ATEN_CPU_CAPABILITY", None)
        if before is not None:
            os.environ["ATEN_CPU_CAPABILITY"] = before


def counts(flag: str, text: str, least: int) -> list[int]:
    """A comma-separated list of whole numbers ≥ least, or a clear exit naming the flag and the item."""
    out = []
    for item in text.split(","):
        if not item.strip().isdigit() or int(item) < least:
            raise SystemExit(f"{flag} {text}: {item!r} is not a whole number of at least {least}")
        out.append(int(item))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lab", default="runs/lab")
    parser.add_argument("--output", default="runs/lab-spread")
    parser.add_argument("--stages", default=",".join(STAGES))
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--kernels", default="native", help="CPU kernel paths: native, avx512, avx2, default")
    parser.add_argument("--quick", action="store_true", help="the quick lab's settings (`tether lab --quick`)")
    args = parser.parse_args()
    lab, output = Path(args.lab), Path(args.output)
    if not (lab / "summary.json").is_file():
        raise SystemExit(f"{lab}: not a finished lab (no summary.json); run `make lab` first")
    cfg = QUICK if args.quick else LabConfig()
    known = [s.name for s in lab_plan(lab, cfg)]
    stages = args.stages.split(",")
    unknown = [s for s in stages if s not in known]
    if unknown:
        raise SystemExit(f"--stages: no lab stage named {', '.join(unknown)}; the lab's stages are {', '.join(known)}")
    kernels = args.kernels.split(",")
    if not set(kernels) <= set(KERNELS):
        raise SystemExit(f"--kernels {args.kernels}: each of {', '.join(KERNELS)}")
    draws = [(s, t) for t in counts("--threads", args.threads, 1) for s in counts("--seeds", args.seeds, 0)]
    cores = usable_cores()
    output.mkdir(parents=True, exist_ok=True)
    spread = {}
    # draws on t threads run cores // t side by side; the one-thread draws first, then the others; each kernel path
    # in pools of its own, whose spawned workers start with ATEN_CPU_CAPABILITY set (read when torch starts)
    for kernel in kernels:
        for threads in sorted({t for _, t in draws}):
            batch = [(s, t) for s, t in draws if t == threads]
            with (
                kernel_path(kernel),
                ProcessPoolExecutor(
                    max(1, cores // threads), mp_context=multiprocessing.get_context("spawn"), initializer=worker_init
                ) as pool,
            ):
                futures = {
                    pool.submit(run_draw, str(lab), str(output), stages, s, t, args.quick, kernel): (s, t)
                    for s, t in batch
                }
                for future, (s, t) in futures.items():
                    results = future.result()
                    lessons = judge(results)
                    name = draw_name(s, t, kernel)
                    spread[name] = {
                        "figures": row(results),
                        "lessons": {n: {"holds": lesson.holds, "line": lesson.line} for n, lesson in lessons.items()},
                    }
                    print(json.dumps({"draw": name, **spread[name]}), flush=True)
    verdicts: dict = {}
    for draw in spread.values():
        for name, lesson in draw["lessons"].items():
            verdicts.setdefault(name, []).append(lesson["holds"])
    for name, holds in verdicts.items():
        print(f"{name}: holds on {sum(holds)} of {len(holds)} draws")
    numbers = {}
    for draw in spread.values():
        for key, value in draw["figures"].items():
            if isinstance(value, (int, float)):
                numbers.setdefault(key, []).append(value)
    for key, values in numbers.items():
        sd = statistics.stdev(values) if len(values) > 1 else 0.0
        print(f"{key}: mean {statistics.mean(values):.3f} ± {sd:.3f} [{min(values):.3f}, {max(values):.3f}]")
    (output / "spread.json").write_text(json.dumps({"draws": spread, "verdicts": verdicts}, indent=2))


if __name__ == "__main__":
    main()
