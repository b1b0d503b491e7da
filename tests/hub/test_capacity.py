"""Capacity on its own: admission verdicts, the queue, a stuck pod, with every input explicit.

The inventory is the real model filled from the recorded sandbox objects
(tests/fixtures/nodes/); only its watches are replaced. Time is a clock the
tests move: nothing here sleeps and then asserts on how long it took.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging

import pytest
import yaml

from gpuspawner.core.catalog import parse_catalog
from gpuspawner.core.limits import Holding
from gpuspawner.core.options import resolve_selection
from gpuspawner.core.placement import Placement
from gpuspawner.core.refusals import Refusal
from gpuspawner.hub import state as hubstate
from gpuspawner.hub.capacity import (
    Capacity,
    GPUUnschedulable,
    QueueSettings,
    Requester,
    figures,
)
from gpuspawner.inventory.figures import live_payload as payload
from gpuspawner.inventory.model import demand_for, inventory_from

from ..conftest import FIXTURES

NODES = FIXTURES / "nodes"
LOG = logging.getLogger("test.capacity")
NO_PLACEMENT = Placement({}, [])


def items(name):
    return json.loads((NODES / name).read_text())["items"]


class Clock:
    def __init__(self, now=1000.0):
        self.now = now

    def __call__(self):
        return self.now


class FakeInventory:
    """The reflector's interface over a real Inventory; tests change the inventory directly.

    With a ``clock``, waiting for a change that never comes moves that clock
    by the whole timeout instead of sleeping, so a queue's timeout passes at once.
    """

    def __init__(self, inventory, clock=None, missing=()):
        self.inventory = inventory
        self.clock = clock
        self.missing_permissions = list(missing)
        self.ready = not missing
        self.changed = asyncio.Event()
        self.waits = 0

    async def wait_ready(self, timeout):
        return self.ready

    async def wait_for_change(self, timeout):
        self.waits += 1
        if self.clock is not None:
            self.clock.now += timeout
            return
        try:
            await asyncio.wait_for(self.changed.wait(), timeout)
        except asyncio.TimeoutError:
            pass
        self.changed.clear()


def raw_catalog(limits=None):
    raw = yaml.safe_load((NODES / "catalog.yaml").read_text())
    if limits is not None:
        raw["limits"] = limits
    return raw


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def state():
    return hubstate.HubState()


def recorded_inventory():
    return inventory_from(
        items("recorded-nodes.json") + items("variants-nodes.json"),
        items("recorded-pods.json") + items("variants-pods.json"),
    )


@pytest.fixture
def inventory():
    return FakeInventory(recorded_inventory())


@pytest.fixture
def catalog():
    return parse_catalog(raw_catalog(), "test")


def select(catalog, gpu_type, gpus, image="pytorch"):
    return resolve_selection({"profile": image, "gpu_type": gpu_type, "gpus": str(gpus)}, catalog)


def a100_figures(inventory, catalog):
    return inventory.inventory.availability(demand_for(catalog.gpu_types["a100"]))


def held(*holdings):
    listed = []

    async def holdings_now(every_user):
        listed.append(every_user)
        return list(holdings)

    holdings_now.listed = listed
    return holdings_now


async def admit(
    capacity,
    catalog,
    selection,
    inventory,
    *,
    user="carol",
    groups=(),
    server="",
    holdings=None,
    queue=False,
    queue_timeout=300.0,
):
    await capacity.admit(
        catalog,
        selection,
        Requester(user, tuple(groups), server),
        holdings=holdings or held(),
        inventory=inventory,
        placement=NO_PLACEMENT,
        queue=QueueSettings(enabled=queue, timeout=queue_timeout),
        who=f"{user}'s server",
    )


# ---------------------------------------------------------------------------
# figures
# ---------------------------------------------------------------------------


def test_figures_follow_the_inventory_and_are_none_without_it(inventory, catalog):
    found = figures(inventory, catalog, NO_PLACEMENT)
    assert found["a100"] == a100_figures(inventory, catalog)
    assert set(found) == set(catalog.gpu_types)
    assert figures(None, catalog, NO_PLACEMENT) is None
    inventory.ready = False
    assert figures(inventory, catalog, NO_PLACEMENT) is None


def test_figures_honour_the_admins_node_placement(inventory, catalog):
    nowhere = Placement({"example.com/pool": "none-has-this"}, [])
    found = figures(inventory, catalog, nowhere)
    assert found["a100"].allocatable == 0
    assert figures(inventory, catalog, NO_PLACEMENT)["a100"].allocatable > 0


def test_payload_says_why_there_are_no_figures(inventory, catalog):
    assert payload(None, catalog, NO_PLACEMENT)["problem"] == "the GPU inventory is turned off"
    assert payload(inventory, None, NO_PLACEMENT)["problem"] == "the catalog is invalid"
    blind = FakeInventory(inventory.inventory, missing=["The hub may not list nodes."])
    assert payload(blind, catalog, NO_PLACEMENT)["problem"] == "The hub may not list nodes."
    loading = FakeInventory(inventory.inventory)
    loading.ready = False
    assert payload(loading, catalog, NO_PLACEMENT)["problem"] == (
        "the GPU inventory is still loading"
    )


# ---------------------------------------------------------------------------
# admission verdicts
# ---------------------------------------------------------------------------


async def test_a_request_that_fits_is_reserved(state, inventory, catalog):
    capacity = Capacity(state, LOG)
    selection = select(catalog, "a100", 2)
    await admit(capacity, catalog, selection, inventory, server="exp")
    (reserved,) = state.reservations("carol")
    assert (reserved.user, reserved.server, reserved.gpu_type, reserved.gpus) == (
        "carol",
        "exp",
        "a100",
        2,
    )
    assert not state.lock("user:carol").locked()


async def test_a_cpu_request_is_neither_checked_nor_reserved(state, inventory, catalog):
    holdings = held()
    await admit(
        Capacity(state, LOG), catalog, select(catalog, "a100", 0), inventory, holdings=holdings
    )
    assert holdings.listed == []  # the cluster was not asked
    assert state.reservations() == []


async def test_never_schedulable_is_refused_even_with_the_queue_on(state, inventory, catalog):
    with pytest.raises(Refusal) as info:
        await admit(
            Capacity(state, LOG), catalog, select(catalog, "a100", 8), inventory, queue=True
        )
    assert info.value.reason == "never-schedulable"
    assert info.value.message.startswith("No node has 8 NVIDIA A100 GPUs; the largest has 4.")
    assert state.reservations() == []
    assert len(state.wait_queue) == 0


async def test_no_free_gpus_now_is_refused_with_the_figures(state, inventory, catalog):
    with pytest.raises(Refusal) as info:
        await admit(Capacity(state, LOG), catalog, select(catalog, "a100", 4), inventory)
    now = a100_figures(inventory, catalog)
    assert info.value.reason == "no-capacity"
    assert info.value.status == 503
    assert f"{now.free} of {now.allocatable} are free" in info.value.message
    assert state.reservations() == []


async def test_without_an_inventory_only_the_limits_decide(state, catalog):
    await admit(Capacity(state, LOG), catalog, select(catalog, "a100", 8), None)
    assert [h.gpus for h in state.reservations()] == [8]


async def test_over_the_limit_with_nothing_held_is_refused_without_asking_the_cluster(
    state, inventory
):
    catalog = parse_catalog(raw_catalog({"default": 2}), "test")
    holdings = held()
    with pytest.raises(Refusal) as info:
        await admit(
            Capacity(state, LOG), catalog, select(catalog, "a100", 4), inventory, holdings=holdings
        )
    assert info.value.reason == "limit"
    assert holdings.listed == []
    assert state.reservations() == []


async def test_holdings_and_reservations_count_against_the_limit(state, inventory):
    catalog = parse_catalog(raw_catalog({"default": 2}), "test")
    capacity = Capacity(state, LOG)
    running = Holding("carol", "", "a100", 1, 1.0)
    await admit(
        capacity, catalog, select(catalog, "a100", 1), inventory, server="b", holdings=held(running)
    )
    # The reservation of server "b" is counted by whoever reads the holdings next.
    assert [h.server for h in state.reservations("carol")] == ["b"]
    assert state.reservations("someone-else") == []
    with pytest.raises(Refusal) as info:
        await admit(
            Capacity(state, LOG),
            catalog,
            select(catalog, "a100", 1),
            inventory,
            server="c",
            holdings=held(running, *state.reservations("carol")),
        )
    assert info.value.reason == "limit"


async def test_a_group_pool_reads_every_users_holdings(state, inventory):
    catalog = parse_catalog(raw_catalog({"default": 4, "group_pools": {"students": 3}}), "test")
    holdings = held(Holding("ivan", "", "a100", 2, 2.0, pool_groups=("students",)))
    with pytest.raises(Refusal) as info:
        await admit(
            Capacity(state, LOG),
            catalog,
            select(catalog, "a100", 2),
            inventory,
            groups=["students"],
            holdings=holdings,
        )
    assert holdings.listed == [True]
    assert info.value.reason == "group-pool"
    assert not state.lock("pool:students").locked()


async def test_unknown_usage_is_a_503_and_leaves_no_lock_or_reservation(state, inventory, catalog):
    async def unreachable(every_user):
        raise OSError("connection refused")

    with pytest.raises(Refusal) as info:
        await admit(
            Capacity(state, LOG),
            catalog,
            select(catalog, "a100", 1),
            inventory,
            holdings=unreachable,
        )
    assert (info.value.status, info.value.reason) == (503, "usage-unknown")
    assert state.reservations() == []
    assert not state.lock("user:carol").locked()


async def test_one_users_concurrent_requests_are_admitted_one_at_a_time(state, inventory):
    catalog = parse_catalog(raw_catalog({"default": 2}), "test")

    def attempt(server):
        async def holdings(every_user):
            await asyncio.sleep(0)  # yield, as a real listing does
            return state.reservations("carol")

        return admit(
            Capacity(state, LOG),
            catalog,
            select(catalog, "a100", 1),
            inventory,
            server=server,
            holdings=holdings,
        )

    results = await asyncio.gather(*(attempt(f"s{i}") for i in range(5)), return_exceptions=True)
    assert sum(r is None for r in results) == 2
    assert all(isinstance(r, Refusal) for r in results if r is not None)
    assert len(state.reservations("carol")) == 2


# ---------------------------------------------------------------------------
# the queue
# ---------------------------------------------------------------------------


async def wait_until_queued(capacity):
    for _ in range(100):
        if capacity.queue_message:
            return
        await asyncio.sleep(0)
    raise AssertionError("the request never joined the queue")


async def test_queued_requests_wait_in_order_and_leave_when_gpus_free(state, inventory, catalog):
    first, second = Capacity(state, LOG), Capacity(state, LOG)
    one = asyncio.ensure_future(
        admit(first, catalog, select(catalog, "a100", 4), inventory, user="ann", queue=True)
    )
    await wait_until_queued(first)
    two = asyncio.ensure_future(
        admit(second, catalog, select(catalog, "a100", 4), inventory, user="ben", queue=True)
    )
    await wait_until_queued(second)
    assert first.queue_message.startswith("1st in line for 4 × NVIDIA A100 (1 waiting)")
    assert second.queue_message.startswith("2nd in line for 4 × NVIDIA A100 (2 waiting)")
    assert len(state.wait_queue) == 2
    assert sorted(h.user for h in state.reservations()) == ["ann", "ben"]
    # Ben gives up: he leaves the queue and his GPUs are no longer reserved.
    two.cancel()
    with pytest.raises(asyncio.CancelledError):
        await two
    assert len(state.wait_queue) == 1
    assert [h.user for h in state.reservations()] == ["ann"]
    assert not one.done()
    # The 2-GPU pod on gpu-a100-0 ends: that node has 4 free.
    inventory.inventory.remove_pod("default", "bound-2xa100")
    inventory.changed.set()
    await asyncio.wait_for(one, 5)
    assert first.queue_message == ""
    assert len(state.wait_queue) == 0
    assert [h.user for h in state.reservations()] == ["ann"]


def pod_on(node, name, gpus, namespace="jupyterhub"):
    """A bound pod holding ``gpus`` A100s, shaped like the recorded one."""
    pod = copy.deepcopy(bound_pod())
    pod["metadata"].update(name=name, namespace=namespace, uid=f"uid-{name}")
    pod["spec"]["nodeName"] = node
    for container in pod["spec"]["containers"]:
        for section in ("limits", "requests"):
            if "nvidia.com/gpu" in (container.get("resources") or {}).get(section, {}):
                container["resources"][section]["nvidia.com/gpu"] = str(gpus)
    return pod


async def admit_queued(capacity, catalog, gpus, inventory, user):
    await capacity.admit(
        catalog,
        select(catalog, "a100", gpus),
        Requester(user, (), "", pod=f"jupyterhub/jupyter-{user}"),
        holdings=held(),
        inventory=inventory,
        placement=NO_PLACEMENT,
        queue=QueueSettings(enabled=True, timeout=300),
        who=f"{user}'s server",
    )


async def test_gpus_promised_to_the_first_in_line_are_not_given_to_the_second(
    state, inventory, catalog
):
    first, second = Capacity(state, LOG), Capacity(state, LOG)
    one = asyncio.ensure_future(admit_queued(first, catalog, 4, inventory, "ann"))
    await wait_until_queued(first)
    two = asyncio.ensure_future(admit_queued(second, catalog, 4, inventory, "ben"))
    await wait_until_queued(second)
    # A culled 2-GPU server goes: gpu-a100-0 has 4 free, enough for one of them.
    inventory.inventory.remove_pod("default", "bound-2xa100")
    inventory.changed.set()
    await asyncio.wait_for(one, 5)
    # Ann's pod is not on a node yet, so the inventory still shows 4 free there;
    # her promise keeps Ben waiting instead of letting both in for the same GPUs.
    for _ in range(3):
        inventory.changed.set()
        await asyncio.sleep(0.01)
    assert not two.done()
    assert second.queue_message.startswith(
        "1st in line for 4 × NVIDIA A100 (1 waiting): 1 of 8 are free"
    )
    # Her pod is bound: the inventory counts it, her promise no longer adds to it.
    inventory.inventory.set_pod(pod_on("gpu-a100-0", "jupyter-ann", 4))
    inventory.changed.set()
    await asyncio.sleep(0.01)
    assert not two.done()
    # Her server stops: Ben's turn.
    inventory.inventory.remove_pod("jupyterhub", "jupyter-ann")
    state.release("ann", "")
    inventory.changed.set()
    await asyncio.wait_for(two, 5)


async def test_a_request_refused_for_lack_of_gpus_counts_as_demand_once_and_for_a_while(
    state, inventory, catalog, clock
):
    capacity = Capacity(state, LOG, clock=clock)
    settings = QueueSettings(enabled=False, demand_window=600)
    for _ in range(3):  # the same server asked three times
        with pytest.raises(Refusal):
            await capacity.admit(
                catalog,
                select(catalog, "a100", 4),
                Requester("dora", (), "train"),
                holdings=held(),
                inventory=inventory,
                placement=NO_PLACEMENT,
                queue=settings,
                who="dora's server",
            )
    assert state.demand(clock.now) == [("refused", "a100", 4)]
    assert state.demand(clock.now + 599) == [("refused", "a100", 4)]
    assert state.demand(clock.now + 600) == []


async def test_demand_forgets_a_refused_server_once_it_is_admitted(state, inventory, catalog):
    capacity = Capacity(state, LOG)
    with pytest.raises(Refusal):
        await admit(capacity, catalog, select(catalog, "a100", 4), inventory, user="dora")
    assert [d[0] for d in state.demand(capacity.clock())] == ["refused"]
    await admit(capacity, catalog, select(catalog, "a100", 2), inventory, user="dora")
    assert state.demand(capacity.clock()) == []


async def test_refusals_that_are_not_about_free_gpus_are_not_demand(state, inventory, catalog):
    capacity = Capacity(state, LOG)
    with pytest.raises(Refusal) as info:  # no node has 8: never schedulable
        await admit(capacity, catalog, select(catalog, "a100", 8), inventory)
    assert info.value.reason == "never-schedulable"
    assert state.demand(capacity.clock()) == []


async def test_queued_requests_are_demand_while_they_wait(state, inventory, catalog):
    capacity = Capacity(state, LOG)
    waiting = asyncio.ensure_future(admit_queued(capacity, catalog, 4, inventory, "ann"))
    await wait_until_queued(capacity)
    assert state.demand(capacity.clock()) == [("queued", "a100", 4)]
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert state.demand(capacity.clock()) == []


async def test_the_queue_gives_up_after_its_timeout_on_the_clock(state, catalog, clock):
    inventory = FakeInventory(recorded_inventory(), clock)
    capacity = Capacity(state, LOG, clock=clock)
    with pytest.raises(Refusal) as info:
        await admit(
            capacity, catalog, select(catalog, "a100", 4), inventory, queue=True, queue_timeout=12
        )
    assert info.value.reason == "no-capacity"
    assert info.value.message.startswith("No node had 4 free NVIDIA A100 GPUs within 12 seconds")
    assert clock.now == 1012  # it looked again every 5 s of the clock: 5, 5, then the last 2
    assert inventory.waits == 3
    assert state.reservations() == []
    assert len(state.wait_queue) == 0
    assert capacity.queue_message == ""


async def test_a_cancelled_wait_leaves_the_queue_and_releases_its_reservation(
    state, inventory, catalog
):
    capacity = Capacity(state, LOG)
    waiting = asyncio.ensure_future(
        admit(capacity, catalog, select(catalog, "a100", 4), inventory, queue=True)
    )
    await wait_until_queued(capacity)
    assert len(state.wait_queue) == 1 and len(state.reservations()) == 1
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert len(state.wait_queue) == 0
    assert state.reservations() == []
    assert capacity.queue_message == ""


async def test_a_spawner_whose_start_is_cancelled_leaves_the_queue_and_its_reservation(
    offline_kubeconfig,
):
    from traitlets.config import Config

    from .test_spawner import make_spawner

    state = hubstate.reset()
    inventory = FakeInventory(recorded_inventory())
    c = Config()
    c.GPUSpawner.catalog_file = str(NODES / "catalog.yaml")
    c.GPUSpawner.gpu_queue_enabled = True
    spawner = make_spawner(c)
    spawner.gpu_inventory = lambda: inventory
    spawner.user_options = {"profile": "pytorch", "gpu_type": "a100", "gpus": "4"}
    try:
        start = asyncio.ensure_future(spawner.start())
        await wait_until_queued(spawner.capacity)
        assert spawner._gpu_check_progress().startswith("1st in line for 4 × NVIDIA A100")
        start.cancel()  # what the hub does when the user cancels the spawn
        with pytest.raises(asyncio.CancelledError):
            await start
        assert len(state.wait_queue) == 0
        assert state.reservations() == []
        assert spawner._gpu_check_progress() is None
    finally:
        hubstate.reset()


# ---------------------------------------------------------------------------
# a pod the scheduler cannot place
# ---------------------------------------------------------------------------


def unschedulable_pod(message=None):
    pod = copy.deepcopy(
        next(p for p in items("recorded-pods.json") if p["metadata"]["name"] == "pending-8xa100")
    )
    if message is not None:
        pod["status"]["conditions"][0]["message"] = message
    return pod


def bound_pod():
    return next(p for p in items("recorded-pods.json") if p["metadata"]["name"] == "bound-2xa100")


def test_a_pod_short_of_gpus_fails_exactly_at_the_timeout(state, catalog, clock):
    capacity = Capacity(state, LOG, clock=clock)
    selection = select(catalog, "a100", 2)
    pod = unschedulable_pod()
    capacity.watch_scheduling(pod, selection, timeout=30, who="carol")
    assert capacity.scheduling_progress(30).endswith("Giving up in 30 s unless GPUs are freed.")
    clock.now += 29.5
    capacity.watch_scheduling(pod, selection, timeout=30, who="carol")
    assert capacity.scheduling_progress(30).endswith("Giving up in 0 s unless GPUs are freed.")
    clock.now += 0.5
    with pytest.raises(GPUUnschedulable) as info:
        capacity.watch_scheduling(pod, selection, timeout=30, who="carol")
    assert "too few free NVIDIA A100 GPUs" in str(info.value)


def test_a_bound_pod_or_a_new_spawn_restarts_the_wait(state, catalog, clock):
    capacity = Capacity(state, LOG, clock=clock)
    selection = select(catalog, "a100", 2)
    capacity.watch_scheduling(unschedulable_pod(), selection, timeout=10, who="carol")
    clock.now += 9
    capacity.watch_scheduling(bound_pod(), selection, timeout=10, who="carol")
    assert capacity.unschedulable is None
    clock.now += 9
    capacity.watch_scheduling(unschedulable_pod(), selection, timeout=10, who="carol")
    clock.now += 9
    capacity.start_over()
    assert capacity.unschedulable is None
    capacity.watch_scheduling(unschedulable_pod(), selection, timeout=10, who="carol")
    clock.now += 9.9
    capacity.watch_scheduling(unschedulable_pod(), selection, timeout=10, who="carol")


def test_other_reasons_and_a_zero_timeout_never_fail_fast(state, catalog, clock):
    capacity = Capacity(state, LOG, clock=clock)
    selection = select(catalog, "a100", 2)
    cpu = unschedulable_pod("0/5 nodes are available: 5 Insufficient cpu.")
    capacity.watch_scheduling(cpu, selection, timeout=1, who="carol")
    clock.now += 3600
    capacity.watch_scheduling(cpu, selection, timeout=1, who="carol")
    assert capacity.scheduling_progress(1) == (
        "No node can take this server yet: 5 nodes have too little free CPU."
    )
    capacity.watch_scheduling(unschedulable_pod(), selection, timeout=0, who="carol")
    clock.now += 3600
    capacity.watch_scheduling(unschedulable_pod(), selection, timeout=0, who="carol")
    assert "Giving up" not in capacity.scheduling_progress(0)


def limited_catalog(total):
    return parse_catalog(raw_catalog({"default": {"gpus": total}}), "test")


async def refuse_named_servers(capacity, catalog, inventory, user, servers, gpus, settings):
    for server in servers:
        with pytest.raises(Refusal) as info:
            await capacity.admit(
                catalog,
                select(catalog, "a100", gpus),
                Requester(user, (), server),
                holdings=held(),
                inventory=inventory,
                placement=NO_PLACEMENT,
                queue=settings,
                who=f"{user}'s server {server!r}",
            )
        assert info.value.reason == "no-capacity"


async def test_one_person_refused_from_five_servers_is_demand_for_what_they_may_take(
    state, inventory, catalog, clock
):
    # Every A100 is taken. The user may hold 2 GPUs in all: five named servers
    # asking for 2 each are 2 GPUs of demand, not 10.
    inventory.inventory.set_pod(pod_on("gpu-a100-0", "jupyter-ann", 2))
    inventory.inventory.set_pod(pod_on("gpu-a100-1", "jupyter-ben", 1))
    assert a100_figures(inventory, catalog).free == 0
    limited = limited_catalog(2)
    capacity = Capacity(state, LOG, clock=clock)
    settings = QueueSettings(enabled=False, demand_window=600)
    servers = ["a", "b", "c", "d", "e"]
    await refuse_named_servers(capacity, limited, inventory, "mallory", servers, 2, settings)
    assert state.demand(clock.now) == [("refused", "a100", 2)]
    # and 1 GPU each: still 2 GPUs of demand, however the person splits it
    await refuse_named_servers(capacity, limited, inventory, "mallory", servers, 1, settings)
    assert state.demand(clock.now) == [("refused", "a100", 2)]


async def test_each_person_counts_once_and_separately(state, inventory, catalog, clock):
    capacity = Capacity(state, LOG, clock=clock)
    settings = QueueSettings(enabled=False, demand_window=600)
    await refuse_named_servers(capacity, catalog, inventory, "ann", ["x", "y"], 4, settings)
    await refuse_named_servers(capacity, catalog, inventory, "ben", ["z"], 4, settings)
    # no limit: ann's two servers are 8 GPUs of her demand, ben's one is 4
    assert sorted(state.demand(clock.now)) == [("refused", "a100", 4), ("refused", "a100", 8)]


async def test_a_persons_demand_is_cleared_when_any_of_their_requests_is_admitted(
    state, inventory, catalog, clock
):
    capacity = Capacity(state, LOG, clock=clock)
    settings = QueueSettings(enabled=False, demand_window=600)
    await refuse_named_servers(capacity, catalog, inventory, "ann", ["x", "y", "z"], 4, settings)
    await refuse_named_servers(capacity, catalog, inventory, "ben", ["w"], 4, settings)
    # ann gets 1 GPU on another server: she is no longer waiting; ben still is
    await admit(capacity, catalog, select(catalog, "a100", 1), inventory, user="ann", server="v")
    assert state.demand(clock.now) == [("refused", "a100", 4)]


async def test_queued_requests_of_one_person_count_once_within_their_limit(state, inventory, clock):
    # As in the hub, a user's queued requests are reserved and count against their limit.
    catalog = limited_catalog(4)

    async def holdings_now(every_user):
        return state.reservations()

    async def queued(server):
        await Capacity(state, LOG).admit(
            catalog,
            select(catalog, "a100", 4),
            Requester("ann", (), server, pod=f"jupyterhub/jupyter-ann-{server}"),
            holdings=holdings_now,
            inventory=inventory,
            placement=NO_PLACEMENT,
            queue=QueueSettings(enabled=True, timeout=300),
            who=f"ann's server {server!r}",
        )

    first = asyncio.ensure_future(queued("one"))
    for _ in range(100):
        if len(state.wait_queue):
            break
        await asyncio.sleep(0)
    with pytest.raises(Refusal) as info:
        await queued("two")
    assert info.value.reason != "no-capacity"
    assert state.demand(clock.now) == [("queued", "a100", 4)]
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    assert state.demand(clock.now) == []
