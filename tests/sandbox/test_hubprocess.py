"""Stopping a hub leaves none of the processes it started (the real hub runs in tests/hub)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

from gpuspawner_sandbox import hubprocess, testing
from gpuspawner_sandbox.lifetime import alive

# A stand-in for a hub whose local spawner started a server in a session of its own
# (LocalProcessSpawner does, with start_new_session) and that exits at SIGTERM
# without stopping it, as a hub killed in its shutdown would.
HUB = """
import signal, subprocess, sys, time
server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                          start_new_session=True)
print(server.pid, flush=True)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
time.sleep(120)
"""


def test_stop_kills_a_server_the_hub_started_in_its_own_session(tmp_path):
    process = subprocess.Popen(
        [sys.executable, "-c", HUB], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    server = int(process.stdout.readline())
    assert server in hubprocess.descendants(process.pid)
    assert os.getsid(server) != os.getsid(process.pid)  # out of reach of the hub's killpg
    hub = hubprocess.Hub(process, "http://127.0.0.1:9", "token", tmp_path / "log")
    hub.stop()
    deadline = time.monotonic() + 10
    while alive(server) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(server)


def test_descendants_are_found_at_every_depth():
    # sh (ours) -> sh -> sleep: the sleep is a grandchild
    process = subprocess.Popen(
        ["sh", "-c", "sh -c 'sleep 60; true' & wait"], start_new_session=True
    )
    try:
        deadline = time.monotonic() + 10
        names: list[str] = []
        while "sleep" not in names and time.monotonic() < deadline:
            found = hubprocess.descendants(process.pid)
            names = [open(f"/proc/{pid}/comm").read().strip() for pid in found]
            time.sleep(0.05)
        assert sorted(names) == ["sh", "sleep"]
        assert process.pid not in found and os.getpid() not in found
    finally:
        os.killpg(process.pid, 9)
        process.wait()


# A run that ends without stopping its hub: a pytest-xdist worker at Ctrl-C ends
# without its fixtures' teardown.
STARTER = """
import os, sys
from pathlib import Path
from gpuspawner_sandbox import hubprocess
hub = hubprocess.start_hub(Path(sys.argv[1]))
print(hub.process.pid, *hubprocess.descendants(hub.process.pid), flush=True)
os._exit(0)
"""


def test_a_hub_and_its_proxy_end_with_the_run_that_started_them(tmp_path):
    starter = subprocess.run(
        [sys.executable, "-c", STARTER, str(tmp_path / "hub")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert starter.returncode == 0, starter.stderr
    hub, *started = (int(pid) for pid in starter.stdout.split())
    assert started, "the hub runs its proxy"
    pids = (hub, *started)
    try:
        testing.wait_for(
            "the hub and its proxy to end",
            lambda: not any(alive(pid) for pid in pids),
            timeout=30,
            interval=0.2,
        )
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                if alive(pid):
                    os.kill(pid, signal.SIGKILL)
