"""One set of real nodes per machine: the claim their start takes and their teardown gives back.

Real nodes share what a machine has only once: the bridges ``gsbr<N>`` and
``gshub0``, our iptables chain and the sysctls the kubelet changes. Two sets at
once (two developers' test runs, a demo beside ``make test``) would take each
other's bridges and restore each other's settings. So a start first claims the
machine: it creates :data:`CLAIM_PATH` exclusively, naming its state directory
and its pid, and :func:`release` removes it once the host is restored.

A claim outlives the process that took it (``gpuspawner-sandbox up`` returns
while its nodes run), so it is judged by what it names: it stands while its
state directory records running nodes, or while its pid lives (between the
claim and the first record). Anything else is a claim left by a crash, which
the next start takes over. ``/run`` is a tmpfs: a reboot, which ends every
node, also ends every claim.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

#: Where the claim lives; tests point it elsewhere.
CLAIM_PATH = Path("/run/gpuspawner-sandbox-real-nodes.json")

#: How often a start that may wait looks again.
POLL_SECONDS = 2.0


class MachineBusy(Exception):
    """Another set of real nodes runs on this machine; the message says which and what to do."""


@dataclass(frozen=True)
class Claim:
    state_dir: str
    pid: int


def read_claim(path: Path | None = None) -> Claim | None:
    """The claim on this machine, or None (no claim, or one that cannot be read)."""
    try:
        raw = json.loads((path or CLAIM_PATH).read_text())
        return Claim(str(raw["state_dir"]), int(raw["pid"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stands(claim: Claim, recorded: Callable[[Path], bool]) -> bool:
    """Whether a claim still holds: its nodes are recorded as running, or its claimer lives."""
    return recorded(Path(claim.state_dir)) or _pid_alive(claim.pid)


def busy_message(claim: Claim) -> str:
    return (
        f"Real nodes of another local cluster run on this machine (state dir {claim.state_dir}); "
        f"stop them first with `gpuspawner-sandbox --state-dir {claim.state_dir} down`, "
        "or wait for that test run or demo to end."
    )


def claim(
    state_dir: Path,
    recorded: Callable[[Path], bool],
    *,
    wait: float = 0,
    emit: Callable[[str], None] | None = None,
    path: Path | None = None,
) -> None:
    """Claim the machine for the real nodes of ``state_dir``; wait up to ``wait`` seconds.

    ``recorded(state_dir)`` says whether a state directory records running nodes.
    Raises :class:`MachineBusy` when another claim still stands after the wait.
    """
    path = path or CLAIM_PATH
    mine = json.dumps({"state_dir": str(state_dir), "pid": os.getpid()}) + "\n"
    deadline = time.monotonic() + wait
    told = False
    while True:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            held = read_claim(path)
            if held is None or held.state_dir == str(state_dir) or not stands(held, recorded):
                # Unreadable, ours from an earlier start, or left by a crash: take it over.
                path.unlink(missing_ok=True)
                continue
            if time.monotonic() >= deadline:
                raise MachineBusy(busy_message(held)) from None
            if emit is not None and not told:
                emit(
                    f"Waiting for the real nodes of {held.state_dir} to stop (at most {wait:.0f} s)…"
                )
                told = True
            time.sleep(POLL_SECONDS)
            continue
        with os.fdopen(fd, "w") as f:
            f.write(mine)
        return


def release(state_dir: Path, path: Path | None = None) -> None:
    """Give the machine back, if ``state_dir`` holds it."""
    path = path or CLAIM_PATH
    held = read_claim(path)
    if held is not None and held.state_dir == str(state_dir):
        path.unlink(missing_ok=True)
