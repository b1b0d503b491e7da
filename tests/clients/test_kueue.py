"""gpuspawner.clients.kueue against a stand-in API server on 127.0.0.1, through the real client.

The stand-in (tests/kubeapi.py's, with Kueue's paths) answers Kueue's objects and
the visibility API's pending workloads by their exact request path, as sent on
the wire (still escaped), and records the Authorization header of each request.
Errors are scripted as in tests/clients/test_kube.py: 403 (refused, never
retried), 404, 5xx and a request that gets no answer (retried by the reader's
policy).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
from aiohttp import web

from gpuspawner.clients import kube
from gpuspawner.clients.kube import KubeClient, NotFound, Reader, Refused, Retryable, RetryPolicy
from gpuspawner.clients.kueue import KueueClient
from gpuspawner.core import kueue

from ..kubeapi import StandInApi, status_body

FAST = RetryPolicy(timeout=2, first_delay=0.01, max_delay=0.05)
TOKEN = "standin-token"  # the token StandInApi.kubeconfig writes

KUEUE = "/apis/kueue.x-k8s.io/v1beta2"
VISIBILITY = "/apis/visibility.kueue.x-k8s.io/v1beta2"

FORBIDDEN_VISIBILITY = (
    'clusterqueues.visibility.kueue.x-k8s.io "notebooks" is forbidden: User '
    '"system:serviceaccount:jupyterhub:hub" cannot get resource "clusterqueues/pendingworkloads" '
    'in API group "visibility.kueue.x-k8s.io" at the cluster scope'
)


def named(kind: str, name: str, namespace: str | None = None, **extra) -> dict:
    meta = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": kind, "metadata": meta, **extra}


def item(name: str, uid: str, kind: str, position: int) -> dict:
    return {
        "metadata": {
            "name": name,
            "namespace": "jupyterhub",
            "ownerReferences": [{"apiVersion": "v1", "kind": kind, "name": name, "uid": uid}],
        },
        "priority": 1000,
        "localQueueName": "gpu-notebooks",
        "positionInClusterQueue": position,
        "positionInLocalQueue": position,
    }


def pending(*items: dict) -> dict:
    return {
        "kind": "PendingWorkloadsSummary",
        "apiVersion": "visibility.kueue.x-k8s.io/v1beta2",
        "metadata": {"creationTimestamp": None},
        "items": list(items),
    }


class KueueStandIn(StandInApi):
    """Answers GETs by the raw request path: an object, or a list (paged like the pods')."""

    def __init__(self, answers: dict[str, dict | list[dict] | str]):
        super().__init__()
        self.answers = answers
        #: (raw path, query, Authorization header) of every request, in order
        self.seen: list[tuple[str, dict[str, str], str | None]] = []
        #: called with each request once it is answered: the cluster moving on meanwhile
        self.after_answer: Callable[[web.Request], None] | None = None

    async def _get(self, request: web.Request) -> web.Response:
        response = await self._answer(request)
        if self.after_answer is not None:
            self.after_answer(request)
        return response

    async def _answer(self, request: web.Request) -> web.Response:
        self.seen.append(
            (
                request.raw_path.split("?")[0],
                dict(request.query),
                request.headers.get("Authorization"),
            )
        )
        failure = self.fail.pop(0) if self.fail else self.always
        if failure == "hang":
            await self._stopping.wait()
            return web.Response(status=503)
        if failure is not None:
            code, message = failure if isinstance(failure, tuple) else (failure, "")
            return web.json_response(status_body(code, message or f"injected {code}"), status=code)
        answer = self.answers.get(request.raw_path.split("?")[0])
        if answer is None:
            return web.json_response(
                status_body(
                    404, f"the server could not find the requested resource ({request.path})"
                ),
                status=404,
            )
        if isinstance(answer, str):
            return web.Response(text=answer, content_type="application/json")
        if isinstance(answer, dict) and answer.get("kind") == "PendingWorkloadsSummary":
            # the visibility API's options, as Kueue applies them (default limit 1000)
            offset = int(request.query.get("offset") or 0)
            limit = int(request.query.get("limit") or 1000)
            return web.json_response({**answer, "items": answer["items"][offset : offset + limit]})
        if isinstance(answer, dict):
            return web.json_response(answer)
        start = int(request.query.get("continue") or 0)
        limit = int(request.query.get("limit") or 0) or len(answer) or 1
        meta = {"resourceVersion": "200"}
        if start + limit < len(answer):
            meta["continue"] = str(start + limit)
        return web.json_response(
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "List",
                "metadata": meta,
                "items": answer[start : start + limit],
            }
        )

    async def start(self) -> KueueStandIn:
        app = web.Application()
        app.router.add_get("/{tail:.*}", self._get)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]
        return self

    @property
    def paths(self) -> list[str]:
        return [path for path, _, _ in self.seen]


