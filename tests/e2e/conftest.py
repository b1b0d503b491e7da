"""The end-to-end stack: the real control plane, real nodes, a real hub with GPUSpawner.

Started once for the package (tests/e2e): the control plane, the default
topology's nodes as real nodes (kubelet, containerd, runc, CNI; GPU nodes with
our device plugin, NVIDIA's runtime in CDI mode, the emulated driver and DCGM
exporter) holding the notebook image built here, a real Prometheus, and the hub
on the host's address in the pod range. The hub reaches the cluster only with
the service account of config/rbac.yaml. Where real nodes cannot run (no Go,
no runc, not root), these tests are skipped loudly, and fail in CI.

``tests/e2e/test_real_nodes.py::test_down_restores_the_host`` stops the stack
and compares the host with the snapshot taken before it started; it runs after
every test that uses the stack (:data:`LAST_TESTS`).
"""

from __future__ import annotations

import contextlib
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpuspawner.core.catalog import load_catalog_file
from gpuspawner_sandbox import hoststate, nodeconfig, testing
from gpuspawner_sandbox.demo import SandboxStack
from gpuspawner_sandbox.topology import load_topology

from ..chromium import sync_browser
from ..conftest import FIXTURES

E2E_CATALOG = FIXTURES / "catalogs" / "e2e.yaml"
#: The image every real node holds (no registry is reachable): for pods tests create themselves.
NODE_IMAGE = load_catalog_file(E2E_CATALOG).images["pytorch"].image

# Admins who configure an image-wide NVIDIA_VISIBLE_DEVICES=all (a common CUDA
# image default) must not leak GPUs into CPU-only servers. Merged into the sandbox
# config's environment (GPUSPAWNER_CULLER_URL, for the notebook's cull warning;
# traitlets merges the two sections' update()s), not replacing it.
EXTRA_HUB_CONFIG = """
c.KubeSpawner.environment.update({"NVIDIA_VISIBLE_DEVICES": "all"})
c.KubeSpawner.start_timeout = 240
# tests/e2e/test_admin_page.py reads the hub's /metrics without a token
c.JupyterHub.authenticate_prometheus = False
"""
#: Run after every other test that uses the stack, in this order: the forward-drop
#: counter read once the whole suite has run, then the test that stops the stack.
LAST_TESTS = ("test_nothing_was_forwarded_out_of_the_pod_ranges", "test_down_restores_the_host")


def emit(line: str) -> None:
    """Progress of the stack's start and of measured steps, past pytest's capture."""
    sys.__stderr__.write(line + "\n")


@pytest.fixture
def report(pytestconfig):
    """Say a measured figure on the terminal while the test runs (pytest captures its output)."""

    def say(line: str) -> None:
        with testing.capture_disabled(pytestconfig):
            emit(line)

    return say


@dataclass
class RealStack:
    stack: SandboxStack
    #: the host before the stack started (:func:`gpuspawner_sandbox.hoststate.snapshot`)
    before: dict
    #: the nodes' cgroup roots, compared with ``before``
    cgroup_roots: list[str]


@pytest.fixture(scope="package")
def real(tmp_path_factory, pytestconfig):
    testing.node_binaries(pytestconfig)  # build first; skip (fail in CI) where nodes cannot run
    state_dir = tmp_path_factory.mktemp("sandbox")
    roots = [nodeconfig.cgroup_root(n.name) for n in load_topology(None).nodes]
    before = hoststate.snapshot(state_dir / "nodes", roots)
    s = SandboxStack(
        state_dir,
        catalog=E2E_CATALOG,
        extra_hub_config=EXTRA_HUB_CONFIG,
        machine_wait=testing.MACHINE_WAIT,
        # The tests wait for GPU activity to reach Prometheus: every 2 s, not the demo's 10.
        scrape_interval="2s",
        emit=emit,
    )
    with testing.capture_disabled(pytestconfig), s:
        yield RealStack(s, before, roots)


@pytest.fixture(scope="package")
def stack(real):
    return real.stack


def pytest_collection_modifyitems(items):
    """The tests of :data:`LAST_TESTS` run after every other test that uses the stack."""
    e2e = [i for i in items if Path(str(i.fspath)).parent == Path(__file__).parent]
    if not e2e:
        return
    first = items.index(e2e[0])

    def order(item) -> int:
        if item.name in LAST_TESTS:
            return 1 + LAST_TESTS.index(item.name)
        return (
            0 if {"real", "stack", "hub", "kube"} & set(item.fixturenames) else len(LAST_TESTS) + 1
        )

    rest = [i for i in items if i not in e2e]
    items[:] = rest[:first] + sorted(e2e, key=order) + rest[first:]


