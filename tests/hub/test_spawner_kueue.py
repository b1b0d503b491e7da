"""GPUSpawner in Kueue mode (``c.GPUSpawner.kueue_queue``): labels, admission, waiting, restarts.

Pods are built by KubeSpawner's own code; Kueue is the stand-in client of
test_kueue behind a real KueueView; the hub's pod watch is a dict; KubeSpawner's
poll, start and stop are replaced where they would reach a cluster.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import re
import time

import pytest
from kubespawner import KubeSpawner
from traitlets.config import Config

from gpuspawner.core import kueue, labels, refusals, stopreasons
from gpuspawner.core.catalog import parse_catalog
from gpuspawner.core.refusals import Refusal
from gpuspawner.hub.capacity import Capacity, QueueSettings, Requester
from gpuspawner.hub.compat import SpawnException
from gpuspawner.hub.kueue import KueueView
from gpuspawner.hub.spawner import GPUSpawner, KueueWaitTimeout

from .test_capacity import (
    NO_PLACEMENT,
    FakeInventory,
    held,
    raw_catalog,
    recorded_inventory,
    select,
    state,  # noqa: F401 (a fixture)
)
from .test_capacity import catalog as capacity_catalog  # noqa: F401 (a fixture)
from .test_kueue import NAMESPACE, FakeKueue, cluster_queue, queue_with_mine, resource_flavor
from .test_spawner import User, _isolated, build, make_spawner  # noqa: F401 (the fixture)

LOG = logging.getLogger("test.hub.spawner_kueue")
A100 = {"profile": "pytorch", "gpu_type": "a100", "gpus": "2"}


def kueue_config(**traits):
    c = Config()
    c.KubeSpawner.namespace = NAMESPACE
    c.GPUSpawner.kueue_queue = "gpu-notebooks"
    for name, value in traits.items():
        setattr(c.GPUSpawner, name, value)
    return c


def with_view(spawner, client):
    """The spawner reads Kueue through a real KueueView over the stand-in client.

    (A spawner made with ``_mock`` has no view of its own: it would need a cluster.)
    """
    view = KueueView(client, spawner.namespace, spawner.kueue_queue, LOG, interval=0.01)
    spawner.kueue_view = lambda: view
    return view


class Reflector:
    def __init__(self):
        self.pods = {}


@pytest.fixture
def reflector(monkeypatch):
    ref = Reflector()
    monkeypatch.setattr(GPUSpawner, "pod_reflector", property(lambda self: ref))
    return ref


def rfc3339(epoch):
    return datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc).strftime(
        "%Y-%m-%dT%H:%M:%SZ"
    )


def queued_pod(spawner, uid="uid-carol", created=None, gated=True):
    """The server's pod as the watch sees it while Kueue holds it (gated), or once admitted."""
    gates = [{"name": kueue.ADMISSION_GATE}] if gated else []
    return {
        "metadata": {
            "name": spawner.pod_name,
            "namespace": spawner.namespace,
            "uid": uid,
            "creationTimestamp": rfc3339(time.time() if created is None else created),
            "labels": kueue.pod_labels("gpu-notebooks", kueue.DEFAULT_PRIORITY_CLASS),
        },
        "spec": {"schedulingGates": gates, "containers": [{"name": "notebook"}]},
        "status": {
            "phase": "Pending",
            "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}
            ],
        },
    }


def running(pod):
    pod["spec"]["schedulingGates"] = []
    pod["spec"]["nodeName"] = "gpu-a-1"
    pod["status"] = {
        "phase": "Running",
        "podIP": "10.244.1.7",
        "conditions": [{"type": "Ready", "status": "True"}],
        "containerStatuses": [{"name": "notebook", "ready": True, "state": {"running": {}}}],
    }
    return pod


# ---------------------------------------------------------------------------
# the pod's labels
# ---------------------------------------------------------------------------


async def test_a_gpu_servers_pod_goes_to_the_local_queue_with_its_priority_class():
    pod = await build(make_spawner(kueue_config()), A100)
    pod_labels = pod["metadata"]["labels"]
    assert pod_labels[kueue.QUEUE_LABEL] == "gpu-notebooks"
    assert pod_labels[kueue.PRIORITY_CLASS_LABEL] == "gpuspawner-interactive"


