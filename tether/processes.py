"""What a process of tether's own does about its life on Linux: die with the process that started it, and carry a
name that ps shows (prctl calls, and nothing elsewhere: another OS has no prctl); and what a process removes before
SIGTERM ends it."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable

_BEFORE_SIGTERM: list[Callable[[], None]] = []  # what before_sigterm_death registered, run once
_SIGTERM_BEFORE = [signal.SIG_DFL]  # the handler SIGTERM had before this module's


def die_with_parent(signal_number: int = 9) -> None:
    """This process gets SIGKILL (or ``signal_number``) when the process that started it ends (Linux's
    PR_SET_PDEATHSIG; elsewhere nothing). For the processes of a multi-process launch, which torch.distributed's agent starts in sessions of
    their own so that a kill of the launcher's process group misses them, for the lab's workers and for the rollout
    worker (rollout/async_worker.py): each would otherwise go on working for a run that has ended, or writing a run
    folder that a resumed run then writes too. (The signal comes when the thread
    that started this process ends: launchers start their processes from their main thread.)"""
    import ctypes

    try:
        ctypes.CDLL(None).prctl(1, signal_number)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: no prctl
        pass


def name_process(name: bytes) -> None:
    """The process's name in ps and /proc/<pid>/comm (Linux's PR_SET_NAME; elsewhere nothing)."""
    import ctypes

    try:
        ctypes.CDLL(None).prctl(15, name)  # 15: PR_SET_NAME
    except (OSError, AttributeError):  # not Linux: no prctl
        pass


def before_sigterm_death(cleanup: Callable[[], None]) -> None:
    """Run ``cleanup()`` when this process is sent SIGTERM, then go on as SIGTERM would have: death by the signal
    (the default; the exit status is unchanged), or the handler that was installed before (called). For what only
    this process can remove: the rollout worker's weight slots in shared memory, which the worker removes when its
    trainer dies, unless both are killed at once — a launcher's agent sends SIGTERM to a failed rank's whole session,
    the worker included, and a default SIGTERM death runs no exit function. Registered once per function; from the
    main thread only (Python's signals), elsewhere nothing; nothing where SIGTERM is ignored."""
    if threading.current_thread() is not threading.main_thread() or cleanup in _BEFORE_SIGTERM:
        return
    current = signal.getsignal(signal.SIGTERM)
    if current is signal.SIG_IGN:
        return
    if current is not _on_sigterm:
        _SIGTERM_BEFORE[0] = signal.SIG_DFL if current is None else current  # None: set outside Python
        signal.signal(signal.SIGTERM, _on_sigterm)
    _BEFORE_SIGTERM.append(cleanup)


def _on_sigterm(signum, frame) -> None:
    try:
        while _BEFORE_SIGTERM:
            _BEFORE_SIGTERM.pop(0)()
    finally:  # a clean-up that failed does not keep the process alive: SIGTERM's end comes all the same
        previous = _SIGTERM_BEFORE[0]
        signal.signal(signal.SIGTERM, previous)
        if callable(previous):
            previous(signum, frame)
        else:  # the default: die of the signal, now that nothing catches it
            os.kill(os.getpid(), signal.SIGTERM)
