"""gpuspawner.core.kueue: Kueue v1beta2 objects in, data out; hostile input never raises.

The objects below are shaped as Kueue v0.17.0 writes them (``apis/kueue/v1beta2``,
``apis/visibility/v1beta2``; a pending workload's metadata carries the owner
references, ``pkg/visibility/storage/utils.go``), with its own message texts:
``pkg/scheduler/flavorassigner`` for QuotaReserved=False, ``pkg/scheduler/preemption``
and ``pkg/controller/jobframework`` for a preempted pod's ``TerminationTarget``.
Objects recorded from a real Kueue run (tests/fixtures/kueue/) are read at the end.
"""

from __future__ import annotations

import copy
import json
import math

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuspawner.core import kueue, stopreasons
from gpuspawner.core.kueue import (
    ClusterQueueStatus,
    FlavorQuota,
    PendingEntry,
    Place,
    PodSetRequest,
    amount,
    blocking_reason,
    cluster_queue_status,
    flavor_gpu_types,
    flavor_node_labels,
    is_gated,
    max_admissible,
    pending_entries,
    place_of,
    pod_labels,
    preemption_cause,
    progress_message,
    queue_of,
    request_flavor,
    termination,
    was_preempted,
    workload_is_pending,
    workload_owner_uid,
    workload_requests,
)

from ..conftest import FIXTURES
from ..security.payloads import PAYLOADS

A100 = "nvidia-a100-sxm4-80gb"
H100 = "nvidia-h100-80gb-hbm3"
MIG = "nvidia-a100-sxm4-80gb-mig"
PRODUCT = "nvidia.com/gpu.product"
GPU = "nvidia.com/gpu"

#: The message of QuotaReserved=False, as flavorassigner's Assignment.Message() writes it.
NO_QUOTA = (
    f"couldn't assign flavors to pod set main: insufficient unused quota for {GPU} "
    f"in flavor {A100}, 1 more needed"
)
#: The Workload's Evicted message for preemption (preemption.go, preemptionMessage).
PREEMPTED = (
    "Preempted to accommodate a workload (UID: 5f1c0b4e-7a0e-4c59-9a0f-1b2b8f0c9d11, "
    "JobUID: 9d3e2a77-2c7b-4b9f-8a41-0f6c3a5e1b22) due to prioritization in the "
    "ClusterQueue; preemptor path: /gpus/notebooks; preemptee path: /gpus/notebooks"
)


# ---------------------------------------------------------------------------
# Kueue objects, as the API server returns them
# ---------------------------------------------------------------------------


def notebook_pod(**status) -> dict:
    """A notebook's pod as Kueue's webhook leaves it: queue labels, gate, finalizer."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "jupyter-alice",
            "namespace": "jupyterhub",
            "uid": "0b7f7a8e-1d5c-4a57-9c0e-5d4a3f2e1c01",
            "labels": {
                kueue.QUEUE_LABEL: "gpu-notebooks",
                kueue.PRIORITY_CLASS_LABEL: "gpuspawner-interactive",
                "kueue.x-k8s.io/managed": "true",
                "kueue.x-k8s.io/podset": "main",
            },
            "finalizers": ["kueue.x-k8s.io/managed"],
        },
        "spec": {
            "schedulingGates": [{"name": kueue.ADMISSION_GATE}],
            "containers": [{"name": "notebook", "resources": {"limits": {GPU: "1"}}}],
        },
        "status": {"phase": "Pending", **status},
    }


def preempted_pod(reason: str = kueue.PREEMPTED_REASON, message: str = PREEMPTED) -> dict:
    """A pod Kueue stopped: pod_controller.go Stop patches this condition, then deletes it."""
    pod = notebook_pod(
        phase="Running",
        conditions=[
            {"type": "Ready", "status": "True"},
            {
                "type": "TerminationTarget",
                "status": "True",
                "lastTransitionTime": "2026-12-06T10:00:00Z",
                "reason": reason,
                "message": message,
            },
        ],
    )
    pod["spec"].pop("schedulingGates")
    pod["metadata"]["deletionTimestamp"] = "2026-12-06T10:00:01Z"
    return pod


def workload(conditions: list[dict] | None = None, **spec) -> dict:
    """The Workload Kueue's pod integration makes for a notebook's pod."""
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {
            "name": "pod-jupyter-alice-3c1d2",
            "namespace": "jupyterhub",
            "labels": {"kueue.x-k8s.io/job-uid": "0b7f7a8e-1d5c-4a57-9c0e-5d4a3f2e1c01"},
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": "jupyter-alice",
                    "uid": "0b7f7a8e-1d5c-4a57-9c0e-5d4a3f2e1c01",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
            "finalizers": ["kueue.x-k8s.io/resource-in-use"],
        },
        "spec": {
            "active": True,
            "queueName": "gpu-notebooks",
            "priority": 1000,
            "priorityClassRef": {
                "group": "kueue.x-k8s.io",
                "kind": "WorkloadPriorityClass",
                "name": "gpuspawner-interactive",
            },
            "podSets": [
                {
                    "name": "main",
                    "count": 1,
                    "template": {
                        "metadata": {"labels": {"app": "jupyterhub", "component": "singleuser"}},
                        "spec": {
                            "nodeSelector": {PRODUCT: "NVIDIA-A100-SXM4-80GB"},
                            "initContainers": [
                                {
                                    "name": "gpu-check",
                                    "resources": {
                                        "limits": {GPU: "1"},
                                        "requests": {"cpu": "100m", GPU: "1"},
                                    },
                                }
                            ],
                            "containers": [
                                {
                                    "name": "notebook",
                                    "resources": {
                                        "limits": {"memory": "16Gi", GPU: "1"},
                                        "requests": {"cpu": "500m", "memory": "8Gi", GPU: "1"},
                                    },
                                }
                            ],
                        },
                    },
                }
            ],
            **spec,
        },
        "status": {"conditions": conditions or []},
    }


def quota_reserved(status: str, message: str = "", reason: str = "Pending") -> dict:
    return {
        "type": "QuotaReserved",
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": "2026-12-06T09:58:00Z",
        "observedGeneration": 1,
    }


def job_workload() -> dict:
    """A batch/v1 Job's Workload: 4 pods with limits only, no node selector."""
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {
            "name": "job-train-6f8d2",
            "namespace": "batch",
            "ownerReferences": [
                {"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "job-uid-1"}
            ],
        },
        "spec": {
            "queueName": "batch",
            "priority": 100,
            "podSets": [
                {
                    "name": "main",
                    "count": 4,
                    "template": {
                        "spec": {
                            "containers": [
                                {"name": "train", "resources": {"limits": {GPU: "2", "cpu": "8"}}}
                            ]
                        }
                    },
                }
            ],
        },
        "status": {
            "conditions": [
                quota_reserved(
                    "False",
                    f"couldn't assign flavors to pod set main: insufficient unused quota for "
                    f"{GPU} in flavor {A100}, 6 more needed",
                )
            ]
        },
    }