#: By raw path: an object, a list (answered in pages) or raw text.
ANSWERS: dict[str, dict | list[dict] | str] = {
    f"{KUEUE}/clusterqueues": [named("ClusterQueue", n) for n in ("notebooks", "batch", "team-a")],
    f"{KUEUE}/clusterqueues/notebooks": named(
        "ClusterQueue", "notebooks", spec={"cohortName": "gpus"}
    ),
    f"{KUEUE}/resourceflavors": [
        named("ResourceFlavor", n) for n in ("default-flavor", "nvidia-a100")
    ],
    f"{KUEUE}/namespaces/jupyterhub/localqueues/gpu-notebooks": named(
        "LocalQueue", "gpu-notebooks", "jupyterhub", spec={"clusterQueue": "notebooks"}
    ),
    f"{KUEUE}/workloads": [named("Workload", f"w-{i}", f"ns-{i % 2}") for i in range(5)],
    f"{KUEUE}/namespaces/jupyterhub/workloads": [
        named("Workload", "pod-jupyter-alice-1", "jupyterhub")
    ],
    f"{KUEUE}/namespaces/jupyterhub/workloads/pod-jupyter-alice-1": named(
        "Workload", "pod-jupyter-alice-1", "jupyterhub"
    ),
    f"{VISIBILITY}/clusterqueues/notebooks/pendingworkloads": pending(
        item("pod-b", "uid-b", "Pod", 1), item("job-a", "uid-a", "Job", 0)
    ),
    f"{VISIBILITY}/namespaces/jupyterhub/localqueues/gpu-notebooks/pendingworkloads": pending(
        item("pod-b", "uid-b", "Pod", 0)
    ),
}


@pytest.fixture
async def server():
    api = KueueStandIn(ANSWERS)
    await api.start()
    yield api
    await api.stop()


@pytest.fixture
async def client(server, tmp_path, monkeypatch):
    """A KueueClient sharing a KubeClient configured from a kubeconfig, as the services make it."""
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setattr(kube, "SERVICE_ACCOUNT", str(tmp_path / "no-service-account"))
    monkeypatch.setenv("KUBECONFIG", str(server.kubeconfig(tmp_path)))
    kube_client = KubeClient("jupyterhub", Reader(FAST, page_size=2, timeout=1))
    yield await KueueClient.from_kube(kube_client)
    await kube_client.close()


async def test_objects_are_read_from_kueues_paths(server, client):
    cq = await client.cluster_queue("notebooks")
    assert cq["spec"] == {"cohortName": "gpus"}
    lq = await client.local_queue("jupyterhub", "gpu-notebooks")
    assert lq["spec"] == {"clusterQueue": "notebooks"}
    wl = await client.workload("jupyterhub", "pod-jupyter-alice-1")
    assert wl["metadata"]["name"] == "pod-jupyter-alice-1"
    assert server.paths == [
        f"{KUEUE}/clusterqueues/notebooks",
        f"{KUEUE}/namespaces/jupyterhub/localqueues/gpu-notebooks",
        f"{KUEUE}/namespaces/jupyterhub/workloads/pod-jupyter-alice-1",
    ]


