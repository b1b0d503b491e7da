"""The collector: recorded hub and cluster data through stand-in clients, a real Prometheus."""

from __future__ import annotations

import logging

from gpuspawner.admin.collect import Collector, KubeReader
from gpuspawner.clients.hubapi import HubError
from gpuspawner.clients.kube import KubeClient, Reader, RetryPolicy
from gpuspawner.clients.prometheus import GPUQueries, PrometheusClient

from ..culler.dcgm import DCGMExporter
from ..culler.promserver import start_prometheus
from ..kubeapi import StandInApi
from .conftest import ADMIN, _load


class Hub:
    """The two hub calls the collector makes, answered from users.json."""

    def __init__(self, users, fail=False):
        self.users = users
        self.fail = fail

    async def iter_users(self, state="active"):
        if self.fail:
            raise HubError("The hub API did not answer GET /users after 5 attempts.")
        for user in self.users:
            yield user

    async def request(self, method, path):
        name = path.rsplit("/", 1)[-1]
        if name == "quiet":
            return 200, {"name": "quiet", "admin": False, "groups": ["students"], "servers": {}}
        raise HubError(f"The hub refused GET {path} with 404.", status=404)


class Kube:
    def __init__(self, fail=False):
        self.fail = fail

    async def snapshot(self):
        if self.fail:
            raise RuntimeError("HTTP 403: nodes is forbidden")
        return _load("pods.json"), _load("nodes.json"), _load("all-pods.json")


async def test_report_from_the_sources(users):
    collector = Collector(Hub(users), Kube(), str(ADMIN / "catalog.yaml"), cache_seconds=60)
    report = await collector.report()
    assert report.problems == ()
    assert {t.key: (t.allocatable, t.in_use) for t in report.types} == {
        "a100": (8, 3),
        "h100": (8, 4),
    }
    assert report.user("student").rule == "group rule 'students'"
    # cached for the next page view; a stop invalidates it
    assert await collector.report() is report
    assert await collector.report(fresh=True) is not report
    collector.invalidate()
    assert await collector.report() is not report
    # a user without servers is looked up for --user
    quiet = await collector.report(("quiet", "nobody"))
    assert quiet.user("quiet").rule == "group rule 'students'" and quiet.user("nobody") is None


async def test_each_failing_source_is_one_note(users):
    collector = Collector(Hub(users, fail=True), Kube(fail=True), "/nonexistent/catalog.yaml")
    report = await collector.report()
    assert report.users == () and report.types == ()
    assert len(report.problems) == 3
    assert report.problems[0].startswith("The catalog could not be read, so limits are not shown")
    assert report.problems[1] == (
        "The hub's users could not be listed: The hub API did not answer GET /users after 5 attempts."
    )
    assert report.problems[2] == "The cluster could not be read: HTTP 403: nodes is forbidden"
    without = await Collector(Hub(users), None).report()
    assert "Kubernetes is not configured" in " ".join(without.problems)
    assert without.user("ann").limit is None


async def test_utilisation_from_a_real_prometheus(users, tmp_path):
    exporter = DCGMExporter()
    exporter.start()
    devices = exporter.sample_devices()
    exporter.assign(devices[0], "jupyterhub", "jupyter-ann", util=60)
    exporter.assign(devices[1], "jupyterhub", "jupyter-ann", util=20)
    prometheus = start_prometheus(tmp_path, f"127.0.0.1:{exporter._server.server_address[1]}")
    try:
        prometheus.wait_for('DCGM_FI_DEV_GPU_UTIL{pod="jupyter-ann"}', lambda r: len(r) == 2)
        client = PrometheusClient(prometheus.url, GPUQueries())
        collector = Collector(Hub(users), Kube(), str(ADMIN / "catalog.yaml"), client)
        report = await collector.report()
    finally:
        prometheus.stop()
        exporter.stop()
    assert report.utilisation_source == "prometheus" and report.problems == ()
    ann = report.user("ann").servers[0]
    # the busiest of the pod's GPUs, averaged over the window
    assert ann.utilisation == 0.6
    assert report.user("student").servers[0].utilisation is None


async def test_a_refused_pod_list_is_a_note_not_an_empty_cluster(users, tmp_path, monkeypatch):
    """The real client against a stand-in API server: a 403 on pods is said, never shown as no pods."""
    server = await StandInApi(pods=_load("all-pods.json"), nodes=_load("nodes.json")).start()
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(server.kubeconfig(tmp_path)))
    client = KubeClient("jupyterhub", Reader(RetryPolicy(timeout=1, first_delay=0.01)))
    collector = Collector(Hub(users), KubeReader(client), str(ADMIN / "catalog.yaml"))
    try:
        allowed = await collector.report(fresh=True)
        server.forbidden = {"pods"}
        refused = await collector.report(fresh=True)
    finally:
        await client.close()
        await server.stop()
    assert allowed.problems == ()
    assert {t.key: (t.allocatable, t.in_use) for t in allowed.types} == {
        "a100": (8, 3),
        "h100": (8, 4),
    }
    assert allowed.user("ann").servers[0].pod
    assert refused.problems == (
        "The cluster could not be read: Listing pods (all) in all namespaces failed with "
        'HTTP 403: pods is forbidden: User "system:serviceaccount:jupyterhub:hub" cannot list '
        'resource "pods" in API group "" in the namespace "jupyterhub"',
    )
    assert [(t.key, t.nodes, t.in_use) for t in refused.types] == [("a100", 0, 0), ("h100", 0, 0)]
    assert refused.user("ann").servers[0].pod == ""


async def test_anything_else_the_prometheus_client_raises_is_one_sentence(users, caplog):
    """Whatever shape the client lets through, the page goes on without utilisation."""

    class Crashing:
        url = "http://prometheus.example"
        timeout = 5.0
        queries = GPUQueries()

        async def per_pod(self, promql, at):
            raise TypeError("list indices must be integers or slices, not str")  # a bad shape

    collector = Collector(Hub(users), Kube(), str(ADMIN / "catalog.yaml"), Crashing())
    with caplog.at_level(logging.WARNING):
        report = await collector.report()
    assert report.problems == (
        "GPU utilisation is not shown: Prometheus at http://prometheus.example answered "
        "something that is not a query result.",
    )
    assert report.utilisation_source == "unavailable"
    assert report.user("ann").servers[0].node  # the rest is there
    assert "TypeError" in caplog.text and "Traceback" not in caplog.text