def quota(name: str, nominal: str, borrowing: str | None = None, lending: str | None = None):
    found = {"name": name, "nominalQuota": nominal}
    if borrowing is not None:
        found["borrowingLimit"] = borrowing
    if lending is not None:
        found["lendingLimit"] = lending
    return found


def cluster_queue_object() -> dict:
    """ClusterQueue ``notebooks`` as the sandbox makes it (docs/kueue.md)."""
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ClusterQueue",
        "metadata": {"name": "notebooks", "generation": 1},
        "spec": {
            "cohortName": "gpus",
            "namespaceSelector": {},
            "queueingStrategy": "BestEffortFIFO",
            "preemption": {"withinClusterQueue": "Never", "reclaimWithinCohort": "Never"},
            "flavorFungibility": {
                "whenCanBorrow": "MayStopSearch",
                "whenCanPreempt": "TryNextFlavor",
            },
            "resourceGroups": [
                {
                    "coveredResources": ["cpu", "memory"],
                    "flavors": [
                        {
                            "name": "default-flavor",
                            "resources": [quota("cpu", "1k"), quota("memory", "10Ti")],
                        }
                    ],
                },
                {
                    "coveredResources": [GPU],
                    "flavors": [
                        {"name": A100, "resources": [quota(GPU, "2")]},
                        {"name": H100, "resources": [quota(GPU, "1", borrowing="3")]},
                    ],
                },
                {
                    "coveredResources": ["nvidia.com/mig-1g.10gb"],
                    "flavors": [{"name": MIG, "resources": [quota("nvidia.com/mig-1g.10gb", "4")]}],
                },
            ],
        },
        "status": {
            "conditions": [
                {
                    "type": "Active",
                    "status": "True",
                    "reason": "Ready",
                    "message": "Can admit new workloads",
                }
            ],
            "flavorsReservation": [
                {
                    "name": "default-flavor",
                    "resources": [
                        {"name": "cpu", "total": "1500m", "borrowed": "0"},
                        {"name": "memory", "total": "24Gi", "borrowed": "0"},
                    ],
                },
                {"name": A100, "resources": [{"name": GPU, "total": "2", "borrowed": "0"}]},
                {"name": H100, "resources": [{"name": GPU, "total": "2", "borrowed": "1"}]},
            ],
            "flavorsUsage": [
                {
                    "name": "default-flavor",
                    "resources": [
                        {"name": "cpu", "total": "1"},
                        {"name": "memory", "total": "16Gi"},
                    ],
                },
                {"name": A100, "resources": [{"name": GPU, "total": "2"}]},
                {"name": H100, "resources": [{"name": GPU, "total": "1", "borrowed": "0"}]},
            ],
            "pendingWorkloads": 3,
            "reservingWorkloads": 3,
            "admittedWorkloads": 2,
        },
    }


def resource_flavors() -> list[dict]:
    def flavor(name: str, labels: dict | None) -> dict:
        spec = {"nodeLabels": labels} if labels is not None else {}
        return {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ResourceFlavor",
            "metadata": {"name": name},
            "spec": spec,
        }

    return [
        flavor("default-flavor", None),
        flavor(A100, {PRODUCT: "NVIDIA-A100-SXM4-80GB"}),
        flavor(H100, {PRODUCT: "NVIDIA-H100-80GB-HBM3"}),
        flavor(MIG, {PRODUCT: "NVIDIA-A100-SXM4-80GB", "nvidia.com/mig.strategy": "mixed"}),
    ]


def pending_item(
    name: str,
    namespace: str,
    owner_kind: str,
    uid: str,
    local_queue: str,
    cq_position: int,
    lq_position: int,
    priority: int = 1000,
) -> dict:
    api_version = "v1" if owner_kind == "Pod" else "batch/v1"
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "creationTimestamp": "2026-12-06T09:50:00Z",
            "ownerReferences": [
                {"apiVersion": api_version, "kind": owner_kind, "name": name, "uid": uid}
            ],
        },
        "priority": priority,
        "localQueueName": local_queue,
        "positionInClusterQueue": cq_position,
        "positionInLocalQueue": lq_position,
    }


def summary(*items: dict) -> dict:
    return {
        "kind": "PendingWorkloadsSummary",
        "apiVersion": "visibility.kueue.x-k8s.io/v1beta2",
        "metadata": {"creationTimestamp": None},
        "items": list(items),
    }


#: ClusterQueue ``notebooks``: a job and two notebooks of two hubs ahead of alice.
CQ_SUMMARY = summary(
    # listed out of order: the reader sorts by the ClusterQueue position
    pending_item(
        "pod-jupyter-alice-3c1d2", "jupyterhub", "Pod", "uid-alice", "gpu-notebooks", 4, 1
    ),
    pending_item("job-train-6f8d2", "research", "Job", "uid-train", "team-a", 0, 0, 100),
    pending_item("pod-jupyter-bob-9a8b7", "jupyterhub", "Pod", "uid-bob", "gpu-notebooks", 1, 0),
    pending_item("pod-jupyter-carol-1f2e3", "hub2", "Pod", "uid-carol", "gpu-notebooks", 2, 0),
    pending_item("jobset-sweep-77aa1", "research", "JobSet", "uid-sweep", "team-a", 3, 1, 100),
)
#: LocalQueue jupyterhub/gpu-notebooks: bob, then alice.
LQ_SUMMARY = summary(
    pending_item("pod-jupyter-bob-9a8b7", "jupyterhub", "Pod", "uid-bob", "gpu-notebooks", 1, 0),
    pending_item(
        "pod-jupyter-alice-3c1d2", "jupyterhub", "Pod", "uid-alice", "gpu-notebooks", 4, 1
    ),
)


