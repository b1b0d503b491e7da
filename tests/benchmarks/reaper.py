"""Run a command and report every process it leaves behind; then end them.

    python tests/benchmarks/reaper.py REPORT -- COMMAND [ARG...]

The reaper makes itself a child subreaper (``PR_SET_CHILD_SUBREAPER``): every
process COMMAND starts becomes the reaper's child once its own parent is gone,
however it was started (a new session, a double fork, a shim). When COMMAND
exits, the reaper writes to REPORT (JSON) those still running, with their
command lines, kills them and waits for them, and exits with COMMAND's status.
So a test reads what a benchmark leaked without guessing names, and a leak never
outlives the test. SIGTERM and SIGINT sent to the reaper are passed on to COMMAND.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from gpuspawner_sandbox.hubprocess import descendants
from gpuspawner_sandbox.lifetime import alive

_PR_SET_CHILD_SUBREAPER = 36

#: How long the reaper tries to end what was left before it gives up on it.
KILL_SECONDS = 30


def _cmdline(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


def _reap_any() -> None:
    """Collect every child that has exited, without waiting."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _end_leftovers() -> None:
    deadline = time.monotonic() + KILL_SECONDS
    while True:
        _reap_any()
        left = [pid for pid in descendants(os.getpid()) if alive(pid)]
        if not left or time.monotonic() > deadline:
            return
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print(__doc__, file=sys.stderr)
        return 2
    report, command = Path(argv[0]), argv[2:]
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")
    child = subprocess.Popen(command)

    def forward(signum: int, frame: object) -> None:
        try:
            os.kill(child.pid, signum)
        except ProcessLookupError:
            pass

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    # Orphans become our children and must be reaped as they exit: wait for anyone.
    while True:
        pid, status = os.waitpid(-1, 0)
        if pid == child.pid:
            code = os.waitstatus_to_exitcode(status)
            # Killed by a signal: report it as a shell does (128 + its number).
            child.returncode = code if code >= 0 else 128 - code
            break
    left = [
        {"pid": pid, "cmdline": _cmdline(pid)} for pid in descendants(os.getpid()) if alive(pid)
    ]
    report.write_text(json.dumps(left, indent=2) + "\n")
    _end_leftovers()
    return child.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
