"""The end-to-end stack: the real control plane, the local kubelet, a real hub with GPUSpawner.

Started once per test session. The hub reaches the cluster only with the
service account of config/rbac.yaml. When the control plane cannot be built
(no Go), these tests are skipped loudly, and fail in CI.
"""

from __future__ import annotations

import contextlib
import shutil
import time

import pytest

from gpuspawner_sandbox.demo import SandboxStack
from gpuspawner_sandbox.testing import control_plane_binary

from ..conftest import FIXTURES

E2E_CATALOG = FIXTURES / "catalogs" / "e2e.yaml"

# Admins who configure an image-wide NVIDIA_VISIBLE_DEVICES=all (a common CUDA
# image default) must not leak GPUs into CPU-only servers.
EXTRA_HUB_CONFIG = """
c.KubeSpawner.environment = {"NVIDIA_VISIBLE_DEVICES": "all"}
c.KubeSpawner.start_timeout = 120
# tests/e2e/test_admin_page.py reads the hub's /metrics without a token
c.JupyterHub.authenticate_prometheus = False
"""


@pytest.fixture(scope="session")
def stack(tmp_path_factory, pytestconfig):
    binary = control_plane_binary(pytestconfig)
    s = SandboxStack(
        tmp_path_factory.mktemp("sandbox"),
        catalog=E2E_CATALOG,
        extra_hub_config=EXTRA_HUB_CONFIG,
        binary=binary,
    )
    with s:
        yield s


@pytest.fixture
def hub(stack):
    return stack.hub


@pytest.fixture
def kube(stack):
    return stack.control_plane.admin_api()


@contextlib.contextmanager
def hub_with(stack, extra_config: str):
    """The session's hub restarted with extra settings, and restored afterwards."""
    before = stack.extra_hub_config
    stack.extra_hub_config = before + extra_config
    stack.stop_hub()
    stack.start_hub()
    try:
        yield stack.hub
    finally:
        stack.extra_hub_config = before
        stack.stop_hub()
        stack.start_hub()


def ensure_user(hub, name):
    r = hub.api("POST", f"/users/{name}")
    assert r.status in (201, 409), r.body


def wait_for(predicate, timeout=90, interval=0.5, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def server_state(hub, user, name=""):
    return hub.api("GET", f"/users/{user}").json()["servers"].get(name)


def wait_ready(hub, user, name="", timeout=120):
    def ready():
        s = server_state(hub, user, name)
        if s is None:
            raise AssertionError(
                f"{user}'s server {name!r} stopped while starting:\n{hub.log()[-3000:]}"
            )
        return s["ready"]

    return wait_for(ready, timeout, what=f"{user}'s server {name!r} to be ready")


def stop_server(hub, user, name=""):
    path = f"/users/{user}/servers/{name}" if name else f"/users/{user}/server"
    r = hub.api("DELETE", path)
    assert r.status in (202, 204, 400), r.body
    wait_for(
        lambda: server_state(hub, user, name) is None, 90, what=f"{user}'s server {name!r} to stop"
    )


def pod_of(kube, user, name=""):
    """The live pod of a user's server, found by KubeSpawner's labels."""
    for pod in user_pods(kube, user):
        if pod["metadata"]["labels"].get("hub.jupyter.org/servername", "") == name:
            return pod
    return None


def user_pods(kube, user):
    pods = kube.get(
        "/api/v1/namespaces/jupyterhub/pods",
        query={"labelSelector": f"hub.jupyter.org/username={user}"},
    )["items"]
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


@pytest.fixture(scope="module")
def browser():
    """Debian's headless Chromium driven by playwright (which never downloads a browser here).

    Module-scoped: playwright's sync API keeps an event loop running in this
    thread while it is open, which the asyncio tests of later modules cannot share.
    """
    from playwright.sync_api import sync_playwright

    if not shutil.which(CHROMIUM):
        pytest.fail("Chromium is not installed: run scripts/install-system-packages.sh")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


def browser_log_in(browser, hub, name, path="/hub/home"):
    """A browser page logged into the hub as ``name`` (dummy authenticator), opened at ``path``."""
    from gpuspawner_sandbox.demo import DEMO_PASSWORD

    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    page.goto(hub.public_url + path)
    page.fill("#username_input", name)
    page.fill("#password_input", DEMO_PASSWORD)
    page.click("#login_submit")
    page.wait_for_load_state()
    return page