async def test_the_priority_class_is_the_admins_and_may_be_none():
    pod = await build(make_spawner(kueue_config(kueue_priority_class="teaching")), A100)
    assert pod["metadata"]["labels"][kueue.PRIORITY_CLASS_LABEL] == "teaching"
    pod = await build(make_spawner(kueue_config(kueue_priority_class="")), A100)
    assert pod["metadata"]["labels"][kueue.QUEUE_LABEL] == "gpu-notebooks"
    assert kueue.PRIORITY_CLASS_LABEL not in pod["metadata"]["labels"]


async def test_a_cpu_servers_pod_is_left_to_the_scheduler():
    pod = await build(make_spawner(kueue_config()), {"profile": "pytorch", "gpus": "0"})
    assert kueue.QUEUE_LABEL not in pod["metadata"]["labels"]
    assert kueue.PRIORITY_CLASS_LABEL not in pod["metadata"]["labels"]


async def test_without_kueue_no_pod_carries_its_labels():
    pod = await build(make_spawner(), A100)
    assert not [k for k in pod["metadata"]["labels"] if k.startswith("kueue.x-k8s.io/")]


# ---------------------------------------------------------------------------
# admission: the hub's queue steps aside (Capacity)
# ---------------------------------------------------------------------------


def kueue_check(refusal=None):
    calls = []

    async def check():
        calls.append(True)
        if refusal is not None:
            raise refusal

    check.calls = calls
    return check


async def admit(capacity, catalog, selection, inventory, *, user="carol", queue=True, kueue=None):
    await capacity.admit(
        catalog,
        selection,
        Requester(user, (), ""),
        holdings=held(),
        inventory=inventory,
        placement=NO_PLACEMENT,
        queue=QueueSettings(enabled=queue, timeout=300.0),
        who=f"{user}'s server",
        kueue=kueue,
    )


@pytest.mark.parametrize("queue", [True, False])
async def test_in_kueue_a_request_with_no_free_gpus_now_is_admitted_at_once(
    state,  # noqa: F811
    capacity_catalog,  # noqa: F811
    queue,
):
    """The recorded nodes have no 4 free A100s: without Kueue this is refused or queued."""
    inventory = FakeInventory(recorded_inventory())
    selection = select(capacity_catalog, "a100", 4)
    without = Capacity(state, LOG)
    if not queue:
        with pytest.raises(Refusal) as info:
            await admit(without, capacity_catalog, selection, inventory, queue=False)
        assert info.value.reason == refusals.REASON_NO_CAPACITY
    check = kueue_check()
    capacity = Capacity(state, LOG)
    await asyncio.wait_for(
        admit(capacity, capacity_catalog, selection, inventory, queue=queue, kueue=check), 5
    )
    assert check.calls == [True]
    assert inventory.waits == 0  # never waited in the hub's queue
    assert not capacity.queue_message
    assert [(h.user, h.gpus) for h in state.reservations()] == [("carol", 4)]


async def test_in_kueue_a_request_no_node_could_ever_hold_is_still_refused(
    state,  # noqa: F811
    capacity_catalog,  # noqa: F811
):
    inventory = FakeInventory(recorded_inventory())
    with pytest.raises(Refusal) as info:
        await admit(
            Capacity(state, LOG),
            capacity_catalog,
            select(capacity_catalog, "a100", 8),
            inventory,
            kueue=kueue_check(),
        )
    assert info.value.reason == refusals.REASON_NEVER
    assert state.reservations() == []


async def test_in_kueue_a_request_over_the_users_limit_is_refused_before_kueue_is_asked(
    state,  # noqa: F811
):
    catalog = parse_catalog(raw_catalog({"default": 2}), "test")
    check = kueue_check()
    with pytest.raises(Refusal) as info:
        await admit(Capacity(state, LOG), catalog, select(catalog, "a100", 4), None, kueue=check)
    assert info.value.reason == refusals.REASON_LIMIT
    assert check.calls == []
    assert state.reservations() == []


async def test_in_kueue_a_quota_refusal_leaves_no_reservation(
    state,  # noqa: F811
    capacity_catalog,  # noqa: F811
):
    refusal = refusals.refuse(
        refusals.REASON_NEVER, "quota-none", "ask-admin", queue="q", gpu_type="A100"
    )
    with pytest.raises(Refusal) as info:
        await admit(
            Capacity(state, LOG),
            capacity_catalog,
            select(capacity_catalog, "a100", 1),
            FakeInventory(recorded_inventory()),
            kueue=kueue_check(refusal),
        )
    assert info.value is refusal
    assert state.reservations() == []


