"""The hub's published GPU demand, as the culler reads it back (the real collector's text)."""

from __future__ import annotations

import time

from prometheus_client import REGISTRY, generate_latest

from gpuspawner.culler.demand import parse_hub_metrics, total_by_type
from gpuspawner.culler.policy import Request
from gpuspawner.hub import metrics
from gpuspawner.hub import state as hubstate
from gpuspawner.inventory.model import Availability, NodeFigures

from ..admin.test_metrics import FakeSpawner


def published(state: hubstate.HubState, figures: dict) -> str:
    """The hub's /hub/metrics text with this state and these figures, from the real collector."""
    spawner = FakeSpawner(
        pod_reflector=None,
        gpu_catalog_configured=True,
        gpu_inventory=lambda: object(),
        load_catalog=lambda: None,
        gpu_availability=lambda catalog: figures,
    )
    metrics.track(spawner)
    text = generate_latest(REGISTRY).decode()
    del spawner
    return text


def test_the_culler_reads_back_what_the_hub_publishes():
    state = hubstate.reset()
    try:
        soon = time.monotonic() + 60
        state.record_refusal("dora", "", "a100", 4, until=soon)
        state.record_refusal("eve", "", "a100", 4, until=soon)
        state.record_refusal("fay", "", "h100", 8, until=soon)
        state.wait_queue.join("a100", object(), 2, owner=("gus", ""))
        nodes = (
            NodeFigures("gpu-a100-0", allocatable=4, requested=3),
            NodeFigures("gpu-a100-1", allocatable=4, requested=0),
        )
        text = published(
            state, {"a100": Availability("a100", "nvidia.com/gpu", "NVIDIA A100", nodes)}
        )
    finally:
        hubstate.reset()
    demand = parse_hub_metrics(text)
    assert sorted(demand.requests, key=lambda r: (r.gpu_type, r.source)) == [
        Request("a100", 2, "queued"),
        Request("a100", 4, "refused"),
        Request("a100", 4, "refused"),
        Request("h100", 8, "refused"),
    ]
    assert demand.free == {"a100": {"gpu-a100-0": 1, "gpu-a100-1": 4}}
    assert total_by_type(demand.requests) == {
        ("a100", "queued"): 2,
        ("a100", "refused"): 8,
        ("h100", "refused"): 8,
    }


def test_pending_pods_and_malformed_samples_are_not_taken_from_the_hub():
    text = "\n".join(
        [
            "# TYPE gpuspawner_gpu_demand gauge",
            'gpuspawner_gpu_demand{gpu_type="a100",gpus="1",source="pending"} 3.0',
            'gpuspawner_gpu_demand{gpu_type="a100",gpus="x",source="queued"} 1.0',
            'gpuspawner_gpu_demand{gpu_type="a100",gpus="-2",source="queued"} 1.0',
            'gpuspawner_gpu_demand{gpu_type="a100",gpus="2",source="queued"} 0.0',
            'gpuspawner_gpu_demand{gpu_type="",gpus="2",source="queued"} 1.0',
            'gpuspawner_gpu_demand{gpu_type="a100",gpus="2",source="refused"} 1.0',
            "# TYPE gpuspawner_node_gpus gauge",
            'gpuspawner_node_gpus{gpu_type="a100",node="n0",figure="allocatable"} 4.0',
            'gpuspawner_node_gpus{gpu_type="a100",node="n0",figure="free"} -1.0',
            'gpuspawner_node_gpus{gpu_type="a100",node="n1",figure="free"} 2.0',
            "",
        ]
    )
    demand = parse_hub_metrics(text)
    # pending pods come from the culler's own pod list (other replicas' pods too)
    assert demand.requests == (Request("a100", 2, "refused"),)
    assert demand.free == {"a100": {"n1": 2}}


def test_a_hub_without_gpuspawner_publishes_no_demand():
    text = '# TYPE jupyterhub_active_users gauge\njupyterhub_active_users{period="24h"} 3.0\n'
    assert parse_hub_metrics(text) == parse_hub_metrics("")
    assert parse_hub_metrics(text).requests == ()
