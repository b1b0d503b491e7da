"""Cluster-aware GPU choices on the local GPU cluster, through the real hub.

The session's hub is restarted once for this module with a 10-second
fail-fast timeout, and restored afterwards. The figures come from the
gpuspawner service (config/sandbox/jupyterhub_config.py), whose watches of
nodes and pods, like the hub's own, run with the service account of
config/rbac.yaml; they are checked against what the cluster's pods hold, as
changes, never as fixed numbers.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import json
import logging
import re
import urllib.error
import urllib.request

import pytest

from gpuspawner_sandbox import testing
from gpuspawner_sandbox.kubeapi import ApiError

from .conftest import (
    NODE_IMAGE,
    ensure_user,
    hub_with,
    pod_of,
    server_state,
    stop_server,
    wait_for,
    wait_ready,
)

# Not below JupyterHub's 10 s slow-spawn wait: the stuck request must be accepted
# (202) before it fails, or the POST itself carries the failure.
CAPACITY_CONFIG = """
c.GPUSpawner.gpu_unschedulable_timeout = 10
"""


@pytest.fixture(scope="module")
def capacity_hub(stack):
    # Another namespace's pods (the batch jobs below) count only with the admin's opt-in:
    # the cluster-wide pod read and the setting (docs/capacity.md, "Permissions").
    stack.opt_in_all_namespaces()
    try:
        with hub_with(stack, CAPACITY_CONFIG) as hub:
            try:
                yield hub
            finally:
                # before hub_with restarts the session's hub, which does not count them
                stack.opt_in_all_namespaces(on=False)
    finally:
        stack.opt_in_all_namespaces(on=False)


def user_token(hub, name):
    ensure_user(hub, name)
    r = hub.api("POST", f"/users/{name}/tokens", {"note": "capacity test"})
    assert r.status in (200, 201), r.body
    return r.json()["token"]


def get(hub, path, token):
    request = urllib.request.Request(
        f"{hub.public_url}{path}", headers={"Authorization": f"token {token}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def browser(hub, name):
    """A cookie session logged in through the login form, as a browser is."""
    import http.cookiejar
    import re
    import urllib.parse

    from gpuspawner_sandbox.demo import DEMO_PASSWORD

    opener = urllib.request.build_opener(
        urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar())
    )
    with opener.open(f"{hub.public_url}/hub/login", timeout=30) as response:
        xsrf = re.search(r'name="_xsrf" value="([^"]+)"', response.read().decode()).group(1)
    body = urllib.parse.urlencode({"username": name, "password": DEMO_PASSWORD, "_xsrf": xsrf})
    with opener.open(f"{hub.public_url}/hub/login", body.encode(), timeout=30) as response:
        assert response.status == 200
    return opener


def availability(hub, token):
    status, body = get(hub, "/services/gpuspawner/availability", token)
    assert status == 200, body
    return json.loads(body)


def figures_when(hub, token, check, what):
    def current():
        payload = availability(hub, token)
        return payload if payload["available"] and check(payload["types"]) else None

    return wait_for(current, 60, what=what)


def test_form_and_endpoint_show_free_gpus_that_follow_servers(capacity_hub, kube):
    hub = capacity_hub
    token = user_token(hub, "fiona")
    before = figures_when(hub, token, lambda t: "a100" in t, "the inventory's first figures")
    a100 = before["types"]["a100"]
    assert a100["allocatable"] == 8 and a100["largest_node"] == 4  # 2 nodes with 4 A100
    assert before["types"]["h100"]["largest_node"] == 8

    session = browser(hub, "fiona")
    with session.open(f"{hub.public_url}/hub/spawn/fiona", timeout=30) as response:
        form = response.read().decode()
    assert 'name="profile-option-pytorch--gpu_type"' in form  # KubeSpawner's form
    assert f"{a100['free']} free of 8 (at most {a100['largest_free']} on one node)" in form
    assert '"/services/gpuspawner/availability"' in form  # the script that keeps it current
    # ... which the browser may fetch with its login cookie (through the hub's OAuth)
    with session.open(f"{hub.public_url}/services/gpuspawner/availability", timeout=30) as response:
        assert json.loads(response.read())["types"]["a100"]["free"] == a100["free"]

    r = hub.api(
        "POST", "/users/fiona/server", {"profile": "pytorch", "gpu_type": "a100", "gpus": "2"}
    )
    assert r.status in (201, 202), r.body
    wait_ready(hub, "fiona")
    try:
        node = pod_of(kube, "fiona")["spec"]["nodeName"]
        during = figures_when(
            hub, token, lambda t: t["a100"]["free"] == a100["free"] - 2, "2 fewer free A100s"
        )
        assert during["types"]["a100"]["requested"] == a100["requested"] + 2
        assert during["types"]["h100"]["free"] == before["types"]["h100"]["free"]
        assert node.startswith("gpu-a100-")
    finally:
        stop_server(hub, "fiona")
    figures_when(hub, token, lambda t: t["a100"]["free"] == a100["free"], "the 2 A100s back")


def test_never_schedulable_request_is_refused_at_once_without_a_pod(capacity_hub, kube):
    hub = capacity_hub
    ensure_user(hub, "hog")  # unlimited in the e2e catalog, so only the cluster can say no
    token = user_token(hub, "hog")
    figures_when(hub, token, lambda t: "a100" in t, "figures")
    r = hub.api(
        "POST", "/users/hog/server", {"profile": "pytorch", "gpu_type": "a100", "gpus": "8"}
    )
    assert r.status == 400, r.body
    assert r.json()["message"] == (
        "No node has 8 NVIDIA A100 GPUs; the largest has 4. "
        "Ask for 4 or fewer, or choose NVIDIA H100."
    )
    assert pod_of(kube, "hog") is None
    assert server_state(hub, "hog") is None


BATCH_NAMESPACE = "batch"


def blocking_pod(name, node):
    """A batch job holding all 4 A100s of a node that takes its time to stop (ignores SIGTERM)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": BATCH_NAMESPACE},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
            ],
            "terminationGracePeriodSeconds": 120,
            "containers": [
                {
                    "name": "train",
                    "image": NODE_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", "trap '' TERM; while true; do sleep 1; done"],
                    "resources": {"limits": {"nvidia.com/gpu": "4"}},
                }
            ],
        },
    }


