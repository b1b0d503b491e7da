"""Pods -> servers' pods and waiting GPU requests, from a PodList in the API's shape."""

from __future__ import annotations

import json

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
