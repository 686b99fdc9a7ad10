"""A worker process for the reward functions named by specs (``module:function``, ``file.py:function``).

A call that runs past its time limit is killed with the worker — a thread could only be abandoned — and the next
call starts a fresh worker. The worker is spawned (a fresh interpreter: no forked copy of the trainer's threads
or CUDA state), loads the same specs, and answers one call at a time over a pipe; arguments and results travel as
JSON, so nothing is unpickled on either side. Module-level state of a reward file lives in the worker (and starts
over when a hung call forced a new one).

Ctrl-C reaches the worker too (it shares the terminal's process group): the worker ends on it at once and quietly,
by SIGINT's default action, and the trainer prints its one line. It is started with SIGINT blocked, so a Ctrl-C
while it is still starting waits until its handler is the default one, and then ends it just as quietly.
"""

from __future__ import annotations

import json
import multiprocessing
import signal

STARTUP_S = 300.0  # a fresh interpreter importing the reward modules (and torch) — not counted in a call's limit


class RemoteError(Exception):
    """An exception raised by a reward function inside the worker; ``kind`` is its type's name."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def _jsonable(value):
    if hasattr(value, "tolist"):  # tensors, numpy arrays and scalars
        return value.tolist()
    return str(value)


def images_to_json(images: list[list]) -> list[list[str]]:
    """A batch's images (one list of PIL images per row) as base64 PNG text, lossless, to travel to the worker."""
    import base64
    import io

    def text(image) -> str:
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        return base64.b64encode(buffer.getvalue()).decode()

    return [[text(image) for image in row] for row in images]


def images_from_json(rows: list[list[str]]) -> list[list]:
    """images_to_json's text back as PIL images (RGB, the pixels sent)."""
    import base64
    import io

    from PIL import Image

    return [[Image.open(io.BytesIO(base64.b64decode(t))).convert("RGB") for t in row] for row in rows]


def _serve(conn, specs: dict[str, str]) -> None:
    """The worker's loop: load the functions, then answer {name, kwargs} with {value} or {kind, error}."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # no KeyboardInterrupt traceback: the trainer reports the Ctrl-C
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # blocked by RewardWorker._start
    from tether.rewards.loading import load_reward_function

    try:
        functions = {name: load_reward_function(target) for name, target in specs.items()}
    except Exception as err:  # noqa: BLE001 - reported to the trainer, which loaded the same specs already
        conn.send_bytes(json.dumps({"kind": type(err).__name__, "error": str(err)}).encode())
        return
    conn.send_bytes(b'{"ready": true}')
    while True:
        try:
            request = json.loads(conn.recv_bytes())
        except (EOFError, OSError):  # the trainer is gone
            return
        kwargs = request["kwargs"]
        if isinstance(kwargs.get("trainer_state"), dict):
            from tether.rewards.loading import TrainerState

            kwargs["trainer_state"] = TrainerState(**kwargs["trainer_state"])
        if "images" in kwargs:  # a vision-language model's prompts' images, sent as PNG text
            kwargs["images"] = images_from_json(kwargs["images"])
        try:
            reply = {"value": functions[request["name"]](**kwargs)}
        except Exception as err:  # noqa: BLE001 - the user's function; the trainer applies reward_on_error
            reply = {"kind": type(err).__name__, "error": str(err)}
        conn.send_bytes(json.dumps(reply, default=_jsonable).encode())


class RewardWorker:
    """Calls reward functions by name in a worker process that is killed when a call outlives its limit."""

    def __init__(self, specs: dict[str, str]):
        self.specs = specs  # component name -> the spec it was loaded from
        self.process = None
        self.conn = None

    def _start(self) -> None:
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(child, self.specs), daemon=True, name="tether-rewards")
        # the child inherits this thread's signal mask: a Ctrl-C during its start-up stays pending until _serve
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            self.process.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        child.close()
        reply = self._reply(
            STARTUP_S, RuntimeError(f"the reward worker did not start within {STARTUP_S:g} s"), "while starting"
        )
        if isinstance(reply, Exception):
            raise reply
        if "ready" not in reply:
            self.stop()
            raise RemoteError(reply["kind"], reply["error"])

    def call(self, name: str, kwargs: dict, timeout: float | None):
        """The function's return value, a RemoteError, or TimeoutError (the worker was killed)."""
        if self.process is None or not self.process.is_alive():
            self._start()
        self.conn.send_bytes(json.dumps({"name": name, "kwargs": kwargs}, default=_jsonable).encode())
        late = TimeoutError(f"no result within {timeout:g} s (reward timeout); its worker process was killed")
        reply = self._reply(timeout, late, "during the call")
        if isinstance(reply, Exception):
            return reply
        return reply["value"] if "value" in reply else RemoteError(reply["kind"], reply["error"])

    def _reply(self, timeout: float | None, late: Exception, when: str) -> dict | Exception:
        """The worker's next message, or the error that stopped it: ``late`` when none came within ``timeout`` (the
        worker is killed), a RemoteError when its process ended (``when``: while starting, during the call)."""
        if not self.conn.poll(timeout):
            self.stop()
            return late
        try:
            return json.loads(self.conn.recv_bytes())
        except (EOFError, OSError):
            code = self.process.exitcode if self.process is not None else None
            self.stop()
            return RemoteError("WorkerDied", f"the reward worker process ended (exit code {code}) {when}")

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None and self.process.is_alive() else None

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.join(5)
        if self.conn is not None:
            self.conn.close()
        self.process = self.conn = None
