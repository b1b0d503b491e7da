"""The inventory's watches against a scripted API: pages, events, a 410 relist, a 403.

The real API server is exercised in tests/e2e/test_capacity.py; here the
answers are scripted so each path is taken on purpose. Objects are the
recorded ones (tests/fixtures/nodes/).
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging

from gpuspawner.clients import kube
from gpuspawner.inventory.reflectors import InventoryReflector

from ..conftest import FIXTURES


def items(name):
    return json.loads((FIXTURES / "nodes" / name).read_text())["items"]


class Content:
    def __init__(self, chunks):
        self.chunks = chunks

    async def iter_any(self):
        for chunk in self.chunks:
            yield chunk


class Response:
    def __init__(self, status, body=None, lines=()):
        self.status = status
        self.body = body
        # Split mid-line on purpose: events must be reassembled.
        text = "".join(json.dumps(line) + "\n" for line in lines).encode()
        self.content = Content([text[i : i + 700] for i in range(0, len(text), 700)])

    async def read(self):
        return json.dumps(self.body).encode()

    def release(self):
        pass


class ScriptedApi:
    """list_node / list_pod_for_all_namespaces / list_namespaced_pod answering from scripts."""

    def __init__(self, nodes, pods, node_watches=(), pod_watches=(), forbidden=()):
        self.objects = {"nodes": nodes, "pods": pods}
        self.watches = {"nodes": list(node_watches), "pods": list(pod_watches)}
        self.forbidden = set(forbidden)
        #: statuses the next list requests (not watches) get instead of a page
        self.list_failures: list[int] = []
        self.calls = []

    async def _answer(self, kind, **kwargs):
        self.calls.append((kind, kwargs))
        if kind in self.forbidden:
            return Response(403, {"code": 403})
        if self.list_failures and not kwargs.get("watch"):
            status = self.list_failures.pop(0)
            return Response(status, {"code": status, "message": "etcdserver: request timed out"})
        if kwargs.get("watch"):
            script = self.watches[kind.split(":")[0]]
            if not script:
                await asyncio.sleep(3600)  # a quiet watch
            return script.pop(0)
        objs = self.objects[kind.split(":")[0]]
        start = int(kwargs.get("_continue") or 0)
        page = objs[start : start + kwargs["limit"]]
        more = start + kwargs["limit"] < len(objs)
        meta = {
            "resourceVersion": "100",
            **({"continue": str(start + kwargs["limit"])} if more else {}),
        }
        return Response(200, {"items": page, "metadata": meta})

    def list_node(self, **kwargs):
        return self._answer("nodes", **kwargs)

    def list_pod_for_all_namespaces(self, **kwargs):
        return self._answer("pods", **kwargs)

    def list_namespaced_pod(self, namespace, **kwargs):
        return self._answer(f"pods:{namespace}", **kwargs)


async def settle(reflector, check):
    for _ in range(200):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the reflector did not get there")


def a100_free(reflector):
    from gpuspawner.inventory.model import Demand

    demand = Demand(
        key="a100",
        resource="nvidia.com/gpu",
        node_selector={"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"},
        tolerations=({"key": "nvidia.com/gpu", "operator": "Exists"},),
    )
    return reflector.inventory.availability(demand).free


async def test_lists_in_pages_then_follows_events():
    nodes, pods = items("recorded-nodes.json"), items("recorded-pods.json")
    bound = next(p for p in pods if p["metadata"]["name"] == "bound-2xa100")
    second = copy.deepcopy(bound)
    second["metadata"].update(name="another", resourceVersion="101")
    gone = copy.deepcopy(bound)
    gone["metadata"]["resourceVersion"] = "103"
    api = ScriptedApi(
        nodes,
        pods,
        pod_watches=[
            Response(
                200,
                lines=[
                    {"type": "ADDED", "object": second},
                    {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "102"}}},
                    {"type": "DELETED", "object": gone},
                ],
            )
        ],
    )
    reflector = InventoryReflector(api, namespace="jupyterhub", page_size=2)
    reflector.start()
    try:
        await settle(reflector, lambda: reflector.ready)
        assert set(reflector.inventory.nodes) == {
            "gpu-a100-0",
            "gpu-a100-1",
            "gpu-h100-0",
            "gpu-h100-mig-0",
        }
        node_lists = [kw for kind, kw in api.calls if kind == "nodes" and not kw.get("watch")]
        assert len(node_lists) == 3  # 5 nodes in pages of 2
        await settle(reflector, lambda: reflector.pods_watch.events == 2)
        assert set(reflector.inventory.pods) == {"default/another", "default/pending-8xa100"}
        assert a100_free(reflector) == 8 - 2
        pod_watches = [kw for kind, kw in api.calls if kind == "pods" and kw.get("watch")]
        # The finished pods are filtered by the API server, and the watch resumes
        # from the last version seen when the server ends it.
        assert pod_watches[0]["field_selector"] == "status.phase!=Succeeded,status.phase!=Failed"
        await settle(
            reflector,
            lambda: len([c for c in api.calls if c[0] == "pods" and c[1].get("watch")]) == 2,
        )
        pod_watches = [kw for kind, kw in api.calls if kind == "pods" and kw.get("watch")]
        assert pod_watches[1]["resource_version"] == "103"
    finally:
        await reflector.stop()


async def test_gone_watch_lists_again():
    nodes, pods = items("recorded-nodes.json"), items("recorded-pods.json")
    api = ScriptedApi(
        nodes,
        pods,
        node_watches=[
            Response(200, lines=[{"type": "ERROR", "object": {"code": 410, "message": "too old"}}])
        ],
    )
    reflector = InventoryReflector(api, namespace="jupyterhub")
    reflector.start()
    try:
        await settle(
            reflector,
            lambda: len([c for c in api.calls if c[0] == "nodes" and not c[1].get("watch")]) == 2,
        )
    finally:
        await reflector.stop()


async def test_forbidden_nodes_and_pods_warn_once_each_and_fall_back(caplog):
    api = ScriptedApi(
        items("recorded-nodes.json"), items("recorded-pods.json"), forbidden={"nodes", "pods"}
    )
    api.objects["pods:jupyterhub"] = api.objects["pods"]
    api.watches["pods:jupyterhub"] = []
    log = logging.getLogger("reflector-test")
    reflector = InventoryReflector(api, namespace="jupyterhub", log=log)
    with caplog.at_level(logging.WARNING, logger="reflector-test"):
        reflector.start()
        try:
            await settle(reflector, lambda: reflector.pods_watch.synced.is_set())
            assert not await reflector.wait_ready(0.1)
            assert reflector.nodes_forbidden
        finally:
            await reflector.stop()
    warnings = [r.getMessage() for r in caplog.records if r.name == "reflector-test"]
    assert len(warnings) == 2, warnings
    assert (
        "may not list nodes. It needs cluster-wide 'list' and 'watch' on 'nodes'"
        in warnings[0] + warnings[1]
    )
    assert reflector.pods_scope == "namespace jupyterhub"
    assert [kind for kind, _ in api.calls].count("nodes") == 1  # a 403 is not retried
    # the warning says how to count every namespace, or to stop asking
    pods_warning = next(w for w in warnings if "may not list pods in all namespaces" in w)
    assert "config/rbac-opt-in-all-namespaces.yaml" in pods_warning
    assert "gpu_inventory_all_namespaces = False" in pods_warning
    # and the figures say they counted one namespace's pods
    assert reflector.inventory.pods_namespace == "jupyterhub"


async def test_the_hubs_namespace_alone_is_read_and_the_figures_say_so():
    """gpu_inventory_all_namespaces off (the default): never a cluster-wide pod list."""
    nodes, pods = items("recorded-nodes.json"), items("recorded-pods.json")
    api = ScriptedApi(nodes, pods)  # (its answers do not depend on the namespace asked)
    own = InventoryReflector(api, namespace="jupyterhub", all_namespaces=False)
    every = InventoryReflector(
        ScriptedApi(nodes, pods), namespace="jupyterhub", all_namespaces=True
    )
    for reflector in (own, every):
        reflector.start()
        try:
            assert await reflector.wait_ready(10)
        finally:
            await reflector.stop()
    assert {kind for kind, _ in api.calls} == {"nodes", "pods:jupyterhub"}
    assert own.missing_permissions == []
    # the same pods counted (the namespace's), only the figures' word on them differs
    assert own.inventory.pods and set(own.inventory.pods) == set(every.inventory.pods)
    assert own.inventory.pods_namespace == "jupyterhub"
    assert every.inventory.pods_namespace == ""


async def test_a_failed_page_is_retried_without_starting_the_list_again():
    nodes, pods = items("recorded-nodes.json"), items("recorded-pods.json")
    api = ScriptedApi(nodes, pods)
    reflector = InventoryReflector(api, namespace="jupyterhub", page_size=2)
    reflector.nodes_watch.retry = kube.RetryPolicy(timeout=5, first_delay=0.01)
    # the first page of nodes arrives, the second fails twice (500, then 429), then arrives
    first_page = await reflector.nodes_watch.list_call(limit=2, _preload_content=False)
    api.calls.clear()
    token = json.loads(await first_page.read())["metadata"]["continue"]
    original = api._answer

    async def flaky(kind, **kwargs):
        if kind == "nodes" and kwargs.get("_continue") == token and api.list_failures == []:
            api.list_failures[:] = [500, 429]
            api._answer = original
        return await original(kind, **kwargs)

    api._answer = flaky
    await reflector.nodes_watch.list_all()
    continues = [kw.get("_continue") for kind, kw in api.calls if kind == "nodes"]
    assert continues[0] is None  # listed once from the start…
    assert continues[1:] == [token] * 3 + continues[4:]  # …its second page asked three times
    assert None not in continues[1:]
    calm = InventoryReflector(ScriptedApi(nodes, pods), namespace="jupyterhub")
    await calm.nodes_watch.list_all()
    assert set(reflector.inventory.nodes) == set(calm.inventory.nodes)


async def test_a_forbidden_watch_event_is_a_missing_permission(caplog):
    forbidden = {"code": 403, "reason": "Forbidden", "message": "nodes is forbidden"}
    api = ScriptedApi(
        items("recorded-nodes.json"),
        items("recorded-pods.json"),
        node_watches=[Response(200, lines=[{"type": "ERROR", "object": forbidden}])],
    )
    reflector = InventoryReflector(api, namespace="jupyterhub")
    reflector.start()
    try:
        await settle(reflector, lambda: reflector.nodes_forbidden)
    finally:
        await reflector.stop()
    watches = [kw for kind, kw in api.calls if kind == "nodes" and kw.get("watch")]
    assert len(watches) == 1  # not retried


async def test_pod_listeners_get_every_listed_pod_and_every_event_and_cannot_break_the_watch():
    nodes, pods = items("recorded-nodes.json"), items("recorded-pods.json")
    bound = next(p for p in pods if p["metadata"]["name"] == "bound-2xa100")
    gone = copy.deepcopy(bound)
    gone["metadata"]["resourceVersion"] = "103"
    api = ScriptedApi(
        nodes, pods, pod_watches=[Response(200, lines=[{"type": "DELETED", "object": gone}])]
    )
    reflector = InventoryReflector(api, namespace="jupyterhub", page_size=2)
    seen = []
    reflector.add_pod_listener(lambda kind, pod: seen.append((kind, pod["metadata"]["name"])))

    def broken(kind, pod):
        raise ValueError("a listener's bug")

    reflector.add_pod_listener(broken)
    reflector.start()
    try:
        await settle(reflector, lambda: reflector.pods_watch.events == 1)
    finally:
        await reflector.stop()
    # Every pod of the list (GPU or not: the listener decides), then the watch's events,
    # with the pod's last state; the broken listener changed nothing.
    assert seen == [("LISTED", p["metadata"]["name"]) for p in pods] + [("DELETED", "bound-2xa100")]
    assert "default/bound-2xa100" not in reflector.inventory.pods
