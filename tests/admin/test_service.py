"""The GPU page's stop marks the pod "stopped by an admin" before asking the hub to stop it."""

from __future__ import annotations

import pytest

from gpuspawner import labels, stopnotice
from gpuspawner.admin.collect import KubeReader
from gpuspawner.admin.service import GPUAdmin
from gpuspawner.kube import KubeClient

from ..kubeapi import StandInApi


@pytest.fixture
async def kubeapi(tmp_path, monkeypatch, pods):
    server = await StandInApi(pods=pods).start()
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(server.kubeconfig(tmp_path)))
    yield server
    await server.stop()


def annotations(server, name):
    pod = next(p for p in server.objects["pods"] if p["metadata"]["name"] == name)
    return pod["metadata"].get("annotations") or {}


async def test_the_stopped_servers_pod_and_only_it_is_marked(kubeapi):
    admin = GPUAdmin()
    admin.kube = KubeReader(KubeClient("jupyterhub"))
    try:
        await admin.annotate_stop("student", "notes")
    finally:
        await admin.kube.close()
    notice = stopnotice.StopNotice.from_state(
        annotations(kubeapi, "jupyter-student--notes")[labels.ANNOTATION_STOP_REASON]
    )
    assert notice.reason == stopnotice.REASON_ADMIN
    assert notice.sentence().endswith("because an admin stopped it from the GPU page.")
    assert labels.ANNOTATION_STOP_REASON not in annotations(kubeapi, "jupyter-student")
    patches = [r for r in kubeapi.requests if r[0] == "PATCH"]
    assert [r[1] for r in patches] == ["/api/v1/namespaces/jupyterhub/pods/jupyter-student--notes"]


async def test_a_refused_annotation_is_logged_and_the_stop_goes_on(kubeapi, capfd):
    admin = GPUAdmin()
    admin.kube = KubeReader(KubeClient("jupyterhub"))
    kubeapi.always = 403
    try:
        await admin.annotate_stop("ann", "")  # returns: the caller stops the server next
    finally:
        await admin.kube.close()
    assert "Could not mark ann/default as stopped by an admin" in capfd.readouterr().err