# ---------------------------------------------------------------------------
# admission: requests no quota could ever admit (GPUSpawner._check_kueue_quota)
# ---------------------------------------------------------------------------


def alice_spawner(client, **traits):
    """alice has no limit in the pools catalog: only Kueue's quotas can refuse her."""
    spawner = make_spawner(kueue_config(**traits), user=User("alice"))
    with_view(spawner, client)
    return spawner


async def refused(spawner, options):
    with pytest.raises(SpawnException) as info:
        await build(spawner, options)
    error = info.value
    assert "Traceback" not in error.jupyterhub_message
    assert hubstate_reservations() == []
    return error


def hubstate_reservations():
    from gpuspawner.hub import state as hubstate

    return hubstate.current().reservations()


async def test_a_request_within_the_quota_and_what_it_may_borrow_is_admitted():
    client = FakeKueue()
    client.cqs = [cluster_queue("notebooks", nominal=2), cluster_queue("batch", nominal=2)]
    spawner = alice_spawner(client)
    pod = await build(spawner, {"profile": "pytorch", "gpu_type": "a100", "gpus": "4"})
    assert pod["metadata"]["labels"][kueue.QUEUE_LABEL] == "gpu-notebooks"
    assert {"local_queue", "cluster_queues", "resource_flavors"} <= set(client.calls)


async def test_a_request_larger_than_any_quota_could_admit_is_refused_at_once():
    client = FakeKueue()
    client.cqs = [
        cluster_queue("notebooks", nominal=1),
        cluster_queue("batch", nominal=4, borrowing_limit=None),
    ]
    client.cqs[0]["spec"]["resourceGroups"][1]["flavors"][0]["resources"][0]["borrowingLimit"] = 1
    error = await refused(alice_spawner(client), {**A100, "gpus": "4"})
    assert (error.status_code, error.reason) == (400, refusals.REASON_NEVER)
    assert error.jupyterhub_message == (
        "The cluster's GPU queue 'gpu-notebooks' can never admit 4 NVIDIA A100 GPUs: its quota, "
        "with what it may borrow, is 2 at most. Ask for 2 or fewer."
    )


async def test_a_gpu_type_without_a_flavor_in_the_queue_is_refused_at_once():
    """The queue's only GPU flavor is the A100s': an H100 request would wait for ever."""
    client = FakeKueue()
    error = await refused(
        alice_spawner(client), {"profile": "pytorch", "gpu_type": "h100", "gpus": "1"}
    )
    assert (error.status_code, error.reason) == (400, refusals.REASON_NEVER)
    assert error.jupyterhub_message == (
        "The cluster's GPU queue 'gpu-notebooks' has no quota for NVIDIA H100 GPUs. "
        "Please ask an admin."
    )


async def test_a_resource_the_queue_does_not_cover_is_refused_at_once():
    client = FakeKueue()
    error = await refused(
        alice_spawner(client), {"profile": "pytorch", "gpu_type": "mig", "gpus": "1"}
    )
    assert error.reason == refusals.REASON_NEVER
    assert "has no quota for A100 MIG 1g.10gb GPUs" in error.jupyterhub_message


@pytest.mark.parametrize("labels", [{}, {"topology.kubernetes.io/zone": "zone-a"}])
async def test_a_flavor_without_gpu_labels_serves_every_type_of_its_resource(labels):
    """Kueue gives a pod a flavor whose node labels its node selector does not contradict."""
    client = FakeKueue()
    client.flavors = [
        resource_flavor("nvidia-a100", "NVIDIA-A100-SXM4-80GB"),
        {"kind": "ResourceFlavor", "metadata": {"name": "any-gpu"}, "spec": {"nodeLabels": labels}},
    ]
    for cq in client.cqs:
        cq["spec"]["resourceGroups"][1]["flavors"].append(
            {"name": "any-gpu", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 1}]}
        )
    spawner = alice_spawner(client)
    await build(spawner, {"profile": "pytorch", "gpu_type": "h100", "gpus": "2"})  # 1 + 1 borrowed
    spawner._release_reservation()  # as the end of its start would
    error = await refused(
        alice_spawner(client), {"profile": "pytorch", "gpu_type": "h100", "gpus": "4"}
    )
    assert "is 2 at most" in error.jupyterhub_message