class SharedKueue:
    """Kueue, and the stack's hub on it, for the modules that use them one after another
    (test_kueue.py, then test_kueue_preemption.py): deployed once, with the ClusterQueues'
    preemption switched between modules (:meth:`gpuspawner_sandbox.kueue.Kueue.set_preemption`),
    and removed as soon as the next test needs neither (:func:`pytest_runtest_teardown`), so
    that the rest of the package runs without Kueue, as before."""

    def __init__(self, stack: SandboxStack, pytestconfig) -> None:
        self._stack = stack
        self._pytestconfig = pytestconfig
        self._held = contextlib.ExitStack()
        self._kueue = None
        self._preemption: bool | None = None
        self._hub = None

    def kueue(self, *, preemption: bool):
        """The running Kueue (deployed on first use) with preemption on or off."""
        from gpuspawner_sandbox.demo import HUB_NAMESPACE

        if self._kueue is None:
            self._kueue = self._held.enter_context(
                testing.running_kueue(
                    self._stack.nodes, HUB_NAMESPACE, self._pytestconfig, preemption=preemption
                )
            )
        elif self._preemption != preemption:
            self._kueue.set_preemption(preemption)
        self._preemption = preemption
        return self._kueue

    def hub(self):
        """The stack's hub restarted on Kueue with the hub's Kueue rights (once)."""
        from .test_kueue import hub_on_kueue

        if self._hub is None:
            self._hub = self._held.enter_context(hub_on_kueue(self._stack))
        return self._hub

    def close(self) -> None:
        """The hub back off Kueue, then Kueue removed; nothing when nothing was started."""
        self._kueue = self._hub = self._preemption = None
        self._held.close()


#: The package's :class:`SharedKueue`, for :func:`pytest_runtest_teardown`.
SHARED_KUEUE = pytest.StashKey[SharedKueue]()


@pytest.fixture(scope="package")
def shared_kueue(stack, pytestconfig):
    shared = SharedKueue(stack, pytestconfig)
    pytestconfig.stash[SHARED_KUEUE] = shared
    try:
        yield shared
    finally:
        del pytestconfig.stash[SHARED_KUEUE]
        shared.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """Kueue goes once the tests that use it have run: after the last of a run of them."""
    yield
    shared = item.config.stash.get(SHARED_KUEUE, None)
    if shared is None or "shared_kueue" not in item.fixturenames:
        return
    if nextitem is None or "shared_kueue" not in nextitem.fixturenames:
        shared.close()


@pytest.fixture(scope="module")
def kueue(shared_kueue):
    """Kueue and its queues on the stack's cluster (gpuspawner_sandbox.kueue; docs/sandbox.md,
    "Kueue"): a ``kueue.Kueue`` with ``api`` (the admin's KubeApi), ``hub_namespace``
    (jupyterhub), ``local_queue`` (gpu-notebooks), ``cluster_queues`` (notebooks, batch),
    ``batch_namespace`` and ``batch_local_queue`` (batch), ``flavors``, ``pending(cq)``.
    Preemption off. Shared with the next module that uses Kueue (:class:`SharedKueue`)."""
    return shared_kueue.kueue(preemption=False)


@pytest.fixture(scope="module")
def kueue_preemption(shared_kueue):
    """As :func:`kueue`, with preemption on (LowerPriority within a ClusterQueue, reclaim
    within the cohort). A module uses one of the two."""
    return shared_kueue.kueue(preemption=True)


@pytest.fixture(scope="module")
def kueue_hub(shared_kueue, kueue):
    """The stack's hub on Kueue, with the hub's Kueue rights (config/rbac-kueue.yaml);
    shared like Kueue itself."""
    return shared_kueue.hub()


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


def ask_stop(hub, user, name=""):
    """Ask the hub to stop a server (as its user's DELETE does), without waiting."""
    path = f"/users/{user}/servers/{name}" if name else f"/users/{user}/server"
    r = hub.api("DELETE", path)
    assert r.status in (202, 204, 400), r.body


def stop_servers(hub, servers):
    """Stop several (user, name) servers at once and wait until all are gone.

    The DELETEs go out together: the hub answers each only when its stop is done
    or after its slow-stop wait (KubeSpawner's stop waits for the pod to go).
    """
    with ThreadPoolExecutor(max_workers=max(1, len(servers))) as pool:
        list(pool.map(lambda server: ask_stop(hub, *server), servers))
    wait_for(
        lambda: all(server_state(hub, user, name) is None for user, name in servers),
        90,
        what=f"servers {servers} to stop",
    )


def stop_server(hub, user, name=""):
    stop_servers(hub, [(user, name)])


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


@pytest.fixture(scope="module")
def browser():
    """Debian's headless Chromium driven by playwright (tests/chromium.py)."""
    with sync_browser() as b:
        yield b


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
