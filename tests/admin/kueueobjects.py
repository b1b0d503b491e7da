"""Kueue objects for the GPU page's ClusterQueue table, shaped as kueue.x-k8s.io/v1beta2 serves them.

Small dicts after Kueue v0.17.0's types (apis/kueue/v1beta2/clusterqueue_types.go,
resourceflavor_types.go, workload_types.go) and the design's cluster (docs/kueue.md):
one ResourceFlavor per GPU model, named after its ``nvidia.com/gpu.product`` label,
plus ``default-flavor`` for cpu and memory; ClusterQueues ``notebooks`` and ``batch``
in the cohort ``gpus``. The recorded objects of tests/fixtures/kueue/ are read where
a test needs Kueue's own output.

:class:`StandInKueue` answers as :class:`gpuspawner.clients.kueue.KueueClient` does,
with its errors, and records each call.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpuspawner.clients.kube import NotFound
from gpuspawner.core import kueue

GPU = "nvidia.com/gpu"
A100 = "nvidia-a100-sxm4-80gb"
H100 = "nvidia-h100-80gb-hbm3"
PRODUCT = "nvidia.com/gpu.product"


def flavor(name: str, labels: Mapping[str, str] | None = None) -> dict:
    spec = {"nodeLabels": dict(labels)} if labels else {}
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ResourceFlavor",
        "metadata": {"name": name},
        "spec": spec,
    }


def flavors() -> list[dict]:
    """The sandbox's flavors: one per GPU model (the catalog's a100 and h100), and cpu/memory's."""
    return [
        flavor(A100, {PRODUCT: "NVIDIA-A100-SXM4-80GB"}),
        flavor(H100, {PRODUCT: "NVIDIA-H100-80GB-HBM3"}),
        flavor("default-flavor"),
    ]


def _usage(amounts: Mapping[tuple[str, str], Any]) -> list[dict]:
    by_flavor: dict[str, list[dict]] = {}
    for (flavor_name, resource), total in amounts.items():
        by_flavor.setdefault(flavor_name, []).append(
            {"name": resource, "total": str(total), "borrowed": "0"}
        )
    return [{"name": f, "resources": r} for f, r in by_flavor.items()]


def cluster_queue(
    name: str,
    gpu_quotas: Iterable[tuple[str, str, Any, Any]],
    *,
    cohort: str = "gpus",
    used: Mapping[tuple[str, str], Any] | None = None,
    reserved: Mapping[tuple[str, str], Any] | None = None,
    pending: int = 0,
) -> dict:
    """A ClusterQueue: cpu and memory in ``default-flavor``, then ``gpu_quotas``
    ((flavor, resource, nominal, borrowing limit or None), in the order Kueue tries them)."""
    gpu_flavors: dict[str, list[dict]] = {}
    covered: list[str] = []
    for flavor_name, resource, nominal, borrowing in gpu_quotas:
        quota: dict[str, Any] = {"name": resource, "nominalQuota": str(nominal)}
        if borrowing is not None:
            quota["borrowingLimit"] = str(borrowing)
        gpu_flavors.setdefault(flavor_name, []).append(quota)
        if resource not in covered:
            covered.append(resource)
    groups = [
        {
            "coveredResources": ["cpu", "memory"],
            "flavors": [
                {
                    "name": "default-flavor",
                    "resources": [
                        {"name": "cpu", "nominalQuota": "1k"},
                        {"name": "memory", "nominalQuota": "10Ti"},
                    ],
                }
            ],
        }
    ]
    if gpu_flavors:
        groups.append(
            {
                "coveredResources": covered,
                "flavors": [{"name": f, "resources": r} for f, r in gpu_flavors.items()],
            }
        )
    spec: dict[str, Any] = {
        "namespaceSelector": {},
        "queueingStrategy": "BestEffortFIFO",
        "resourceGroups": groups,
    }
    if cohort:
        spec["cohortName"] = cohort
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": spec,
        "status": {
            "flavorsUsage": _usage(used or {}),
            "flavorsReservation": _usage(reserved or used or {}),
            "pendingWorkloads": pending,
            "reservingWorkloads": 0,
            "admittedWorkloads": 0,
        },
    }


def workload(
    namespace: str,
    name: str,
    pod_sets: Iterable[tuple[int, Mapping[str, Any], Mapping[str, str]]],
    *,
    queue: str = "gpu-notebooks",
    admitted: bool = False,
) -> dict:
    """A Workload with pod sets of (count, per-pod requests, node selector); pending unless
    ``admitted`` (then QuotaReserved is True)."""
    sets = []
    for i, (count, requests, selector) in enumerate(pod_sets):
        spec: dict[str, Any] = {
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example.org/x",
                    "resources": {"requests": {k: str(v) for k, v in requests.items()}},
                }
            ]
        }
        if selector:
            spec["nodeSelector"] = dict(selector)
        sets.append({"name": f"set-{i}", "count": count, "template": {"spec": spec}})
    reserved = {
        "type": "QuotaReserved",
        "status": "True" if admitted else "False",
        "reason": "QuotaReserved" if admitted else "Pending",
        "message": "Quota reserved" if admitted else "couldn't assign flavors to pod set main",
    }
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"queueName": queue, "podSets": sets},
        "status": {"conditions": [reserved]},
    }