async def test_a_missing_local_queue_refuses_gpu_servers_in_one_sentence(caplog):
    client = FakeKueue()
    client.local_queues = {}
    spawner = alice_spawner(client)
    with caplog.at_level(logging.ERROR):
        error = await refused(spawner, A100)
    assert (error.status_code, error.reason) == (500, refusals.REASON_CATALOG_INVALID)
    assert error.jupyterhub_message == (
        "The cluster's GPU queue 'gpu-notebooks' is not set up, so no GPU server can start "
        "right now. Please tell an admin."
    )
    assert "Kueue's queue for GPU servers is missing" in caplog.text
    assert "Traceback" not in caplog.text
    # a CPU server does not need the queue
    await build(spawner, {"profile": "pytorch", "gpus": "0"})


async def test_a_missing_cluster_queue_is_the_same_sentence():
    client = FakeKueue()
    client.cqs = [cluster_queue("batch")]
    error = await refused(alice_spawner(client), A100)
    assert error.reason == refusals.REASON_CATALOG_INVALID
    assert "is not set up" in error.jupyterhub_message


async def test_a_queue_that_cannot_be_read_refuses_with_try_again():
    from gpuspawner.clients import kube

    client = FakeKueue()
    client.fail["local_queue"] = kube.Retryable("503 Service Unavailable", 503)
    error = await refused(alice_spawner(client), A100)
    assert (error.status_code, error.reason) == (503, refusals.REASON_CATALOG_INVALID)
    assert error.jupyterhub_message.startswith("The cluster's GPU queue could not be read")


async def test_without_the_cluster_role_kueue_alone_decides():
    """docs/kueue.md: the hub's ClusterRole is optional."""
    from gpuspawner.clients import kube

    client = FakeKueue()
    client.fail["cluster_queues"] = kube.Refused("forbidden", 403)
    client.fail["cluster_queue"] = kube.Refused("forbidden", 403)
    pod = await build(alice_spawner(client), {**A100, "gpus": "4"})
    assert pod["metadata"]["labels"][kueue.QUEUE_LABEL] == "gpu-notebooks"


# ---------------------------------------------------------------------------
# waiting in Kueue: the progress line, the timeout
# ---------------------------------------------------------------------------


async def test_the_progress_line_gives_the_place_while_the_pod_is_gated(reflector):
    client = FakeKueue()
    queue_with_mine(client)
    client.workload_list = []
    spawner = make_spawner(kueue_config())
    view = with_view(spawner, client)
    try:
        await build(spawner, A100)
        pod = queued_pod(spawner)
        reflector.pods[f"{spawner.namespace}/{spawner.pod_name}"] = pod
        assert spawner._gpu_check_progress() == (
            "Waiting in the cluster's GPU queue for 2 NVIDIA A100 GPUs."
        )
        while client.calls.count("workloads") < 1:
            client.read.clear()
            await asyncio.wait_for(client.read.wait(), 5)
        await asyncio.sleep(0)
        assert spawner._gpu_check_progress() == (
            "Waiting in the cluster's GPU queue for 2 NVIDIA A100 GPUs: 1 of 2 in this hub's "
            "queue, 3 in the notebooks queue (ahead of it: 1 notebook and 1 job)."
        )
        # admitted: the watch sees the gate gone; the place is no longer followed
        spawner.is_pod_running(running(pod))
        assert view.place("uid-carol") is None
        assert "uid-carol" not in view._waiters
        assert "GPU queue" not in (spawner._gpu_check_progress() or "")
    finally:
        view.cancel()


async def test_a_gated_pod_past_the_queue_timeout_ends_the_wait(reflector):
    spawner = make_spawner(kueue_config(gpu_queue_timeout=300))
    await build(spawner, A100)
    now = time.time()
    assert spawner.is_pod_running(queued_pod(spawner, created=now - 10)) is False
    with pytest.raises(KueueWaitTimeout):
        spawner.is_pod_running(queued_pod(spawner, created=now - 400))
    # admitted, it is the scheduler's and the image's time, not the queue's
    assert spawner.is_pod_running(queued_pod(spawner, created=now - 400, gated=False)) is False


async def test_without_kueue_a_gated_pod_never_times_out_in_it():
    spawner = make_spawner(Config())
    await build(spawner, A100)
    assert spawner.is_pod_running(queued_pod(spawner, created=time.time() - 4000)) is False


