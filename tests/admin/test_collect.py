"""The collector: recorded hub and cluster data through stand-in clients, a real Prometheus."""

from __future__ import annotations

import logging

import yaml

from gpuspawner.admin.collect import Collector, KubeReader, KueueReader
from gpuspawner.admin.report import format_text
from gpuspawner.clients.hubapi import HubError
from gpuspawner.clients.kube import KubeClient, KubeError, NotFound, Reader, Refused, RetryPolicy
from gpuspawner.clients.prometheus import GPUQueries, PrometheusClient

from ..conftest import REPO
from ..culler.dcgm import DCGMExporter
from ..culler.promserver import start_prometheus
from ..kubeapi import StandInApi
from .conftest import ADMIN, _load
from .kueueobjects import A100, GPU, H100, StandInKueue, sandbox_kueue


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


# ---------------------------------------------------------------------------
# Kueue's ClusterQueues (GPUAdmin.kueue_cluster_queues)
# ---------------------------------------------------------------------------


def kueue_collector(users, kueue_client, names=("notebooks", "batch"), **reader):
    reader = KueueReader(names, client=kueue_client, **reader)
    return Collector(Hub(users), Kube(), str(ADMIN / "catalog.yaml"), kueue=reader)


def rows_of(report):
    return {(r.cluster_queue, r.flavor, r.resource): r for r in report.kueue}


async def test_cluster_queues_beside_the_pool(users):
    client = sandbox_kueue()
    report = await kueue_collector(users, client).report()
    assert report.problems == ()
    assert report.kueue_cluster_queues == ("notebooks", "batch")
    # the pool figures are still there, read in the same pass
    assert {t.key for t in report.types} == {"a100", "h100"}
    rows = rows_of(report)
    # GPU resources only, in the order named and Kueue's flavor order
    assert list(rows) == [
        ("notebooks", A100, GPU),
        ("notebooks", H100, GPU),
        ("batch", A100, GPU),
        ("batch", H100, GPU),
    ]
    a100 = rows[("notebooks", A100, GPU)]
    assert (a100.cohort, a100.gpu_type, a100.gpu_type_name) == ("gpus", "a100", "NVIDIA A100")
    assert (a100.nominal, a100.borrowing_limit, a100.in_use, a100.reserved) == (4, None, 3, 4)
    # 3 pods x 1 GPU of the Job with no node selector: the first flavor; the admitted
    # Workload and the deleted one are not pending
    assert (a100.pending_workloads, a100.pending_gpus, a100.pending_partial) == (4, 3, False)
    h100 = rows[("notebooks", H100, GPU)]
    assert (h100.gpu_type, h100.borrowing_limit, h100.pending_gpus) == ("h100", 2, 2)
    batch = rows[("batch", H100, GPU)]
    assert (batch.in_use, batch.pending_workloads, batch.pending_gpus) == (6, 0, 0)
    # one read of each: the queues, the flavors, each pending list, each pending Workload
    assert [c for c in client.calls if c[0] != "workload"] == [
        ("cluster_queue", ("notebooks",)),
        ("cluster_queue", ("batch",)),
        ("resource_flavors", ()),
        ("pending_in_cluster_queue", ("notebooks",)),
        ("pending_in_cluster_queue", ("batch",)),
    ]
    assert sorted(c[1] for c in client.calls if c[0] == "workload") == [
        ("batch", "job-train-2"),
        ("jupyterhub", "pod-jupyter-ann-1"),
        ("jupyterhub", "pod-jupyter-bob-3"),
        ("jupyterhub", "pod-jupyter-gone-4"),
    ]


async def test_without_the_setting_kueue_is_not_read(users):
    report = await Collector(Hub(users), Kube(), str(ADMIN / "catalog.yaml")).report()
    assert report.kueue_cluster_queues == () and report.kueue == ()
    assert "Cluster queues" not in format_text(report)


async def test_a_cluster_queue_that_does_not_exist_is_a_sentence(users):
    client = sandbox_kueue()
    report = await kueue_collector(users, client, ("notebooks", "nope")).report()
    assert report.problems == (
        "The ClusterQueue 'nope' does not exist (GPUAdmin.kueue_cluster_queues names it).",
    )
    assert {r.cluster_queue for r in report.kueue} == {"notebooks"}
    assert ("pending_in_cluster_queue", ("nope",)) not in client.calls


async def test_no_rights_on_kueue_is_a_sentence_naming_the_role(users):
    refused = Refused(
        "Reading ClusterQueue 'notebooks' failed: HTTP 403: clusterqueues.kueue.x-k8s.io \"notebooks\" is forbidden",
        403,
        "Forbidden",
    )
    client = sandbox_kueue(fail={("cluster_queue", "notebooks"): refused})
    report = await kueue_collector(users, client).report()
    (problem,) = report.problems
    assert problem.startswith(
        "The ClusterQueue 'notebooks' is not shown: the admin service may not read it "
        "(config/rbac-kueue.yaml grants it, as the chart does with "
        "gpuspawner.admin.kueueClusterQueues; docs/security.md): Reading ClusterQueue"
    )
    assert {r.cluster_queue for r in report.kueue} == {"batch"}


