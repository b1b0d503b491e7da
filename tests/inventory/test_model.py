"""Inventory arithmetic over Node and Pod objects recorded from the sandbox's API server.

``recorded-*.json`` come from the real API server (tests/fixtures/nodes/record.py);
``variants-*.json`` are hand-written changes of them (cordoned, NotReady, tainted,
MIG "single", time-sliced, AMD nodes; terminating, finished, init-container and
sidecar pods), each marked with the annotation gpuspawner.io/fixture-variant.
"""

from __future__ import annotations

import copy
import json
import random

import pytest

from gpuspawner.core.catalog import load_catalog_file
from gpuspawner.inventory.model import (
    Demand,
    Inventory,
    demand_for,
    inventory_from,
    node_record,
    parse_quantity,
    pod_record,
    pod_requests,
)

from ..conftest import FIXTURES

NODES = FIXTURES / "nodes"


def items(name: str) -> list[dict]:
    return json.loads((NODES / name).read_text())["items"]


def by_name(objs: list[dict]) -> dict[str, dict]:
    return {o["metadata"]["name"]: o for o in objs}


@pytest.fixture(scope="module")
def catalog():
    return load_catalog_file(NODES / "catalog.yaml")


@pytest.fixture(scope="module")
def nodes():
    return items("recorded-nodes.json") + items("variants-nodes.json")


@pytest.fixture(scope="module")
def pods():
    return items("recorded-pods.json") + items("variants-pods.json")


def figures(inventory: Inventory, catalog, key: str):
    return inventory.availability(demand_for(catalog.gpu_types[key]))


def own_requests(pod: dict) -> int:
    """What a pod's containers ask for, container by container (no scheduler rules)."""
    spec = pod["spec"]
    containers = spec["containers"] + spec.get("initContainers", [])
    return [
        parse_quantity(v)
        for c in containers
        for k, v in (c.get("resources", {}).get("requests") or {}).items()
        if k.startswith("nvidia.com/")
    ]


# -- records ---------------------------------------------------------------


def test_recorded_gpu_node_keeps_only_accelerators_and_is_usable(nodes):
    record = node_record(by_name(nodes)["gpu-a100-0"])
    raw = by_name(nodes)["gpu-a100-0"]
    assert record.allocatable == {
        "nvidia.com/gpu": int(raw["status"]["allocatable"]["nvidia.com/gpu"])
    }
    assert record.ready and not record.cordoned and record.usable
    assert ("nvidia.com/gpu", "present", "NoSchedule") in record.taints


def test_cpu_node_has_no_accelerators(nodes):
    assert node_record(by_name(nodes)["cpu-0"]).allocatable == {}


def test_cordoned_and_not_ready_nodes_are_not_usable(nodes):
    cordoned = node_record(by_name(nodes)["gpu-a100-cordoned"])
    not_ready = node_record(by_name(nodes)["gpu-a100-notready"])
    assert cordoned.cordoned and not cordoned.usable and cordoned.state == "cordoned"
    assert not not_ready.ready and not not_ready.usable and not_ready.state == "not ready"


def test_node_without_conditions_is_not_ready(nodes):
    node = copy.deepcopy(by_name(nodes)["gpu-a100-0"])
    node["status"]["conditions"] = []
    assert not node_record(node).usable


def test_mig_and_other_vendors_are_inventoried(nodes):
    mig = node_record(by_name(nodes)["gpu-h100-mig-0"]).allocatable
    assert set(mig) == {"nvidia.com/mig-1g.10gb", "nvidia.com/mig-3g.40gb"}
    assert node_record(by_name(nodes)["amd-mi300x-0"]).allocatable == {"amd.com/gpu": 8}
    assert node_record(by_name(nodes)["gpu-a100-shared"]).allocatable == {
        "nvidia.com/gpu.shared": 16
    }


@pytest.mark.parametrize(
    "text,expected",
    [("4", 4), (8, 8), ("1k", 1000), ("2500m", 2), ("junk", 0), (True, 0), ("-1", 0)],
)
def test_parse_quantity(text, expected):
    assert parse_quantity(text) == expected


def test_init_container_and_app_container_share_the_request(pods):
    # The GPU check init container asks for the same 2 GPUs as the notebook:
    # the scheduler counts them once, not twice.
    pod = by_name(pods)["bound-2xa100"]
    assert own_requests(pod) == [2, 2]
    assert pod_requests(pod) == {"nvidia.com/gpu": 2}


