"""The README's main command: it starts the cluster on real nodes and the hub, answers, and Ctrl-C
stops everything and restores the host."""

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from gpuspawner_sandbox import hoststate, nodeconfig, testing
from gpuspawner_sandbox.hubprocess import free_port
from gpuspawner_sandbox.testing import processes_mentioning
from gpuspawner_sandbox.topology import load_topology


class Visitor:
    """A person in a browser: logged in through the login form, with the hub's cookies."""

    def __init__(self, base: str, name: str):
        import http.cookiejar
        import re
        import urllib.parse

        self.base = base
        self.jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar))
        with self.opener.open(f"{base}/hub/login", timeout=30) as response:
            xsrf = re.search(r'name="_xsrf" value="([^"]+)"', response.read().decode()).group(1)
        body = urllib.parse.urlencode({"username": name, "password": "gpu", "_xsrf": xsrf})
        with self.opener.open(f"{base}/hub/login", body.encode(), timeout=30) as response:
            assert response.status == 200

    def page(self, path: str) -> str:
        with self.opener.open(f"{self.base}{path}", timeout=30) as response:
            return response.read().decode()

    def api(self, method: str, path: str, body=None):
        """The hub's REST API as the hub's own pages call it: cookie plus XSRF header."""
        import json

        xsrf = next(c.value for c in self.jar if c.name == "_xsrf")
        request = urllib.request.Request(
            f"{self.base}/hub/api{path}",
            data=None if body is None else json.dumps(body).encode(),
            method=method,
            headers={"X-XSRFToken": xsrf, "Content-Type": "application/json"},
        )
        try:
            with self.opener.open(request, timeout=30) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()


def test_demo_starts_the_hub_and_ctrl_c_leaves_nothing_running(tmp_path, pytestconfig):
    testing.node_binaries(pytestconfig)  # built (or skipped/failed loudly) like the other e2e tests
    state = tmp_path / "demo-state"
    roots = [nodeconfig.cgroup_root(n.name) for n in load_topology(None).nodes]
    before = hoststate.snapshot(state / "nodes", roots)
    port = free_port()
    command = [
        str(Path(sys.executable).parent / "gpuspawner-sandbox"),
        "demo",
        "--port",
        str(port),
        "--state-dir",
        str(state),
        # the story's culler stops an idle holder after 5 s instead of 2 minutes
        "--pressure-timeout",
        "5",
        # another test run's real nodes on this machine: take turns, as the tests do
        "--machine-wait",
        str(testing.MACHINE_WAIT),
    ]
    log = (tmp_path / "demo.log").open("w+")
    demo = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        # the control plane, five real nodes, the hub (or first another test run's nodes)
        deadline = time.monotonic() + 600 + testing.MACHINE_WAIT
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
        assert processes_mentioning(str(state))  # control plane, nodes and hub run from it

        # The story: ada and bob hold every A100 with idle servers. Carol asks for
        # two and waits in line; the culler frees one holder's node for her.
        testing.wait_for(
            "the story's servers",
            lambda: "The story:" in (tmp_path / "demo.log").read_text(),
            timeout=300,
            interval=1,
        )
        base = f"http://127.0.0.1:{port}"
        carol = Visitor(base, "carol")
        status, body = carol.api(
            "POST", "/users/carol/server", {"profile": "pytorch", "gpu_type": "a100", "gpus": "2"}
        )
        # 202 while she waits; 201 when the culler's pass frees a node within JupyterHub's
        # slow_spawn_timeout (10 s), which the story's 5 s pressure timeout allows
        assert status in (201, 202), body

        def carol_ready():
            status, model = carol.api("GET", "/users/carol")
            server = (model.get("servers") or {}).get("") if status == 200 else None
            return server and server.get("ready")

        testing.wait_for(
            "carol's queued A100 server to start", carol_ready, timeout=300, interval=1
        )
        # she waited in the hub's queue: the A100s were all held when she asked
        hub_log = (state / "hub" / "hub.log").read_text()
        assert "carol leaves the GPU queue for NVIDIA A100" in hub_log

        def server_of(visitor, holder):
            _, model = visitor.api("GET", f"/users/{holder}")
            return (model.get("servers") or {}).get("")

        # Carol's server can be up while the hub still finishes the culled holder's
        # stop (JupyterHub's "pending stop" until it has seen the pod go): a holder
        # whose stop has begun counts as stopped.
        visitors = {holder: Visitor(base, holder) for holder in ("ada", "bob")}
        servers = {holder: server_of(visitors[holder], holder) for holder in visitors}
        stopped = [
            holder
            for holder, server in servers.items()
            if server is None or server.get("pending") == "stop"
        ]
        assert len(stopped) == 1, f"exactly one holder's server was stopped for carol: {servers}"
        (holder,) = stopped
        visitor = visitors[holder]
        testing.wait_for(
            f"{holder}'s stop to finish", lambda: not server_of(visitor, holder), timeout=120
        )
        assert "because" in visitor.page("/hub/home")  # the line saying why it stopped
    finally:
        if demo.poll() is None:
            os.kill(demo.pid, signal.SIGINT)  # what Ctrl-C sends
        code = demo.wait(timeout=300)  # the nodes' teardown deletes their copies of the image
    assert code == 0, (tmp_path / "demo.log").read_text()
    time.sleep(1)
    assert processes_mentioning(str(state)) == []
    assert hoststate.differences(before, hoststate.snapshot(state / "nodes", roots)) == []
