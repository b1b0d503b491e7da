"""Admission against the inventory: never schedulable, not now, queueing, and the scheduler's reasons."""

from __future__ import annotations

import json

import pytest

from gpuspawner.core import admission
from gpuspawner.core.catalog import load_catalog_file
from gpuspawner.core.refusals import Refusal
from gpuspawner.inventory.model import Availability, NodeFigures, demand_for, inventory_from

from ..conftest import FIXTURES

NODES = FIXTURES / "nodes"


def items(name):
    return json.loads((NODES / name).read_text())["items"]


@pytest.fixture(scope="module")
def figures():
    catalog = load_catalog_file(NODES / "catalog.yaml")
    inventory = inventory_from(
        items("recorded-nodes.json") + items("variants-nodes.json"),
        items("recorded-pods.json") + items("variants-pods.json"),
    )
    return {k: inventory.availability(demand_for(t)) for k, t in catalog.gpu_types.items()}


def test_request_larger_than_any_node_is_never_schedulable(figures):
    with pytest.raises(Refusal) as refused:
        admission.check_capacity(
            "NVIDIA A100", 8, figures["a100"], {"NVIDIA H100": figures["h100"]}
        )
    assert refused.value.reason == admission.REASON_NEVER
    assert refused.value.status == 400
    largest = figures["a100"].largest_node
    assert refused.value.message == (
        f"No node has 8 NVIDIA A100 GPUs; the largest has {largest}. "
        f"Ask for {largest} or fewer, or choose NVIDIA H100."
    )


def test_never_schedulable_without_alternative(figures):
    with pytest.raises(Refusal) as refused:
        admission.check_capacity(
            "NVIDIA H100", 16, figures["h100"], {"NVIDIA A100": figures["a100"]}
        )
    assert "choose" not in refused.value.message
    assert refused.value.message.endswith("Ask for 8 or fewer.")


def test_type_without_any_usable_node(figures):
    with pytest.raises(Refusal) as refused:
        admission.check_capacity("NVIDIA T4", 1, figures["t4"], {"NVIDIA A100": figures["a100"]})
    assert refused.value.reason == admission.REASON_NEVER
    assert refused.value.message == (
        "No node that can run servers has NVIDIA T4 GPUs. Choose NVIDIA A100, or ask an admin."
    )


def test_request_that_fits_later_is_refused_with_current_figures(figures):
    a100 = figures["a100"]
    assert a100.largest_free < 4 <= a100.largest_node
    with pytest.raises(Refusal) as refused:
        admission.check_capacity("NVIDIA A100", 4, a100, {"NVIDIA H100": figures["h100"]})
    assert refused.value.reason == admission.REASON_NO_CAPACITY
    assert refused.value.status == 503
    assert refused.value.message == (
        f"No node has 4 NVIDIA A100 GPUs free right now: {a100.free} of {a100.allocatable} are "
        f"free, at most {a100.largest_free} on one node. Ask for {a100.largest_free} or fewer, "
        f"choose NVIDIA H100 ({figures['h100'].free} free), or try again later."
    )


def test_request_that_fits_later_waits_when_queueing(figures):
    verdict = admission.check_capacity("NVIDIA A100", 4, figures["a100"], queueing=True)
    assert verdict.wait
    assert verdict.message.startswith("1st in line for 4 × NVIDIA A100 (1 waiting): ")
    assert verdict.message.endswith("It starts as soon as one node has 4 free.")


@pytest.mark.parametrize(
    "n, text",
    [
        (1, "1st"),
        (2, "2nd"),
        (3, "3rd"),
        (4, "4th"),
        (11, "11th"),
        (12, "12th"),
        (13, "13th"),
        (21, "21st"),
        (22, "22nd"),
        (101, "101st"),
        (111, "111th"),
    ],
)
def test_places_in_line_read_as_ordinals(n, text):
    assert admission.ordinal(n) == text


def a100_nodes(*free_of_four):
    nodes = tuple(
        NodeFigures(f"gpu-a100-{i}", allocatable=4, requested=4 - free)
        for i, free in enumerate(free_of_four)
    )
    return Availability("a100", "nvidia.com/gpu", "NVIDIA A100", nodes)


def test_promised_gpus_take_the_best_fitting_node():
    # 3 free on node 0, 4 free on node 1: a promised 3 takes node 0, so a 4 still fits.
    after = admission.after_claims(a100_nodes(3, 4), [3])
    assert [n.free for n in after.nodes] == [0, 4]
    assert after.fits_now(4)
    # A promised 4 can only go to node 1: a second 4 no longer fits anywhere.
    after = admission.after_claims(a100_nodes(3, 4), [4])
    assert [n.free for n in after.nodes] == [3, 0]
    assert not after.fits_now(4)