# ---------------------------------------------------------------------------
# pods
# ---------------------------------------------------------------------------


def test_pod_labels():
    assert pod_labels("gpu-notebooks", "gpuspawner-interactive") == {
        "kueue.x-k8s.io/queue-name": "gpu-notebooks",
        "kueue.x-k8s.io/priority-class": "gpuspawner-interactive",
    }
    # no priority class: Kueue uses the default WorkloadPriorityClass (or none)
    assert pod_labels("gpu-notebooks", "") == {"kueue.x-k8s.io/queue-name": "gpu-notebooks"}
    assert kueue.DEFAULT_PRIORITY_CLASS == "gpuspawner-interactive"


def test_queue_of():
    assert queue_of(notebook_pod()) == "gpu-notebooks"
    assert queue_of({"metadata": {"labels": {"app": "x"}}}) == ""
    for junk in (None, {}, {"metadata": []}, {"metadata": {"labels": ["a"]}}, "pod"):
        assert queue_of(junk) == ""
    assert queue_of({"metadata": {"labels": {kueue.QUEUE_LABEL: 7}}}) == ""


def test_is_gated():
    assert is_gated(notebook_pod())
    admitted = notebook_pod()
    admitted["spec"]["schedulingGates"] = []
    assert not is_gated(admitted)
    other = notebook_pod()
    other["spec"]["schedulingGates"] = [{"name": "example.com/other-gate"}]
    assert not is_gated(other)
    for gates in ({"name": kueue.ADMISSION_GATE}, kueue.ADMISSION_GATE, [kueue.ADMISSION_GATE]):
        junk = notebook_pod()
        junk["spec"]["schedulingGates"] = gates
        assert not is_gated(junk)
    for junk in (None, {}, {"spec": None}, {"spec": "x"}, []):
        assert not is_gated(junk)


def test_a_preempted_pod_as_kueue_marks_it():
    # pod_controller_test.go: reason "WorkloadEvictedDueToPreempted" (composed by the
    # job framework's stopJob from "WorkloadEvicted" and the Evicted reason "Preempted")
    assert was_preempted(preempted_pod())
    # the reason alone says it; Kueue's own integration test sets any message
    assert was_preempted(preempted_pod(message="By test"))
    condition = termination(preempted_pod())
    assert condition is not None and condition["reason"] == "WorkloadEvictedDueToPreempted"


def test_a_plain_workload_evicted_reason_counts_when_the_message_says_preempted():
    assert was_preempted(preempted_pod(reason="WorkloadEvicted"))
    assert not was_preempted(
        preempted_pod(reason="WorkloadEvicted", message="Workload evicted due to node failures")
    )


def _preempted_because(words: str) -> str:
    """Kueue v0.17's message (preemption.go preemptionMessage) for one of its causes."""
    return (
        "Preempted to accommodate a workload (UID: 5f1c, JobUID: 9d3e) due to "
        f"{words}; preemptor path: /gpus/batch; preemptee path: /gpus/notebooks"
    )


@pytest.mark.parametrize(
    ("words", "cause"),
    [
        # preemption.go HumanReadablePreemptionReasons, every one
        ("prioritization in the ClusterQueue", stopreasons.PREEMPTED_FOR_PRIORITY),
        ("reclamation within the cohort", stopreasons.PREEMPTED_TO_RECLAIM),
        ("reclamation within the cohort while borrowing", stopreasons.PREEMPTED_TO_RECLAIM),
        ("Fair Sharing within the cohort", stopreasons.PREEMPTED_FOR_FAIR_SHARING),
        ("UNKNOWN", ""),
    ],
)
def test_why_kueue_preempted_a_pod_is_read_from_its_words(words, cause):
    assert preemption_cause(preempted_pod(message=_preempted_because(words))) == cause
    assert preemption_cause(preempted_pod(message=PREEMPTED)) == stopreasons.PREEMPTED_FOR_PRIORITY
    # a pod that was not preempted has no cause, whatever its message says
    stopped = preempted_pod(
        reason="WorkloadEvictedDueToPodsReadyTimeout", message=_preempted_because(words)
    )
    assert preemption_cause(stopped) == ""
    assert preemption_cause(None) == preemption_cause({}) == ""


@pytest.mark.parametrize(
    ("reason", "message"),
    [
        ("WorkloadEvictedDueToPodsReadyTimeout", "Workload evicted due to a PodsReady timeout"),
        ("WorkloadEvictedDueToClusterQueueStopped", "The ClusterQueue is stopped"),
        ("WorkloadDeleted", "Preempted to accommodate ... (not an eviction)"),
        ("NotAdmitted", "Not admitted by cluster queue"),
        ("", PREEMPTED),
    ],
)
def test_other_stops_are_not_preemption(reason, message):
    assert not was_preempted(preempted_pod(reason=reason, message=message))


def test_termination_needs_status_true():
    pod = preempted_pod()
    pod["status"]["conditions"][1]["status"] = "False"
    assert termination(pod) is None and not was_preempted(pod)
    assert termination(notebook_pod()) is None and not was_preempted(notebook_pod())


@pytest.mark.parametrize(
    "conditions",
    [
        None,
        "TerminationTarget",
        {"type": "TerminationTarget", "status": "True", "reason": kueue.PREEMPTED_REASON},
        [None, 3, "x", ["TerminationTarget"]],
        [{"type": "TerminationTarget", "status": True, "reason": kueue.PREEMPTED_REASON}],
        [{"type": "TerminationTarget", "status": "True", "reason": ["WorkloadEvicted"]}],
        [
            {
                "type": "TerminationTarget",
                "status": "True",
                "reason": "WorkloadEvicted",
                "message": 7,
            }
        ],
    ],
)
def test_malformed_conditions_are_not_preemption(conditions):
    pod = notebook_pod()
    pod["status"]["conditions"] = conditions
    assert not was_preempted(pod)
    assert not was_preempted(None) and not was_preempted({"status": []})


# ---------------------------------------------------------------------------
# the visibility API
# ---------------------------------------------------------------------------