async def test_the_kueue_timeout_deletes_the_pod_and_fails_the_spawn_in_one_sentence(
    monkeypatch,
):
    spawner = make_spawner(kueue_config(gpu_queue_timeout=300))
    stopped = []

    async def waiting_start(self):
        await self.load_user_options()
        self.is_pod_running(queued_pod(self, created=time.time() - 400))

    async def stop(now=False):
        stopped.append(now)

    monkeypatch.setattr(KubeSpawner, "_start", waiting_start)
    spawner.stop = stop
    spawner.user_options = dict(A100)
    with pytest.raises(SpawnException) as info:
        await spawner.start()
    assert stopped == [True]
    assert (info.value.status_code, info.value.reason) == (503, refusals.REASON_NO_CAPACITY)
    assert re.fullmatch(
        r"The server waited 40[01] seconds in the cluster's GPU queue for 2 NVIDIA A100 GPUs "
        r"without being admitted, so it was not started\. Try again later\.",
        info.value.jupyterhub_message,
    ), info.value.jupyterhub_message
    assert spawner.stop_notice().reason == stopreasons.REASON_STUCK_PENDING
    assert hubstate_reservations() == []


# ---------------------------------------------------------------------------
# the hub's restart: a queued server keeps its place (compat.hub_checks_at_start)
# ---------------------------------------------------------------------------


@pytest.fixture
def kube_poll(monkeypatch):
    """KubeSpawner's poll: it starts the pods watch (here: makes the reflector appear),
    then a pod in it is running or starting (None), else gone (1)."""
    holder = {"reflector": None, "polls": 0}
    ref = Reflector()
    monkeypatch.setattr(GPUSpawner, "pod_reflector", property(lambda self: holder["reflector"]))

    async def poll(self):
        holder["polls"] += 1
        holder["reflector"] = ref
        return None if f"{self.namespace}/{self.pod_name}" in ref.pods else 1

    monkeypatch.setattr(KubeSpawner, "poll", poll)
    holder["pods"] = ref.pods
    return holder


def restarted_spawner(**traits):
    spawner = make_spawner(kueue_config(**traits))
    spawner._check_pending = True  # what JupyterHub's init_spawners sets while it polls
    return spawner


async def test_at_the_hubs_start_a_queued_server_is_kept_until_it_runs(kube_poll):
    spawner = restarted_spawner()
    pod = queued_pod(spawner)
    kube_poll["pods"][f"{spawner.namespace}/{spawner.pod_name}"] = pod
    # the pods watch starts in KubeSpawner's poll: the wait must come after it
    assert spawner.pod_reflector is None
    task = asyncio.ensure_future(spawner.poll())
    for _ in range(20):
        await asyncio.sleep(0.01)
    assert not task.done()  # gated: the hub keeps waiting, it does not stop the server
    running(pod)
    assert await asyncio.wait_for(task, 10) is None


async def test_at_the_hubs_start_a_server_waiting_past_the_queue_timeout_is_stopped(kube_poll):
    spawner = restarted_spawner(gpu_queue_timeout=300)
    pod = queued_pod(spawner, created=time.time() - 400)
    pod["metadata"]["labels"].update({labels.LABEL_GPU_TYPE: "a100", labels.LABEL_GPUS: "2"})
    kube_poll["pods"][f"{spawner.namespace}/{spawner.pod_name}"] = pod
    assert await asyncio.wait_for(spawner.poll(), 10) == 1
    # its user is told why, as when the wait ends during a spawn; the hub saves it as it stops
    notice = spawner.stop_notice()
    assert notice.reason == stopreasons.REASON_STUCK_PENDING
    assert notice.held == "2 × NVIDIA A100"
    assert 400 <= notice.seconds < 410
    assert stopreasons.StopNotice.from_state(
        spawner.get_state()[stopreasons.STATE_KEY]
    ) == notice.for_server(spawner.name, notice.held)
    assert re.fullmatch(
        r"Your server \(2 × NVIDIA A100\) was stopped at \d\d:\d\d UTC because no node had "
        r"free GPUs for it for 6 minutes\.",
        notice.sentence(),
    ), notice.sentence()


async def test_at_the_hubs_start_a_running_server_is_polled_as_ever(kube_poll, caplog):
    spawner = restarted_spawner()
    kube_poll["pods"][f"{spawner.namespace}/{spawner.pod_name}"] = running(queued_pod(spawner))
    with caplog.at_level(logging.INFO):
        assert await asyncio.wait_for(spawner.poll(), 10) is None
    assert "waits in Kueue's queue" not in caplog.text


