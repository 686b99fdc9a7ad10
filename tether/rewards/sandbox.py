"""Run model-written Python behind a real boundary: bubblewrap namespaces plus a cgroup for the whole process tree.

``isolation="bubblewrap"`` (the default) runs a fresh interpreter (-I) under ``bwrap`` with every namespace
unshared (user, pid, network, ipc, uts, cgroup), as an unprivileged user (65534) with no capabilities, with
read-only mounts of the interpreter and the system libraries only, a private /tmp (tmpfs), its own /proc (it
sees none of the trainer's processes, so neither /proc/<ppid>/environ nor /proc/<ppid>/mem), an empty
environment, no network, a new session (no terminal) and --die-with-parent. A cgroup caps memory and the
number of processes of the whole tree (children, daemons and fork bombs included); stdout and stderr go to
files capped at ``max_output_bytes`` (RLIMIT_FSIZE, also a cap on any file it writes); at the wall-clock limit
the whole tree is killed (the pid namespace dies with its first process, and the cgroup is emptied).
docs/rewards.md lists what is and is not isolated.

Where that boundary cannot be had (bubblewrap missing, no namespaces, no writable cgroup), ``run_python``
refuses with SandboxUnavailable, unless the caller opts into ``isolation="weak"`` by name: a separate
interpreter in its own session with per-process memory and file-size limits and a timeout that kills its
process group — containment for honest mistakes, not a security boundary.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

ISOLATIONS = ("bubblewrap", "weak")
CGROUP_ROOT = Path("/sys/fs/cgroup")
NOBODY = 65534
PROGRAM = Path("/program.py")  # where the model's code stands inside the bubblewrap sandbox (a file of its own)


class SandboxUnavailable(RuntimeError):
    """The strict sandbox cannot be set up here; the message says why and how to proceed."""


@dataclass
class SandboxResult:
    ok: bool  # exited with status 0 within the limits
    returncode: int | None  # None when killed for time
    timed_out: bool
    stdout: str
    stderr: str
    output_truncated: bool = False  # stdout or stderr reached max_output_bytes


def run_python(
    code: str,
    stdin: str = "",
    timeout_s: float = 5.0,
    memory_mb: int = 512,
    max_processes: int = 32,
    max_output_bytes: int = 1 << 20,
    isolation: str = "bubblewrap",
) -> SandboxResult:
    """Execute ``code`` in a child interpreter; never raises for the child's failures (only SandboxUnavailable)."""
    if isolation not in ISOLATIONS:
        raise ValueError(f"isolation={isolation!r}: choose {' or '.join(ISOLATIONS)}")
    with tempfile.TemporaryDirectory(prefix="tether-sandbox-") as work:
        out_path, err_path, in_path = (Path(work) / name for name in ("stdout", "stderr", "stdin"))
        in_path.write_text(stdin)
        # the program as a file, not a -c argument: any text the model wrote runs (or fails in the child), where an
        # argument with a NUL byte or over the kernel's 128 KiB made Popen itself raise
        program = Path(work) / PROGRAM.name
        program.write_bytes(code.encode("utf-8", "surrogatepass"))
        if isolation == "weak":
            command, group = [sys.executable, "-I", str(program)], None
        else:
            command, group = _bubblewrap_command(program), _CGroup.create(memory_mb, max_processes)
        try:
            limits = _limits(memory_mb if isolation == "weak" else 0, max_output_bytes, group)
            with open(in_path) as fin, open(out_path, "w") as fout, open(err_path, "w") as ferr:
                start = time.monotonic()
                proc = subprocess.Popen(
                    command,
                    stdin=fin,
                    stdout=fout,
                    stderr=ferr,
                    preexec_fn=limits,
                    close_fds=True,
                    env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"} if group is None else {},
                )
                timed_out = _wait(proc, timeout_s - (time.monotonic() - start))
                _kill_tree(proc)
        finally:  # the cgroup is the machine's, not the temporary folder's: never left behind
            if group is not None:
                group.kill_all()
                group.remove()
        out, err = (_read_capped(p, max_output_bytes) for p in (out_path, err_path))
    returncode = None if timed_out else proc.returncode
    truncated = out[1] or err[1]
    return SandboxResult(returncode == 0 and not truncated, returncode, timed_out, out[0], err[0], truncated)