def test_pod_stuck_without_gpus_fails_fast_with_the_reason_and_is_removed(
    stack, capacity_hub, kube
):
    """GPUs of a terminating pod look free (it is going), but the scheduler counts them
    until the pod is gone: a request admitted meanwhile stays unschedulable, and must fail
    within the fail-fast time instead of the start timeout."""
    hub = capacity_hub
    token = user_token(hub, "stuck")
    with contextlib.suppress(ApiError):
        kube.post("/api/v1/namespaces", {"metadata": {"name": BATCH_NAMESPACE}})
    names = {"train-0": "gpu-a100-0", "train-1": "gpu-a100-1"}
    try:
        for name, node in names.items():
            kube.post(f"/api/v1/namespaces/{BATCH_NAMESPACE}/pods", blocking_pod(name, node))
        # Only a started container ignores SIGTERM: a pod deleted before its container runs
        # is gone at once (real nodes take a moment to start it).
        wait_for(
            lambda: all(testing.running_pod(kube, BATCH_NAMESPACE, n) for n in names),
            120,
            what="the batch pods to run",
        )
        # Another namespace's pods count: the A100s are all taken.
        figures_when(hub, token, lambda t: t["a100"]["free"] == 0, "no free A100 (batch pods)")
        r = hub.api(
            "POST", "/users/stuck/server", {"profile": "pytorch", "gpu_type": "a100", "gpus": "1"}
        )
        assert r.status == 503, r.body
        assert r.json()["message"].startswith(
            "No node has 1 NVIDIA A100 GPU free right now: all 8 are in use."
        )

        for name in names:  # they ignore SIGTERM: terminating for up to 120 s
            kube.delete(f"/api/v1/namespaces/{BATCH_NAMESPACE}/pods/{name}")
        figures_when(
            hub, token, lambda t: t["a100"]["free"] == 8, "terminating pods' GPUs to look free"
        )

        r = hub.api(
            "POST", "/users/stuck/server", {"profile": "pytorch", "gpu_type": "a100", "gpus": "1"}
        )
        assert r.status in (201, 202), r.body

        def unschedulable():
            pod = pod_of(kube, "stuck")
            for condition in (pod or {}).get("status", {}).get("conditions") or []:
                if (
                    condition["type"] == "PodScheduled"
                    and condition.get("reason") == "Unschedulable"
                ):
                    return condition["message"]
            return None

        raw = wait_for(unschedulable, 30, what="the scheduler to find no node")
        assert "Insufficient nvidia.com/gpu" in raw
        wait_for(lambda: server_state(hub, "stuck") is None, 60, what="the spawn to fail fast")
        wait_for(lambda: pod_of(kube, "stuck") is None, 30, what="the stuck pod to be deleted")
        log = hub.log()
        assert (
            "Giving up on stuck after 10 s without free GPUs: No node can take this server yet:"
            in log
        )
        assert "have too few free NVIDIA A100 GPUs" in log

        # After a hub restart, the user is told why at their next visit.
        stack.stop_hub()
        hub = stack.start_hub()
        with browser(hub, "stuck").open(f"{hub.public_url}/hub/home", timeout=30) as page:
            home = html.unescape(re.sub(r"<[^>]+>", "", page.read().decode()))
        assert "Your server (1 × NVIDIA A100) was stopped at" in home, home[-2000:]
        assert "because no node had free GPUs for it for 10 seconds." in home
    finally:
        for name in names:
            with contextlib.suppress(ApiError):
                kube.delete(
                    f"/api/v1/namespaces/{BATCH_NAMESPACE}/pods/{name}",
                    query={"gracePeriodSeconds": "0"},
                )
        # a server that started after all (the test failed) must not hold A100s others need
        if server_state(hub, "stuck") is not None:
            stop_server(hub, "stuck")
    figures_when(hub, token, lambda t: t["a100"]["free"] == 8, "all A100s free again")