async def test_lists_are_read_in_pages(server, client):
    queues = await client.cluster_queues()
    assert [q["metadata"]["name"] for q in queues] == ["notebooks", "batch", "team-a"]
    flavors = await client.resource_flavors()
    assert [f["metadata"]["name"] for f in flavors] == ["default-flavor", "nvidia-a100"]
    assert server.paths == [f"{KUEUE}/clusterqueues"] * 2 + [f"{KUEUE}/resourceflavors"]
    assert [q.get("continue") for _, q, _ in server.seen] == [None, "2", None]
    assert {q["limit"] for _, q, _ in server.seen} == {"2"}


async def test_workloads_of_one_namespace_or_all(server, client):
    everywhere = await client.workloads(None)
    assert [w["metadata"]["name"] for w in everywhere] == [f"w-{i}" for i in range(5)]
    ours = await client.workloads("jupyterhub")
    assert [w["metadata"]["name"] for w in ours] == ["pod-jupyter-alice-1"]
    assert server.paths == [f"{KUEUE}/workloads"] * 3 + [f"{KUEUE}/namespaces/jupyterhub/workloads"]
    await client.workloads("jupyterhub", "kueue.x-k8s.io/job-uid in (a,b)")
    assert server.seen[-1][1]["labelSelector"] == "kueue.x-k8s.io/job-uid in (a,b)"
    assert "labelSelector" not in server.seen[-2][1]


async def test_pending_workloads_from_the_visibility_api(server, client):
    cluster = await client.pending_in_cluster_queue("notebooks")
    assert [(e.name, e.owner_kind, e.owner_uid) for e in cluster] == [
        ("job-a", "Job", "uid-a"),
        ("pod-b", "Pod", "uid-b"),
    ]
    local = await client.pending_in_local_queue("jupyterhub", "gpu-notebooks")
    assert local == [
        kueue.PendingEntry("jupyterhub", "pod-b", "Pod", "uid-b", "gpu-notebooks", 1000, 0, 0)
    ]
    # the cluster queue's 2 fill a page of 2: a second (empty) page tells it ends
    assert server.paths == [
        "/apis/visibility.kueue.x-k8s.io/v1beta2/clusterqueues/notebooks/pendingworkloads",
        "/apis/visibility.kueue.x-k8s.io/v1beta2/clusterqueues/notebooks/pendingworkloads",
        "/apis/visibility.kueue.x-k8s.io/v1beta2/namespaces/jupyterhub/localqueues/gpu-notebooks/pendingworkloads",
    ]


async def test_pending_workloads_are_read_in_pages_up_to_a_limit(server, client):
    path = f"{VISIBILITY}/clusterqueues/long/pendingworkloads"
    server.answers[path] = pending(*(item(f"w-{i}", f"uid-{i}", "Job", i) for i in range(5)))
    everything = await client.pending_in_cluster_queue("long")
    assert [e.name for e in everything] == [f"w-{i}" for i in range(5)]
    # pages of the reader's size (2 here) by Kueue's offset; a short page ends the list
    assert [(q["offset"], q["limit"]) for _, q, _ in server.seen] == [
        ("0", "2"),
        ("2", "2"),
        ("4", "2"),
    ]
    server.seen.clear()
    head = await client.pending_in_cluster_queue("long", limit=1)
    assert [e.name for e in head] == ["w-0"]
    assert [(q["offset"], q["limit"]) for _, q, _ in server.seen] == [("0", "1")]
    server.seen.clear()
    assert [e.name for e in await client.pending_in_cluster_queue("long", limit=3)] == [
        "w-0",
        "w-1",
        "w-2",
    ]
    assert [(q["offset"], q["limit"]) for _, q, _ in server.seen] == [("0", "2"), ("2", "1")]