def test_pending_entries_read_a_summary_in_cluster_queue_order():
    entries = pending_entries(CQ_SUMMARY)
    assert [e.name for e in entries] == [
        "job-train-6f8d2",
        "pod-jupyter-bob-9a8b7",
        "pod-jupyter-carol-1f2e3",
        "jobset-sweep-77aa1",
        "pod-jupyter-alice-3c1d2",
    ]
    assert entries[0] == PendingEntry(
        namespace="research",
        name="job-train-6f8d2",
        owner_kind="Job",
        owner_uid="uid-train",
        local_queue="team-a",
        priority=100,
        position_in_cluster_queue=0,
        position_in_local_queue=0,
    )
    assert [e.is_notebook for e in entries] == [False, True, True, False, True]
    assert entries[-1].position_in_local_queue == 1 and entries[-1].priority == 1000


def test_pending_entries_leave_out_items_without_a_name_or_a_position():
    good = pending_item("w", "ns", "Pod", "u", "q", 2, 0)
    no_name = copy.deepcopy(good)
    no_name["metadata"].pop("name")
    name_not_text = copy.deepcopy(good)
    name_not_text["metadata"]["name"] = ["w"]
    variants = [no_name, name_not_text]
    for position in (None, "1", 1.0, True, False, [1], {"a": 1}):
        bad = copy.deepcopy(good)
        bad["positionInClusterQueue"] = position
        variants.append(bad)
    entries = pending_entries(summary(good, *variants, None, "item", 5, ["x"]))
    assert [e.name for e in entries] == ["w"]


def test_pending_entries_take_safe_defaults_for_odd_fields():
    odd = {
        "metadata": {"name": "w", "namespace": 5, "ownerReferences": {"kind": "Pod"}},
        "priority": "high",
        "localQueueName": None,
        "positionInClusterQueue": -3,
        "positionInLocalQueue": float("nan"),
    }
    huge = pending_item("h", "ns", "Pod", "u", "q", 10**30, 10**400, priority=10**400)
    bools = pending_item("b", "ns", "Pod", "u", "q", 1, 0)
    bools["priority"] = True
    bools["positionInLocalQueue"] = True
    entries = {e.name: e for e in pending_entries(summary(odd, huge, bools))}
    assert entries["w"] == PendingEntry("", "w", "", "", "", 0, 0, 0)
    assert not entries["w"].is_notebook
    assert entries["h"].position_in_cluster_queue == 10**30
    assert entries["b"].priority == 0 and entries["b"].position_in_local_queue == 0
    assert [e.name for e in pending_entries(summary(odd, huge, bools))] == ["w", "b", "h"]


@pytest.mark.parametrize(
    "junk", [None, [], "items", 3, {"items": None}, {"items": {"0": {}}}, {"items": "abc"}]
)
def test_pending_entries_of_junk_are_empty(junk):
    assert pending_entries(junk) == []


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=10**300)
    | st.floats()
    | st.text(max_size=20)
    | st.sampled_from(["NaN", "Infinity", "-1", "1e400", "\uff14", "500m", "\x00\x1b[31m"]),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=20,
)
#: Items with the visibility API's keys and any values.
ITEM = st.fixed_dictionaries(
    {},
    optional={
        "metadata": JSON
        | st.fixed_dictionaries(
            {},
            optional={
                "name": JSON,
                "namespace": JSON,
                "ownerReferences": JSON
                | st.lists(st.dictionaries(st.sampled_from(["kind", "uid"]), JSON)),
            },
        ),
        "priority": JSON,
        "localQueueName": JSON,
        "positionInClusterQueue": JSON,
        "positionInLocalQueue": JSON,
    },
)


@settings(max_examples=300)
@given(st.one_of(JSON, st.fixed_dictionaries({"items": JSON | st.lists(ITEM | JSON, max_size=5)})))
def test_pending_entries_never_raise(data):
    entries = pending_entries(data)
    assert all(isinstance(e, PendingEntry) for e in entries)
    positions = [e.position_in_cluster_queue for e in entries]
    assert positions == sorted(positions) and all(p >= 0 for p in positions)
    assert all(isinstance(e.priority, int) and not isinstance(e.priority, bool) for e in entries)
    assert all(e.name and isinstance(e.owner_uid, str) for e in entries)


@settings(max_examples=200)
@given(JSON)
def test_every_reader_takes_any_json(data):
    """Whatever a Kueue object holds, the readers return data, never an exception."""
    cq = cluster_queue_status({"metadata": {"name": "q"}, "spec": data, "status": data})
    assert cq is not None
    assert all(q.nominal >= 0 and math.isfinite(q.nominal) for q in cq.quotas)
    cluster_queue_status(data)
    for request in workload_requests({"spec": {"podSets": [{"template": {"spec": data}}]}}):
        assert all(v >= 0 and math.isfinite(v) for v in request.resources.values())
        request.gpu_resources()
    workload_requests(data)
    workload_is_pending(data)
    workload_owner_uid(data)
    reason = blocking_reason(
        {"status": {"conditions": [{"type": "QuotaReserved", "message": data}]}}
    )
    assert reason == "" or isinstance(reason, str)
    blocking_reason(data)
    was_preempted(data)
    is_gated(data)
    queue_of(data)
    flavor_node_labels([data])
    value = amount(data)
    assert value >= 0 and math.isfinite(value)


# ---------------------------------------------------------------------------
# quantities
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("4", 4.0),
        (4, 4.0),
        (2.5, 2.5),
        ("500m", 0.5),
        ("1500m", 1.5),
        ("0.5", 0.5),  # not rounded up to a whole unit as a byte count would be
        ("250u", 0.00025),
        ("1k", 1000.0),
        ("16Gi", 16 * 2**30),
        ("10Ti", 10 * 2**40),
        (" 2 ", 2.0),
        # unreadable: 0
        ("", 0.0),
        ("-1", 0.0),
        (-3, 0.0),
        ("NaN", 0.0),
        ("Infinity", 0.0),
        (float("nan"), 0.0),
        (float("inf"), 0.0),
        (True, 0.0),
        (None, 0.0),
        ([4], 0.0),
        ({"value": 4}, 0.0),
        ("\uff14", 0.0),  # a full-width digit
        ("٣", 0.0),  # an Arabic-Indic digit
        ("4\u200b", 0.0),
        ("4 GPUs", 0.0),
        (10**400, 0.0),  # JSON integers have no bound
        ("9" * 400 + "E", 0.0),
    ],
)
def test_amount(value, expected):
    assert amount(value) == pytest.approx(expected)


# ---------------------------------------------------------------------------
# ClusterQueues and ResourceFlavors
# ---------------------------------------------------------------------------


