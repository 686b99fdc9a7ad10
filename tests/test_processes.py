"""tether/processes.py: what a process does before SIGTERM ends it (before_sigterm_death), in processes of their own."""

import signal
import subprocess
import sys
import textwrap


def _run(body: str, tmp_path) -> tuple[int, list[str]]:
    """Run ``body`` after registering a clean-up that appends "cleaned" to a log; (exit code, the log's lines)."""
    log = tmp_path / "log"
    script = textwrap.dedent(
        f"""
        import os, signal, sys, time
        from tether.processes import before_sigterm_death
        def note(word):
            with open({str(log)!r}, "a") as handle:
                handle.write(word + "\\n")
        cleanup = lambda: note("cleaned")
        """
    ) + textwrap.dedent(body)
    code = subprocess.run([sys.executable, "-c", script], timeout=60).returncode
    return code, log.read_text().split() if log.is_file() else []


def test_the_clean_up_runs_once_and_the_process_still_dies_of_sigterm(tmp_path):
    code, log = _run(
        """
        before_sigterm_death(cleanup)
        before_sigterm_death(cleanup)  # the same function twice: once
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)
        note("survived")
        """,
        tmp_path,
    )
    assert code == -signal.SIGTERM
    assert log == ["cleaned"]


def test_a_handler_installed_before_is_called_after_the_clean_up(tmp_path):
    code, log = _run(
        """
        def earlier(signum, frame):
            note("earlier")
            sys.exit(3)
        signal.signal(signal.SIGTERM, earlier)
        before_sigterm_death(cleanup)
        before_sigterm_death(lambda: note("second"))
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)
        """,
        tmp_path,
    )
    assert code == 3
    assert log == ["cleaned", "second", "earlier"]


def test_an_ignored_sigterm_stays_ignored_and_cleans_nothing(tmp_path):
    code, log = _run(
        """
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        before_sigterm_death(cleanup)
        os.kill(os.getpid(), signal.SIGTERM)
        note("survived")
        """,
        tmp_path,
    )
    assert code == 0
    assert log == ["survived"]


def test_from_a_thread_that_is_not_the_main_one_nothing_is_registered(tmp_path):
    code, log = _run(
        """
        import threading
        thread = threading.Thread(target=before_sigterm_death, args=(cleanup,))
        thread.start()
        thread.join()
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)
        """,
        tmp_path,
    )
    assert code == -signal.SIGTERM
    assert log == []


def test_a_clean_up_that_fails_does_not_keep_the_process_alive(tmp_path):
    code, log = _run(
        """
        def broken():
            note("broken")
            raise OSError("gone")
        before_sigterm_death(broken)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)
        note("survived")
        """,
        tmp_path,
    )
    assert code == -signal.SIGTERM
    assert log == ["broken"]
