"""The one reader of GPUSpawner's pods, over recorded-shape pods (tests/fixtures/*-pods)."""

from __future__ import annotations

import copy
import json

import pytest

from gpuspawner.core import podspec
from gpuspawner.core.admission import explain_unschedulable
from gpuspawner.core.serverpod import (
    ServerPod,
    is_gpu_resource,
    is_managed,
    pod_is_active,
    selector,
    server_pods,
    unschedulable_message,
)

from ..conftest import FIXTURES


def items(path):
    return json.loads((FIXTURES / path).read_text())["items"]


def by_name(path):
    return {p["metadata"]["name"]: p for p in items(path)}


GPU_PODS = by_name("gpu-pods/podlist.json")
CULLER_PODS = by_name("culler-pods/podlist.json")


def test_a_gpu_server():
    pod = ServerPod.from_pod(GPU_PODS["jupyter-heidi-slice"])
    assert (pod.name, pod.namespace, pod.user, pod.server) == (
        "jupyter-heidi-slice",
        "jupyterhub",
        "heidi",
        "slice",
    )
    assert (pod.profile, pod.gpu_type, pod.gpus) == ("pytorch", "mig", 2)
    assert pod.weight == pytest.approx(0.142857)
    assert pod.pool_groups == ("students",)
    assert pod.gpu_resource == "nvidia.com/mig-1g.10gb"
    assert pod.key == ("heidi", "slice") and pod.has_gpus and pod.active


def test_a_cpu_server_holds_no_gpus():
    pod = ServerPod.from_pod(GPU_PODS["jupyter-grace"])
    assert (pod.gpu_type, pod.gpus, pod.has_gpus) == (None, 0, False)
    assert pod.weight is None and pod.pool_groups == ()
    assert pod.gpu_resource == "nvidia.com/gpu"  # the default: the pod names none


def test_active_pending_and_terminated():
    failed = ServerPod.from_pod(GPU_PODS["jupyter-frank"])
    assert failed.terminated and not failed.active and not failed.pending
    starting = ServerPod.from_pod(GPU_PODS["jupyter-carol-exp1"])
    assert starting.active and starting.pending and starting.bound  # placed, still starting
    waiting = ServerPod.from_pod(CULLER_PODS["jupyter-wait1"])
    assert waiting.pending and not waiting.bound and waiting.node == ""
    running = ServerPod.from_pod(GPU_PODS["jupyter-carol"])
    assert running.active and running.bound and not running.pending
    deleting = copy.deepcopy(GPU_PODS["jupyter-carol"])
    deleting["metadata"]["deletionTimestamp"] = "2026-11-30T10:00:00Z"
    gone = ServerPod.from_pod(deleting)
    assert gone.deleting and gone.terminated
    assert not pod_is_active(deleting) and pod_is_active(GPU_PODS["jupyter-carol"])


@pytest.mark.parametrize("count", ["x", "-1", "1.5", "", None])
def test_an_unreadable_count_holds_nothing(count):
    pod = copy.deepcopy(GPU_PODS["jupyter-ivan"])
    if count is None:
        del pod["metadata"]["labels"]["gpuspawner.io/gpus"]
    else:
        pod["metadata"]["labels"]["gpuspawner.io/gpus"] = count
    read = ServerPod.from_pod(pod)
    assert (read.gpu_type, read.gpus) == (None, 0)


def test_a_bad_weight_is_not_recorded():
    pod = copy.deepcopy(GPU_PODS["jupyter-ivan"])
    pod["metadata"]["annotations"]["gpuspawner.io/gpu-weight"] = "heavy"
    assert ServerPod.from_pod(pod).weight is None


def test_a_pod_without_kubespawners_annotations_has_no_user():
    pod = ServerPod.from_pod({"metadata": {"name": "stray", "labels": {}}})
    assert pod.user == "" and pod.server == "" and pod.gpu_type is None


def test_waiting_for_its_own_gpu_resource_only():
    waiting = {name: ServerPod.from_pod(p).waiting_for_gpus for name, p in CULLER_PODS.items()}
    assert waiting["jupyter-wait1"] and waiting["jupyter-wait4"]  # a100; a MIG slice
    assert not waiting["jupyter-wait3"]  # unschedulable for CPU
    assert not waiting["jupyter-starting"] and not waiting["jupyter-run"]


