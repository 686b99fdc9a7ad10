"""Sampling beside the trainer: a rollout worker process that draws the next steps' responses while the trainer
updates on this step's (rollout.max_staleness K ≥ 1, docs/scaling.md "Asynchronous rollouts").

The worker is a spawned process holding its own copy of the policy (built from the policy's config, in its dtype;
a LoRA policy's base model, pushed its weights with the adapters merged) and a Hugging Face sampler over it
(backends.HFGenerate, the KV-cache decode). It answers messages in the order they come, over one pipe:

    ("weights", v, path, probe)
                           load version v of the weights from a safetensors file, then answer ("loaded", v, lp):
                           lp the log-probs of the parity probe's tokens under them
    ("generate", key, prompts, seeds)
                           sample one response per prompt with the weights it holds, answer ("rollout", key, v, …)
    ("generate_ids", key, contexts, seeds, pixels, texts)
                           the same from token ids, a vision-language policy's prompts: ``pixels`` names a
                           safetensors file of each row's pixel tensors (the processor's, made by the trainer; the
                           worker removes it once read; a vLLM engine's request has the images too, and ``texts``),
                           or is None
    ("episodes", key, rows, seeds, greedy)
                           run one multi-turn episode per row (agent.env) with the weights it holds, start to end,
                           with environments of its own (agents/worker.py WorkerEpisodes: an AgentSampler built as
                           the trainer's), answer ("rollout", key, v, {"episodes": …, "faults": n}), the episodes
                           without their environments as JSON values (agents/worker.py episode_json), or
                           ({"fault": text}) when one failed with env_on_error = raise
    ("stop",)              end

Because the pipe keeps order, a request sent after version v's weights is sampled with v or later: the trainer
queues step t + K's prompts at the start of step t, right after pushing the weights of its t-th update, so every
rollout it trains on at update u was drawn by a version v ≥ u − K (the bound is checked again on arrival; a rollout
past it is dropped, counted and drawn again). Weights travel as files in two slots, written by the trainer and
read by the worker, so the trainer never writes the slot the worker may still be reading (each write waits for the
worker's acknowledgement of the version two pushes back); a file is tensors only (no pickle). The worker's
log-probs of the sampled tokens come back with the rollout (Rollout.sampler_logprobs), so the stage measures the gap
between the sampling version and the trainer and corrects it (rollout.off_policy_correction; decoupled PPO,
docs/algorithms.md §11).

After every push the trainer compares the worker's probe log-probs with its own of the same version (a fixed token
sequence, PARITY_TOLERANCE): a worker that kept older weights stops the run at the first push it got wrong, from the
first push at start-up on. A worker that dies, or answers nothing within rollout.worker_timeout_s, stops the run
with its pid, its exit code and its last words; it dies with the trainer (PR_SET_PDEATHSIG), so no orphan is left.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import shutil
import signal
import tempfile
import time
import traceback
import weakref
from collections.abc import Callable
from pathlib import Path

import torch

from tether.errors import ConfigError, WorkerError
from tether.models.lm import checkpoint_weights, is_peft
from tether.processes import before_sigterm_death
from tether.rollout.batch import Rollout
from tether.rollout.worker_wire import (
    PARITY_TOLERANCE,
    from_json,
    from_wire,
    pixels_digest,
    probe,
    probe_ids,
    probe_logprobs,
    read_pixels,
    to_json,
    to_wire,
    write_pixels,
)


def _orphaned(slots: str) -> None:
    """The trainer died: nobody else will remove its weight slots from shared memory (a model's weights twice, in
    RAM), so they are removed here, and the worker ends. Two signs, whichever comes first: the pipe's end of file
    (the kernel closes a dying trainer's files first) and SIGTERM (PR_SET_PDEATHSIG, sent as the trainer's thread
    that started this process exits, so getppid() may still name the trainer). A SIGTERM from anyone else ends the
    worker too, and with it the run: the trainer stops at its next word with the worker (RolloutWorkerError)."""
    shutil.rmtree(slots, ignore_errors=True)
    os._exit(1)


def _policy_copy(config, dtype: str, attn: str, device: str, sampled: bool):
    """The worker's copy of the policy (weights pushed later), of the class load_model would pick; a vision-language
    one it samples from (``sampled``: hf) never samples an image placeholder, as the trainer's does not."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    vision = hasattr(config, "vision_config")
    auto = AutoModelForImageTextToText if vision else AutoModelForCausalLM
    model = auto.from_config(config, dtype=getattr(torch, dtype), attn_implementation=attn).to(device).eval()
    if vision and sampled:
        from tether.models.vision import never_sample_placeholders

        never_sample_placeholders(model)
    return model