async def test_unreadable_flavors_leave_the_gpu_types_unknown(users):
    client = sandbox_kueue(fail={"resource_flavors": KubeError("HTTP 500: etcd timeout", 500)})
    report = await kueue_collector(users, client).report()
    (problem,) = report.problems
    assert problem == (
        "Kueue's ResourceFlavors could not be read, so the GPU types of the ClusterQueues' "
        "flavors and their pending GPUs are not known: HTTP 500: etcd timeout."
    )
    rows = rows_of(report)
    assert {r.gpu_type for r in rows.values()} == {""}
    # without the flavors' labels the notebook's H100 node selector contradicts nothing:
    # everything is counted in the first flavor
    assert rows[("notebooks", A100, GPU)].pending_gpus == 5


async def test_no_visibility_api_leaves_the_pending_gpus_unknown(users):
    gone = NotFound(
        "Reading the pending workloads of ClusterQueue 'notebooks' failed: HTTP 404: the "
        "server could not find the requested resource",
        404,
    )
    client = sandbox_kueue(fail={("pending_in_cluster_queue", "notebooks"): gone})
    report = await kueue_collector(users, client).report()
    (problem,) = report.problems
    assert problem.startswith(
        "The pending GPUs of the ClusterQueue 'notebooks' are not shown (Kueue's visibility "
        "API): Reading the pending workloads"
    )
    rows = rows_of(report)
    assert rows[("notebooks", A100, GPU)].pending_gpus is None
    # the quota figures and the other queue stand
    assert rows[("notebooks", A100, GPU)].in_use == 3
    assert rows[("batch", H100, GPU)].pending_gpus == 0
    assert "unknown" in format_text(report)


async def test_a_refused_workload_read_is_a_sentence(users):
    refused = Refused("Reading Workload batch/job-train-2 failed: HTTP 403: forbidden", 403)
    client = sandbox_kueue(fail={("workload", "batch", "job-train-2"): refused})
    report = await kueue_collector(users, client).report()
    (problem,) = report.problems
    assert problem.startswith(
        "The pending GPUs of the ClusterQueue 'notebooks' are not shown: the admin service "
        "may not read it"
    )
    assert rows_of(report)[("notebooks", H100, GPU)].pending_gpus is None


async def test_a_long_queue_is_read_up_to_a_bound(users):
    client = sandbox_kueue()
    report = await kueue_collector(users, client, max_pending=2).report()
    # the first two in the queue's order: the notebook (2 H100s) and the Job (3 A100s)
    assert len([c for c in client.calls if c[0] == "workload"]) == 2
    rows = rows_of(report)
    a100, h100 = rows[("notebooks", A100, GPU)], rows[("notebooks", H100, GPU)]
    assert (a100.pending_gpus, a100.pending_partial) == (3, True)
    assert (h100.pending_gpus, h100.pending_partial) == (2, True)
    assert not rows[("batch", A100, GPU)].pending_partial
    assert "at least 3" in format_text(report)


async def test_without_kubernetes_kueue_is_one_sentence(users):
    reader = KueueReader(["notebooks"])
    report = await Collector(Hub(users), Kube(), kueue=reader).report()
    assert report.problems[-1] == (
        "Kueue's ClusterQueues are not shown: Kubernetes is not configured."
    )
    assert report.kueue == () and report.kueue_cluster_queues == ("notebooks",)


async def test_an_answer_of_the_wrong_shape_is_one_sentence(users, caplog):
    class Garbage(StandInKueue):
        async def resource_flavors(self):
            return 42  # not a list: a TypeError no client check catches

    client = sandbox_kueue()
    broken = Garbage(client.queues.values(), (), client.pending, client.objects.values())
    report = await kueue_collector(users, broken).report()
    assert report.problems == (
        "Kueue's ClusterQueues are not shown: the API server answered something that is "
        "not a Kueue object.",
    )
    assert report.users and report.types  # the rest of the page stands
    assert "Kueue's ClusterQueues could not be read: \"TypeError: 'int'" in caplog.text


#: What each KueueClient method the reader calls needs: (verb, API group, resource).
KUEUE_RIGHTS_NEEDED = {
    "cluster_queue": ("get", "kueue.x-k8s.io", "clusterqueues"),
    "resource_flavors": ("list", "kueue.x-k8s.io", "resourceflavors"),
    "pending_in_cluster_queue": (
        "get",
        "visibility.kueue.x-k8s.io",
        "clusterqueues/pendingworkloads",
    ),
    "workload": ("get", "kueue.x-k8s.io", "workloads"),
}


async def test_config_rbac_kueue_grants_every_read_the_page_makes(users):
    client = sandbox_kueue()
    await kueue_collector(users, client).report()
    used = {method for method, _ in client.calls}
    assert used == set(KUEUE_RIGHTS_NEEDED)
    documents = [
        d for d in yaml.safe_load_all((REPO / "config" / "rbac-kueue.yaml").read_text()) if d
    ]
    cluster_roles = [d for d in documents if d["kind"] == "ClusterRole"]
    bound = {
        d["roleRef"]["name"]
        for d in documents
        if d["kind"] == "ClusterRoleBinding"
        and {"kind": "ServiceAccount", "name": "gpuspawner-hub", "namespace": "jupyterhub"}
        in d["subjects"]
    }
    rules = [r for d in cluster_roles if d["metadata"]["name"] in bound for r in d["rules"]]
    for method in used:
        verb, group, resource = KUEUE_RIGHTS_NEEDED[method]
        assert any(
            group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"]
            for r in rules
        ), (method, verb, group, resource)