def test_cluster_queue_status_reads_quotas_in_order_with_usage():
    cq = cluster_queue_status(cluster_queue_object())
    assert cq is not None
    assert (cq.name, cq.cohort) == ("notebooks", "gpus")
    assert (cq.pending, cq.reserving, cq.admitted) == (3, 3, 2)
    assert [(q.flavor, q.resource) for q in cq.quotas] == [
        ("default-flavor", "cpu"),
        ("default-flavor", "memory"),
        (A100, GPU),
        (H100, GPU),
        (MIG, "nvidia.com/mig-1g.10gb"),
    ]
    assert cq.quota("default-flavor", "cpu") == FlavorQuota(
        "default-flavor", "cpu", 1000.0, None, None, used=1.0, reserved=1.5
    )
    assert cq.quota(A100, GPU) == FlavorQuota(A100, GPU, 2.0, None, None, used=2.0, reserved=2.0)
    assert cq.quota(H100, GPU) == FlavorQuota(H100, GPU, 1.0, 3.0, None, used=1.0, reserved=2.0)
    assert cq.quota(MIG, "nvidia.com/mig-1g.10gb").used == 0.0
    assert cq.quota(A100, "cpu") is None and cq.quota("nope", GPU) is None
    assert cq.flavors_for(GPU) == [A100, H100]
    assert cq.flavors_for("amd.com/gpu") == []


def test_cluster_queue_status_reads_the_v1beta1_cohort_field():
    cq = cluster_queue_object()
    cq["spec"]["cohort"] = cq["spec"].pop("cohortName")
    assert cluster_queue_status(cq).cohort == "gpus"


def test_cluster_queue_without_a_name_is_none():
    cq = cluster_queue_object()
    cq["metadata"]["name"] = ""
    assert cluster_queue_status(cq) is None
    for junk in (None, [], "notebooks", {"metadata": ["notebooks"]}, {"metadata": {"name": 5}}):
        assert cluster_queue_status(junk) is None


def test_cluster_queue_with_malformed_parts_keeps_what_it_can():
    cq = cluster_queue_object()
    groups = cq["spec"]["resourceGroups"]
    groups[0]["flavors"] = {"name": "default-flavor"}  # a map where a list belongs
    groups[1]["flavors"][0]["resources"] = [
        quota(GPU, ["2"]),
        {"name": 7, "nominalQuota": "2"},
        "nvidia.com/gpu",
    ]
    groups[1]["flavors"][1]["resources"] = [quota(GPU, "NaN", borrowing="lots")]
    groups[2]["flavors"][0]["name"] = None
    cq["status"] = {
        "flavorsUsage": {"name": A100},
        "flavorsReservation": [{"name": H100, "resources": [{"name": GPU, "total": True}]}],
        "pendingWorkloads": "3",
        "reservingWorkloads": -2,
        "admittedWorkloads": 10**400,
    }
    read = cluster_queue_status(cq)
    assert [(q.flavor, q.resource, q.nominal) for q in read.quotas] == [
        (A100, GPU, 0.0),
        (H100, GPU, 0.0),
    ]
    # an unreadable borrowing limit is no borrowing, never "no limit"
    assert read.quota(H100, GPU).borrowing_limit == 0.0
    assert read.quota(H100, GPU).reserved == 0.0
    assert (read.pending, read.reserving, read.admitted) == (0, 0, 10**400)


def test_flavor_node_labels():
    labels = flavor_node_labels(resource_flavors())
    assert labels == {
        "default-flavor": {},
        A100: {PRODUCT: "NVIDIA-A100-SXM4-80GB"},
        H100: {PRODUCT: "NVIDIA-H100-80GB-HBM3"},
        MIG: {PRODUCT: "NVIDIA-A100-SXM4-80GB", "nvidia.com/mig.strategy": "mixed"},
    }
    odd = [
        {"metadata": {"name": "x"}, "spec": {"nodeLabels": {"a": "1", "b": 2, "c": None}}},
        {"metadata": {"name": "y"}, "spec": {"nodeLabels": ["a=1"]}},
        {"metadata": {}, "spec": {"nodeLabels": {"a": "1"}}},
        None,
        "flavor",
    ]
    assert flavor_node_labels(odd) == {"x": {"a": "1"}, "y": {}}
    assert flavor_node_labels(None) == {}
    assert flavor_node_labels([]) == {}


def test_flavor_gpu_types_match_the_catalog_selectors():
    selectors = {
        "a100": {PRODUCT: "NVIDIA-A100-SXM4-80GB"},
        "a100-mig": {PRODUCT: "NVIDIA-A100-SXM4-80GB", "nvidia.com/mig.strategy": "mixed"},
        "h100": {PRODUCT: "NVIDIA-H100-80GB-HBM3"},
        "anything": {},
    }
    types = flavor_gpu_types(flavor_node_labels(resource_flavors()), selectors)
    # the MIG flavor's labels satisfy "a100" too: the first in catalog order wins
    assert types == {A100: "a100", H100: "h100", MIG: "a100"}
    reordered = {k: selectors[k] for k in ("a100-mig", "a100", "h100")}
    assert flavor_gpu_types(flavor_node_labels(resource_flavors()), reordered)[MIG] == "a100-mig"
    # a flavor needs every pair of the selector; an empty selector matches nothing
    assert (
        flavor_gpu_types({A100: {PRODUCT: "NVIDIA-A100-SXM4-80GB"}}, {"m": selectors["a100-mig"]})
        == {}
    )
    assert flavor_gpu_types({"default-flavor": {}}, {"anything": {}}) == {}


def status_of(
    name: str,
    cohort: str,
    nominal: float,
    borrowing: float | None = None,
    lending: float | None = None,
    flavor: str = A100,
) -> ClusterQueueStatus:
    return ClusterQueueStatus(
        name, cohort, (FlavorQuota(flavor, GPU, nominal, borrowing, lending),)
    )


def test_max_admissible_without_a_cohort_is_the_nominal_quota():
    queues = [status_of("notebooks", "", 2), status_of("batch", "", 6)]
    assert max_admissible(queues, "notebooks", A100, GPU) == 2
    # an empty cohort name is no cohort, even when another queue has one too
    assert max_admissible(queues, "batch", A100, GPU) == 6


