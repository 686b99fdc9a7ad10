"""The sandbox for model-written code against the attacks that got through the old one. Each test runs one attack
in the isolated sandbox (bubblewrap + a cgroup) and checks from outside that it was contained. Where the boundary
cannot be had here (no bubblewrap, no writable cgroup), these tests skip; CI installs bubblewrap and runs as root."""

import os
import socket
import sys
import time
import uuid

import pytest

from tether.rewards import sandbox
from tether.rewards.sandbox import SandboxUnavailable, check_isolation, run_python, running_with

try:
    check_isolation()
    UNAVAILABLE = None
except SandboxUnavailable as err:
    UNAVAILABLE = str(err)

isolated = pytest.mark.skipif(UNAVAILABLE is not None, reason=f"no isolated sandbox here: {UNAVAILABLE}")
TRAINER = os.getpid()


@isolated
def test_it_runs_code_and_returns_its_output():
    result = run_python("import sys; print(sys.stdin.read().upper())", stdin="hello")
    assert result.ok and result.stdout.strip() == "HELLO" and not result.timed_out


@isolated
def test_no_file_outside_its_private_tmp_can_be_written(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"step": 1}\n')
    code = (
        f"for path in [{str(tmp_path / 'pwned')!r}, {str(metrics)!r}, '/usr/pwned', '/pwned']:\n"
        "    try:\n        open(path, 'a').write('x')\n        print('wrote', path)\n"
        "    except OSError as err:\n        print('refused', path, type(err).__name__)\n"
        "open('/tmp/scratch', 'w').write('fine')\nprint(open('/tmp/scratch').read())"
    )
    result = run_python(code)
    assert "wrote" not in result.stdout and "fine" in result.stdout
    assert not (tmp_path / "pwned").exists() and metrics.read_text() == '{"step": 1}\n'
    assert not os.path.exists("/pwned") and not os.path.exists("/usr/pwned")


@isolated
def test_it_reads_no_secrets_no_passwd_no_trainer_environment_or_memory(monkeypatch):
    monkeypatch.setenv("TETHER_TEST_SECRET", "s3cret-token")
    code = (
        "import os\nprint(sorted(os.environ))\n"
        f"for path in ['/etc/passwd', '/etc/shadow', '/proc/{TRAINER}/environ', '/proc/{TRAINER}/mem', "
        f"'/proc/1/environ', {os.path.expanduser('~')!r} + '/.bash_history']:\n"
        "    try:\n        print(path, open(path, 'rb').read(200))\n"
        "    except OSError as err:\n        print('refused', path, type(err).__name__)\n"
        f"try:\n    fd = os.open('/proc/{TRAINER}/mem', os.O_RDWR)\n    print('opened trainer memory')\n"
        "except OSError:\n    print('no trainer memory')"
    )
    result = run_python(code)
    assert "s3cret-token" not in result.stdout + result.stderr and "TETHER_TEST_SECRET" not in result.stdout
    assert "root:" not in result.stdout and "opened trainer memory" not in result.stdout
    assert "no trainer memory" in result.stdout


@isolated
def test_it_cannot_kill_the_trainer_directly_or_through_libc():
    code = (
        f"import ctypes, os, signal\nfor pid in ({TRAINER}, os.getppid()):\n"
        "    try:\n        os.kill(pid, signal.SIGKILL)\n    except OSError as err:\n        print('refused', pid)\n"
        f"print('libc kill returned', ctypes.CDLL(None).kill({TRAINER}, 9))"
    )
    result = run_python(code)
    time.sleep(0.2)
    assert os.getpid() == TRAINER  # still here
    assert "libc kill returned -1" in result.stdout  # the trainer's pid does not exist in its world


@isolated
def test_it_has_no_network():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    code = (
        f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=1).sendall(b'leak')\n"
        "    print('connected')\nexcept OSError as err:\n    print('refused', type(err).__name__)"
    )
    result = run_python(code)
    with pytest.raises(socket.timeout):
        listener.accept()
    listener.close()
    assert "connected" not in result.stdout and "refused" in result.stdout


@isolated
def test_it_runs_as_an_unprivileged_user():
    result = run_python(
        "import os, subprocess\nprint(os.getuid(), os.geteuid())\n"
        "print(subprocess.run(['id', '-u'], capture_output=True, text=True).stdout.strip())"
    )
    assert result.stdout.split() == ["65534", "65534", "65534"]


@isolated
def test_a_daemon_it_leaves_behind_is_killed():
    marker = f"tether-daemon-{uuid.uuid4().hex}"
    code = (
        f"import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)  # {marker}'], "
        "start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\nprint('left')"
    )
    result = run_python(code)
    time.sleep(0.3)
    assert "left" in result.stdout and not running_with(marker)