def entry(namespace: str, name: str, position: int, kind: str = "Pod") -> kueue.PendingEntry:
    return kueue.PendingEntry(
        namespace=namespace,
        name=name,
        owner_kind=kind,
        owner_uid=f"uid-{name}",
        local_queue="gpu-notebooks",
        priority=1000,
        position_in_cluster_queue=position,
        position_in_local_queue=position,
    )


class StandInKueue:
    """What :class:`~gpuspawner.clients.kueue.KueueClient` answers, from these objects.

    ``fail``: method name (or (method, argument)) -> the error it raises. Every call is
    recorded in ``calls`` as (method, arguments).
    """

    def __init__(
        self,
        queues: Iterable[dict],
        flavors: Iterable[dict] = (),
        pending: Mapping[str, list[kueue.PendingEntry]] | None = None,
        workloads: Iterable[dict] = (),
        fail: Mapping[Any, Exception] | None = None,
    ):
        self.queues = {q["metadata"]["name"]: q for q in queues}
        self.flavors = list(flavors)
        self.pending = dict(pending or {})
        self.objects = {(w["metadata"]["namespace"], w["metadata"]["name"]): w for w in workloads}
        self.fail = dict(fail or {})
        self.calls: list[tuple[str, tuple]] = []

    def _call(self, method: str, *args: Any) -> None:
        self.calls.append((method, args))
        for key in (method, (method, *args)):
            if key in self.fail:
                raise self.fail[key]

    async def cluster_queue(self, name: str) -> dict:
        self._call("cluster_queue", name)
        if name not in self.queues:
            raise NotFound(f"Reading ClusterQueue {name!r} failed: not found", 404, "NotFound")
        return self.queues[name]

    async def resource_flavors(self) -> list[dict]:
        self._call("resource_flavors")
        return self.flavors

    async def pending_in_cluster_queue(
        self, name: str, limit: int | None = None
    ) -> list[kueue.PendingEntry]:
        self._call("pending_in_cluster_queue", name)
        entries = sorted(self.pending.get(name, []), key=lambda e: e.position_in_cluster_queue)
        return entries if limit is None else entries[:limit]

    async def workload(self, namespace: str, name: str) -> dict:
        self._call("workload", namespace, name)
        if (namespace, name) not in self.objects:
            raise NotFound(f"Reading Workload {namespace}/{name} failed: not found", 404)
        return self.objects[(namespace, name)]


def sandbox_kueue(**more: Any) -> StandInKueue:
    """``notebooks`` and ``batch`` over 8 A100s and 8 H100s, half each; work in both.

    notebooks: 3 A100s in use (4 reserved), pending: a notebook asking for 2 H100s (its
    node selector picks the flavor), a Job of 3 pods × 1 GPU with no selector (the first
    flavor, A100), a Workload admitted since the list was read, and one deleted since.
    batch: 6 H100s in use (2 of them borrowed from the cohort); nothing pending.
    """
    notebooks = cluster_queue(
        "notebooks",
        [(A100, GPU, 4, None), (H100, GPU, 4, 2)],
        used={(A100, GPU): 3, ("default-flavor", "cpu"): 6},
        reserved={(A100, GPU): 4, ("default-flavor", "cpu"): 8},
        pending=4,
    )
    batch = cluster_queue(
        "batch", [(A100, GPU, 4, None), (H100, GPU, 4, None)], used={(H100, GPU): 6}
    )
    pending = {
        "notebooks": [
            entry("jupyterhub", "pod-jupyter-ann-1", 0),
            entry("batch", "job-train-2", 1, kind="Job"),
            entry("jupyterhub", "pod-jupyter-bob-3", 2),
            entry("jupyterhub", "pod-jupyter-gone-4", 3),
        ]
    }
    workloads = [
        workload(
            "jupyterhub",
            "pod-jupyter-ann-1",
            [(1, {GPU: 2, "cpu": 4}, {PRODUCT: "NVIDIA-H100-80GB-HBM3"})],
        ),
        workload("batch", "job-train-2", [(3, {GPU: 1, "cpu": 8}, {})], queue="batch"),
        workload("jupyterhub", "pod-jupyter-bob-3", [(1, {GPU: 1}, {})], admitted=True),
    ]
    return StandInKueue(
        more.pop("queues", [notebooks, batch]),
        more.pop("flavors", flavors()),
        more.pop("pending", pending),
        more.pop("workloads", workloads),
        **more,
    )
