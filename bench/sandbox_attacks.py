"""Attack table for tether.rewards.sandbox: each attack runs in the weak mode (the old sandbox: own session,
RLIMIT_AS, timeout) and in the isolated mode (bubblewrap + cgroup), and a check from outside says whether it was
contained. Run as root on Linux with bubblewrap installed:

    .venv/bin/python bench/sandbox_attacks.py
"""

from __future__ import annotations

import os
import socket
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tether.rewards.sandbox import run_python, running_with  # noqa: E402

if "TETHER_BENCH_SECRET" not in os.environ:  # a secret in the initial environment, as /proc/<pid>/environ shows it
    os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, "TETHER_BENCH_SECRET": "s3cret-token"})
TRAINER = os.getpid()


def attacks(work: Path, port: int):
    """(name, code, run_python options, contained(result, seconds) -> bool)."""
    marker = lambda: f"tether-attack-{uuid.uuid4().hex}"
    d, h, b = marker(), marker(), marker()
    sleeper = lambda m, extra="": (
        f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)  # {m}']{extra})"
    )
    out = work / "outside.txt"
    return [
        ("write a file outside its folder", f"open({str(out)!r}, 'w').write('x')", {}, lambda r, s: not out.exists()),
        (
            "append to the trainer's metrics.jsonl",
            f"open({str(work / 'metrics.jsonl')!r}, 'a').write('x')",
            {},
            lambda r, s: (work / "metrics.jsonl").read_text() == "{}\n",
        ),
        ("read /etc/passwd", "print(open('/etc/passwd').read())", {}, lambda r, s: "root:" not in r.stdout),
        (
            "read the trainer's environment",
            "import os; print(os.environ)",
            {},
            lambda r, s: "s3cret-token" not in r.stdout,
        ),
        (
            "read /proc/<trainer>/environ",
            f"print(open('/proc/{TRAINER}/environ', 'rb').read())",
            {},
            lambda r, s: b"s3cret-token".decode() not in r.stdout,
        ),
        (
            "open a socket to the host",
            f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=1); print('in')",
            {},
            lambda r, s: "in" not in r.stdout.split(),
        ),
        (
            "spawn a process as root",
            "import subprocess; print(subprocess.run(['id', '-u'], capture_output=True, text=True).stdout)",
            {},
            lambda r, s: r.stdout.strip() not in ("0", ""),
        ),
        (
            "leave a daemon running",
            f"import subprocess, sys; {sleeper(d, ', start_new_session=True')}; print('left')",
            {},
            lambda r, s: "left" in r.stdout and (time.sleep(0.3), not running_with(d))[1],
        ),
        (
            "hold the output open past the time limit",
            f"import subprocess, sys, time; {sleeper(h)}; time.sleep(60)",
            {"timeout_s": 2.0},
            lambda r, s: r.timed_out and s < 4.0 and not running_with(h),
        ),
        (
            "fork bomb",
            f"import os, time\n# {b}\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        time.sleep(0.01)",
            {"timeout_s": 2.0, "max_processes": 16},
            lambda r, s: s < 8.0 and (time.sleep(0.3), not running_with(b))[1],
        ),
        (
            "exceed memory across 4 children",
            "import os\nks=[]\nfor _ in range(4):\n    p=os.fork()\n    if p==0:\n        x=bytearray(150*2**20)\n"
            "        x[::4096]=b'y'*len(x[::4096])\n        os._exit(0)\n    ks.append(p)\nprint('ok', sum(os.waitpid(k,0)[1]==0 for k in ks))",
            {"memory_mb": 256, "timeout_s": 20},
            lambda r, s: "ok 4" not in r.stdout,
        ),
        (
            "flood the trainer with 300 MB of output",
            "import sys\nfor _ in range(4800): sys.stdout.write('x' * 65536)",
            {"timeout_s": 20},
            lambda r, s: len(r.stdout) <= 1 << 20,
        ),
        (
            "call libc through ctypes to signal the trainer",
            f"import ctypes; print('libc', ctypes.CDLL(None).kill({TRAINER}, 0))",
            {},
            lambda r, s: "libc 0" not in r.stdout,
        ),
        (
            "signal the trainer (kill(pid, 0) probe)",
            f"import os; os.kill({TRAINER}, 0); print('reached')",
            {},
            lambda r, s: "reached" not in r.stdout,
        ),
        (
            "open /proc/<trainer>/mem for writing",
            f"import os; os.open('/proc/{TRAINER}/mem', os.O_RDWR); print('opened')",
            {},
            lambda r, s: "opened" not in r.stdout,
        ),
        (
            "fill the disk (2 GiB)",
            "b = b'x' * 2**20\nwith open('/tmp/fill', 'wb') as f:\n    for _ in range(2048): f.write(b)\nprint('full')",
            {"memory_mb": 256, "timeout_s": 30},
            lambda r, s: "full" not in r.stdout,
        ),
        ("infinite loop", "while True: pass", {"timeout_s": 1.0}, lambda r, s: r.timed_out and s < 3),
        (
            "2 GiB in one process",
            "x = bytearray(2 * 2**30); x[::4096] = b'y' * len(x[::4096])",
            {"memory_mb": 256},
            lambda r, s: not r.ok,
        ),
    ]


def main() -> None:
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        for isolation in ("weak", "bubblewrap"):
            (work / "metrics.jsonl").write_text("{}\n")
            (work / "outside.txt").unlink(missing_ok=True)
            for name, code, options, contained in attacks(work, listener.getsockname()[1]):
                start = time.monotonic()
                result = run_python(code, isolation=isolation, **options)
                rows.append((name, isolation, contained(result, time.monotonic() - start), time.monotonic() - start))
        listener.close()
    names = list(dict.fromkeys(r[0] for r in rows))
    verdict = {(r[0], r[1]): ("contained" if r[2] else "GOT THROUGH") for r in rows}
    print(f"{'attack':45s} {'weak (old)':>12s} {'bubblewrap':>12s}")
    for name in names:
        print(f"{name:45s} {verdict[(name, 'weak')]:>12s} {verdict[(name, 'bubblewrap')]:>12s}")
    for mode in ("weak", "bubblewrap"):
        print(f"{mode}: {sum(verdict[(n, mode)] == 'contained' for n in names)} of {len(names)} contained")


if __name__ == "__main__":
    main()
