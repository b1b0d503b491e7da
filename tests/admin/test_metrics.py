"""gpuspawner.hub.metrics: bounded reasons, GPUs by type and group, the scrape-time collector."""

from __future__ import annotations

import copy
import json
import time
from types import SimpleNamespace

from prometheus_client import REGISTRY, generate_latest

from gpuspawner.core.serverpod import ServerPod
from gpuspawner.hub import metrics

from ..conftest import FIXTURES

CULLER_PODS = json.loads((FIXTURES / "culler-pods" / "podlist.json").read_text())["items"]


def pod(name):
    return copy.deepcopy(next(p for p in CULLER_PODS if p["metadata"]["name"] == name))


def failed_check(exit_code, reason="Error"):
    p = pod("jupyter-starting")
    p["status"]["initContainerStatuses"] = [
        {
            "name": "gpu-check",
            "state": {"terminated": {"exitCode": exit_code, "reason": reason}},
        }
    ]
    return p


def sample(name, **labels):
    return REGISTRY.get_sample_value(name, labels)


def test_check_failure_reasons_are_bounded():
    assert metrics.check_failure_reason(failed_check(5)) == "gpu-count"
    assert metrics.check_failure_reason(failed_check(6)) == "driver-too-old"
    assert metrics.check_failure_reason(failed_check(7)) == "gpu-unhealthy"
    assert metrics.check_failure_reason(failed_check(127)) == "check-not-startable"
    assert metrics.check_failure_reason(failed_check(128, "StartError")) == "check-not-startable"
    assert metrics.check_failure_reason(failed_check(42)) == "other"
    assert metrics.check_failure_reason(pod("jupyter-run")) == "other"


def test_counting_refusals_and_failures():
    before = sample("gpuspawner_spawn_refusals_total", reason="limit") or 0
    metrics.count_refusal("limit")
    assert sample("gpuspawner_spawn_refusals_total", reason="limit") == before + 1
    # an unknown reason never becomes a new label value
    other = sample("gpuspawner_spawn_refusals_total", reason="other") or 0
    metrics.count_refusal("made-up-by-someone")
    assert sample("gpuspawner_spawn_refusals_total", reason="other") == other + 1
    assert sample("gpuspawner_spawn_refusals_total", reason="made-up-by-someone") is None

    failures = sample("gpuspawner_validation_failures_total", reason="driver-too-old")
    metrics.count_validation_failure(failed_check(6))
    assert sample("gpuspawner_validation_failures_total", reason="driver-too-old") == failures + 1

    metrics.observe_spawn_duration("a100", 12.5)
    assert sample("gpuspawner_gpu_spawn_duration_seconds_count", gpu_type="a100") >= 1


def test_gpus_by_group_counts_bound_pods_as_allocated():
    servers = [
        (["ml", "students"], pod("jupyter-run")),  # bound, 2 x a100
        (["students"], pod("jupyter-wait1")),  # not bound, 1 x a100
        ([], pod("jupyter-starting")),  # bound, in no group
        (["ml"], pod("jupyter-cpu")),  # no GPUs
        (["ml"], pod("jupyter-gone")),  # being deleted: holds nothing
    ]
    requested, allocated = metrics.gpus_by_group(servers)
    assert requested == {("a100", "ml"): 2, ("a100", "students"): 3, ("a100", ""): 1}
    assert allocated == {("a100", "ml"): 2, ("a100", "students"): 2, ("a100", ""): 1}


class FakeSpawner:
    """What the collector reads of a GPUSpawner (weakly referenced, like the real one)."""

    def __init__(self, **attributes):
        self.__dict__.update(attributes)


class FakeReflector:
    def __init__(self, pods):
        self.pods = {f"{p['metadata']['namespace']}/{p['metadata']['name']}": p for p in pods}


def test_collector_reads_tracked_spawners_never_users():
    reflector = FakeReflector([pod("jupyter-run"), pod("jupyter-wait1")])
    spawners = [
        FakeSpawner(
            pod_reflector=reflector,
            namespace="jupyterhub",
            pod_name=name,
            user=SimpleNamespace(name=user, groups=[SimpleNamespace(name="collector-group")]),
            gpu_catalog_configured=False,
        )
        for name, user in (("jupyter-run", "run"), ("jupyter-wait1", "wait1"))
    ]
    for s in spawners:
        metrics.track(s)
    text = generate_latest(REGISTRY).decode()
    assert sample("gpuspawner_gpus_requested", gpu_type="a100", group="collector-group") == 3
    assert sample("gpuspawner_gpus_allocated", gpu_type="a100", group="collector-group") == 2
    assert 'user="' not in text and "wait1" not in text
    del spawners, s  # the weak set forgets them
    import gc

    gc.collect()
    assert sample("gpuspawner_gpus_requested", gpu_type="a100", group="collector-group") is None


def test_collector_publishes_demand_by_type_and_count_never_by_user():
    from gpuspawner.hub import state as hubstate
    from gpuspawner.inventory.model import Availability, NodeFigures

    state = hubstate.reset()
    try:
        state.record_refusal("dora", "train", "h100", 4, until=time.monotonic() + 60)
        state.record_refusal("dora", "train", "h100", 4, until=time.monotonic() + 60)
        state.record_refusal("eve", "", "h100", 4, until=time.monotonic() + 60)
        state.record_refusal("old", "", "h100", 2, until=time.monotonic() - 1)  # expired
        state.wait_queue.join("a100", object(), 2, owner=("fay", ""))
        nodes = (
            NodeFigures("gpu-a100-0", allocatable=4, requested=3),
            NodeFigures("gpu-a100-1", allocatable=4, requested=4),
        )
        figures = {"a100": Availability("a100", "nvidia.com/gpu", "NVIDIA A100", nodes)}
        waiting = pod("jupyter-wait1")
        spawner = FakeSpawner(
            pod_reflector=FakeReflector([waiting]),
            namespace="jupyterhub",
            pod_name="jupyter-wait1",
            user=SimpleNamespace(name="wait1", groups=[]),
            gpu_catalog_configured=True,
            gpu_inventory=lambda: object(),
            load_catalog=lambda: None,
            gpu_availability=lambda catalog: figures,
        )
        metrics.track(spawner)
        text = generate_latest(REGISTRY).decode()
        demand = "gpuspawner_gpu_demand"
        assert sample(demand, gpu_type="h100", gpus="4", source="refused") == 2  # dora once
        assert sample(demand, gpu_type="h100", gpus="2", source="refused") is None
        assert sample(demand, gpu_type="a100", gpus="2", source="queued") == 1
        wait1 = ServerPod.from_pod(waiting)
        assert wait1.waiting_for_gpus
        assert sample(demand, gpu_type=wait1.gpu_type, gpus=str(wait1.gpus), source="pending") == 1
        assert (
            sample("gpuspawner_node_gpus", gpu_type="a100", node="gpu-a100-0", figure="free") == 1
        )
        assert (
            sample("gpuspawner_node_gpus", gpu_type="a100", node="gpu-a100-1", figure="allocatable")
            == 4
        )
        samples = [line for line in text.splitlines() if line.startswith(demand)]
        assert len(samples) == 3
        for name in ("dora", "eve", "fay", "wait1", "train"):
            assert not any(name in line for line in samples)
    finally:
        hubstate.reset()
