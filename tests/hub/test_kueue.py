"""The hub's view of its Kueue LocalQueue (gpuspawner.hub.kueue.KueueView).

Kueue's API is a stand-in client with KueueClient's methods; its answers are
objects shaped as Kueue v0.17 (v1beta2) serves them, and the visibility API's
summaries go through core.kueue.pending_entries as the real client's do. Time
is a clock the tests move; the follow loop is awaited through its own reads.
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from gpuspawner.clients import kube
from gpuspawner.core import kueue, stopreasons
from gpuspawner.hub.kueue import PREEMPTED_TTL, QUOTA_TTL, KueueView

NAMESPACE = "jupyterhub"
LOG = logging.getLogger("test.hub.kueue")


def pending(*entries):
    """A visibility API PendingWorkloadsSummary: (name, namespace, owner kind, uid, local queue)."""
    items = []
    for position, (name, namespace, kind, uid, local_queue) in enumerate(entries):
        items.append(
            {
                "metadata": {
                    "name": name,
                    "namespace": namespace,
                    "ownerReferences": [
                        {"apiVersion": "v1", "kind": kind, "name": name, "uid": uid}
                    ],
                },
                "localQueueName": local_queue,
                "priority": 1000 if kind == "Pod" else 100,
                "positionInClusterQueue": position,
                "positionInLocalQueue": sum(
                    1 for e in entries[:position] if (e[1], e[4]) == (namespace, local_queue)
                ),
            }
        )
    return {"kind": "PendingWorkloadsSummary", "items": items}


def cluster_queue(name, cohort="gpus", nominal=4, borrowing_limit=None, flavor="nvidia-a100"):
    resource = {"name": "nvidia.com/gpu", "nominalQuota": nominal}
    if borrowing_limit is not None:
        resource["borrowingLimit"] = borrowing_limit
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": {
            "cohortName": cohort,
            "namespaceSelector": {},
            "resourceGroups": [
                {
                    "coveredResources": ["cpu", "memory"],
                    "flavors": [
                        {
                            "name": "default-flavor",
                            "resources": [
                                {"name": "cpu", "nominalQuota": 1000},
                                {"name": "memory", "nominalQuota": "10Ti"},
                            ],
                        }
                    ],
                },
                {
                    "coveredResources": ["nvidia.com/gpu"],
                    "flavors": [{"name": flavor, "resources": [resource]}],
                },
            ],
        },
        "status": {"pendingWorkloads": 0, "admittedWorkloads": 0},
    }


def resource_flavor(name, product=None):
    spec = {"nodeLabels": {"nvidia.com/gpu.product": product}} if product else {}
    return {"kind": "ResourceFlavor", "metadata": {"name": name}, "spec": spec}


def workload(owner_uid, message=None):
    conditions = []
    if message is not None:
        conditions.append(
            {"type": "QuotaReserved", "status": "False", "reason": "Pending", "message": message}
        )
    return {
        "kind": "Workload",
        "metadata": {
            "name": f"pod-{owner_uid}",
            "namespace": NAMESPACE,
            "ownerReferences": [{"kind": "Pod", "uid": owner_uid}],
        },
        "status": {"conditions": conditions},
    }


class FakeKueue:
    """KueueClient's methods over dicts; an exception as a value is raised; every call recorded."""

    def __init__(self):
        self.calls = []
        self.selectors = []
        self.local_queues = {
            "gpu-notebooks": {
                "kind": "LocalQueue",
                "metadata": {"name": "gpu-notebooks", "namespace": NAMESPACE},
                "spec": {"clusterQueue": "notebooks"},
            }
        }
        self.cqs = [cluster_queue("notebooks", nominal=4), cluster_queue("batch", nominal=4)]
        self.flavors = [resource_flavor("nvidia-a100", "NVIDIA-A100-SXM4-80GB")]
        self.local_pending = pending()
        self.cluster_pending = pending()
        self.workload_list = []
        self.fail = {}
        self.read = asyncio.Event()

    def _answer(self, name, value):
        self.calls.append(name)
        error = self.fail.get(name)
        if error is not None:
            raise error
        return value

    async def local_queue(self, namespace, name):
        found = self.local_queues.get(name)
        if found is None:
            self.calls.append("local_queue")
            raise kube.NotFound(f"localqueues {name!r} not found", 404)
        return self._answer("local_queue", found)

    async def cluster_queues(self):
        return self._answer("cluster_queues", self.cqs)

    async def cluster_queue(self, name):
        found = next((q for q in self.cqs if q["metadata"]["name"] == name), None)
        if found is None:
            self.calls.append("cluster_queue")
            raise kube.NotFound(f"clusterqueues {name!r} not found", 404)
        return self._answer("cluster_queue", found)

    async def resource_flavors(self):
        return self._answer("resource_flavors", self.flavors)

    async def workloads(self, namespace, selector=""):
        self.selectors.append(selector)
        result = self._answer("workloads", self.workload_list)
        self.read.set()  # the last read of a refresh
        return result

    async def pending_in_local_queue(self, namespace, name, limit=None):
        entries = kueue.pending_entries(self._answer("pending_local", self.local_pending))
        return entries if limit is None else entries[:limit]

    async def pending_in_cluster_queue(self, name, limit=None):
        entries = kueue.pending_entries(self._answer("pending_cluster", self.cluster_pending))
        return entries if limit is None else entries[:limit]


