"""Pressure culling that frees what fits, on the local cluster, through the real hub.

The A100 pool is two nodes of 4. Four idle 2-GPU servers fill it; someone then
asks for 4 A100. No node has 4 free, so the hub refuses the request (or queues
it); the hub publishes that demand on its metrics, the culler reads it and
stops exactly the two servers that share one node, and the request fits.
Freeing one GPU on each node would help nobody, and is never done.
"""

from __future__ import annotations

import contextlib
import json
import urllib.request

import pytest

from gpuspawner_sandbox.demo import HUB_NAMESPACE

from .conftest import (
    NODE_IMAGE,
    ensure_user,
    hub_with,
    pod_of,
    server_state,
    stop_servers,
    wait_for,
    wait_ready,
)
from .test_culler import run_culler
from .test_scheduling_and_validation import progress_messages

A100 = {"profile": "pytorch", "gpu_type": "a100"}
HOLDERS = ("pa", "pb", "pc", "pd")


def spawn(hub, user, gpus):
    ensure_user(hub, user)
    r = hub.api("POST", f"/users/{user}/server", {**A100, "gpus": str(gpus)})
    return r


def fill_a100_pool(hub, kube) -> dict[str, str]:
    """Four idle 2 x A100 servers: both 4-GPU nodes full. Returns user -> node."""
    for user in HOLDERS:
        r = spawn(hub, user, 2)
        assert r.status in (201, 202), r.body
    for user in HOLDERS:
        wait_ready(hub, user)
    nodes = {user: pod_of(kube, user)["spec"]["nodeName"] for user in HOLDERS}
    # four 2-GPU pods on two 4-GPU nodes: two on each, wherever the scheduler put them
    assert sorted(list(nodes.values()).count(n) for n in set(nodes.values())) == [2, 2]
    return nodes