async def test_a_queue_moving_between_pages_gives_each_workload_once(server, client):
    """A higher-priority workload queued between two pages shifts the rest back: the
    second page starts with one already read, kept once (its first position)."""
    path = f"{VISIBILITY}/clusterqueues/moving/pendingworkloads"
    server.answers[path] = pending(*(item(f"w-{i}", f"uid-{i}", "Job", i) for i in range(4)))

    def urgent_job_queued(request):
        if request.raw_path.startswith(path) and request.query.get("offset") == "0":
            items = [item("urgent", "uid-urgent", "Job", 0), *server.answers[path]["items"]]
            server.answers[path] = pending(
                *({**it, "positionInClusterQueue": i} for i, it in enumerate(items))
            )

    server.after_answer = urgent_job_queued
    entries = await client.pending_in_cluster_queue("moving")
    assert [(e.name, e.position_in_cluster_queue) for e in entries] == [
        ("w-0", 0),
        ("w-1", 1),
        ("w-2", 3),
        ("w-3", 4),
    ]


async def test_the_bearer_token_is_sent_on_every_request(server, client):
    await client.cluster_queue("notebooks")
    await client.cluster_queues()
    await client.workloads(None)
    await client.pending_in_cluster_queue("notebooks")
    await client.pending_in_local_queue("jupyterhub", "gpu-notebooks")
    assert len(server.seen) == 9  # 1 + 2 pages + 3 pages + 2 pages + 1
    assert {auth for _, _, auth in server.seen} == {f"Bearer {TOKEN}"}


@pytest.mark.parametrize(
    ("name", "segment"),
    [
        ("a/b", "a%2Fb"),
        ("../../../api/v1/secrets", "..%2F..%2F..%2Fapi%2Fv1%2Fsecrets"),
        ("a..b", "a..b"),
        ("q?watch=true#x", "q%3Fwatch=true%23x"),  # "=" may stand in a path
        ("%2F", "%252F"),
        ("zoë", "zo%C3%AB"),
    ],
)
async def test_a_hostile_name_is_one_escaped_path_segment(server, client, name, segment):
    for read in (
        client.cluster_queue(name),
        client.workload("jupyterhub", name),
        client.local_queue(name, name),
        client.pending_in_cluster_queue(name),
        client.pending_in_local_queue(name, name),
    ):
        with pytest.raises(NotFound):
            await read
    assert server.paths == [
        f"{KUEUE}/clusterqueues/{segment}",
        f"{KUEUE}/namespaces/jupyterhub/workloads/{segment}",
        f"{KUEUE}/namespaces/{segment}/localqueues/{segment}",
        f"{VISIBILITY}/clusterqueues/{segment}/pendingworkloads",
        f"{VISIBILITY}/namespaces/{segment}/localqueues/{segment}/pendingworkloads",
    ]
    # nothing reached the query string: it holds the page options alone
    assert [q for _, q, _ in server.seen] == [{}] * 3 + [{"limit": "2", "offset": "0"}] * 2


@pytest.mark.parametrize("name", ["..", ".", ""])
async def test_a_name_no_object_can_have_is_not_asked_for(server, client, name):
    # sent as is, ".." would be resolved by the URL library (clusterqueues/.. reads the
    # group's discovery document) and "" would read the whole list
    for read in (
        client.cluster_queue(name),
        client.workload("jupyterhub", name),
        client.workload(name, "w"),
        client.local_queue("jupyterhub", name),
        client.pending_in_cluster_queue(name),
        client.pending_in_local_queue("jupyterhub", name),
        client.pending_in_local_queue(name, "gpu-notebooks"),
    ):
        with pytest.raises(NotFound) as info:
            await read
        assert "cannot name a Kubernetes object" in str(info.value)
    assert server.seen == []


async def test_refused_is_not_retried(server, client):
    server.always = (403, FORBIDDEN_VISIBILITY)
    with pytest.raises(Refused) as info:
        await client.pending_in_cluster_queue("notebooks")
    assert info.value.status == 403 and info.value.reason == "Forbidden"
    assert FORBIDDEN_VISIBILITY in str(info.value)
    with pytest.raises(Refused):
        await client.cluster_queues()
    with pytest.raises(Refused):
        await client.workload("jupyterhub", "pod-jupyter-alice-1")
    assert len(server.seen) == 3