class Clock:
    def __init__(self, now=100.0):
        self.now = now

    def __call__(self):
        return self.now


@pytest.fixture
def client():
    return FakeKueue()


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def view(client, clock):
    found = KueueView(client, NAMESPACE, "gpu-notebooks", LOG, interval=0.01, clock=clock)
    yield found
    found.cancel()


def queue_with_mine(client):
    """This hub's queue holds carol (first) and dave; batch Jobs and another hub's notebook too."""
    client.local_pending = pending(
        ("pod-carol", NAMESPACE, "Pod", "uid-carol", "gpu-notebooks"),
        ("pod-dave", NAMESPACE, "Pod", "uid-dave", "gpu-notebooks"),
    )
    client.cluster_pending = pending(
        ("job-train", "batch", "Job", "uid-job-1", "batch"),
        ("pod-other-hub", "course", "Pod", "uid-other", "gpu-notebooks"),
        ("pod-carol", NAMESPACE, "Pod", "uid-carol", "gpu-notebooks"),
        ("job-eval", "batch", "Job", "uid-job-2", "batch"),
        ("pod-dave", NAMESPACE, "Pod", "uid-dave", "gpu-notebooks"),
    )


# ---------------------------------------------------------------------------
# places
# ---------------------------------------------------------------------------


async def test_a_place_counts_notebooks_and_jobs_ahead_in_the_cluster_queue(view, client):
    queue_with_mine(client)
    client.workload_list = [
        workload("uid-dave", "couldn't assign flavors to pod set main: insufficient quota"),
    ]
    view.wait("uid-carol")
    view.wait("uid-dave")
    await view.refresh()
    carol, dave = view.place("uid-carol"), view.place("uid-dave")
    assert carol == kueue.Place(
        local_queue="gpu-notebooks",
        cluster_queue="notebooks",
        position_in_local_queue=1,
        waiting_in_local_queue=2,
        position_in_cluster_queue=3,
        ahead_notebooks=1,
        ahead_jobs=1,
        blocked_by="",
    )
    assert (dave.position_in_local_queue, dave.position_in_cluster_queue) == (2, 5)
    assert (dave.ahead_notebooks, dave.ahead_jobs) == (2, 2)
    assert dave.blocked_by == "couldn't assign flavors to pod set main: insufficient quota"
    # the LocalQueue names its ClusterQueue: read once, not on every refresh
    await view.refresh()
    assert client.calls.count("local_queue") == 1
    # only the waiting pods' Workloads are read (by Kueue's label of their pod's uid)
    assert client.selectors[-1] == "kueue.x-k8s.io/job-uid in (uid-carol,uid-dave)"


async def test_a_pod_not_listed_or_not_followed_has_no_place(view, client):
    queue_with_mine(client)
    view.wait("uid-nobody")
    await view.refresh()
    assert view.place("uid-nobody") is None
    assert view.place("uid-carol") is None  # listed, but no spawner asked for it


async def test_without_the_cluster_role_only_the_local_queue_counts_said_once(view, client, caplog):
    queue_with_mine(client)
    client.fail["pending_cluster"] = kube.Refused("clusterqueues/pendingworkloads forbidden", 403)
    view.wait("uid-dave")
    with caplog.at_level(logging.INFO, logger=LOG.name):
        await view.refresh()
        await view.refresh()
    dave = view.place("uid-dave")
    # ahead: carol only, from this hub's queue; the other hub's and the Jobs unseen
    assert (dave.position_in_local_queue, dave.waiting_in_local_queue) == (2, 2)
    assert (dave.ahead_notebooks, dave.ahead_jobs) == (1, 0)
    said = [r for r in caplog.records if "may not list ClusterQueue" in r.getMessage()]
    assert len(said) == 1
    assert "'notebooks'" in said[0].getMessage()
    assert client.calls.count("pending_cluster") == 1  # not asked again