def _serve(
    conn,
    slots: str,
    config,
    dtype: str,
    attn: str,
    device: str,
    tokenizer,
    settings,
    stops: list[int],
    threads: int,
    seed: int,
    agent=None,
    processor=None,
) -> None:
    """The worker's loop (a spawned process), its copy of the policy on ``device`` (the trainer's); ``seed``: its
    RNG's, so a run draws the same responses each time it is run (the pipe's order fixes which weights draw which
    request); ``agent``: what it builds its episodes' sampler from (AsyncRolloutBackend.serve_episodes), or None;
    ``processor``: a vision-language policy's, for an engine that processes the images itself (vLLM)."""
    from safetensors.torch import load_file

    from tether.processes import die_with_parent, name_process
    from tether.rollout.backends import HFGenerate

    signal.signal(signal.SIGTERM, lambda *_: _orphaned(slots))
    die_with_parent(signal.SIGTERM)
    name_process(b"tether-rollout")
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    try:
        model = _policy_copy(config, dtype, attn, device, sampled=settings.backend != "vllm")
        if settings.backend == "vllm":  # the engine's scheduler here, its model in a process of vLLM's own
            from tether.rollout.vllm_backend import VLLMBackend

            sampler = VLLMBackend(model, tokenizer, settings, processor=processor)
        else:
            sampler = HFGenerate(model, tokenizer, settings, copy=True)
        episodes = agent[0](agent[1], tokenizer, sampler, settings, stops) if agent is not None else None
        version = -1
        while True:
            try:
                message = conn.recv()
            except EOFError:  # the trainer ended without a word: it was killed
                _orphaned(slots)
            if message[0] == "weights":
                _, version, path, ids = message
                model.load_state_dict(load_file(path), strict=True)  # the slot is free once this is answered
                sampler.weights_updated(model)  # a sampling-dtype copy or the engine takes them too
                conn.send(("loaded", version, probe(sampler, model, ids).tolist()))
            elif message[0] == "generate":
                _, key, prompts, seeds = message
                t0 = time.perf_counter()
                rollout = sampler.generate(prompts, settings, stops, seeds)
                conn.send(("rollout", key, version, to_wire(rollout), time.perf_counter() - t0))
            elif message[0] == "generate_ids":
                _, key, contexts, seeds, pixels, texts = message
                t0 = time.perf_counter()
                vision, images = read_pixels(pixels, len(contexts))
                shown = {"images": images or [[] for _ in contexts], "texts": texts} if texts is not None else {}
                rollout = sampler.generate_ids(contexts, settings, stops, seeds, vision=vision, **shown)
                rollout.prompts = [""] * len(contexts)  # the trainer has the texts
                conn.send(("rollout", key, version, to_wire(rollout), time.perf_counter() - t0))
            elif message[0] == "episodes":
                _, key, rows, seeds, greedy = message
                t0 = time.perf_counter()
                answer = episodes(rows, seeds, greedy)
                conn.send(("rollout", key, version, answer, time.perf_counter() - t0))
            else:
                if episodes is not None:
                    episodes.close()
                return
    except Exception:  # noqa: BLE001 - reported to the trainer, which raises it with the worker's traceback
        conn.send(("error", traceback.format_exc()))
    finally:  # a spawned process runs no exit handlers: its engine is stopped here, not cut off at exit
        if settings.backend == "vllm":
            from tether.rollout.vllm_backend import shutdown_engine

            shutdown_engine()


class RolloutWorkerError(WorkerError):
    """The rollout worker died, failed or went silent: the run stops (never a silent fallback to sampling here)."""