def test_unschedulable_message_only_for_pending_unscheduled_pods():
    message = unschedulable_message(CULLER_PODS["jupyter-wait1"])
    assert message and "Insufficient nvidia.com/gpu" in message
    assert unschedulable_message(CULLER_PODS["jupyter-starting"]) is None  # scheduled
    assert unschedulable_message(CULLER_PODS["jupyter-run"]) is None
    assert unschedulable_message(None) is None
    bound = by_name("nodes/recorded-pods.json")["bound-2xa100"]
    assert unschedulable_message(bound) is None


def test_selector_and_managed():
    assert selector() == "gpuspawner.io/managed=true"
    assert selector("carol") == "gpuspawner.io/managed=true,hub.jupyter.org/username=carol"
    assert all(is_managed(p) for p in GPU_PODS.values())
    assert not is_managed({"metadata": {"labels": {"app": "jupyterhub"}}})
    assert [p.name for p in server_pods(list(GPU_PODS.values())[:2])] == [
        "jupyter-carol",
        "jupyter-carol-exp1",
    ]


def test_resource_names():
    assert is_gpu_resource("nvidia.com/gpu")
    assert is_gpu_resource("nvidia.com/gpu.shared")
    assert is_gpu_resource("nvidia.com/mig-2g.20gb")
    assert is_gpu_resource("amd.com/gpu")
    assert is_gpu_resource("gpu.intel.com/i915")
    assert not is_gpu_resource("cpu")
    assert not is_gpu_resource("nvidia.com/hostdev")  # a network device, not a GPU
    assert not is_gpu_resource("example.com/fpga")
    assert is_gpu_resource("example.com/fpga", extra={"example.com/fpga"})


def test_one_rule_for_the_pod_spec_and_the_schedulers_reasons():
    """The spawner's NVIDIA_VISIBLE_DEVICES guard and the scheduler's words agree on what a GPU is."""
    for resource in ("amd.com/gpu", "gpu.intel.com/i915", "nvidia.com/mig-1g.10gb"):
        assert podspec.requests_gpu({"limits": {resource: "1"}}, set())
        said = explain_unschedulable(f"0/2 nodes are available: 2 Insufficient {resource}.")
        assert said.insufficient_gpus, resource
    assert not podspec.requests_gpu({"limits": {"nvidia.com/hostdev": "1"}}, set())
    said = explain_unschedulable("0/2 nodes are available: 2 Insufficient nvidia.com/hostdev.")
    assert not said.insufficient_gpus


def _annotated(**annotations):
    pod = copy.deepcopy(GPU_PODS["jupyter-heidi-slice"])
    pod["metadata"]["annotations"].update(annotations)
    return pod


def test_the_stop_reason_and_cull_warning_annotations():
    from gpuspawner.core import labels, stopreasons

    plain = ServerPod.from_pod(GPU_PODS["jupyter-heidi-slice"])
    assert plain.stop_notice is None and plain.cull_warning is None
    pod = ServerPod.from_pod(
        _annotated(
            **{
                labels.ANNOTATION_STOP_REASON: json.dumps(
                    {"reason": "gpu-idle", "at": 1e9, "seconds": 60}
                ),
                labels.ANNOTATION_CULL_WARNING: json.dumps({"reason": "idle", "cull_after": 2e9}),
            }
        )
    )
    assert pod.stop_notice == stopreasons.StopNotice("gpu-idle", 1e9, seconds=60)
    assert pod.cull_warning == stopreasons.CullWarning("idle", 2e9)


@pytest.mark.parametrize("junk", ["{", "null", '{"reason": "idle"}', '"idle"', ""])
def test_an_unreadable_stop_annotation_is_no_notice(junk):
    from gpuspawner.core import labels

    pod = ServerPod.from_pod(
        _annotated(**{labels.ANNOTATION_STOP_REASON: junk, labels.ANNOTATION_CULL_WARNING: junk})
    )
    assert pod.stop_notice is None and pod.cull_warning is None
    assert pod.gpus == 2  # the rest of the pod still reads
