"""Pods -> servers' pods and waiting GPU requests, from a PodList in the API's shape."""

from __future__ import annotations

import copy
import json

from gpuspawner.core import kueue
from gpuspawner.culler.pods import pods_by_server, waiting_requests, with_pods
from gpuspawner.culler.policy import Request, Server

from ..conftest import FIXTURES

PODS = json.loads((FIXTURES / "culler-pods" / "podlist.json").read_text())["items"]


def test_waiting_requests_are_pods_unschedulable_for_their_gpu_resource_one_each():
    assert sorted(waiting_requests(PODS), key=lambda r: (r.gpu_type, r.gpus)) == [
        Request("a100", 1, "pending"),
        Request("a100", 1, "pending"),
        Request("a100-1g", 1, "pending"),
    ]


def test_a_pod_kueue_gates_is_not_pending_demand_it_waits_in_kueues_queue():
    """Kueue's pending list counts it (culler.kueuedemand): never twice."""
    waiting = [p for p in PODS if waiting_requests([p])]
    gated = copy.deepcopy(waiting)
    for pod in gated:
        pod["spec"]["schedulingGates"] = [{"name": kueue.ADMISSION_GATE}]
    assert len(waiting_requests(waiting)) == 3
    assert waiting_requests(gated) == []
    # as the API shows a gated pod: the scheduler has not tried it
    for pod in gated:
        for condition in pod["status"]["conditions"]:
            if condition["type"] == "PodScheduled":
                condition.update(reason="SchedulingGated", message="Scheduling is blocked")
    assert waiting_requests(gated) == []
    # another gate than Kueue's leaves a pod the scheduler found no GPUs for counted
    other = copy.deepcopy(waiting)
    for pod in other:
        pod["spec"]["schedulingGates"] = [{"name": "example.com/other"}]
    assert len(waiting_requests(other)) == 3


def test_pods_by_server_reads_kubespawner_annotations_and_gpuspawner_labels():
    pods = pods_by_server(PODS)
    assert "gone" not in {user for user, _ in pods}  # being deleted
    run = pods[("run", "")]
    assert (run.name, run.namespace, run.gpu_type, run.gpus, run.phase) == (
        "jupyter-run",
        "jupyterhub",
        "a100",
        2,
        "Running",
    )
    assert pods[("wait2", "exp")].name == "jupyter-wait2--exp"
    cpu = pods[("cpu", "")]
    assert (cpu.gpu_type, cpu.gpus) == (None, 0)


def test_pod_labels_win_over_user_options():
    servers = [
        Server(user="run", gpus=0),  # spawned with {} : the catalog default gave 2 GPUs
        Server(user="nobody", gpus=1, gpu_type="h100", pod="p", namespace="n"),
    ]
    merged = with_pods(servers, pods_by_server(PODS))
    assert (merged[0].gpus, merged[0].gpu_type, merged[0].pod, merged[0].profile) == (
        2,
        "a100",
        "jupyter-run",
        "pytorch",
    )
    assert merged[0].node == "gpu-a100-0"
    assert merged[1] == servers[1]
