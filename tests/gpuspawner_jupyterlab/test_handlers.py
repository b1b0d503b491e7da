"""The cull warning inside JupyterLab, end to end (browser test).

A real hub and proxy; the culler as the hub-managed service with a warning
period; a real ``jupyterhub-singleuser`` with JupyterLab and this extension
(installed in the test environment by ``make setup``); the grants come from
config/jupyterhub_config.py as shipped. Headless Chromium logs in, opens
JupyterLab, and must see the notification naming when the server stops and
how to keep it, once, however often JupyterLab asks.
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from ..conftest import REPO
from ..culler.hubtools import (
    CULLER_SERVICE,
    shipped_culler_role,
    shipped_server_token_scopes,
    shipped_user_role,
    spawn,
    wait_ready,
)
from ..e2e.conftest import browser, browser_log_in  # noqa: F401 (the fixture)
from ..hub.hubprocess import free_port, start_hub

pytestmark = pytest.mark.hub

USER = "lab-user"


@pytest.fixture(scope="module")
def lab_hub(tmp_path_factory):
    if not (Path(sys.prefix) / "share/jupyter/labextensions/gpuspawner-jupyterlab").is_dir():
        pytest.fail("gpuspawner-jupyterlab is not installed in this environment: run make setup")
    workdir = tmp_path_factory.mktemp("labhub")
    public_port, culler_port = free_port(), free_port()
    user_role, token_scopes = shipped_user_role(), shipped_server_token_scopes()
    singleuser = Path(sys.executable).parent / "jupyterhub-singleuser"
    service = {
        "name": CULLER_SERVICE,
        "url": f"http://127.0.0.1:{culler_port}",
        # warned at once (idle past 1 s), culled only after an hour: the warning stays
        "command": [
            sys.executable,
            "-m",
            "gpuspawner.culler",
            "--cull-every=1",
            "--kubernetes=off",
            "--min-running=0",
            "--timeout=1",
            "--warning-period=3600",
        ],
        "environment": {"PYTHONPATH": str(REPO)},
    }
    args = ["--LanguageServerManager.autodetect=False", "--CullWarning.poll_seconds=1"]
    if os.geteuid() == 0:
        args.append("--allow-root")
    extra = f"""
c.JupyterHub.spawner_class = "simple"
c.Spawner.ip = "127.0.0.1"
c.Spawner.cmd = [{str(singleuser)!r}]
c.Spawner.args = {args!r}
c.Spawner.default_url = "/lab"
c.Spawner.start_timeout = 120
c.Spawner.http_timeout = 120
c.SimpleLocalProcessSpawner.home_dir_template = {str(workdir / "home" / "{username}")!r}
c.Spawner.environment = {{"GPUSPAWNER_CULLER_URL": "http://127.0.0.1:{public_port}/services/{CULLER_SERVICE}/"}}
c.Spawner.server_token_scopes = {token_scopes!r}
c.JupyterHub.services.append({service!r})
c.JupyterHub.load_roles.append({shipped_culler_role()!r})
c.JupyterHub.load_roles.append({user_role!r})
"""
    hub = start_hub(
        workdir,
        extra_config=extra,
        public_port=public_port,
        env={"PYTHONPATH": str(REPO)},
        timeout=120,
    )
    if hub.process.poll() is not None:
        pytest.fail(f"JupyterHub exited during start:\n{hub.log()[-3000:]}")
    yield hub
    hub.stop()


def wait_warned(hub, user: str, timeout: float = 60) -> None:
    """Until the culler's /warnings (asked with the hub's admin token) lists the user."""
    deadline = time.monotonic() + timeout
    url = f"/services/{CULLER_SERVICE}/warnings"
    while time.monotonic() < deadline:
        request = urllib.request.Request(
            hub.public_url + url, headers={"Authorization": f"token {hub.token}"}
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as r:
                if any(w["user"] == user for w in json.loads(r.read())):
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"the culler never warned {user}:\n{hub.log()[-3000:]}")


def test_jupyterlab_shows_the_cull_warning_once(lab_hub, browser):  # noqa: F811
    spawn(lab_hub, USER, {})
    wait_ready(lab_hub, USER, timeout=120)
    wait_warned(lab_hub, USER)

    page = browser_log_in(browser, lab_hub, USER, f"/user/{USER}/lab")
    polls = []
    page.on(
        "response",
        lambda r: polls.append(r.status) if "/gpuspawner/warning?" in r.url else None,
    )
    toast = page.get_by_text("This server will be stopped at")
    toast.first.wait_for(timeout=120_000)
    text = toast.first.inner_text()
    assert "because it has been idle" in text and "To keep it, use it before then" in text, text

    # JupyterLab asks every second (poll_seconds=1): several answers, one notification
    deadline = time.monotonic() + 60
    while len(polls) < 3 and time.monotonic() < deadline:
        page.wait_for_timeout(500)
    assert len(polls) >= 3 and set(polls) == {200}, polls
    assert toast.count() == 1

    page.context.close()
