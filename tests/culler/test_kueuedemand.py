"""The heads of Kueue's ClusterQueues as pressure requests (pure): Kueue v1beta2 objects in."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuspawner.core import kueue
from gpuspawner.core.catalog import load_catalog_file, parse_catalog
from gpuspawner.culler import kueuedemand as K
from gpuspawner.culler import policy as P

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
#: a100, h100 (by the GFD product label) and a100-1g (a MIG resource, no node selector)
CATALOG = load_catalog_file(FIXTURES / "catalogs" / "e2e.yaml")
TYPES = CATALOG.gpu_types

A100 = "NVIDIA-A100-SXM4-80GB"
H100 = "NVIDIA-H100-80GB-HBM3"
PRODUCT = "nvidia.com/gpu.product"
#: the sandbox's flavor names: the product label, lower-cased
GPU_FLAVORS = (A100.lower(), H100.lower())


def flavor(name: str, **labels: str) -> dict:
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ResourceFlavor",
        "metadata": {"name": name},
        "spec": {"nodeLabels": labels} if labels else {},
    }


FLAVORS = kueue.flavor_node_labels(
    [
        flavor("default-flavor"),
        flavor(A100.lower(), **{PRODUCT: A100}),
        flavor(H100.lower(), **{PRODUCT: H100}),
        flavor("nvidia-a100-mig", **{PRODUCT: "NVIDIA-A100-SXM4-40GB"}),
        flavor("other-gpus", **{PRODUCT: "Tesla-V100"}),
    ]
)


def cluster_queue(name: str, gpu_flavors=GPU_FLAVORS, mig=True) -> dict:
    groups = [
        {
            "coveredResources": ["cpu", "memory"],
            "flavors": [
                {
                    "name": "default-flavor",
                    "resources": [
                        {"name": "cpu", "nominalQuota": "1000"},
                        {"name": "memory", "nominalQuota": "10Ti"},
                    ],
                }
            ],
        },
        {
            "coveredResources": ["nvidia.com/gpu"],
            "flavors": [
                {"name": f, "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 4}]}
                for f in gpu_flavors
            ],
        },
    ]
    if mig:
        groups.append(
            {
                "coveredResources": ["nvidia.com/mig-1g.5gb"],
                "flavors": [
                    {
                        "name": "nvidia-a100-mig",
                        "resources": [{"name": "nvidia.com/mig-1g.5gb", "nominalQuota": 7}],
                    }
                ],
            }
        )
    status = kueue.cluster_queue_status(
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ClusterQueue",
            "metadata": {"name": name},
            "spec": {
                "cohortName": "gpus",
                "namespaceSelector": {},
                "queueingStrategy": "BestEffortFIFO",
                "resourceGroups": groups,
            },
        }
    )
    assert status is not None
    return status


QUEUES = {"batch": cluster_queue("batch"), "notebooks": cluster_queue("notebooks")}


def pod_set(name="main", count=1, gpus=0, resource="nvidia.com/gpu", selector=None) -> dict:
    resources = {"requests": {"cpu": "1", "memory": "2Gi"}}
    if gpus:
        resources["limits"] = {resource: str(gpus)}
    spec = {"containers": [{"name": "c", "image": "x", "resources": resources}]}
    if selector:
        spec["nodeSelector"] = selector
    return {"name": name, "count": count, "template": {"spec": spec}}


def workload(name: str, *pod_sets: dict, namespace="batch", reserved=False) -> dict:
    conditions = [
        {
            "type": "QuotaReserved",
            "status": "True" if reserved else "False",
            "reason": "QuotaReserved" if reserved else "Pending",
            "message": "" if reserved else "couldn't assign flavors to pod set main",
        }
    ]
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"queueName": "batch", "podSets": list(pod_sets)},
        "status": {"conditions": conditions},
    }


def summary(*entries: tuple[str, str, str, int]) -> list[kueue.PendingEntry]:
    """entries: (namespace, workload name, owner kind, position in the ClusterQueue)."""
    return kueue.pending_entries(
        {
            "kind": "PendingWorkloadsSummary",
            "items": [
                {
                    "metadata": {
                        "name": name,
                        "namespace": namespace,
                        "ownerReferences": [{"kind": kind, "name": name, "uid": f"uid-{name}"}],
                    },
                    "priority": 100,
                    "localQueueName": "q",
                    "positionInClusterQueue": position,
                    "positionInLocalQueue": position,
                }
                for namespace, name, kind, position in entries
            ],
        }
    )


def demand(pending, workloads, queues=QUEUES, types=TYPES) -> K.KueueDemand:
    by_key = {(w["metadata"]["namespace"], w["metadata"]["name"]): w for w in workloads}
    return K.kueue_demand(pending, by_key, queues, FLAVORS, types)


def kueue_request(gpu_type: str, gpus: int) -> P.Request:
    return P.Request(gpu_type=gpu_type, gpus=gpus, source="kueue")


def test_the_head_of_a_queue_asks_for_its_gpus_per_pod_and_nothing_behind_it_counts():
    pending = {
        "batch": summary(
            ("batch", "second", "Job", 1), ("batch", "train", "Job", 0), ("batch", "x", "Job", 2)
        )
    }
    found = demand(
        pending,
        [
            workload("train", pod_set(count=1, gpus=4)),
            workload("second", pod_set(count=1, gpus=8)),
            workload("x", pod_set(count=1, gpus=8)),
        ],
    )
    # the first flavor of the ClusterQueue that covers nvidia.com/gpu is the A100s'
    assert found == K.KueueDemand((kueue_request("a100", 4),))
    assert K.head_keys(pending) == [("batch", "train")]


def test_each_pod_of_a_pod_set_is_one_request_of_that_pods_gpus():
    pending = {"batch": summary(("batch", "ddp", "Job", 0))}
    found = demand(
        pending,
        [workload("ddp", pod_set("launcher"), pod_set("workers", count=3, gpus=2))],
    )
    assert found.requests == (kueue_request("a100", 2),) * 3
    assert found.skipped == ()  # a pod set without GPUs is simply no demand


def test_the_pods_node_selector_chooses_the_flavor_and_so_the_gpu_type():
    pending = {"notebooks": summary(("jupyterhub", "pod-alice", "Pod", 0))}
    notebook = workload(
        "pod-alice", pod_set(gpus=1, selector={PRODUCT: H100}), namespace="jupyterhub"
    )
    assert demand(pending, [notebook]).requests == (kueue_request("h100", 1),)


def test_a_mig_slice_is_its_catalog_type_by_its_resource():
    pending = {"notebooks": summary(("jupyterhub", "pod-bob", "Pod", 0))}
    notebook = workload(
        "pod-bob", pod_set(gpus=2, resource="nvidia.com/mig-1g.5gb"), namespace="jupyterhub"
    )
    assert demand(pending, [notebook]).requests == (kueue_request("a100-1g", 2),)


def test_every_named_queue_has_its_own_head():
    pending = {
        "batch": summary(("batch", "train", "Job", 0)),
        "notebooks": summary(("jupyterhub", "pod-alice", "Pod", 0)),
    }
    found = demand(
        pending,
        [
            workload("train", pod_set(count=2, gpus=4)),
            workload("pod-alice", pod_set(gpus=1), namespace="jupyterhub"),
        ],
    )
    assert sorted(found.requests, key=lambda r: r.gpus) == [
        kueue_request("a100", 1),
        kueue_request("a100", 4),
        kueue_request("a100", 4),
    ]


@pytest.mark.parametrize(
    "why",
    ["admitted since the list", "gone since the list", "queue not read", "empty queue"],
)
def test_a_head_that_no_longer_waits_or_is_unknown_counts_for_nothing(why):
    pending = {"batch": summary(("batch", "train", "Job", 0))}
    workloads = [workload("train", pod_set(gpus=4), reserved=why == "admitted since the list")]
    queues = QUEUES
    if why == "gone since the list":
        workloads = []
    elif why == "queue not read":
        queues = {}
    elif why == "empty queue":
        pending = {"batch": []}
    assert demand(pending, workloads, queues) == K.KueueDemand()


def test_a_gpu_pod_set_no_catalog_type_serves_is_left_out_and_said_so_with_quoted_names():
    only_v100 = {"batch": cluster_queue("batch", gpu_flavors=("other-gpus",), mig=False)}
    pending = {"batch": summary(("batch", "evil\nname", "Job", 0))}
    found = demand(pending, [workload("evil\nname", pod_set("w\x1b", gpus=2))], queues=only_v100)
    assert found.requests == ()
    (line,) = found.skipped
    assert "\n" not in line and "\x1b" not in line
    assert line == (
        "the head of ClusterQueue 'batch' ('Job' 'batch/evil\\nname'), pod set 'w\\x1b', "
        "asks for 2 'nvidia.com/gpu' per pod, and flavor 'other-gpus' matches no catalog GPU "
        "type: not counted"
    )
    no_mig = {"batch": cluster_queue("batch", mig=False)}
    pending = {"batch": summary(("batch", "slices", "Job", 0))}
    found = demand(
        pending,
        [workload("slices", pod_set(gpus=1, resource="nvidia.com/mig-1g.5gb"))],
        queues=no_mig,
    )
    assert found.requests == ()
    assert found.skipped[0].endswith("ClusterQueue 'batch' has no flavor for it: not counted")


def test_a_head_asking_for_too_many_pods_is_not_counted():
    pending = {"batch": summary(("batch", "huge", "Job", 0))}
    found = demand(pending, [workload("huge", pod_set(count=K.MAX_HEAD_PODS + 1, gpus=1))])
    assert found.requests == ()
    assert "more than 1000 pods" in found.skipped[0]
    at_most = demand(pending, [workload("huge", pod_set(count=K.MAX_HEAD_PODS, gpus=1))])
    assert len(at_most.requests) == K.MAX_HEAD_PODS


def test_a_gpu_type_is_found_by_its_resource_among_the_catalogs_types():
    assert K.type_selectors(TYPES, "nvidia.com/gpu") == {
        "a100": {PRODUCT: A100},
        "h100": {PRODUCT: H100},
    }
    assert K.flavor_type(A100.lower(), "nvidia.com/gpu", FLAVORS, TYPES) == "a100"
    # a MIG flavor's node labels never make its slices full GPUs, nor the reverse
    assert K.flavor_type("nvidia-a100-mig", "nvidia.com/gpu", FLAVORS, TYPES) is None
    assert K.flavor_type(A100.lower(), "nvidia.com/mig-1g.5gb", FLAVORS, TYPES) == "a100-1g"


def test_a_gpu_type_chosen_by_node_affinity_alone_maps_to_its_flavor_as_in_the_hub():
    types = parse_catalog(
        {
            "images": {"pytorch": {"image": "example/pytorch:2.9"}},
            "gpu_types": {
                "a100": {"node_selector": {PRODUCT: A100}},
                "h100": {"node_affinity": [{"key": PRODUCT, "operator": "In", "values": [H100]}]},
                "anything": {"node_affinity": [{"key": PRODUCT, "operator": "Exists"}]},
            },
        }
    ).gpu_types
    assert K.type_selectors(types, "nvidia.com/gpu")["h100"] == {PRODUCT: frozenset({H100})}
    assert K.flavor_type(H100.lower(), "nvidia.com/gpu", FLAVORS, types) == "h100"
    assert K.flavor_type(A100.lower(), "nvidia.com/gpu", FLAVORS, types) == "a100"
    # an Exists term names no value: it cannot tell flavors apart, so it maps none
    assert K.flavor_type("other-gpus", "nvidia.com/gpu", FLAVORS, types) is None


def test_pressure_frees_for_the_head_of_the_queue_only_what_it_needs():
    """The issue's case: a 4 x A100 Job heads `batch`, behind it another. It waits for
    quota, which the nodes' free figures do not show (n0's "2 free" may be GPUs of another
    namespace's pods the hub does not see): only GPUs this pass frees count. n0 has two
    idle notebooks of 1 GPU, n1 four: exactly n1's four are stopped, nothing for the Job
    behind it."""
    now, hour = 1_800_000_000.0, 3600.0
    pending = {"batch": summary(("batch", "train", "Job", 0), ("batch", "next", "Job", 1))}
    found = demand(
        pending,
        [workload("train", pod_set(gpus=4)), workload("next", pod_set(gpus=4))],
    )

    def notebook(user: str, node: str, idle: float) -> P.Server:
        return P.Server(
            user=user,
            gpus=1,
            gpu_type="a100",
            node=node,
            started=now - 10 * hour,
            last_activity=now - idle,
            pod=f"jupyter-{user}",
            namespace="jupyterhub",
        )

    servers = [
        notebook("a", "n0", 3 * hour),
        notebook("b", "n0", 2 * hour),
        *(notebook(f"c{i}", "n1", 5 * hour) for i in range(4)),
    ]
    result = P.decide_pass(
        servers,
        now,
        P.Policy(default_timeout=None, default_pressure_timeout=0.5 * hour),
        pressure=P.Pressure(found.requests, free={"a100": {"n0": 2, "n1": 0}}),
    )
    assert [d.server.user for d in result.decisions if d.action == P.CULL] == [
        "c0",
        "c1",
        "c2",
        "c3",
    ]
    assert [(o.request, o.node) for o in result.pressure] == [(kueue_request("a100", 4), "n1")]
