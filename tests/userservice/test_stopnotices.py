"""``GET /services/gpuspawner/stop-notices`` under a real hub and proxy.

The notice comes from a server whose start failed as GPUSpawner's does when
the GPU check fails: the spawner keeps the notice in its state, and the hub
saves that state when it stops the server. The service reads it back through
the hub API with the scopes hubconfig.add_service grants it. GPUSpawner's own
keeping of notices is tests/test_spawner_stopnotice.py's and tests/e2e's.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest
from jupyterhub.spawner import Spawner

from gpuspawner import stopnotice
from gpuspawner.userservice.stopnotices import user_notices
from gpuspawner_sandbox.testing import wait_for

from ..conftest import REPO
from ..hub.hubprocess import free_port, start_hub
from .test_hub import user_token

NOTICES = "/services/gpuspawner/stop-notices"


class FailingCheckSpawner(Spawner):
    """Its start fails on a GPU check, keeping why in its state (as GPUSpawner does)."""

    notice: stopnotice.StopNotice | None = None

    async def start(self):
        self.notice = stopnotice.StopNotice(
            stopnotice.REASON_GPU_CHECK, time.time(), kind="xid", detail="GPU 0 fell off the bus"
        )
        raise RuntimeError("the GPU check failed")

    async def poll(self):
        return 1

    async def stop(self, now=False):
        return None

    def get_state(self):
        state = super().get_state()
        if self.notice is not None:
            state[stopnotice.STATE_KEY] = self.notice.to_state()
        return state

    def load_state(self, state):
        super().load_state(state)
        self.notice = stopnotice.StopNotice.from_state(state.get(stopnotice.STATE_KEY))


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    hub = start_hub(
        tmp_path_factory.mktemp("hub"),
        extra_config=f"""
c.JupyterHub.spawner_class = "tests.userservice.test_stopnotices.FailingCheckSpawner"
from gpuspawner.userservice.hubconfig import add_service
add_service(c, url="http://127.0.0.1:{free_port()}", environ={{}})
""",
        env={"PYTHONPATH": str(REPO)},  # the hub imports the spawner above
    )
    if hub.process.poll() is not None:
        pytest.fail(f"JupyterHub exited during start:\n{hub.log()[-3000:]}")
    yield hub
    hub.stop()


def get(hub, token):
    request = urllib.request.Request(
        f"{hub.public_url}{NOTICES}", headers={"Authorization": f"token {token}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_a_user_reads_why_their_server_stopped_and_only_theirs(hub):
    ada, bo = user_token(hub, "ada"), user_token(hub, "bo")
    hub.api("POST", "/users/ada/servers/train", {})
    wait_for(
        "the failed start to end",
        lambda: (
            "train" not in hub.api("GET", "/users/ada").json()["servers"]
            and not hub.api("GET", "/users/ada").json()["pending"]
        ),
        timeout=30,
    )
    status, body = wait_for("the service", lambda: (r := get(hub, ada))[0] != 503 and r)
    assert status == 200, body
    (notice,) = body["notices"]
    assert notice["server"] == "train" and notice["reason"] == "gpu-check"
    assert notice["stopped_at"].endswith("Z")
    assert notice["message"].startswith("Your server 'train' was stopped at ")
    assert notice["message"].endswith(
        "because its GPUs failed their check (xid): GPU 0 fell off the bus."
    )
    assert get(hub, bo) == (200, {"notices": []})  # another user's notices are not theirs
    assert get(hub, hub.token)[0] == 403  # a service is not a user


def test_only_stopped_servers_with_a_readable_notice_count():
    notice = {"reason": "admin", "at": 1e9}
    model = {
        "servers": {
            "a": {"stopped": True, "state": {stopnotice.STATE_KEY: notice}},
            "b": {"stopped": False, "state": {stopnotice.STATE_KEY: notice}},
            "c": {"stopped": True, "state": {stopnotice.STATE_KEY: "junk"}},
            "d": {"stopped": True},
            "e": "junk",
        }
    }
    assert [n["server"] for n in user_notices(model)] == ["a"]
    assert user_notices({}) == []