async def test_after_the_hubs_start_a_queued_server_is_polled_without_waiting(kube_poll):
    spawner = make_spawner(kueue_config())
    assert not spawner._check_pending
    kube_poll["pods"][f"{spawner.namespace}/{spawner.pod_name}"] = queued_pod(spawner)
    assert await asyncio.wait_for(spawner.poll(), 10) is None
    assert kube_poll["polls"] == 1


# ---------------------------------------------------------------------------
# preemption: the pod vanished before the hub polled it
# ---------------------------------------------------------------------------


async def test_a_server_kueue_preempted_says_so_when_its_pod_is_gone(kube_poll):
    spawner = make_spawner(kueue_config())
    view = with_view(spawner, FakeKueue())
    spawner._running = {"held": "2 × NVIDIA A100", "node": ""}
    pod = running(queued_pod(spawner))
    pod["status"]["conditions"].append(
        {
            "type": "TerminationTarget",
            "status": "True",
            "reason": "WorkloadEvictedDueToPreempted",
            "message": "Preempted to accommodate a workload (UID: 5, JobUID: 6) due to "
            "reclamation within the cohort while borrowing; preemptor path: /gpus/batch; "
            "preemptee path: /gpus/notebooks",
            "lastTransitionTime": "2026-12-06T14:02:00Z",
        }
    )
    view.note_pod("DELETED", pod)  # the inventory's watch saw it go
    assert await spawner.poll() == 1
    notice = spawner.stop_notice()
    assert notice.reason == stopreasons.REASON_PREEMPTED
    assert notice.sentence() == (
        "Your server (2 × NVIDIA A100) was stopped at 14:02 UTC because it was preempted for "
        "queued work (its GPUs were borrowed from another queue, which took them back)."
    )


async def test_a_vanished_server_kueue_did_not_preempt_gets_no_such_notice(kube_poll):
    spawner = make_spawner(kueue_config())
    with_view(spawner, FakeKueue())
    spawner._running = {"held": "2 × NVIDIA A100", "node": ""}
    assert await spawner.poll() == 1
    assert spawner.stop_notice() is None


class Inventory:
    """The started inventory reflector, as far as the view's listener goes."""

    def __init__(self):
        self.listeners = []

    def add_pod_listener(self, listener):
        self.listeners.append(listener)


async def test_a_poll_has_the_hubs_view_listen_to_the_pods_watch_once(kube_poll):
    """After the hub's restart no spawn may ask for the view before Kueue preempts a server."""
    from gpuspawner.hub import state as hubstate

    spawner = make_spawner(kueue_config())
    spawner._gpu_mock = False  # a view of its own (no request is made until one is read)
    inventory = Inventory()
    hubstate.current()._inventory = inventory  # started by a form or a metrics scrape
    hubstate.current()._inventory_loop = asyncio.get_running_loop()
    kube_poll["pods"][f"{spawner.namespace}/{spawner.pod_name}"] = running(queued_pod(spawner))
    assert await spawner.poll() is None
    assert await spawner.poll() is None
    assert len(inventory.listeners) == 1
    view = spawner.kueue_view()
    try:
        assert inventory.listeners == [view.note_pod]
    finally:
        view.cancel()
        hubstate.current()._inventory = None


async def test_a_gpu_request_waits_in_kueue_not_for_a_start_turn():
    """A turn held while the pod waits in Kueue would keep the requests behind it out of
    Kueue's queue (found by benchmarks/kueue_spawn.py): GPU servers take none; CPU ones do."""
    from gpuspawner.hub import state as hubstate

    gate = hubstate.current().start_gate
    await gate.enter("someone/else", 1)  # every turn is taken
    client = FakeKueue()
    client.cqs = [cluster_queue("notebooks", nominal=4), cluster_queue("batch", nominal=4)]
    spawner = alice_spawner(client, concurrent_starts=1)
    spawner.user_options = dict(A100)
    await asyncio.wait_for(spawner.load_user_options(), 5)
    assert gate.ahead_of("alice/") is None and gate.starting == 1
    cpu = make_spawner(kueue_config(concurrent_starts=1), user=User("bea"))
    cpu.user_options = {"profile": "pytorch", "gpus": "0"}
    waiting = asyncio.ensure_future(cpu.load_user_options())
    await asyncio.sleep(0.2)
    assert not waiting.done() and gate.ahead_of("bea/") == 0  # waits: next in line
    gate.leave("someone/else")
    await asyncio.wait_for(waiting, 5)
    gate.leave("bea/")
