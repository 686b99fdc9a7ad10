"""What a process of tether's own does about its life on Linux: die with the process that started it, and carry a
name that ps shows. Both are prctl calls, and nothing elsewhere (another OS has no prctl; nothing is done there)."""

from __future__ import annotations


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