def running_with(marker: str) -> bool:
    """Is any process on this machine running with ``marker`` in its command line? (Read from /proc, which does not
    cut long command lines as ps may.) The attack table and the tests use it to find what a sandbox left behind."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if marker.encode() in cmdline.read_bytes():
                return True
        except OSError:
            continue
    return False


def check_isolation(isolation: str = "bubblewrap") -> None:
    """Raise SandboxUnavailable now (e.g. before training) if ``isolation`` cannot be set up here."""
    if isolation == "bubblewrap":
        _bubblewrap_command(PROGRAM)
        _CGroup.create(16, 4).remove()


def _bubblewrap_command(program: Path) -> list[str]:
    """bwrap running the file ``program``, bound read-only at PROGRAM inside."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxUnavailable(
            "bubblewrap (bwrap) is not installed, so model-written code cannot be isolated: "
            "install it (Debian: apt-get install bubblewrap; the set-up does this as root), or "
            "accept a sandbox that is no security boundary by passing isolation='weak'"
        )
    python = os.path.realpath(sys.executable)
    prefix = os.path.realpath(sys.base_prefix)
    command = [
        bwrap,
        "--unshare-all",
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
        "--uid",
        str(NOBODY),
        "--gid",
        str(NOBODY),
        "--clearenv",
        "--setenv",
        "PATH",
        "/usr/bin:/bin",
        "--setenv",
        "HOME",
        "/tmp",
        "--setenv",
        "LANG",
        "C.UTF-8",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--tmpfs",
        "/tmp",
        "--chdir",
        "/tmp",
    ]
    for path in ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/etc/alternatives", "/etc/ld.so.cache"):
        command += ["--ro-bind-try", path, path]
    if not any(prefix == p or prefix.startswith(p + "/") for p in ("/usr", "/lib", "/bin")):
        command += ["--ro-bind", prefix, prefix]  # an interpreter outside the system folders (pyenv, conda)
    command += ["--ro-bind", str(program), str(PROGRAM)]
    return command + ["--remount-ro", "/", "--", python, "-I", str(PROGRAM)]  # only the private /tmp is writable


def _limits(memory_mb: int, max_output_bytes: int, group: "_CGroup | None"):
    """The child's set-up before it execs: its own session, file-size and (weak mode) memory limits, the cgroup."""

    def apply() -> None:
        import resource

        os.setsid()
        resource.setrlimit(resource.RLIMIT_FSIZE, (max_output_bytes, max_output_bytes))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if memory_mb:
            resource.setrlimit(resource.RLIMIT_AS, (memory_mb * 2**20, memory_mb * 2**20))
        if group is not None:
            group.enter(os.getpid())

    return apply


def _wait(proc: subprocess.Popen, timeout: float) -> bool:
    try:
        proc.wait(timeout=max(timeout, 0.0))
        return False
    except subprocess.TimeoutExpired:
        return True


def _kill_tree(proc: subprocess.Popen) -> None:
    """Kill what is left of the process group (the cgroup's daemons that left it: run_python's finally)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def _read_capped(path: Path, cap: int) -> tuple[str, bool]:
    with open(path, "rb") as handle:
        data = handle.read(cap + 1)
    return data[:cap].decode("utf-8", "replace"), len(data) >= cap


class _CGroup:
    """A memory + pids cgroup for the sandbox's whole tree (cgroup v2, or the v1 memory and pids hierarchies)."""

    def __init__(self, folders: list[Path]):
        self.folders = folders

    @classmethod
    def create(cls, memory_mb: int, max_processes: int) -> "_CGroup":
        name = f"tether-sandbox-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        v2 = (CGROUP_ROOT / "cgroup.controllers").is_file()
        folders = [CGROUP_ROOT / name] if v2 else [CGROUP_ROOT / "memory" / name, CGROUP_ROOT / "pids" / name]
        settings = (
            {"memory.max": memory_mb * 2**20, "memory.swap.max": 0, "pids.max": max_processes}
            if v2
            else {"memory.limit_in_bytes": memory_mb * 2**20, "pids.max": max_processes}
        )
        group = cls([])
        try:
            for folder in folders:
                folder.mkdir()
                group.folders.append(folder)
            for key, value in settings.items():
                target = next((f / key for f in folders if (f / key).exists()), None)
                if target is None and key != "memory.swap.max":
                    raise OSError(f"no {key} control")
                if target is not None:
                    target.write_text(str(value))
        except OSError as err:
            group.remove()
            raise SandboxUnavailable(
                f"no cgroup for the sandbox's memory and process limits ({err}; tether needs to "
                f"create one under {CGROUP_ROOT}, as root or with a delegated cgroup): pass "
                "isolation='weak' to run without this boundary"
            ) from None
        return group

    def enter(self, pid: int) -> None:
        for folder in self.folders:
            (folder / "cgroup.procs").write_text(str(pid))

    def kill_all(self) -> None:
        for _ in range(50):  # processes may be forking while they are killed
            pids = {
                int(p)
                for f in self.folders
                if (f / "cgroup.procs").exists()
                for p in (f / "cgroup.procs").read_text().split()
            }
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.02)

    def remove(self) -> None:
        for folder in reversed(self.folders):
            for _ in range(50):
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.02)  # its last processes are still exiting
