"""A vLLM engine's life outside the backend's protocol (rollout/vllm_backend.py, rollout/vllm_judge.py): its
weights folder in shared memory, its start (the environment its worker inherits, vLLM's output sent to a log,
the main-script guard checked first) and a failed start read into one line, and the watchdog that removes the engine
and its folder when the trainer is killed."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import torch

from tether.console import output_to
from tether.errors import ConfigError
from tether.online_sections import VLLM_INSTALL as INSTALL


def _new_folder(prefix: str = "tether-vllm-") -> Path:
    """An empty folder in shared memory (/dev/shm where there is one, else the temporary folder): by default for the
    policy's config and weights."""
    shm = Path("/dev/shm")
    return Path(tempfile.mkdtemp(prefix=prefix, dir=shm if shm.is_dir() and os.access(shm, os.W_OK) else None))


_SOCKETS: list[Path] = []  # this process's folder for vLLM's sockets, made by its first engine


def sockets_folder() -> Path:
    """This process's folder for vLLM's ZMQ socket files (``VLLM_RPC_BASE_PATH``), made once: left to itself vLLM
    makes a socket file per channel in the temporary folder and leaves it there when the engine ends (about eight an
    engine), and it reads its environment once per process (its environment cache, from the first engine core on),
    so one folder serves every engine this process starts. Removed at exit, and by the watchdog should the process
    be killed. In /dev/shm where there is one, named by this process's id: a socket's path must fit in 107 bytes
    (sockaddr_un), which a long TMPDIR would overrun."""
    if not _SOCKETS:
        folder = _new_folder(f"tether-sockets-{os.getpid()}-")
        _SOCKETS.append(folder)
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        os.environ["VLLM_RPC_BASE_PATH"] = str(folder)  # this process's and its engine's (a child inherits it)
    return _SOCKETS[0]


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
    sockets_folder()
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

trainer, folders, births, told = int(sys.argv[1]), sys.argv[2:], {}, True
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
for folder in folders:
    shutil.rmtree(folder, ignore_errors=True)
"""


def _watch(folder: Path):
    """Start the watchdog over the weights ``folder`` and this process's sockets folder (Linux: it reads /proc); None
    elsewhere."""
    import subprocess
    import sys

    if not Path("/proc/self/cmdline").exists():
        return None
    return subprocess.Popen(
        [sys.executable, "-c", WATCHDOG, str(os.getpid()), str(folder), str(sockets_folder())],
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