def hub_metric_lines(hub, name):
    """Samples of one metric on the hub's /hub/metrics (the culler reads them with read:metrics)."""
    request = urllib.request.Request(
        f"{hub.public_url}/hub/metrics", headers={"Authorization": f"token {hub.token}"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        text = response.read().decode()
    return [line for line in text.splitlines() if line.startswith(name + "{")]


def stop_running(hub, users):
    """Stop, together, the default server of each of ``users`` that has one."""
    running = []
    for user in users:
        with contextlib.suppress(Exception):  # a user this test never made has no model
            if server_state(hub, user) is not None:
                running.append((user, ""))
    stop_servers(hub, running)


@pytest.fixture
def clean(hub):
    yield
    stop_running(hub, [*HOLDERS, "quinn", "rhea", "sven"])


def refused_demand(hub):
    """``{(gpu_type, gpus): requests}`` of the refused demand the hub publishes."""
    out = {}
    for line in hub_metric_lines(hub, "gpuspawner_gpu_demand"):
        if 'source="refused"' not in line:
            continue
        labels = dict(
            part.split("=", 1) for part in line[line.index("{") + 1 : line.index("}")].split(",")
        )
        key = (labels["gpu_type"].strip('"'), int(labels["gpus"].strip('"')))
        out[key] = out.get(key, 0) + int(float(line.rsplit(" ", 1)[1]))
    return out


def test_one_person_refused_from_five_named_servers_is_demand_for_their_allowance_only(
    stack, hub, kube, clean
):
    # mallory may hold 2 GPUs (the catalog's default); every A100 is taken. Five
    # named servers asking for 2 each publish 2 GPUs of demand, not 10: the culler
    # would otherwise stop other users' servers for GPUs mallory can never hold.
    fill_a100_pool(hub, kube)
    ensure_user(hub, "mallory")
    try:
        for server in ("s1", "s2", "s3", "s4", "s5"):
            r = hub.api("POST", f"/users/mallory/servers/{server}", {**A100, "gpus": "2"})
            assert r.status == 503, r.body
            assert "No node has 2 NVIDIA A100 GPUs free right now" in r.json()["message"]
        demand = refused_demand(hub)
        published = sum(gpus * n for (gpu_type, gpus), n in demand.items() if gpu_type == "a100")
        assert published == 2, demand
        lines = hub_metric_lines(hub, "gpuspawner_gpu_demand")
        assert not any("mallory" in line for line in lines)
    finally:
        # Any admitted GPU request of hers ends her demand: once the pool is free
        # again, one of her servers gets its 2 A100. The tests after this one must
        # not see her demand for the demand window's 600 s.
        stop_running(hub, HOLDERS)
        r = hub.api("POST", "/users/mallory/servers/s1", {**A100, "gpus": "2"})
        assert r.status in (201, 202), r.body
        stop_servers(hub, [("mallory", "s1")])
    assert refused_demand(hub) == {}


BLOCKER = {
    "apiVersion": "v1",
    "kind": "Pod",
    # in the hub's namespace, whose pods the hub counts (other namespaces' only with the
    # admin's opt-in: docs/security.md); a job of its own there, not one of its servers
    "metadata": {"name": "blocker", "namespace": HUB_NAMESPACE},
    "spec": {
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [
            {
                "name": "job",
                "image": NODE_IMAGE,
                "imagePullPolicy": "Never",
                "command": ["sleep", "600"],
                "resources": {"limits": {"nvidia.com/gpu": "3"}},
            }
        ],
        "terminationGracePeriodSeconds": 1,
    },
}


def test_refused_demand_frees_exactly_one_node_and_the_request_then_fits(
    stack, hub, kube, tmp_path, clean
):
    nodes = fill_a100_pool(hub, kube)
    r = spawn(hub, "rhea", 4)
    assert r.status == 503, r.body
    assert "No node has 4 NVIDIA A100 GPUs free right now" in r.json()["message"]
    # the hub publishes the refusal as demand, by type and count, never by user
    demand = hub_metric_lines(hub, "gpuspawner_gpu_demand")
    assert 'gpuspawner_gpu_demand{gpu_type="a100",gpus="4",source="refused"} 1.0' in demand
    assert not any("rhea" in line for line in demand)

    run = run_culler(stack, hub, tmp_path)
    assert run.returncode == 0, run.stderr
    wait_for(
        lambda: sum(server_state(hub, u) is None for u in HOLDERS) == 2,
        60,
        what="two servers to be culled",
    )
    culled = {u for u in HOLDERS if server_state(hub, u) is None}
    kept = set(HOLDERS) - culled
    assert len({nodes[u] for u in culled}) == 1, (nodes, culled)  # both on one node
    assert all(server_state(hub, u)["ready"] for u in kept)
    freed_node = nodes[next(iter(culled))]

    # the freed node takes the 4-GPU request once its pods are gone
    def admitted():
        r = spawn(hub, "rhea", 4)
        return r if r.status in (201, 202) else None

    wait_for(admitted, 60, interval=2, what="the 4 x A100 request to be admitted")
    wait_ready(hub, "rhea")
    assert pod_of(kube, "rhea")["spec"]["nodeName"] == freed_node
    assert not any(
        'source="refused"' in line for line in hub_metric_lines(hub, "gpuspawner_gpu_demand")
    )


def test_a_4_gpu_request_never_frees_gpus_spread_over_nodes(stack, hub, kube, tmp_path, clean):
    a100_nodes = sorted(
        n["metadata"]["name"]
        for n in kube.get("/api/v1/nodes")["items"]
        if n["metadata"]["labels"].get("nvidia.com/gpu.product") == "NVIDIA-A100-SXM4-80GB"
    )
    assert len(a100_nodes) == 2
    # 3 of each node's 4 A100 go to a job the culler does not manage
    blockers = []
    for i, node in enumerate(a100_nodes):
        pod = {**BLOCKER, "metadata": {**BLOCKER["metadata"], "name": f"blocker-{i}"}}
        pod["spec"] = {**BLOCKER["spec"], "nodeName": node}
        kube.post(f"/api/v1/namespaces/{HUB_NAMESPACE}/pods", pod)
        blockers.append(f"/api/v1/namespaces/{HUB_NAMESPACE}/pods/blocker-{i}")
    try:
        for user in ("pa", "pb"):  # one idle 1-GPU server on each node
            assert spawn(hub, user, 1).status in (201, 202)
        for user in ("pa", "pb"):
            wait_ready(hub, user)
        assert {pod_of(kube, u)["spec"]["nodeName"] for u in ("pa", "pb")} == set(a100_nodes)
        r = spawn(hub, "sven", 4)
        assert r.status == 503, r.body

        run = run_culler(stack, hub, tmp_path)
        assert run.returncode == 0, run.stderr
        log = run.stdout + run.stderr
        assert "Cannot free GPUs for a waiting request of 4 a100 GPUs (refused)" in log
        # stopping both would free 2 GPUs, one on each node: not 4 on one
        assert server_state(hub, "pa") is not None and server_state(hub, "pb") is not None
    finally:
        for path in blockers:
            with contextlib.suppress(Exception):
                kube.delete(path, query={"gracePeriodSeconds": "0"})


def message(event: str) -> str:
    """The message of one progress event (its JSON data)."""
    return json.loads(event).get("message", "")


def starts(prefix: str):
    """A test of one progress event: its message starts with ``prefix``."""
    return lambda event: message(event).startswith(prefix)


QUEUE_CONFIG = """
c.GPUSpawner.gpu_queue_enabled = True
c.GPUSpawner.gpu_queue_timeout = 240
# A queued request is answered 202 after 1 s instead of JupyterHub's 10 s slow-spawn
# wait; its refusals and admissions come well within it.
c.JupyterHub.tornado_settings = {"slow_spawn_timeout": 1}
"""


@pytest.fixture
def queue_hub(stack):
    with hub_with(stack, QUEUE_CONFIG) as hub:
        yield hub


def test_a_queued_request_starts_as_soon_as_the_culler_frees_its_gpus(
    stack, queue_hub, kube, tmp_path
):
    hub = queue_hub
    try:
        nodes = fill_a100_pool(hub, kube)
        r = spawn(hub, "quinn", 4)
        assert r.status == 202, r.body
        first = "1st in line for 4 × NVIDIA A100"
        shown = [message(m) for m in progress_messages(hub, "quinn", 4, until=starts(first))]
        assert any(m.startswith(first) for m in shown), shown
        # Sven gets in line behind her, then gives up: he leaves the queue at once.
        assert spawn(hub, "sven", 4).status == 202
        second = "2nd in line for 4 × NVIDIA A100 (2 waiting)"
        shown = [message(m) for m in progress_messages(hub, "sven", 4, until=starts(second))]
        assert any(m.startswith(second) for m in shown), shown
        queued = 'gpuspawner_gpu_demand{gpu_type="a100",gpus="4",source="queued"}'
        assert f"{queued} 2.0" in hub_metric_lines(hub, "gpuspawner_gpu_demand")
        r = hub.api("DELETE", "/users/sven/server")
        assert r.status in (202, 204), r.body
        wait_for(
            lambda: f"{queued} 1.0" in hub_metric_lines(hub, "gpuspawner_gpu_demand"),
            30,
            what="the abandoned request to leave the queue",
        )
        assert server_state(hub, "sven") is None

        run = run_culler(stack, hub, tmp_path)
        assert run.returncode == 0, run.stderr
        # no retry: the queued spawn itself goes on once the freed GPUs show
        wait_ready(hub, "quinn", timeout=120)
        culled = {u for u in HOLDERS if server_state(hub, u) is None}
        assert len(culled) == 2 and len({nodes[u] for u in culled}) == 1, (nodes, culled)
        assert pod_of(kube, "quinn")["spec"]["nodeName"] == nodes[next(iter(culled))]
    finally:
        stop_running(hub, [*HOLDERS, "quinn", "sven"])
