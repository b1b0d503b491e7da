"""gpuspawner.clients.kube against a stand-in API server on 127.0.0.1, through the real client.

Each error path is taken on purpose: pages, 401/403 (refused, never retried),
404, 410 (expired), 500 and 429 (retried), a request that gets no answer
(timeout) and a server that is gone (connection refused).
"""

from __future__ import annotations

import logging

import pytest

from gpuspawner.clients import kube
from gpuspawner.clients.kube import (
    Expired,
    KubeClient,
    KubeError,
    NotFound,
    Reader,
    Refused,
    Retryable,
    RetryPolicy,
    error_for,
)

from ..kubeapi import FORBIDDEN_PODS, StandInApi, core_api_for

FAST = RetryPolicy(timeout=2, first_delay=0.01, max_delay=0.05)


def pod(name, namespace="jupyterhub", **labels):
    return {"metadata": {"name": name, "namespace": namespace, "labels": labels}}


@pytest.fixture
async def server():
    api = StandInApi(
        pods=[pod(f"jupyter-{i}", **{"gpuspawner.io/managed": "true"}) for i in range(5)]
        + [pod("other", "batch"), pod("cpu-only", **{"app": "x"})],
        nodes=[{"metadata": {"name": f"node-{i}"}} for i in range(3)],
    )
    await api.start()
    yield api
    await api.stop()


@pytest.fixture
async def core(server):
    api = await core_api_for(server)
    yield api
    await api.api_client.close()


async def test_lists_every_page_with_the_selector(server, core):
    reader = Reader(FAST, page_size=2)
    pods = await reader.pods(core, namespace="jupyterhub", selector="gpuspawner.io/managed=true")
    assert [p["metadata"]["name"] for p in pods] == [f"jupyter-{i}" for i in range(5)]
    assert [q.get("continue") for _, q in server.requests] == [None, "2", "4"]
    assert {q["labelSelector"] for _, q in server.requests} == {"gpuspawner.io/managed=true"}
    assert {q["limit"] for _, q in server.requests} == {"2"}
    assert {path for path, _ in server.requests} == {"/api/v1/namespaces/jupyterhub/pods"}


async def test_every_namespace_and_nodes(server, core):
    everywhere = await Reader(FAST, page_size=3).pods(core, namespace=None)
    assert len(everywhere) == 7
    assert server.requests[0][0] == "/api/v1/pods"
    listing = await Reader(FAST, page_size=2).list_all(core.list_node, what="Listing nodes")
    assert [n["metadata"]["name"] for n in listing.items] == ["node-0", "node-1", "node-2"]
    assert listing.resource_version == "100"


@pytest.mark.parametrize("status", [401, 403])
async def test_refusal_is_an_error_and_is_not_retried(server, core, status):
    server.always = status
    with pytest.raises(Refused) as info:
        await Reader(FAST).pods(core, namespace="jupyterhub")
    assert info.value.status == status
    assert len(server.requests) == 1
    if status == 403:
        assert FORBIDDEN_PODS in str(info.value)
        assert info.value.reason == "Forbidden"


async def test_not_found(server, core):
    server.fail = [404]
    with pytest.raises(NotFound) as info:
        await Reader(FAST).pods(core, namespace="nowhere")
    assert info.value.status == 404 and len(server.requests) == 1


async def test_an_expired_continue_token_asks_for_a_fresh_list(server, core):
    pages = Reader(FAST, page_size=2).pages(
        core.list_namespaced_pod, "jupyterhub", what="Listing pods"
    )
    first = await pages.__anext__()
    assert len(first["items"]) == 2
    server.fail = [(410, "The provided continue parameter is too old")]
    with pytest.raises(Expired) as info:
        await pages.__anext__()
    assert "too old" in str(info.value)
    assert len(server.requests) == 2  # not retried: the caller lists again