async def wait_for_reads(client, count):
    while client.calls.count("workloads") < count:
        client.read.clear()
        await asyncio.wait_for(client.read.wait(), 5)


async def test_a_failing_read_is_logged_once_and_the_loop_goes_on(view, client, caplog):
    queue_with_mine(client)
    client.fail["pending_local"] = kube.Retryable("503 Service Unavailable", 503)
    with caplog.at_level(logging.WARNING, logger=LOG.name):
        view.wait("uid-carol")
        while client.calls.count("pending_local") < 3:
            await asyncio.sleep(0.01)
        assert view.place("uid-carol") is None
        del client.fail["pending_local"]
        await wait_for_reads(client, 1)
        await asyncio.sleep(0)
    assert view.place("uid-carol") is not None
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["Could not read Kueue's queue 'gpu-notebooks': 503 Service Unavailable"]


async def test_the_loop_reads_while_someone_waits_and_stops_when_no_one_does(view, client):
    queue_with_mine(client)
    view.wait("uid-carol")
    await wait_for_reads(client, 2)
    task = view._task
    assert task is not None and not task.done()
    view.done("uid-carol")
    assert view.place("uid-carol") is None
    await asyncio.wait_for(task, 5)
    reads = client.calls.count("workloads")
    await asyncio.sleep(0.05)
    assert client.calls.count("workloads") == reads
    # someone waits again: the reads start again
    view.wait("uid-dave")
    await wait_for_reads(client, reads + 1)
    assert view.place("uid-dave") is not None


async def test_a_waiter_already_followed_does_not_wake_the_loop(client, clock):
    """Every waiting spawner calls wait() on each progress tick; that must not read each time."""
    view = KueueView(client, NAMESPACE, "gpu-notebooks", LOG, interval=3600, clock=clock)
    try:
        queue_with_mine(client)
        view.wait("uid-carol")
        await wait_for_reads(client, 1)
        for _ in range(5):
            view.wait("uid-carol")
            await asyncio.sleep(0)
        await asyncio.sleep(0.05)
        assert client.calls.count("workloads") == 1
        view.wait("uid-dave")  # a new one is read at once
        await wait_for_reads(client, 2)
        assert view.place("uid-dave") is not None
    finally:
        view.cancel()


async def test_cancel_stops_the_loop(view, client):
    view.wait("uid-carol")
    task = view._task
    await wait_for_reads(client, 1)
    view.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert view.place("uid-carol") is None


# ---------------------------------------------------------------------------
# quotas
# ---------------------------------------------------------------------------


async def test_quotas_read_the_cohort_and_the_flavors_and_are_reused_within_their_ttl(
    view, client, clock
):
    quotas = await view.quotas()
    assert quotas.cluster_queue == "notebooks"
    assert [q.name for q in quotas.queues] == ["notebooks", "batch"]
    assert quotas.flavor_labels == {
        "nvidia-a100": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
    }
    assert kueue.max_admissible(quotas.queues, "notebooks", "nvidia-a100", "nvidia.com/gpu") == 8
    clock.now += QUOTA_TTL - 1
    assert await view.quotas() is quotas
    assert client.calls.count("cluster_queues") == 1
    client.cqs = [cluster_queue("notebooks", nominal=2)]
    clock.now += 1
    again = await view.quotas()
    assert client.calls.count("cluster_queues") == 2
    assert [(q.name, q.quotas[-1].nominal) for q in again.queues] == [("notebooks", 2.0)]


async def test_a_missing_local_queue_is_not_found(view, client):
    client.local_queues = {}
    with pytest.raises(kube.NotFound):
        await view.quotas()


async def test_a_local_queue_without_a_cluster_queue_is_not_found(view, client):
    client.local_queues["gpu-notebooks"]["spec"] = {}
    with pytest.raises(kube.NotFound, match="names no ClusterQueue"):
        await view.quotas()


async def test_a_missing_cluster_queue_is_not_found(view, client):
    client.cqs = [cluster_queue("batch")]
    with pytest.raises(kube.NotFound, match="'notebooks' does not exist"):
        await view.quotas()


async def test_a_missing_cluster_queue_is_not_found_when_it_is_read_alone(view, client):
    client.fail["cluster_queues"] = kube.Refused("forbidden", 403)
    client.cqs = [cluster_queue("batch")]
    with pytest.raises(kube.NotFound):
        await view.quotas()