def test_inventory_without_node_permission_warns_once_and_has_no_figures(stack, tmp_path, caplog):
    """The reflector itself, with a service account that has only the namespaced Role."""
    from kubernetes_asyncio import client, config

    from gpuspawner.inventory.reflectors import InventoryReflector

    cp = stack.control_plane
    manifest = tmp_path / "no-inventory.yaml"
    manifest.write_text(
        """
apiVersion: v1
kind: ServiceAccount
metadata: {name: hub-without-inventory, namespace: jupyterhub}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: hub-without-inventory, namespace: jupyterhub}
subjects: [{kind: ServiceAccount, name: hub-without-inventory, namespace: jupyterhub}]
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: gpuspawner-hub}
"""
    )
    cp.apply_manifests(manifest)
    cp.wait_for_service_account("jupyterhub", "hub-without-inventory")
    kubeconfig = cp.service_account_kubeconfig("jupyterhub", "hub-without-inventory")

    async def run():
        cfg = client.Configuration()
        await config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
        async with client.ApiClient(cfg) as api:
            reflector = InventoryReflector(
                client.CoreV1Api(api), namespace="jupyterhub", log=logging.getLogger("inv-test")
            )
            reflector.start()
            try:
                ready = await reflector.wait_ready(10)
                await asyncio.sleep(2)  # both watches have given their answer
                return ready, reflector
            finally:
                await reflector.stop()

    with caplog.at_level(logging.WARNING, logger="inv-test"):
        ready, reflector = asyncio.run(run())
    assert not ready
    warnings = [r.getMessage() for r in caplog.records if r.name == "inv-test"]
    nodes = [w for w in warnings if "may not list nodes" in w]
    assert len(nodes) == 1, warnings
    assert "cluster-wide 'list' and 'watch' on 'nodes'" in nodes[0]
    # Pods: falls back to the hub's namespace, which the Role allows, with one warning.
    assert sum("may not list pods in all namespaces" in w for w in warnings) == 1
    assert reflector.pods_scope == "namespace jupyterhub"
    assert reflector.pods_watch.synced.is_set()
