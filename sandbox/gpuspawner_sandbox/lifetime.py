"""Processes that end with the run that started them.

An interrupted or crashed test run, demo or benchmark must leave no control
plane, node or hub behind. The kernel sends a child SIGTERM when the thread that
started it exits (``PR_SET_PDEATHSIG``); that follows the thread that forked,
not the process, so only children of the main thread are given it.
"""

from __future__ import annotations

import ctypes
import signal
import threading
from collections.abc import Callable
from pathlib import Path

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    # Runs in the child between fork and exec.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def dying_with_us(wanted: bool = True) -> Callable[[], None] | None:
    """The ``preexec_fn`` that makes a child get SIGTERM when the thread starting it ends.

    None when not ``wanted`` (a cluster that ``gpuspawner-sandbox up`` leaves
    running) or off the main thread, whose end is not the run's.
    """
    if wanted and threading.current_thread() is threading.main_thread():
        return _die_with_parent
    return None


def alive(pid: int) -> bool:
    """Whether the process runs: it exists and is not a zombie waiting for its parent."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"