def test_max_admissible_borrows_the_cohorts_quota():
    queues = [status_of("notebooks", "gpus", 2), status_of("batch", "gpus", 2)]
    assert max_admissible(queues, "notebooks", A100, GPU) == 4
    # a third queue lends too; one in another cohort does not
    queues += [status_of("team", "gpus", 3), status_of("elsewhere", "other", 8)]
    assert max_admissible(queues, "notebooks", A100, GPU) == 7
    # only the same flavor and resource lend
    queues += [status_of("h100s", "gpus", 8, flavor=H100)]
    assert max_admissible(queues, "notebooks", A100, GPU) == 7
    assert max_admissible(queues, "h100s", H100, GPU) == 8


def test_max_admissible_respects_lending_limits():
    queues = [status_of("notebooks", "gpus", 2), status_of("batch", "gpus", 4, lending=1)]
    assert max_admissible(queues, "notebooks", A100, GPU) == 3
    # lending nothing
    queues = [status_of("notebooks", "gpus", 2), status_of("batch", "gpus", 4, lending=0)]
    assert max_admissible(queues, "notebooks", A100, GPU) == 2
    # a lending limit above the nominal quota lends the nominal quota
    queues = [status_of("notebooks", "gpus", 2), status_of("batch", "gpus", 4, lending=9)]
    assert max_admissible(queues, "notebooks", A100, GPU) == 6
    # its own lending limit does not bound what it uses itself
    queues = [status_of("notebooks", "gpus", 2, lending=0), status_of("batch", "gpus", 4)]
    assert max_admissible(queues, "notebooks", A100, GPU) == 6


def test_max_admissible_respects_its_borrowing_limit():
    queues = [status_of("notebooks", "gpus", 2, borrowing=1), status_of("batch", "gpus", 4)]
    assert max_admissible(queues, "notebooks", A100, GPU) == 3
    queues = [status_of("notebooks", "gpus", 2, borrowing=0), status_of("batch", "gpus", 4)]
    assert max_admissible(queues, "notebooks", A100, GPU) == 2
    # a borrowing limit above what the cohort can lend: the cohort's bound
    queues = [
        status_of("notebooks", "gpus", 2, borrowing=10),
        status_of("batch", "gpus", 4, lending=3),
    ]
    assert max_admissible(queues, "notebooks", A100, GPU) == 5


def test_max_admissible_from_cluster_queue_objects():
    notebooks = cluster_queue_status(cluster_queue_object())
    batch_object = cluster_queue_object()
    batch_object["metadata"]["name"] = "batch"
    batch_object["spec"]["resourceGroups"][1]["flavors"] = [
        {"name": A100, "resources": [quota(GPU, "6", lending="2")]},
        {"name": H100, "resources": [quota(GPU, "7")]},
    ]
    batch = cluster_queue_status(batch_object)
    queues = iter([notebooks, batch])  # any iterable, read once
    assert max_admissible(queues, "notebooks", A100, GPU) == 4
    # H100: nominal 1, borrowing limit 3 of the 7 batch could lend
    assert max_admissible([notebooks, batch], "notebooks", H100, GPU) == 4
    assert max_admissible([notebooks, batch], "batch", A100, GPU) == 8


def test_max_admissible_unknown_is_none():
    queues = [status_of("notebooks", "gpus", 2)]
    assert max_admissible(queues, "missing", A100, GPU) is None
    assert max_admissible(queues, "notebooks", H100, GPU) is None
    assert max_admissible(queues, "notebooks", A100, "nvidia.com/mig-1g.10gb") is None
    assert max_admissible([], "notebooks", A100, GPU) is None


# ---------------------------------------------------------------------------
# Workloads
# ---------------------------------------------------------------------------


def test_workload_requests_of_a_notebook():
    [request] = workload_requests(workload())
    assert request == PodSetRequest(
        name="main",
        count=1,
        # the init container's GPU is the notebook's: counted once
        resources={"cpu": 0.5, "memory": 8 * 2**30, GPU: 1.0},
        node_selector={PRODUCT: "NVIDIA-A100-SXM4-80GB"},
    )
    assert request.gpu_resources() == {GPU: 1}


def test_workload_requests_of_a_job_use_limits_where_nothing_is_requested():
    [request] = workload_requests(job_workload())
    assert (request.name, request.count, request.node_selector) == ("main", 4, {})
    assert request.resources == {GPU: 2.0, "cpu": 8.0}
    assert request.gpu_resources() == {GPU: 2}


def test_init_containers_sidecars_and_overhead_count_as_kubernetes_counts_them():
    spec = {
        "containers": [
            {"name": "a", "resources": {"requests": {"cpu": "1", GPU: "1"}}},
            {"name": "b", "resources": {"requests": {"cpu": "1"}}},
        ],
        "initContainers": [
            # a regular init container alone needs more cpu than the containers' sum
            {"name": "setup", "resources": {"requests": {"cpu": "3", GPU: "1"}}},
            # a sidecar runs beside the containers: added to them
            {
                "name": "proxy",
                "restartPolicy": "Always",
                "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}},
            },
            # an init container after the sidecar runs beside it
            {"name": "late", "resources": {"requests": {"memory": "2Gi"}}},
        ],
        "overhead": {"cpu": "250m", "memory": "128Mi"},
    }
    assert kueue.pod_resources(spec) == {
        "cpu": 3.0 + 0.25,  # max(1 + 1 + 0.5, 3) + overhead
        "memory": 3 * 2**30 + 128 * 2**20,  # max(0 + 1Gi, 2Gi + 1Gi) + overhead
        GPU: 1.0,
    }


def test_workload_requests_take_safe_defaults():
    job = job_workload()
    pod_sets = job["spec"]["podSets"]
    pod_sets.append({"name": "no-count", "template": {"spec": {"containers": "x"}}})
    pod_sets.append({"name": "negative", "count": -2})
    pod_sets.append({"name": "bool", "count": True, "template": []})
    pod_sets.append(
        {
            "name": 5,
            "count": "3",
            "template": {
                "spec": {
                    "nodeSelector": {PRODUCT: ["x"], "ok": "yes", "n": 1},
                    "containers": [
                        {"resources": {"limits": {GPU: "0.5", "amd.com/gpu": "1e9"}}},
                        {"resources": {"requests": ["cpu"]}},
                        "container",
                    ],
                }
            },
        }
    )
    pod_sets.append("podset")
    requests = workload_requests(job)
    assert [(r.name, r.count) for r in requests] == [
        ("main", 4),
        ("no-count", 1),
        ("negative", 0),
        ("bool", 1),
        ("", 1),
    ]
    last = requests[-1]
    assert last.node_selector == {"ok": "yes"}
    assert last.resources == {GPU: 0.5, "amd.com/gpu": 0.0}
    # under one GPU is no GPU
    assert last.gpu_resources() == {}
    assert requests[1].resources == {}
    for junk in (None, [], {"spec": []}, {"spec": {"podSets": {"main": {}}}}):
        assert workload_requests(junk) == []