def test_larger_promises_are_placed_first_and_unplaceable_ones_take_nothing():
    after = admission.after_claims(a100_nodes(2, 4), [2, 4])
    assert [n.free for n in after.nodes] == [0, 0]
    after = admission.after_claims(a100_nodes(1, 1), [4, 0, -1])
    assert [n.free for n in after.nodes] == [1, 1]
    assert admission.after_claims(a100_nodes(2, 4), []) == a100_nodes(2, 4)


def test_request_that_fits_now_and_cpu_only_pass(figures):
    assert not admission.check_capacity(
        "NVIDIA A100", figures["a100"].largest_free, figures["a100"]
    ).wait
    assert not admission.check_capacity("NVIDIA T4", 0, figures["t4"]).wait


def test_figures_label(figures):
    a100 = figures["a100"]
    assert admission.figures_label(a100) == (
        f"{a100.free} free of {a100.allocatable} (at most {a100.largest_free} on one node)"
    )
    assert admission.figures_label(figures["h100"]) == f"{figures['h100'].free} free of 8"
    assert admission.figures_label(figures["t4"]) == "no node available"
    assert admission.figures_label(None) == ""


def test_wait_queue_is_first_come_first_served_but_not_blocked_by_a_large_request(figures):
    a100 = figures["a100"]  # at most 2 free on one node
    queue = admission.WaitQueue()
    big, small, later = object(), object(), object()
    queue.join("a100", big, 4)
    queue.join("a100", small, 1)
    queue.join("a100", later, 1)
    assert queue.place("a100", small) == (2, 3)
    assert not queue.may_start("a100", big, a100)
    assert queue.may_start("a100", small, a100)
    assert not queue.may_start("a100", later, a100)  # small goes first
    queue.leave("a100", small)
    assert queue.may_start("a100", later, a100)
    assert queue.place("a100", later) == (2, 2)
    queue.leave("a100", big)
    queue.leave("a100", later)
    assert len(queue) == 0


def test_wait_queue_lets_the_head_go_when_it_fits():
    from gpuspawner.inventory.model import Availability

    freed = Availability("a100", "nvidia.com/gpu", "A100", (NodeFigures("n", 4, 0),))
    queue = admission.WaitQueue()
    first, second = object(), object()
    queue.join("a100", first, 4)
    queue.join("a100", second, 1)
    assert queue.may_start("a100", first, freed)
    assert not queue.may_start("a100", second, freed)


def test_scheduler_message_recorded_from_the_sandbox():
    pending = next(
        p for p in items("recorded-pods.json") if p["metadata"]["name"] == "pending-8xa100"
    )
    raw = admission.unschedulable_message(pending)
    assert raw.startswith("0/5 nodes are available")
    explained = admission.explain_unschedulable(raw, ["nvidia.com/gpu"], "NVIDIA A100 GPUs")
    assert explained.insufficient_gpus
    assert explained.message == (
        "No node can take this server yet: 2 nodes have too few free NVIDIA A100 GPUs, "
        "3 nodes are not of this GPU type."
    )


@pytest.mark.parametrize(
    "raw,plain,gpus_short",
    [
        (
            "0/4 nodes are available: 1 node(s) were unschedulable, 3 Insufficient cpu. "
            "preemption: 0/4 nodes are available: 4 No preemption victims found.",
            "No node can take this server yet: 1 node is cordoned, 3 nodes have too little free CPU.",
            False,
        ),
        (
            "0/3 nodes are available: 1 node(s) had untolerated taint {node.kubernetes.io/unreachable: }, "
            "2 Insufficient nvidia.com/mig-1g.10gb.",
            "No node can take this server yet: 1 node is not ready, "
            "2 nodes have too few free nvidia.com/mig-1g.10gb.",
            True,
        ),
        (
            "0/2 nodes are available: 2 node(s) had untolerated taint {dedicated: training}.",
            "No node can take this server yet: 2 nodes are reserved for other work "
            "(a taint this server does not tolerate).",
            False,
        ),
        (
            "no nodes available to schedule pods",
            "The cluster has no node that can run servers yet.",
            False,
        ),
    ],
)
def test_scheduler_reasons_in_plain_words(raw, plain, gpus_short):
    explained = admission.explain_unschedulable(raw, ["nvidia.com/gpu"])
    assert (explained.message, explained.insufficient_gpus) == (plain, gpus_short)