async def test_without_the_list_right_a_queue_outside_a_cohort_is_read_alone(view, client):
    client.fail["cluster_queues"] = kube.Refused("forbidden", 403)
    client.cqs = [cluster_queue("notebooks", cohort="", nominal=3), cluster_queue("batch")]
    quotas = await view.quotas()
    assert [q.name for q in quotas.queues] == ["notebooks"]
    assert "cluster_queue" in client.calls


async def test_without_the_cluster_role_no_quota_is_known_said_once(view, client, clock, caplog):
    """docs/kueue.md: the ClusterRole is optional; without it Kueue alone decides."""
    client.fail["cluster_queues"] = kube.Refused("forbidden", 403)
    client.fail["cluster_queue"] = kube.Refused("forbidden", 403)
    with caplog.at_level(logging.INFO, logger=LOG.name):
        assert await view.quotas() is None
        clock.now += QUOTA_TTL
        assert await view.quotas() is None
    said = [r for r in caplog.records if "Kueue's quotas" in r.getMessage()]
    assert len(said) == 1


async def test_a_queue_that_may_borrow_is_unknown_when_its_cohort_cannot_be_listed(view, client):
    """Its own quota alone would refuse what Kueue admits by borrowing."""
    client.fail["cluster_queues"] = kube.Refused("forbidden", 403)
    assert await view.quotas() is None


async def test_without_the_flavors_no_quota_is_known(view, client):
    client.fail["resource_flavors"] = kube.Refused("forbidden", 403)
    assert await view.quotas() is None


async def test_other_errors_reach_the_caller(view, client):
    client.fail["cluster_queues"] = kube.Retryable("timed out", None)
    with pytest.raises(kube.Retryable):
        await view.quotas()


# ---------------------------------------------------------------------------
# preemption
# ---------------------------------------------------------------------------


def pod(name="jupyter-carol", reason=None, message="", namespace=NAMESPACE):
    conditions = [{"type": "Ready", "status": "True"}]
    if reason is not None:
        conditions.append(
            {
                "type": "TerminationTarget",
                "status": "True",
                "reason": reason,
                "message": message,
                "lastTransitionTime": "2026-12-06T14:02:00Z",
            }
        )
    return {
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}"},
        "status": {"phase": "Running", "conditions": conditions},
    }


AT = 1796565720.0  # 2026-12-06T14:02:00Z


@pytest.mark.parametrize(
    "reason, message, cause",
    [
        ("WorkloadEvictedDueToPreempted", "Preempted to accommodate a workload", ""),
        (
            "WorkloadEvicted",
            "Preempted to accommodate a workload (UID: 1, JobUID: 2) due to prioritization in "
            "the ClusterQueue; preemptor path: /gpus/notebooks; preemptee path: /gpus/notebooks",
            stopreasons.PREEMPTED_FOR_PRIORITY,
        ),
    ],
)
async def test_a_preempted_pod_is_remembered_once(view, reason, message, cause):
    view.note_pod("MODIFIED", pod(reason=reason, message=message))
    assert view.preemption_notice("jupyterhub/jupyter-dave") is None
    notice = view.preemption_notice("jupyterhub/jupyter-carol")
    assert notice == stopreasons.StopNotice(stopreasons.REASON_PREEMPTED, AT, detail=cause)
    assert view.preemption_notice("jupyterhub/jupyter-carol") is None


@pytest.mark.parametrize(
    "reason, message",
    [
        (None, ""),
        ("WorkloadEvictedDueToPodsReadyTimeout", "Exceeded the PodsReady timeout"),
        ("WorkloadEvicted", "The ClusterQueue is stopped"),
        ("PodFailurePolicy", "Preempted"),  # not Kueue's
    ],
)
async def test_a_pod_kueue_did_not_preempt_is_not_remembered(view, reason, message):
    view.note_pod("DELETED", pod(reason=reason, message=message))
    assert view.preemption_notice("jupyterhub/jupyter-carol") is None


async def test_a_preemption_no_spawner_asked_about_is_forgotten_after_a_while(view, clock):
    view.note_pod("MODIFIED", pod("jupyter-carol", "WorkloadEvictedDueToPreempted"))
    clock.now += PREEMPTED_TTL
    view.note_pod("MODIFIED", pod("jupyter-dave", "WorkloadEvictedDueToPreempted"))
    assert view.preemption_notice("jupyterhub/jupyter-carol") is None
    assert view.preemption_notice("jupyterhub/jupyter-dave").at == AT


async def test_pods_of_another_namespace_are_kept_apart(view):
    view.note_pod("DELETED", pod(reason="WorkloadEvictedDueToPreempted", namespace="course"))
    assert view.preemption_notice("jupyterhub/jupyter-carol") is None
    assert view.preemption_notice("course/jupyter-carol").at == AT