async def test_server_errors_and_throttling_are_retried(server, core, caplog):
    server.fail = [500, 429, 503]
    with caplog.at_level(logging.WARNING, logger="gpuspawner.clients.kube"):
        pods = await Reader(FAST).pods(core, namespace="jupyterhub")
    assert len(pods) == 6
    assert len(server.requests) == 4
    assert [r.getMessage().split(" failed with ")[1][:8] for r in caplog.records] == [
        "HTTP 500",
        "HTTP 429",
        "HTTP 503",
    ]


async def test_retries_end_at_the_deadline(server, core):
    server.always = 500
    # tries at 0, 0.05, 0.15, 0.35, 0.55, 0.75, 0.95 s at the earliest: no eighth fits
    policy = RetryPolicy(timeout=1, first_delay=0.05, max_delay=0.2)
    with pytest.raises(Retryable) as info:
        await Reader(policy).pods(core, namespace="jupyterhub")
    assert info.value.status == 500
    assert 2 <= len(server.requests) <= 7


async def test_a_request_without_answer_times_out_and_is_retried(server, core):
    server.fail = ["hang"]
    pods = await Reader(FAST, timeout=1).pods(core, namespace="jupyterhub")
    assert len(pods) == 6 and len(server.requests) == 2


async def test_a_server_that_is_gone_is_retryable(server, core):
    await server.stop()
    with pytest.raises(Retryable) as info:
        await Reader(RetryPolicy(timeout=0.1, first_delay=0.05)).pods(core, namespace="jupyterhub")
    assert info.value.status is None
    assert "got no answer" in str(info.value)


async def test_the_service_client_reads_a_kubeconfig(server, tmp_path, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(server.kubeconfig(tmp_path)))
    client = KubeClient("jupyterhub", Reader(FAST))
    try:
        ours = await client.list_pods("gpuspawner.io/managed=true")
        every = await client.list_pods(all_namespaces=True)
        nodes = await client.list_nodes()
    finally:
        await client.close()
    assert (len(ours), len(every), len(nodes)) == (5, 7, 3)


def test_error_for_every_status():
    cases = {
        401: Refused,
        403: Refused,
        404: NotFound,
        410: Expired,
        429: Retryable,
        500: Retryable,
        504: Retryable,
        None: Retryable,
    }
    for status, kind in cases.items():
        error = error_for(status, b'{"message": "said so", "reason": "R"}', "Listing pods")
        assert type(error) is kind, status
    plain = error_for(422, b"<html>bad gateway</html>", "Listing pods")
    assert type(plain) is KubeError
    assert str(plain) == "Listing pods failed with HTTP 422: <html>bad gateway</html>"


def test_the_delays_double_up_to_the_cap():
    delays = RetryPolicy(first_delay=0.5, max_delay=3).delays()
    assert [next(delays) for _ in range(5)] == [0.5, 1.0, 2.0, 3, 3]


async def test_only_retryable_errors_are_retried():
    calls = []

    async def refused():
        calls.append(1)
        raise Refused("no", 403)

    with pytest.raises(Refused):
        await FAST.run(refused)
    assert len(calls) == 1

    async def flaky():
        calls.append(1)
        if len(calls) < 4:
            raise Retryable("later", 503)
        return "ok"

    assert await FAST.run(flaky) == "ok"
    assert len(calls) == 4


def test_namespace_discovery(monkeypatch, tmp_path):
    monkeypatch.setattr(kube, "SERVICE_ACCOUNT", str(tmp_path))
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    assert kube.default_namespace() == "jupyterhub"
    (tmp_path / "namespace").write_text("hub-ns\n")
    assert kube.default_namespace() == "hub-ns"
    monkeypatch.setenv("POD_NAMESPACE", "from-env")
    assert kube.default_namespace() == "from-env"


async def test_a_broken_kubeconfig_is_a_kube_error(tmp_path, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setattr(kube, "SERVICE_ACCOUNT", str(tmp_path))
    broken = tmp_path / "kubeconfig.yaml"
    broken.write_text("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\n")
    monkeypatch.setenv("KUBECONFIG", str(broken))
    client = KubeClient("jupyterhub")
    with pytest.raises(KubeError) as info:
        await client.list_pods()
    assert str(info.value).startswith("The Kubernetes client could not be configured: ")
    await client.close()
