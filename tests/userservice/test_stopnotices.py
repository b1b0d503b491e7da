"""``GET /services/gpuspawner/stop-notices`` under a real hub and proxy.

The notice comes from a server whose start failed as GPUSpawner's does when
the GPU check fails: the spawner keeps the notice in its state, and the hub
saves that state when it stops the server. The service reads it back through
the hub API with the asking user's own token (their login's OAuth token, or
the token a script sends), whose scopes hubconfig.add_service lets reach the
user's own servers only; the service has no scope of its own. GPUSpawner's
own keeping of notices is tests/hub/test_spawner_stopnotice.py's and tests/e2e's.
"""

from __future__ import annotations

import http.cookiejar
import json
import re
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest
from jupyterhub.spawner import Spawner

from gpuspawner.core import stopreasons
from gpuspawner.userservice.stopnotices import NO_STATE, state_hidden, user_notices
from gpuspawner_sandbox.testing import wait_for

from ..conftest import REPO
from ..hub.hubprocess import free_port, start_hub
from .test_hub import user_token

NOTICES = "/services/gpuspawner/stop-notices"


class FailingCheckSpawner(Spawner):
    """Its start fails on a GPU check, keeping why in its state (as GPUSpawner does)."""

    notice: stopreasons.StopNotice | None = None

    async def start(self):
        self.notice = stopreasons.StopNotice(
            stopreasons.REASON_GPU_CHECK, time.time(), kind="xid", detail="GPU 0 fell off the bus"
        )
        raise RuntimeError("the GPU check failed")

    async def poll(self):
        return 1

    async def stop(self, now=False):
        return None

    def get_state(self):
        state = super().get_state()
        if self.notice is not None:
            state[stopreasons.STATE_KEY] = self.notice.to_state()
        return state

    def load_state(self, state):
        super().load_state(state)
        self.notice = stopreasons.StopNotice.from_state(state.get(stopreasons.STATE_KEY))


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


def get(hub, token=None, opener=None):
    headers = {"Authorization": f"token {token}"} if token else {}
    request = urllib.request.Request(f"{hub.public_url}{NOTICES}", headers=headers)
    try:
        with (opener or urllib.request.build_opener()).open(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def stopped_by_a_failed_check(hub, user):
    """The user's server 'train' failed its start: its notice is in its saved state."""
    assert hub.api("POST", f"/users/{user}").status in (201, 409)
    hub.api("POST", f"/users/{user}/servers/train", {})
    wait_for(
        "the failed start to end",
        lambda: (
            "train" not in (model := hub.api("GET", f"/users/{user}").json())["servers"]
            and not model["pending"]
        ),
        timeout=30,
    )


def logged_in(hub, user):
    """A browser's session: logged in at the hub, cookies kept (the service's OAuth too)."""
    from gpuspawner_sandbox.demo import DEMO_PASSWORD

    opener = urllib.request.build_opener(
        urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar())
    )
    with opener.open(f"{hub.public_url}/hub/login", timeout=30) as response:
        xsrf = re.search(r'name="_xsrf" value="([^"]+)"', response.read().decode()).group(1)
    body = urllib.parse.urlencode({"username": user, "password": DEMO_PASSWORD, "_xsrf": xsrf})
    # on to the home page, not to the default server (whose start would fail here)
    login = f"{hub.public_url}/hub/login?next=%2Fhub%2Fhome"
    opener.open(login, body.encode(), timeout=30).close()
    return opener


def test_a_user_reads_why_their_server_stopped_and_only_theirs(hub):
    ada, bo = user_token(hub, "ada"), user_token(hub, "bo")
    stopped_by_a_failed_check(hub, "ada")
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


def test_a_browser_reads_them_with_the_token_of_its_login_to_the_service(hub):
    """The OAuth token the hub issues the service for the user carries the user's own
    read:servers and admin:server_state, and nothing on anyone else (JupyterHub 5.5 and 6.1)."""
    stopped_by_a_failed_check(hub, "cleo")
    browser = logged_in(hub, "cleo")
    status, body = wait_for("the service", lambda: (r := get(hub, opener=browser))[0] != 503 and r)
    assert status == 200, body
    assert [n["server"] for n in body["notices"]] == ["train"]
    assert body["notices"][0]["reason"] == "gpu-check"


def test_the_service_reads_no_more_than_the_users_own_token_may(hub):
    """A token that may reach the service but not read its user's servers gets no notices:
    the service has no token of its own to read them with."""
    stopped_by_a_failed_check(hub, "dora")
    r = hub.api("POST", "/users/dora/tokens", {"scopes": ["access:services!service=gpuspawner"]})
    assert r.status in (200, 201), r.body
    narrow = r.json()["token"]
    status, body = wait_for("the service", lambda: (r := get(hub, narrow))[0] != 503 and r)
    assert status == 403, body
    assert json.loads(body) == {"status": 403, "message": NO_STATE}
    # servers but not their state: the hub leaves the state out, the service says so
    r = hub.api(
        "POST",
        "/users/dora/tokens",
        {"scopes": ["access:services!service=gpuspawner", "read:servers!user"]},
    )
    assert r.status in (200, 201), r.body
    status, body = get(hub, r.json()["token"])
    assert status == 403, body
    assert json.loads(body)["message"] == NO_STATE


def test_only_stopped_servers_with_a_readable_notice_count():
    notice = {"reason": "admin", "at": 1e9}
    model = {
        "servers": {
            "a": {"stopped": True, "state": {stopreasons.STATE_KEY: notice}},
            "b": {"stopped": False, "state": {stopreasons.STATE_KEY: notice}},
            "c": {"stopped": True, "state": {stopreasons.STATE_KEY: "junk"}},
            "d": {"stopped": True},
            "e": "junk",
        }
    }
    assert [n["server"] for n in user_notices(model)] == ["a"]
    assert user_notices({}) == []


def test_a_preemption_notice_is_served_with_its_sentence():
    notice = {"reason": stopreasons.REASON_PREEMPTED, "at": 1e9, "detail": "reclaim"}
    model = {"servers": {"a": {"stopped": True, "state": {stopreasons.STATE_KEY: notice}}}}
    (served,) = user_notices(model)
    assert served["reason"] == "preempted"
    assert served["message"].endswith(
        "because it was preempted for queued work (its GPUs were borrowed from another queue, "
        "which took them back)."
    )


def test_a_stopped_server_without_its_state_means_the_token_may_not_read_it():
    assert state_hidden({"servers": {"a": {"stopped": True}}})
    assert not state_hidden({"servers": {"a": {"stopped": True, "state": {}}}})
    # running servers, or none stopped: nothing to tell from
    assert not state_hidden({"servers": {"a": {"stopped": False}}})
    assert not state_hidden({"servers": {}})
    # no servers at all: the token may not even list them
    assert state_hidden({"name": "ada", "kind": "user"})