def test_gpu_resources_with_the_catalogs_extra_names():
    request = PodSetRequest("main", 1, {"example.com/accel": 2.0, "cpu": 4.0, GPU: 1.0}, {})
    assert request.gpu_resources() == {GPU: 1}
    assert request.gpu_resources(["example.com/accel"]) == {GPU: 1, "example.com/accel": 2}


def test_workload_is_pending():
    assert workload_is_pending(workload())
    assert workload_is_pending(workload([quota_reserved("False", NO_QUOTA)]))
    admitted = workload(
        [quota_reserved("True", "Quota reserved in ClusterQueue notebooks", "QuotaReserved")]
    )
    assert not workload_is_pending(admitted)
    finished = workload(
        [
            quota_reserved("False", NO_QUOTA),
            {"type": "Finished", "status": "True", "reason": "Succeeded", "message": "done"},
        ]
    )
    assert not workload_is_pending(finished)
    not_finished = workload(
        [quota_reserved("False", NO_QUOTA), {"type": "Finished", "status": "False"}]
    )
    assert workload_is_pending(not_finished)


def test_blocking_reason_is_kueues_message():
    assert blocking_reason(workload([quota_reserved("False", NO_QUOTA)])) == NO_QUOTA
    assert blocking_reason(job_workload()).endswith("6 more needed")
    assert blocking_reason(workload([quota_reserved("True", "Quota reserved")])) == ""
    assert blocking_reason(workload()) == ""
    assert blocking_reason(workload([quota_reserved("False", "")])) == ""
    for junk in (None, [], "x", {"status": {"conditions": {"type": "QuotaReserved"}}}):
        assert blocking_reason(junk) == ""
    not_text = workload([quota_reserved("False")])
    not_text["status"]["conditions"][0]["message"] = ["insufficient"]
    assert blocking_reason(not_text) == ""


def _is_one_printable_line(text: str) -> bool:
    return len(text) <= kueue.MESSAGE_LENGTH and text.isprintable() and text == text.strip()


def test_blocking_reason_is_one_printable_line_at_most_300_characters():
    long = f"{NO_QUOTA}; " * 40
    reason = blocking_reason(workload([quota_reserved("False", long)]))
    assert 290 <= len(reason) <= 300 and reason.endswith("…") and _is_one_printable_line(reason)
    assert reason.startswith(NO_QUOTA)
    hostile = "line one\r\nSet-Cookie: x=1\x00\x1b[31m\u2028red\u202e\ttabbed\x7f"
    reason = blocking_reason(workload([quota_reserved("False", hostile)]))
    assert reason == "line one Set-Cookie: x=1 [31m red tabbed"
    assert _is_one_printable_line(reason)


@pytest.mark.parametrize(("name", "value"), PAYLOADS)
def test_blocking_reason_of_hostile_messages(name, value):
    reason = blocking_reason(workload([quota_reserved("False", value)]))
    assert _is_one_printable_line(reason), name


def test_workload_owner_uid():
    assert workload_owner_uid(workload()) == "0b7f7a8e-1d5c-4a57-9c0e-5d4a3f2e1c01"
    assert workload_owner_uid(job_workload()) == "job-uid-1"
    for junk in (
        None,
        {},
        {"metadata": {"ownerReferences": []}},
        {"metadata": {"ownerReferences": [{"uid": 5}]}},
    ):
        assert workload_owner_uid(junk) == ""


def test_request_flavor_is_the_first_flavor_the_node_selector_allows():
    cq = cluster_queue_status(cluster_queue_object())
    labels = flavor_node_labels(resource_flavors())
    [notebook] = workload_requests(workload())
    assert request_flavor(notebook, GPU, cq, labels) == A100
    h100 = PodSetRequest("main", 1, {GPU: 1}, {PRODUCT: "NVIDIA-H100-80GB-HBM3"})
    assert request_flavor(h100, GPU, cq, labels) == H100
    # no selector, or one on other labels: the first flavor in the ClusterQueue's order
    anywhere = PodSetRequest("main", 1, {GPU: 1}, {"kubernetes.io/arch": "amd64"})
    assert request_flavor(anywhere, GPU, cq, labels) == A100
    # a selector no flavor allows, a resource the queue does not cover
    nowhere = PodSetRequest("main", 1, {GPU: 1}, {PRODUCT: "Tesla-T4"})
    assert request_flavor(nowhere, GPU, cq, labels) is None
    assert request_flavor(notebook, "amd.com/gpu", cq, labels) is None
    # a flavor without node labels (or unknown) allows every pod
    assert request_flavor(nowhere, "cpu", cq, labels) == "default-flavor"
    assert request_flavor(nowhere, GPU, cq, {}) == A100


# ---------------------------------------------------------------------------
# a notebook's place
# ---------------------------------------------------------------------------


def test_place_of_counts_notebooks_and_jobs_ahead_across_the_cluster_queue():
    local, cluster = pending_entries(LQ_SUMMARY), pending_entries(CQ_SUMMARY)
    place = place_of("uid-alice", local, cluster, "notebooks", blocked_by=NO_QUOTA)
    assert place == Place(
        local_queue="gpu-notebooks",
        cluster_queue="notebooks",
        position_in_local_queue=2,
        waiting_in_local_queue=2,
        position_in_cluster_queue=5,
        ahead_notebooks=2,  # bob, and carol of another hub
        ahead_jobs=2,  # a Job and a JobSet
        blocked_by=NO_QUOTA,
    )
    bob = place_of("uid-bob", local, cluster, "notebooks")
    assert (bob.position_in_local_queue, bob.position_in_cluster_queue) == (1, 2)
    assert (bob.ahead_notebooks, bob.ahead_jobs, bob.blocked_by) == (0, 1, "")


