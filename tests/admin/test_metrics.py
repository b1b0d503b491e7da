"""gpuspawner.metrics: bounded reasons, GPUs by type and group, the scrape-time collector."""

from __future__ import annotations

import copy
import json
from types import SimpleNamespace

from prometheus_client import REGISTRY, generate_latest

from gpuspawner import metrics

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