class AsyncRolloutBackend:
    """A GenerationBackend whose responses are drawn by a rollout worker process, ahead of the trainer by at most
    ``settings.max_staleness`` updates. ``prefetch`` queues a request the stage will ask for later (the same prompts
    and seeds); ``generate`` returns a queued request's rollout when it was queued, or asks for it now and waits."""

    samples_trainer_weights = False  # the worker's copy is the weights of some version, not the trainer's own
    draws_from_own_rng = True  # the worker's torch RNG, seeded once at its start
    reads_images = False  # a vision-language policy's pixels (and for vLLM its images) are sent by generate_ids

    def __init__(self, policy, tokenizer, settings, dp=None, processor=None):
        self.policy, self.tokenizer, self.settings = policy, tokenizer, settings
        # a vision-language policy's processor goes to a vLLM engine in the worker, which is sent the images too
        self.processor = processor if settings.backend == "vllm" else None
        self.reads_images = self.processor is not None
        # rollout_workers = one on N processes: process 0 owns the one worker and hands every process its rows
        # (``dp``'s collectives, every process in step); per_process: each process its own worker, no collective
        self.dp = dp
        self.one_worker = dp is not None and dp.active and settings.rollout_workers == "one"
        self.owner = not self.one_worker or dp.rank == 0
        self.max_staleness = settings.max_staleness
        self.timeout = settings.worker_timeout_s
        self.version = 0  # the trainer's: updates pushed so far (weights_updated calls)
        self.pushed = -1  # the newest version sent to the worker
        self.acked = -1  # the newest version the worker said it loaded
        self.slot_versions = [-1, -1]  # the version last written to each weights slot (-1: none yet)
        self.pending: list[tuple] = []  # keys queued, in the order the worker will answer them
        self.ready: dict[tuple, tuple[int, dict]] = {}  # key -> (version, rollout) answered, not yet taken
        self.dropped = 0  # rollouts that arrived past the staleness bound and were drawn again
        self.figures: dict[str, float] = {"sync_s": 0.0, "wait_s": 0.0, "busy_s": 0.0, "rows": 0.0}
        # named by the trainer's pid, which a test looks for once the trainer is killed
        shm = "/dev/shm" if Path("/dev/shm").is_dir() else None
        self.slots = Path(tempfile.mkdtemp(prefix=f"tether-weights-{os.getpid()}-", dir=shm))
        before_sigterm_death(lambda slots=str(self.slots): shutil.rmtree(slots, ignore_errors=True))  # gone or not
        self.process = self.conn = None
        self.trainer_threads = 0  # the trainer's threads before the worker took its share (CPU only)
        self.probe = probe_ids(tokenizer, policy.config)
        self.probes: dict[int, torch.Tensor] = {}  # version -> the trainer's probe log-probs, until the worker's come
        # the worker's episode sampler (builder, spec) and how an episode it sends reads back: serve_episodes
        self.agent = self.read_episode = None
        self.requests = 0  # pixel files written: each request's has a name of its own

    # ── the worker's life ──

    def _start(self, stops: list[int]) -> None:
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        config = (self.policy.get_base_model() if is_peft(self.policy) else self.policy).config
        dtype = str(next(self.policy.parameters()).dtype).removeprefix("torch.")
        # the cores are shared on a CPU: the worker takes async_threads (default half the trainer's), the trainer
        # what is left, so the two sides never ask for more threads than the trainer had (OpenMP threads that
        # outnumber the cores spin against each other: measured, docs/scaling.md)
        budget = torch.get_num_threads()
        threads = self.settings.async_threads or max(1, budget // 2)
        if next(self.policy.parameters()).device.type == "cpu":
            self.trainer_threads = budget  # given back at close
            torch.set_num_threads(max(1, budget - threads))
        device = str(next(self.policy.parameters()).device)
        attn = config._attn_implementation
        # the worker's RNG from the trainer's seed (the run's, train.seed): an asynchronous run is reproducible
        seed = torch.initial_seed()
        args = (child, str(self.slots), config, dtype, attn, device, self.tokenizer, self.settings, stops, threads)
        args += (seed, self.agent, self.processor)
        # a vLLM engine starts a process of its own, which a daemonic process may not: that worker is not daemonic,
        # and is stopped at exit by _close_at_exit instead (multiprocessing would otherwise wait for it at exit)
        daemon = self.settings.backend != "vllm"
        self.process = context.Process(target=_serve, args=args, daemon=daemon, name="tether-rollout")
        self.process.start()
        child.close()
        _LIVE.add(self)
        atexit.unregister(_close_at_exit)  # registered after the start, so after multiprocessing's own exit function:
        atexit.register(_close_at_exit)  # it runs first

    def close(self) -> None:
        if self.trainer_threads:
            torch.set_num_threads(self.trainer_threads)
            self.trainer_threads = 0
        if self.process is not None:
            if self.process.is_alive():
                self.conn.send(("stop",))
                self.process.join(5)
            if self.process.is_alive():
                self.process.kill()
                self.process.join(5)
        self.process = None
        if self.slots.is_dir():
            shutil.rmtree(self.slots)

    def __del__(self):
        try:
            self.close()
        except (OSError, AttributeError, TypeError):  # interpreter teardown: the worker dies with us anyway
            pass

    def _receive(self) -> tuple:
        """The worker's next message, or RolloutWorkerError when it died, failed or said nothing within the limit."""
        deadline = time.monotonic() + self.timeout
        while not self.conn.poll(1.0):
            if not self.process.is_alive():
                raise self._died()
            if time.monotonic() > deadline:
                raise RolloutWorkerError(
                    f"the rollout worker (pid {self.process.pid}) answered nothing in {self.timeout:g} s "
                    "(rollout.worker_timeout_s)"
                )
        try:
            message = self.conn.recv()
        except (EOFError, ConnectionResetError):  # the pipe's other end closed: the worker ended mid-answer
            raise self._died() from None
        if message[0] == "error":
            raise RolloutWorkerError(f"the rollout worker (pid {self.process.pid}) failed:\n{message[1]}")
        if message[0] == "loaded":
            self._check_parity(message[1], torch.tensor(message[2], dtype=torch.float64))
            self.acked = max(self.acked, message[1])
        else:
            _, key, version, data, seconds = message
            self.figures["busy_s"] += seconds
            self.pending.remove(key)
            self.ready[key] = (version, data if key[0] == "episodes" else from_wire(data, version))
        return message

    def _died(self) -> RolloutWorkerError:
        self.process.join(5)  # its exit code, once the kernel has it
        return RolloutWorkerError(
            f"the rollout worker (pid {self.process.pid}) died with exit code {self.process.exitcode}"
        )

    def _send(self, message: tuple) -> None:
        try:
            self.conn.send(message)
        except (BrokenPipeError, ConnectionResetError):  # the worker is gone
            raise self._died() from None

    # ── the weights ──

    def _check_parity(self, version: int, worker: torch.Tensor) -> None:
        """The worker's probe log-probs for ``version`` against the trainer's of the same version (PARITY_TOLERANCE):
        a worker that kept older weights, or loaded them wrongly, stops the run here."""
        gap = float((worker - self.probes.pop(version)).abs().max())
        self.figures["parity"] = max(self.figures.get("parity", 0.0), gap)
        if not gap <= PARITY_TOLERANCE:  # NaN included
            raise RolloutWorkerError(
                f"the rollout worker (pid {self.process.pid}) does not hold the weights of version {version}: its "
                f"log-probs of the parity probe differ from the trainer's by up to {gap:.3g} nats (at most "
                f"{PARITY_TOLERANCE:g} allowed)"
            )

    def _push(self) -> None:
        """Send the trainer's weights as version self.version (slot version % 2, once the worker has loaded the
        version that last used that slot)."""
        from safetensors.torch import save_file

        t0 = time.perf_counter()
        slot = self.version % 2
        # the version that last used the slot, not version − 2: versions counted while no worker ran (a resumed
        # run's updates before its first request) were never sent, and no answer would come for them
        while self.acked < self.slot_versions[slot]:
            self._receive()
        self.slots.mkdir(exist_ok=True)  # a worker that was sent SIGTERM removed it on its way out (_orphaned)
        path = self.slots / f"slot{slot}.safetensors"
        # a LoRA policy's adapters merged in (W + ΔW beside the weights): the worker holds the plain model
        state = {name: tensor.detach().to("cpu").clone() for name, tensor in checkpoint_weights(self.policy).items()}
        save_file(state, str(path))
        self.probes[self.version] = probe_logprobs(self.policy, self.probe)
        self._send(("weights", self.version, str(path), self.probe))
        self.pushed = self.slot_versions[slot] = self.version
        self.figures["sync_s"] += time.perf_counter() - t0

    def weights_updated(self, policy) -> None:
        self.policy = policy
        self.version += 1
        if self.one_worker:  # process 0 pushes; a worker found dead there stops every process here, together
            self._from_owner(lambda: self._push() if self.process is not None else None)
        elif self.process is not None:
            self._push()

    # ── requests ──

    def _submit(self, key: tuple, stops: list[int], message: tuple) -> None:
        if self.process is None:
            self._start(stops)
        if self.pushed < self.version:
            self._push()
        self._send(message)
        self.pending.append(key)

    def _take(self, key: tuple, ask: Callable[[], None], rows: int):
        """(version, answer) of a request: queued earlier (``ask`` sends it now if not); an answer drawn more than
        max_staleness updates back is dropped, counted, and drawn again with the newest weights."""
        if key not in self.pending and key not in self.ready:
            ask()
        t0 = time.perf_counter()
        while key not in self.ready:
            self._receive()
        self.figures["wait_s"] += time.perf_counter() - t0
        version, answer = self.ready.pop(key)
        self.figures["rows"] += rows
        if self.version - version > self.max_staleness:
            self.dropped += rows
            return self._take(key, ask, rows)
        return version, answer

    @staticmethod
    def _key(prompts: list[str], seeds: list[int] | None) -> tuple:
        return (tuple(prompts), tuple(seeds) if seeds is not None else None)

    def _everyone(self, prompts: list, seeds: list[int] | None) -> tuple[list, list | None, int, int]:
        """Every process's prompts (or episode rows) and seeds in rank order (a collective), and where this
        process's rows lie."""
        parts = self.dp.gather_json([[list(prompts), list(seeds) if seeds is not None else None]])
        start = sum(len(p) for p, _ in parts[: self.dp.rank])
        everyone = [x for p, _ in parts for x in p]
        seeds = None if any(s is None for _, s in parts) else [x for _, s in parts for x in s]
        return everyone, seeds, start, start + len(prompts)

    def _from_owner(self, fn, encode: Callable = to_json, decode: Callable = from_json):
        """fn() on process 0, which owns the one worker, and its result (or None) on every process (a collective),
        sent as the JSON values ``encode`` gives and read back by ``decode`` (a rollout's by default). A
        RolloutWorkerError there is raised on every process, so none waits for an answer that will not come."""
        result, error = None, None
        if self.owner:
            try:
                result = fn()
            except RolloutWorkerError as err:
                error = err
        sent = self.dp.broadcast_json(
            {"error": str(error or ""), "value": encode(result) if result is not None and not error else None}
        )
        if sent["error"]:
            raise error or RolloutWorkerError(f"the rollout worker beside process 0 stopped: {sent['error']}")
        return result if self.owner or sent["value"] is None else decode(sent["value"])

    def prefetch(self, prompts: list[str], stops: list[int], seeds: list[int] | None = None) -> None:
        """Queue a request the stage will make later with these prompts and seeds (rollout_workers = one: every
        process's, as one request to the one worker)."""
        self._ahead(prompts, seeds, lambda everyone, seeds: self._queue(everyone, stops, seeds))

    def _ahead(self, items: list, seeds: list[int] | None, queue: Callable) -> None:
        """queue(items, seeds) now; rollout_workers = one: every process's items and seeds, queued by process 0."""
        if self.one_worker:
            everyone, seeds, _, _ = self._everyone(items, seeds)
            self._from_owner(lambda: queue(everyone, seeds))
        else:
            queue(items, seeds)

    def _queue(self, prompts: list[str], stops: list[int], seeds: list[int] | None) -> None:
        key = self._key(prompts, seeds)
        if key not in self.pending and key not in self.ready:
            self._submit(key, stops, ("generate", key, list(prompts), list(seeds) if seeds is not None else None))

    def generate(self, prompts: list[str], sampling, stop_ids: list[int], seeds: list[int] | None = None) -> Rollout:
        if not self.one_worker:
            return self._draw(prompts, stop_ids, seeds)
        everyone, seeds, start, stop = self._everyone(prompts, seeds)
        return self._from_owner(lambda: self._draw(everyone, stop_ids, seeds)).select(torch.arange(start, stop))

    def _draw(self, prompts: list[str], stop_ids: list[int], seeds: list[int] | None) -> Rollout:
        key = self._key(prompts, seeds)
        message = ("generate", key, list(prompts), list(seeds) if seeds is not None else None)
        return self._take(key, lambda: self._submit(key, stop_ids, message), len(prompts))[1]

    # ── a vision-language policy's prompts: token ids with their pixel tensors ──

    def prefetch_ids(self, contexts: list, stops: list[int], seeds: list | None, vision: list, **shown) -> None:
        """Queue a request the stage will make later (generate_ids with the same arguments)."""
        key = self._ids_key(contexts, seeds, vision)
        if key not in self.pending and key not in self.ready:
            self._submit(key, stops, self._ids_message(key, contexts, seeds, vision, **shown))

    def generate_ids(
        self,
        contexts: list[list[int]],
        sampling,
        stop_ids: list[int],
        seeds: list[int] | None = None,
        max_new_tokens: int | None = None,
        greedy: bool = False,
        vision: list | None = None,
        **shown,
    ) -> Rollout:
        """A vision-language policy's responses (``vision``: each prompt's pixel tensors; the rollout keeps the
        trainer's). Multi-turn episodes are drawn whole by the worker (serve_episodes), never turn by turn here."""
        if vision is None or max_new_tokens is not None or greedy:
            raise RolloutWorkerError(
                "the rollout worker draws multi-turn episodes whole (serve_episodes), not turn by turn"
            )
        key = self._ids_key(contexts, seeds, vision)
        ask = lambda: self._submit(key, stop_ids, self._ids_message(key, contexts, seeds, vision, **shown))  # noqa: E731
        rollout = self._take(key, ask, len(contexts))[1]
        rollout.vision = list(vision)
        return rollout

    @staticmethod
    def _ids_key(contexts: list[list[int]], seeds: list[int] | None, vision: list[dict | None]) -> tuple:
        return ("ids", tuple(map(tuple, contexts)), tuple(seeds) if seeds is not None else None, pixels_digest(vision))

    def _ids_message(self, key: tuple, contexts, seeds, vision, images=None, texts=None) -> tuple:
        """The request's message, its pixels (and images) written beside the weight slots (the worker removes them)."""
        pixels = None
        if any(v is not None for v in vision):
            self.requests += 1
            pixels = self.slots / f"pixels-{self.requests}.safetensors"
            write_pixels(pixels, vision, images)
        seeds, texts = (list(x) if x is not None else None for x in (seeds, texts))
        return ("generate_ids", key, [list(c) for c in contexts], seeds, str(pixels) if pixels else None, texts)

    # ── multi-turn episodes (agent.env), drawn whole by the worker ──

    def serve_episodes(self, builder: Callable, spec: tuple, read: Callable) -> None:
        """The worker will draw episodes: ``builder(spec, tokenizer, sampler, settings, stops)`` makes, in the
        worker, what answers ("episodes", …) messages (agents/worker.py WorkerEpisodes), each episode as JSON values
        that ``read`` turns back into one here. ``spec`` is sent to the worker by value; one that cannot be is a
        ConfigError here, before the worker starts."""
        import pickle

        try:
            pickle.dumps(spec)
        except (pickle.PicklingError, AttributeError, TypeError) as err:
            raise ConfigError(
                f"--max-staleness: the rollout worker builds the environment in a process of its own, and the one "
                f"given cannot be sent there ({err}); name a class by module:Class, or hand the Python API a class "
                "defined at the top level of a module"
            ) from None
        self.agent, self.read_episode = (builder, spec), read

    @staticmethod
    def _episodes_key(rows: list[dict], seeds: list[int] | None, greedy: bool) -> tuple:
        import json

        text = tuple(json.dumps(row, sort_keys=True, default=str) for row in rows)
        return ("episodes", text, tuple(seeds) if seeds is not None else None, greedy)

    def prefetch_episodes(self, rows: list[dict], stops: list[int], seeds: list[int] | None = None) -> None:
        """Queue a later step's episodes (one per row, these seeds; rollout_workers = one: every process's, as one
        request to the one worker)."""
        self._ahead(rows, seeds, lambda everyone, seeds: self._queue_episodes(everyone, stops, seeds))

    def _queue_episodes(self, rows: list[dict], stops: list[int], seeds: list[int] | None) -> None:
        key = self._episodes_key(rows, seeds, False)
        if key not in self.pending and key not in self.ready:
            self._submit(key, stops, ("episodes", key, list(rows), seeds, False))

    def episodes(self, rows: list[dict], stops: list[int], seeds: list[int] | None, greedy: bool) -> tuple[int, dict]:
        """(version, answer) of one episode per row: queued earlier or drawn now; ``answer`` as WorkerEpisodes
        gives it, its episodes read back (serve_episodes). rollout_workers = one: process 0's worker draws every
        process's rows, and each process gets its share as JSON values; the environments' faults are counted once,
        by process 0 (the run sums them)."""
        if not self.one_worker:
            version, answer = self._episodes(rows, stops, seeds, greedy)
        else:
            everyone, seeds, start, stop = self._everyone(rows, seeds)
            drawn = self._from_owner(lambda: self._episodes(everyone, stops, seeds, greedy), encode=list, decode=tuple)
            version, answer = drawn
            if "episodes" in answer:
                answer = {"episodes": answer["episodes"][start:stop], "faults": answer["faults"] if self.owner else 0}
        if "episodes" in answer:
            answer = {**answer, "episodes": [self.read_episode(e) for e in answer["episodes"]]}
        return version, answer

    def _episodes(self, rows: list[dict], stops: list[int], seeds: list[int] | None, greedy: bool) -> tuple[int, dict]:
        key = self._episodes_key(rows, seeds, greedy)
        message = ("episodes", key, list(rows), seeds, greedy)
        return self._take(key, lambda: self._submit(key, stops, message), len(rows))

    def step_figures(self, rollout: Rollout) -> dict:
        """The step's figures (docs/metrics.md): the staleness of its responses (updates between the weights that
        drew them and the trainer's), responses drawn again past the bound, and the seconds the trainer spent writing
        weights and waiting for responses; the time counters start again."""
        staleness = (self.version - rollout.policy_versions).float()
        out = {
            "async/staleness_mean": float(staleness.mean()),
            "async/staleness_max": float(staleness.max()),
            "async/dropped": float(self.dropped),
            "async/weight_sync_s": self.figures["sync_s"],
            "async/parity_max_diff": self.figures.get("parity", 0.0),
            "async/trainer_wait_s": self.figures["wait_s"],
            "async/rollout_busy_s": self.figures["busy_s"],
            "async/worker_rows": self.figures["rows"],
        }
        self.figures = {"sync_s": 0.0, "wait_s": 0.0, "busy_s": 0.0, "rows": 0.0}
        return out

    def describe(self) -> str:
        engine = (
            "a vLLM engine, its model in a process of vLLM's own; the parity probe read from the engine"
            if self.settings.backend == "vllm"
            else "Hugging Face model, KV cache"
        )
        return (
            f"a rollout worker process beside the trainer ({engine}), at most "
            f"{self.max_staleness} update(s) behind; weights as files after every update"
            + ("; multi-turn episodes drawn whole there, with environments of its own" if self.agent else "")
            + (f"; one worker, beside process 0, for all {self.dp.world} processes" if self.one_worker else "")
        )


_LIVE: weakref.WeakSet = weakref.WeakSet()  # backends whose worker may be running


def _close_at_exit() -> None:
    """Stop every worker still running when the interpreter exits (a worker that is not daemonic is stopped here,
    not waited for by multiprocessing's own exit function)."""
    for backend in list(_LIVE):
        backend.close()
