"""The lab's stages: a cache keyed on each stage's recipe, and a scheduler that runs independent stages side by side.

A stage writes into <output>/<name>/ and finishes by writing stage.json with the hash of its recipe: its own
settings, the hashes of the stages it reads, and a fingerprint of tether's code. A later run skips a stage whose
stage.json carries the same hash; a training stage that was killed resumes from its last checkpoint.

With ``workers`` > 1, every stage whose inputs are ready runs on a worker process, and a stage that has the
machine to itself gets every core as threads. Why processes as well as threads: a lab stage's generation loop is
mostly Python per token, which a second thread does not speed; measured on two cores, a stage on one thread takes
1.3-2.0x as long as alone on two, so two stages side by side do about 1.26x the work (docs/lab.md, "The stages").
The figures do not depend on it: every stage is seeded, and a worker's stage computes what the same stage computes
inline (tests/test_lab_pipeline.py checks it, number for number).
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import shutil
import time
import traceback
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from tether.console import console, output_to
from tether.train.checkpoint import latest_checkpoint


@dataclass(frozen=True)
class Stage:
    """One stage of a plan: its folder name, its own settings, the stages whose outputs it reads (their hashes are
    part of its recipe, and it starts once they are done), the summary table it belongs to (None: its own key), and
    ``run(folder, resume) -> figures`` (JSON)."""

    name: str
    recipe: dict
    needs: tuple = ()
    family: str | None = None
    run: Callable[[Path, bool], dict] | None = field(default=None, compare=False, repr=False)


def _hash(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:12]


def code_fingerprint(root: Path | None = None) -> str:
    """A hash of every .py file of the tether package (relative paths and contents). Every stage's recipe includes
    it, so after any change to tether's code a stage is computed again instead of showing figures an older build
    made. Deliberately the whole package, not a guessed list of the modules a stage uses: a list that missed one
    would bring the stale figures back."""
    root = root or Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


class Stages:
    """Runs stages into one folder, skipping those whose stage.json matches their recipe (and tether's code)."""

    def __init__(self, output: Path, fresh: bool = False, code: str | None = None):
        self.output = Path(output)
        self.fresh = fresh
        self.timings: dict[str, float] = {}
        self.cached: dict[str, bool] = {}
        self.code = code or code_fingerprint()

    def recipe_hash(self, recipe: dict) -> str:
        return _hash({**recipe, "code": self.code})

    def cached_result(self, name: str, recipe_hash: str):
        """The stage's figures when its stage.json carries ``recipe_hash`` (recorded as cached), else None."""
        done = self.output / name / "stage.json"
        if self.fresh or not done.is_file():
            return None
        record = json.loads(done.read_text())
        if record.get("recipe_hash") != recipe_hash:
            return None
        console.print(f"lab: {name}: cached ({self.output / name})", style="dim")
        self.timings[name], self.cached[name] = record["seconds"], True
        return record["result"]

    def run(self, name: str, recipe: dict, fn):
        """(hash, figures) of one stage, computed here unless cached; a killed stage with the same recipe resumes."""
        folder = self.output / name
        recipe_hash = self.recipe_hash(recipe)
        recipe = {**recipe, "code": self.code}  # recipe.json records what the hash covers
        hit = self.cached_result(name, recipe_hash)
        if hit is not None:
            return recipe_hash, hit
        started = folder / "recipe.json"
        resume = (
            not self.fresh
            and started.is_file()
            and json.loads(started.read_text()).get("recipe_hash") == recipe_hash
            and (latest_checkpoint(folder) or latest_checkpoint(folder / "run")) is not None
        )
        if not resume:
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
            started.write_text(json.dumps({"recipe_hash": recipe_hash, "recipe": recipe}, indent=2, default=str))
        console.print(f"lab: {name}" + (" (resuming)" if resume else ""), style="bold")
        t0, began = time.perf_counter(), time.time()
        result = fn(folder, resume)
        seconds = round(time.perf_counter() - t0, 1)
        done = folder / "stage.json"
        tmp = done.with_suffix(".tmp")
        # began/ended (Unix time): when stages ran side by side, and in which order
        tmp.write_text(
            json.dumps(
                {
                    "recipe_hash": recipe_hash,
                    "seconds": seconds,
                    "began": began,
                    "ended": time.time(),
                    "result": result,
                },
                indent=2,
            )
        )
        tmp.replace(done)
        self.timings[name], self.cached[name] = seconds, False
        return recipe_hash, result

    def run_plan(self, plan: list[Stage], workers: int = 1, rebuild: tuple | None = None) -> dict[str, dict]:
        """Every stage of ``plan`` (listed after the stages it needs): {name: figures}. ``workers`` > 1 runs ready
        stages on that many processes; each rebuilds the plan as ``rebuild[0](*rebuild[1])`` (a module-level
        function and its arguments) and runs its stage from there."""
        hashes: dict[str, str] = {}
        recipes: dict[str, dict] = {}
        for stage in plan:
            missing = [n for n in stage.needs if n not in hashes]
            if missing:
                raise ValueError(f"lab plan: stage {stage.name!r} needs {missing}, which no earlier stage makes")
            recipes[stage.name] = {**stage.recipe, "needs": {n: hashes[n] for n in stage.needs}}
            hashes[stage.name] = self.recipe_hash(recipes[stage.name])
        if workers <= 1:
            return {s.name: self.run(s.name, recipes[s.name], s.run)[1] for s in plan}
        if rebuild is None:
            raise ValueError("run_plan with workers > 1 needs rebuild=(plan function, its arguments)")
        results = self._run_on_workers(plan, recipes, hashes, workers, rebuild)
        order = [s.name for s in plan]
        self.timings = {n: self.timings[n] for n in order}
        self.cached = {n: self.cached[n] for n in order}
        return {n: results[n] for n in order}

    def _run_on_workers(self, plan: list[Stage], recipes: dict, hashes: dict, workers: int, rebuild: tuple) -> dict:
        pending, running, results = list(plan), {}, {}
        # among ready stages, those that others wait for go first (the agent chain's SFT before a lone RL stage)
        waited_on = {s.name: sum(s.name in t.needs for t in plan) for s in plan}
        cores = usable_cores()
        logs = self.output / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"), initializer=worker_init)
        try:
            while pending or running:
                ready = [s for s in pending if all(n in results for n in s.needs)]
                hits = [(s, self.cached_result(s.name, hashes[s.name])) for s in ready]
                hits = [(s, r) for s, r in hits if r is not None]
                for stage, result in hits:
                    results[stage.name] = result
                    pending.remove(stage)
                if hits:
                    continue
                start = sorted(ready, key=lambda s: -waited_on[s.name])[: workers - len(running)]
                threads = max(1, cores // (len(running) + len(start))) if start else 1
                for stage in start:
                    log = logs / f"{stage.name}.log"
                    console.print(
                        f"lab: {stage.name} (worker, {threads} thread{'s' * (threads > 1)}; log {log})", style="bold"
                    )
                    running[
                        pool.submit(
                            run_in_worker,
                            rebuild,
                            str(self.output),
                            stage.name,
                            recipes[stage.name],
                            self.fresh,
                            self.code,
                            threads,
                            str(log),
                        )
                    ] = stage
                    pending.remove(stage)
                if not running:
                    raise RuntimeError(f"lab plan: nothing can start; waiting: {[s.name for s in pending]}")
                finished, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in finished:
                    stage = running.pop(future)
                    log = logs / f"{stage.name}.log"
                    try:
                        seconds, results[stage.name] = future.result()
                    except BaseException:
                        tail = log.read_text(errors="replace").splitlines()[-25:] if log.is_file() else []
                        console.print(f"lab: {stage.name} failed; the end of {log}:", style="red")
                        console.print("\n".join(tail), highlight=False)
                        if running:
                            console.print(
                                f"lab: waiting for {', '.join(s.name for s in running.values())} to end "
                                "(a later run reuses them)"
                            )
                        raise
                    self.timings[stage.name], self.cached[stage.name] = seconds, False
                    console.print(f"lab: {stage.name} done in {seconds:.1f} s")
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        return results


def worker_init() -> None:
    """A worker dies with the lab's process (Linux): a killed `tether lab` leaves no stage running on, which a
    resumed run would otherwise start a second time into the same folder."""
    from tether.console import quiet_libraries
    from tether.processes import die_with_parent

    die_with_parent()
    quiet_libraries()


def run_in_worker(
    rebuild: tuple, output: str, name: str, recipe: dict, fresh: bool, code: str, threads: int, log: str
) -> tuple[float, dict]:
    import torch

    torch.set_num_threads(threads)
    build, args = rebuild
    stage = next(s for s in build(*args) if s.name == name)
    stages = Stages(Path(output), fresh, code)
    with output_to(log):
        try:
            _, result = stages.run(name, recipe, stage.run)
        except BaseException:
            traceback.print_exc()
            raise
    return stages.timings[name], result
