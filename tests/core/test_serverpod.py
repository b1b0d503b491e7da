"""The one reader of GPUSpawner's pods, over recorded-shape pods (tests/fixtures/*-pods)."""

from __future__ import annotations

import copy
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuspawner.core import podspec
from gpuspawner.core.admission import explain_unschedulable
from gpuspawner.core.serverpod import (
    ServerPod,
    is_gpu_resource,
    is_managed,
    parse_timestamp,
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


#: Kueue's own words when it preempts a notebook's workload (pkg/scheduler/preemption)
PREEMPTED = (
    "Preempted to accommodate a workload (UID: 5c0e, JobUID: 9f1a) due to prioritization in "
    "the ClusterQueue; preemptor path: /gpus/notebooks; preemptee path: /gpus/notebooks"
)


def _stopped_by_kueue(message=PREEMPTED, reason="WorkloadEvicted", when="2026-12-01T14:02:00Z"):
    """A notebook's pod as Kueue leaves it when it evicts the pod's workload: the
    TerminationTarget condition patched on, then deleted (pod_controller.go)."""
    pod = copy.deepcopy(GPU_PODS["jupyter-heidi-slice"])
    condition = {
        "type": "TerminationTarget",
        "status": "True",
        "reason": reason,
        "message": message,
    }
    if when:
        condition["lastTransitionTime"] = when
    pod["status"].setdefault("conditions", []).append(condition)
    pod["metadata"]["deletionTimestamp"] = "2026-12-01T14:02:30Z"
    pod["metadata"]["deletionGracePeriodSeconds"] = 30
    return pod


def test_a_pod_kueue_preempted_says_so_at_the_time_kueue_marked_it():
    from gpuspawner.core import stopreasons

    notice = ServerPod.from_pod(_stopped_by_kueue()).stop_notice
    assert notice == stopreasons.StopNotice(
        stopreasons.REASON_PREEMPTED,
        parse_timestamp("2026-12-01T14:02:00Z"),
        detail=stopreasons.PREEMPTED_FOR_PRIORITY,  # Kueue's words: "due to prioritization"
    )
    # without the condition's time: when its deletion was asked for
    notice = ServerPod.from_pod(_stopped_by_kueue(when="")).stop_notice
    assert notice.at == parse_timestamp("2026-12-01T14:02:00Z")


def test_a_stop_annotation_wins_over_kueues_condition():
    from gpuspawner.core import labels, stopreasons

    pod = _stopped_by_kueue()
    pod["metadata"]["annotations"][labels.ANNOTATION_STOP_REASON] = json.dumps(
        {"reason": "pressure", "at": 1e9, "seconds": 3600}
    )
    assert ServerPod.from_pod(pod).stop_notice == stopreasons.StopNotice(
        "pressure", 1e9, seconds=3600
    )


@pytest.mark.parametrize(
    ("reason", "message"),
    [
        # evicted, but not for other work: Kueue's PodsReady timeout, a deactivated workload
        ("WorkloadEvicted", "Exceeded the PodsReady timeout default/pod-x"),
        ("WorkloadEvicted", "The workload is deactivated"),
        # stopped because its workload went away, not preempted
        ("WorkloadDeleted", PREEMPTED),
    ],
)
def test_other_kueue_stops_are_not_called_preemption(reason, message):
    assert ServerPod.from_pod(_stopped_by_kueue(message, reason)).stop_notice is None


# ---------------------------------------------------------------------------
# issue 32: usage times, charge group, idle timeout and keep (hand-written pods in the API's
# shape, tests/fixtures/pods)
# ---------------------------------------------------------------------------

POD_FILES = FIXTURES / "pods"


def pod_file(name):
    return json.loads((POD_FILES / f"{name}.json").read_text())


def at(text):
    return parse_timestamp(text)


def test_rfc3339_times_as_the_api_writes_them():
    assert parse_timestamp("1970-01-01T00:00:00Z") == 0
    assert parse_timestamp("2026-11-29T22:41:07Z") == 1795992067
    assert parse_timestamp("2026-11-29T23:41:07+01:00") == 1795992067
    assert parse_timestamp("2026-11-29T22:41:07.250000Z") == 1795992067.25
    assert parse_timestamp("2026-11-29T22:41:07") == 1795992067  # no offset: UTC, never local


@pytest.mark.parametrize(
    "junk", [None, "", "Z", "yesterday", "2026-13-01T00:00:00Z", 1795992067, ["x"], {"a": 1}]
)
def test_a_time_that_is_not_one_reads_as_none(junk):
    assert parse_timestamp(junk) is None


def test_a_running_server_was_scheduled_and_has_not_ended():
    pod = ServerPod.from_pod(pod_file("gpu-check-succeeded"))
    assert pod.uid == "3f6c2b1e-9a4d-4c8e-b7f1-2d5e8a9c0b14"
    assert pod.scheduled_at == at("2026-11-29T22:41:07Z")
    # the GPU check (an init container) terminated, the notebook runs: not ended
    assert pod.ended_at is None and pod.deleted_at is None


def test_a_pod_whose_gpu_check_failed_ended_when_the_check_did():
    pod = ServerPod.from_pod(pod_file("gpu-check-terminated-message"))
    assert pod.phase == "Failed"
    assert pod.ended_at == at("2026-11-29T22:41:12Z")


def test_a_pod_not_yet_scheduled_has_no_start():
    pod = copy.deepcopy(pod_file("gpu-check-succeeded"))
    pod["status"] = {
        "phase": "Pending",
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "lastTransitionTime": "2026-11-29T22:41:07Z",
            }
        ],
    }
    assert ServerPod.from_pod(pod).scheduled_at is None