@isolated
def test_a_child_holding_the_output_open_does_not_outlive_the_time_limit():
    marker = f"tether-holder-{uuid.uuid4().hex}"
    code = (
        f"import subprocess, sys, time\nsubprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)  # {marker}'])\n"
        "time.sleep(60)"
    )
    start = time.monotonic()
    result = run_python(code, timeout_s=1.0)
    assert result.timed_out and time.monotonic() - start < 4.0 and not running_with(marker)


@isolated
def test_a_fork_bomb_is_held_by_the_process_limit():
    marker = f"tether-bomb-{uuid.uuid4().hex}"
    code = (
        f"import os, time\n# {marker}\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n"
        "        time.sleep(0.01)"
    )
    start = time.monotonic()
    result = run_python(code, timeout_s=2.0, max_processes=16)
    assert not result.ok and time.monotonic() - start < 8.0
    time.sleep(0.3)
    assert not running_with(marker)


@isolated
def test_memory_is_limited_across_children():
    code = (
        "import os\nkids = []\nfor _ in range(4):\n    pid = os.fork()\n    if pid == 0:\n"
        "        block = bytearray(150 * 2**20)\n        for i in range(0, len(block), 4096):\n            block[i] = 1\n"
        "        os._exit(0)\n    kids.append(pid)\n"
        "ok = sum(os.waitpid(k, 0)[1] == 0 for k in kids)\nprint('children ok', ok)"
    )
    result = run_python(code, memory_mb=256, timeout_s=20)
    assert "children ok 4" not in result.stdout  # 600 MB in all does not fit in 256 MB


@isolated
def test_output_floods_and_disk_filling_are_capped():
    flood = run_python(
        "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)", max_output_bytes=1 << 20, timeout_s=10
    )
    assert not flood.ok and len(flood.stdout) <= 1 << 20 and flood.output_truncated
    disk = run_python(
        "block = b'x' * (1 << 20)\nwith open('/tmp/fill', 'wb') as f:\n    for _ in range(2048):\n"
        "        f.write(block)\nprint('filled 2 GiB')",
        memory_mb=256,
        timeout_s=20,
    )
    assert not disk.ok and "filled" not in disk.stdout


@isolated
def test_time_and_single_process_memory():
    slow = run_python("while True: pass", timeout_s=0.5)
    assert slow.timed_out and not slow.ok and slow.returncode is None
    greedy = run_python("x = bytearray(2 * 1024 ** 3)\nx[::4096] = b'y' * len(x[::4096])", memory_mb=256)
    assert not greedy.ok


def test_without_bubblewrap_it_refuses_unless_the_weak_mode_is_named(monkeypatch):
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    with pytest.raises(SandboxUnavailable, match="bubblewrap .* is not installed.*isolation='weak'"):
        run_python("print(1)")
    with pytest.raises(SandboxUnavailable):
        check_isolation()
    assert run_python("print(1)", isolation="weak").stdout.strip() == "1"
    with pytest.raises(ValueError, match="isolation='none'"):
        run_python("print(1)", isolation="none")


def test_the_code_reward_refuses_too_without_a_boundary(monkeypatch):
    from tether.rewards.builtin import python_tests

    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    with pytest.raises(SandboxUnavailable):
        python_tests(["print(1)"], [""])


def test_the_sandbox_child_does_not_inherit_this_process(tmp_path):
    """Outside the sandbox too: the interpreter it starts is a fresh one (-I), even in the weak mode."""
    result = run_python("import sys; print(sys.flags.isolated)", isolation="weak")
    assert result.stdout.strip() == "1"
    assert sys.executable  # the trainer's interpreter is what runs the code


def sandbox_cgroups() -> set:
    """This process's sandbox cgroups that exist now (cgroup v2, or the v1 memory and pids hierarchies)."""
    root = sandbox.CGROUP_ROOT
    found = set()
    for folder in (root, root / "memory", root / "pids"):
        if folder.is_dir():
            found |= {p for p in folder.glob(f"tether-sandbox-{os.getpid()}-*")}
    return found


@pytest.mark.parametrize("isolation", ["weak", pytest.param("bubblewrap", marks=isolated)])
def test_any_text_the_model_writes_runs_as_a_file_and_fails_in_the_child(isolation):
    """A NUL byte, or code longer than the kernel takes as one argument (128 KiB), made Popen raise when the code
    was a -c argument (the run stopped with it); as a file the child runs it, or fails with a SyntaxError."""
    nul = run_python("print('a\x00b')", isolation=isolation)
    assert not nul.ok and nul.returncode == 1 and "null bytes" in nul.stderr
    long = run_python("x = 1\n" * 40_000 + "print(x + 1)", isolation=isolation)  # 240 KB
    assert long.ok and long.stdout.strip() == "2"
    assert not sandbox_cgroups()


@isolated
def test_the_cgroup_is_removed_when_the_child_cannot_start(monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError(7, "Argument list too long")

    monkeypatch.setattr(sandbox.subprocess, "Popen", refuse)
    with pytest.raises(OSError, match="Argument list too long"):
        run_python("print(1)")
    assert not sandbox_cgroups()