def test_larger_init_container_sets_the_request(pods):
    pod = by_name(pods)["init-larger-a100"]
    assert sorted(own_requests(pod)) == [1, 3]
    assert pod_requests(pod) == {"nvidia.com/gpu": 3}


def test_sidecar_runs_beside_later_init_containers_and_the_app(pods):
    # sidecar 1 + a later init container 2 = 3 at the peak; app 1 + sidecar 1 = 2.
    assert pod_requests(by_name(pods)["sidecar-h100"]) == {"nvidia.com/gpu": 3}


def test_limits_only_pod_counts_its_limits(pods):
    pod = copy.deepcopy(by_name(pods)["bound-2xa100"])
    for c in pod["spec"]["containers"] + pod["spec"]["initContainers"]:
        c["resources"].pop("requests", None)
    assert pod_requests(pod) == {"nvidia.com/gpu": 2}


def test_overhead_is_added(pods):
    pod = copy.deepcopy(by_name(pods)["bound-2xa100"])
    pod["spec"]["overhead"] = {"cpu": "250m", "nvidia.com/gpu": "1"}
    assert pod_requests(pod) == {"nvidia.com/gpu": 3}


def test_terminating_finished_and_cpu_pods_hold_nothing(pods):
    named = by_name(pods)
    assert pod_record(named["terminating-1xa100"]) is None
    assert pod_record(named["succeeded-4xa100"]) is None
    assert pod_record(named["cpu-only"]) is None
    assert pod_record(named["bound-2xa100"]).node == "gpu-a100-0"
    assert pod_record(named["pending-8xa100"]).node == ""


# -- figures per GPU type --------------------------------------------------


def test_a100_figures_count_usable_nodes_and_active_pods(catalog, nodes, pods):
    inventory = inventory_from(nodes, pods)
    a100 = figures(inventory, catalog, "a100")
    assert [n.node for n in a100.nodes] == ["gpu-a100-0", "gpu-a100-1"]
    assert sorted(n.node for n in a100.excluded) == ["gpu-a100-cordoned", "gpu-a100-notready"]
    # gpu-a100-0: the 2-GPU pod; gpu-a100-1: the 3-GPU init container pod (the
    # terminating and the finished pod there hold nothing).
    held = {n.node: n.requested for n in a100.nodes}
    assert held == {"gpu-a100-0": 2, "gpu-a100-1": 3}
    assert a100.allocatable == 8
    assert a100.free == 8 - 2 - 3
    assert a100.largest_free == 2
    assert a100.largest_node == 4
    assert a100.pending == 1  # the 8-GPU pod the scheduler could not place
    assert a100.fits_now(2) and not a100.fits_now(3)
    assert a100.fits_ever(4) and not a100.fits_ever(8)


def test_node_selector_separates_models_sharing_a_resource(catalog, nodes, pods):
    inventory = inventory_from(nodes, pods)
    h100 = figures(inventory, catalog, "h100")
    assert [n.node for n in h100.nodes] == ["gpu-h100-0"]
    assert h100.free == 8 - 3  # the sidecar pod
    # The MIG "single" node exposes nvidia.com/gpu too, but is not an A100 product.
    a100_nodes = {n.node for n in figures(inventory, catalog, "a100").nodes}
    assert "gpu-a100-mig-single" not in a100_nodes


def test_untolerated_taint_excludes_a_node_and_a_toleration_admits_it(catalog, nodes, pods):
    inventory = inventory_from(nodes, pods)
    a100 = catalog.gpu_types["a100"]
    assert "gpu-a100-tainted" not in {n.node for n in figures(inventory, catalog, "a100").nodes}
    tolerant = demand_for(
        a100, extra_tolerations=[{"key": "dedicated", "operator": "Equal", "value": "training"}]
    )
    assert "gpu-a100-tainted" in {n.node for n in inventory.availability(tolerant).nodes}


def test_node_affinity_with_no_matching_node(catalog, nodes, pods):
    t4 = figures(inventory_from(nodes, pods), catalog, "t4")
    assert t4.nodes == () and t4.free == 0 and not t4.fits_ever(1)


def test_mig_shared_and_amd_types(catalog, nodes, pods):
    inventory = inventory_from(nodes, pods)
    mig = figures(inventory, catalog, "mig-1g")
    assert (mig.allocatable, mig.free) == (2, 1)
    shared = figures(inventory, catalog, "shared")
    assert (shared.allocatable, shared.free) == (16, 13)
    amd = figures(inventory, catalog, "mi300x")
    assert (amd.allocatable, amd.free, [n.node for n in amd.nodes]) == (8, 8, ["amd-mi300x-0"])