async def test_not_found(server, client):
    with pytest.raises(NotFound) as info:
        await client.cluster_queue("missing")
    assert info.value.status == 404
    with pytest.raises(NotFound):
        await client.pending_in_local_queue("jupyterhub", "missing")
    with pytest.raises(NotFound):
        await client.workloads("nowhere-with-workloads")
    assert len(server.seen) == 3  # never retried


async def test_server_errors_are_retried(server, client, caplog):
    server.fail = [500, 503, (503, "service unavailable: the visibility server is starting")]
    with caplog.at_level(logging.WARNING, logger="gpuspawner.clients.kube"):
        cluster = await client.pending_in_cluster_queue("notebooks")
    assert [e.name for e in cluster] == ["job-a", "pod-b"]
    assert len(server.seen) == 5  # 3 failures, the first page, the second (empty) page
    assert len(caplog.records) == 3
    assert (
        "Reading the pending workloads of ClusterQueue 'notebooks'"
        in caplog.records[0].getMessage()
    )
    server.fail = [429, 502]
    assert (await client.cluster_queue("notebooks"))["metadata"]["name"] == "notebooks"
    server.fail = [500]
    assert len(await client.cluster_queues()) == 3  # a page is retried on its own


async def test_no_answer_is_retried(server, client):
    server.fail = ["hang"]  # the reader's timeout is 1 s
    local = await client.pending_in_local_queue("jupyterhub", "gpu-notebooks")
    assert len(local) == 1 and len(server.seen) == 2


async def test_retries_end_at_the_deadline(server, tmp_path, monkeypatch):
    server.always = 503
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setattr(kube, "SERVICE_ACCOUNT", str(tmp_path / "none"))
    monkeypatch.setenv("KUBECONFIG", str(server.kubeconfig(tmp_path)))
    kube_client = KubeClient(
        "jupyterhub", Reader(RetryPolicy(timeout=0.5, first_delay=0.05, max_delay=0.1))
    )
    client = await KueueClient.from_kube(kube_client)
    try:
        with pytest.raises(Retryable) as info:
            await client.pending_in_cluster_queue("notebooks")
    finally:
        await kube_client.close()
    assert info.value.status == 503
    assert 2 <= len(server.seen) <= 10


async def test_a_server_that_is_gone_is_retryable(server, client):
    await server.stop()
    client.reader = Reader(RetryPolicy(timeout=0.1, first_delay=0.05))
    with pytest.raises(Retryable) as info:
        await client.cluster_queue("notebooks")
    assert info.value.status is None and "got no answer" in str(info.value)


async def test_an_answer_that_is_not_an_object_is_a_kube_error(server, client):
    server.answers[f"{VISIBILITY}/clusterqueues/odd/pendingworkloads"] = "[]"
    server.answers[f"{VISIBILITY}/clusterqueues/html/pendingworkloads"] = "<html>proxy</html>"
    for name in ("odd", "html"):
        with pytest.raises(kube.KubeError) as info:
            await client.pending_in_cluster_queue(name)
        assert type(info.value) is kube.KubeError and info.value.status == 200
    assert len(server.seen) == 2  # not retried


async def test_a_client_of_its_own(server):
    from kubernetes_asyncio import client as k8s

    configuration = k8s.Configuration()
    configuration.host = server.url
    api_client = k8s.ApiClient(configuration)
    try:
        own = KueueClient(api_client, Reader(FAST))
        assert [e.name for e in await own.pending_in_cluster_queue("notebooks")] == [
            "job-a",
            "pod-b",
        ]
        # a default reader: the clients' module logger and policy
        assert KueueClient(api_client).reader.retry == RetryPolicy()
    finally:
        await api_client.close()
    assert server.seen[0][2] is None  # no kubeconfig, no token
