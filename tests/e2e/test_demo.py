"""The README's main command: it starts the cluster and the hub, answers, and Ctrl-C stops everything."""

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from gpuspawner.sandbox.hubprocess import free_port
from gpuspawner.sandbox.testing import control_plane_binary, processes_mentioning


def test_demo_starts_the_hub_and_ctrl_c_leaves_nothing_running(tmp_path, pytestconfig):
    control_plane_binary(pytestconfig)  # built (or skipped/failed loudly) like the other e2e tests
    state = tmp_path / "demo-state"
    port = free_port()
    command = [
        str(Path(sys.executable).parent / "gpuspawner-sandbox"),
        "demo",
        "--port",
        str(port),
        "--state-dir",
        str(state),
    ]
    log = (tmp_path / "demo.log").open("w+")
    demo = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while "is running at" not in (tmp_path / "demo.log").read_text():
            assert demo.poll() is None, (tmp_path / "demo.log").read_text()
            assert time.monotonic() < deadline, (tmp_path / "demo.log").read_text()
            time.sleep(0.5)
        output = (tmp_path / "demo.log").read_text()
        assert f"http://127.0.0.1:{port}/" in output
        assert "password 'gpu'" in output
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/hub/api", timeout=30) as r:
            assert r.status == 200
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/hub/login", timeout=30) as r:
            assert b"password" in r.read().lower()
        assert processes_mentioning(str(state))  # control plane, kubelet and hub run from it
    finally:
        os.kill(demo.pid, signal.SIGINT)  # what Ctrl-C sends
        code = demo.wait(timeout=90)
    assert code == 0, (tmp_path / "demo.log").read_text()
    time.sleep(1)
    assert processes_mentioning(str(state)) == []
