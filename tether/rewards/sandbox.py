"""Run model-written Python in a separate process with a time and a memory limit.

The child gets a fresh interpreter (-I: no user site, no PYTHON* variables), its own process group, an
address-space limit (RLIMIT_AS) and a wall-clock timeout after which the whole group is killed. This is
containment for honest mistakes (infinite loops, runaway memory), not a security boundary against a
hostile program: it can still read files and open sockets. Linux/macOS only (resource limits).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass


@dataclass
class SandboxResult:
    ok: bool  # exited with status 0 within the limits
    returncode: int | None  # None when killed for time
    timed_out: bool
    stdout: str
    stderr: str


def run_python(code: str, stdin: str = "", timeout_s: float = 5.0, memory_mb: int = 512) -> SandboxResult:
    """Execute ``code`` in a child interpreter; never raises for the child's failures."""
    def limit() -> None:
        import resource

        os.setsid()
        limit_bytes = memory_mb * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))

    proc = subprocess.Popen([sys.executable, "-I", "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=limit)
    try:
        out, err = proc.communicate(stdin, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, err = proc.communicate()
        return SandboxResult(False, None, True, out, err)
    return SandboxResult(proc.returncode == 0, proc.returncode, False, out, err)