def test_place_of_without_the_cluster_queue_counts_the_local_queue():
    local = pending_entries(LQ_SUMMARY)
    place = place_of("uid-alice", local, None, "notebooks")
    assert (place.position_in_local_queue, place.waiting_in_local_queue) == (2, 2)
    # its position in the ClusterQueue is the visibility API's, from the LocalQueue's list
    assert place.position_in_cluster_queue == 5
    assert (place.ahead_notebooks, place.ahead_jobs) == (1, 0)


def test_place_of_when_the_cluster_list_has_moved_on():
    # read a moment apart: the ClusterQueue's list no longer has alice
    local = pending_entries(LQ_SUMMARY)
    cluster = [e for e in pending_entries(CQ_SUMMARY) if e.owner_uid != "uid-alice"]
    place = place_of("uid-alice", local, cluster, "notebooks")
    assert place.position_in_cluster_queue == 5
    assert (place.ahead_notebooks, place.ahead_jobs) == (2, 2)


def test_place_of_a_workload_not_listed_is_none():
    local, cluster = pending_entries(LQ_SUMMARY), pending_entries(CQ_SUMMARY)
    assert place_of("uid-carol", local, cluster, "notebooks") is None  # another hub's
    assert place_of("uid-nobody", local, cluster, "notebooks") is None
    assert place_of("", local, cluster, "notebooks") is None
    no_uid = [PendingEntry("jupyterhub", "w", "Pod", "", "gpu-notebooks", 0, 0, 0)]
    assert place_of("", no_uid, None, "notebooks") is None
    assert place_of("uid-alice", [], cluster, "notebooks") is None


def place(position=2, waiting=3, cq_position=4, notebooks=1, jobs=2, blocked_by=""):
    return Place(
        "gpu-notebooks", "notebooks", position, waiting, cq_position, notebooks, jobs, blocked_by
    )


def test_progress_message():
    assert progress_message(place(), 2, "A100") == (
        "Waiting in the cluster's GPU queue for 2 A100 GPUs: 2 of 3 in this hub's queue, "
        "4 in the notebooks queue (ahead of it: 1 notebook and 2 jobs)."
    )


@pytest.mark.parametrize(
    ("notebooks", "jobs", "ahead"),
    [
        (0, 0, "nothing ahead of it"),
        (1, 0, "ahead of it: 1 notebook and 0 jobs"),
        (0, 1, "ahead of it: 0 notebooks and 1 job"),
        (1, 1, "ahead of it: 1 notebook and 1 job"),
        (3, 12, "ahead of it: 3 notebooks and 12 jobs"),
    ],
)
def test_progress_message_counts_singular_and_plural(notebooks, jobs, ahead):
    message = progress_message(place(notebooks=notebooks, jobs=jobs), 1, "H100")
    assert message.startswith("Waiting in the cluster's GPU queue for 1 H100 GPU: ")
    assert message.endswith(f"({ahead}).")


def test_progress_message_without_a_place_and_with_kueues_reason():
    assert progress_message(None, 1, "A100") == "Waiting in the cluster's GPU queue for 1 A100 GPU."
    assert (
        progress_message(None, 4, "A100") == "Waiting in the cluster's GPU queue for 4 A100 GPUs."
    )
    message = progress_message(place(blocked_by=NO_QUOTA), 1, "A100")
    assert message.endswith(f"(ahead of it: 1 notebook and 2 jobs). Kueue: {NO_QUOTA}")


# ---------------------------------------------------------------------------
# objects recorded from a real Kueue run
# ---------------------------------------------------------------------------

RECORDED = FIXTURES / "kueue"


def recorded() -> list[tuple[str, dict]]:
    """(file name, object) of every recorded object; a List's items one by one."""
    found = []
    for path in sorted(RECORDED.glob("*")) if RECORDED.is_dir() else []:
        if path.suffix == ".json":
            data = json.loads(path.read_text())
        elif path.suffix in (".yaml", ".yml"):
            data = yaml.safe_load(path.read_text())
        else:
            continue
        if not isinstance(data, dict):
            continue
        if data.get("kind", "").endswith("List") and isinstance(data.get("items"), list):
            found += [(path.name, item) for item in data["items"] if isinstance(item, dict)]
        else:
            found.append((path.name, data))
    return found


def of_kind(kind: str) -> list[dict]:
    objects = [obj for _, obj in recorded() if obj.get("kind") == kind]
    if not objects:
        pytest.skip(f"no recorded {kind} in tests/fixtures/kueue")
    return objects


def test_recorded_workloads():
    for obj in of_kind("Workload"):
        requests = workload_requests(obj)
        assert requests and all(r.count >= 1 for r in requests), obj["metadata"]["name"]
        assert workload_owner_uid(obj)
        reason = blocking_reason(obj)
        assert _is_one_printable_line(reason)
        if workload_is_pending(obj) and reason:
            assert reason.startswith(("couldn't assign flavors", "failed to assign flavors"))


def test_recorded_cluster_queues():
    for obj in of_kind("ClusterQueue"):
        cq = cluster_queue_status(obj)
        assert cq is not None and cq.name == obj["metadata"]["name"]
        assert cq.quotas, cq.name
        groups = obj["spec"]["resourceGroups"]
        assert len(cq.quotas) == sum(
            len(f.get("resources") or []) for g in groups for f in g.get("flavors") or []
        )
        for q in cq.quotas:
            assert max_admissible([cq], cq.name, q.flavor, q.resource) >= q.nominal


def test_recorded_resource_flavors():
    flavors = of_kind("ResourceFlavor")
    labels = flavor_node_labels(flavors)
    assert set(labels) == {f["metadata"]["name"] for f in flavors}


def test_recorded_pending_workloads():
    for obj in of_kind("PendingWorkloadsSummary"):
        entries = pending_entries(obj)
        assert len(entries) == len(obj.get("items") or [])
        for entry in entries:
            assert entry.owner_uid and entry.owner_kind and entry.local_queue


def test_the_workloads_selector_names_only_valid_uids():
    assert kueue.workloads_selector([]) == ""
    assert kueue.workloads_selector(["b-2", "a-1", "a-1"]) == "kueue.x-k8s.io/job-uid in (a-1,b-2)"
    hostile = ["x) , other in (y", "a b", "é", "", "z" * 64, "ok"]
    assert kueue.workloads_selector(hostile) == "kueue.x-k8s.io/job-uid in (ok)"