def test_affinity_operators():
    node = {
        "metadata": {"name": "n", "labels": {"mem": "81920", "zone": "a"}},
        "spec": {},
        "status": {
            "allocatable": {"nvidia.com/gpu": "1"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
    inventory = inventory_from([node], [])

    def served(*exprs):
        demand = Demand(key="x", resource="nvidia.com/gpu", node_affinity=exprs)
        return bool(inventory.availability(demand).nodes)

    assert served({"key": "mem", "operator": "Gt", "values": ["40000"]})
    assert not served({"key": "mem", "operator": "Lt", "values": ["40000"]})
    assert served({"key": "zone", "operator": "NotIn", "values": ["b"]})
    assert not served({"key": "zone", "operator": "DoesNotExist"})
    assert served(
        {"key": "gone", "operator": "DoesNotExist"}, {"key": "zone", "operator": "Exists"}
    )
    assert not served({"key": "mem", "operator": "Gt", "values": ["lots"]})


# -- updates, event by event ----------------------------------------------


def test_events_in_any_order_give_the_same_figures_as_a_fresh_list(catalog, nodes, pods):
    rng = random.Random(6)
    inventory = Inventory()
    inventory.replace_nodes(nodes)
    live: dict[str, dict] = {}
    for _ in range(300):
        pod = copy.deepcopy(rng.choice(pods))
        meta = pod["metadata"]
        if rng.random() < 0.3 and live:
            key = rng.choice(sorted(live))
            namespace, name = key.split("/")
            inventory.remove_pod(namespace, name)
            del live[key]
            continue
        # Move pods between nodes and states, as binding and deletion do.
        meta["name"] = f"{meta['name']}-{rng.randrange(5)}"
        pod["spec"]["nodeName"] = rng.choice(["gpu-a100-0", "gpu-a100-1", "gpu-h100-0", None])
        if pod["spec"]["nodeName"] is None:
            del pod["spec"]["nodeName"]
        inventory.set_pod(pod)
        live[f"{meta['namespace']}/{meta['name']}"] = pod
    fresh = inventory_from(nodes, list(live.values()))
    for key in catalog.gpu_types:
        assert figures(inventory, catalog, key) == figures(fresh, catalog, key), key


def test_generation_changes_only_with_the_figures(nodes, pods):
    inventory = inventory_from(nodes, pods)
    before = inventory.generation
    inventory.set_pod(by_name(pods)["bound-2xa100"])  # same object again
    inventory.set_node(by_name(nodes)["gpu-a100-0"])
    inventory.set_pod(by_name(pods)["cpu-only"])  # holds no GPU
    assert inventory.generation == before
    inventory.remove_pod("default", "bound-2xa100")
    assert inventory.generation == before + 1


def test_node_losing_its_gpus_and_deleted_node_leave_the_figures(catalog, nodes, pods):
    inventory = inventory_from(nodes, pods)
    node = copy.deepcopy(by_name(nodes)["gpu-a100-0"])
    node["status"]["allocatable"].pop("nvidia.com/gpu")
    inventory.set_node(node)
    assert [n.node for n in figures(inventory, catalog, "a100").nodes] == ["gpu-a100-1"]
    inventory.remove_node("gpu-a100-1")
    assert figures(inventory, catalog, "a100").nodes == ()


def test_cordoning_a_node_by_event_moves_it_to_excluded(catalog, nodes, pods):
    inventory = inventory_from(nodes, pods)
    node = copy.deepcopy(by_name(nodes)["gpu-a100-0"])
    node["spec"]["unschedulable"] = True
    inventory.set_node(node)
    a100 = figures(inventory, catalog, "a100")
    assert "gpu-a100-0" in {n.node for n in a100.excluded}
    assert a100.allocatable == 4


def test_queue_place_counts_earlier_pending_pods(pods):
    inventory = inventory_from([], pods)
    pending = by_name(pods)["pending-8xa100"]
    created = pending["metadata"]["creationTimestamp"]
    assert inventory.pending_before("nvidia.com/gpu", created, "default/pending-8xa100") == 0
    assert inventory.pending_before("nvidia.com/gpu", "9999-01-01T00:00:00Z") == 1
    assert inventory.pending_before("nvidia.com/mig-1g.10gb", "9999-01-01T00:00:00Z") == 0