def stopped(pod, finished="2026-11-29T23:00:05Z", phase="Running"):
    """The pod with its notebook terminated at ``finished``."""
    pod = copy.deepcopy(pod)
    pod["status"]["phase"] = phase
    pod["status"]["containerStatuses"][0]["state"] = {
        "terminated": {
            "exitCode": 0,
            "reason": "Completed",
            "startedAt": "2026-11-29T22:41:13Z",
            "finishedAt": finished,
        }
    }
    return pod


def deleting(pod, when="2026-11-29T23:00:30Z", grace=30):
    pod = copy.deepcopy(pod)
    pod["metadata"]["deletionTimestamp"] = when
    pod["metadata"]["deletionGracePeriodSeconds"] = grace
    return pod


def test_a_stopped_pod_ended_at_its_last_containers_finish():
    running = pod_file("gpu-check-succeeded")
    # all containers terminated, the kubelet has not yet set the phase: ended already
    assert ServerPod.from_pod(stopped(running)).ended_at == at("2026-11-29T23:00:05Z")
    done = ServerPod.from_pod(deleting(stopped(running, phase="Succeeded")))
    assert done.ended_at == at("2026-11-29T23:00:05Z")
    assert done.deleted_at == at("2026-11-29T23:00:00Z")  # deletionTimestamp less the grace


def test_a_pod_being_deleted_holds_its_gpus_until_its_containers_stop():
    pod = ServerPod.from_pod(deleting(pod_file("gpu-check-succeeded")))
    assert pod.deleting and pod.ended_at is None
    assert pod.deleted_at == at("2026-11-29T23:00:00Z")


def test_a_finished_pod_without_container_times_ended_when_deleted_or_last_changed():
    pod = copy.deepcopy(pod_file("gpu-check-succeeded"))
    pod["status"] = {
        "phase": "Failed",
        "reason": "Evicted",
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "True",
                "lastTransitionTime": "2026-11-29T22:41:07Z",
            },
            {"type": "Ready", "status": "False", "lastTransitionTime": "2026-11-29T23:10:00Z"},
        ],
    }
    assert ServerPod.from_pod(pod).ended_at == at("2026-11-29T23:10:00Z")
    assert ServerPod.from_pod(deleting(pod)).ended_at == at("2026-11-29T23:00:00Z")


def test_the_issue_32_annotations():
    from gpuspawner.core import labels

    plain = ServerPod.from_pod(GPU_PODS["jupyter-heidi-slice"])
    assert (plain.charge_group, plain.idle_timeout, plain.keep_until) == ("", None, None)
    pod = ServerPod.from_pod(
        _annotated(
            **{
                labels.ANNOTATION_CHARGE_GROUP: "ml-team",
                labels.ANNOTATION_IDLE_TIMEOUT: "5400",
                labels.ANNOTATION_KEEP_UNTIL: json.dumps(
                    {"until": 2e9 + 3600, "seconds": 3600, "at": 2e9}
                ),
            }
        )
    )
    assert (pod.charge_group, pod.idle_timeout, pod.keep_until) == ("ml-team", 5400, 2e9 + 3600)


@pytest.mark.parametrize(
    "idle, keep",
    [
        ("0", "{"),
        ("-60", "null"),
        ("nan", '{"until": "soon"}'),
        ("inf", '{"until": true}'),
        ("an hour", '{"until": NaN}'),
        ("", "[1]"),
    ],
)
def test_unreadable_idle_timeouts_and_keeps_read_as_none(idle, keep):
    from gpuspawner.core import labels

    pod = ServerPod.from_pod(
        _annotated(**{labels.ANNOTATION_IDLE_TIMEOUT: idle, labels.ANNOTATION_KEEP_UNTIL: keep})
    )
    assert pod.idle_timeout is None and pod.keep_until is None
    assert pod.gpus == 2


JUNK = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=20), inner, max_size=3)
    ),
    max_leaves=10,
)
STATUS_KEYS = st.sampled_from(
    ["phase", "conditions", "containerStatuses", "initContainerStatuses", "reason"]
)
META_KEYS = st.sampled_from(["uid", "deletionTimestamp", "deletionGracePeriodSeconds", "name"])


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(STATUS_KEYS, JUNK, max_size=5),
    st.dictionaries(META_KEYS, JUNK, max_size=4),
    st.lists(
        st.fixed_dictionaries(
            {"type": st.just("PodScheduled"), "status": st.just("True")},
            optional={"lastTransitionTime": JUNK},
        ),
        max_size=2,
    ),
)
def test_garbage_in_the_status_never_raises(status, meta, conditions):
    pod = copy.deepcopy(pod_file("gpu-check-succeeded"))
    pod["status"] = dict(status)
    if conditions:
        pod["status"]["conditions"] = conditions
    pod["metadata"].update(meta)
    read = ServerPod.from_pod(pod)
    for value in (read.scheduled_at, read.ended_at, read.deleted_at):
        assert value is None or isinstance(value, float)
