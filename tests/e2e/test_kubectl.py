"""The venv's ``kubectl`` against the end-to-end stack (the demo's), as docs/sandbox.md shows it.

Everything goes through the API server with the admin kubeconfig: ``get nodes`` reads it,
``exec`` and ``logs`` are its pods subresources, which it forwards to the pod's kubelet.
The GPUs that ``nvidia-smi -L`` lists through ``kubectl exec`` are compared with what the
kubelet allocated to the notebook (its PodResources API), as test_real_nodes does in the
container's namespaces.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from gpuspawner.core import labels
from gpuspawner_sandbox.demo import HUB_NAMESPACE
from gpuspawner_sandbox.topology import load_topology

from .conftest import pod_of, stop_server, user_pods, wait_for
from .test_real_nodes import _held, _start_gpu_server, _wait_ready

#: What `make setup` puts on the venv's PATH (sandbox/pyproject.toml's `kubectl`).
KUBECTL = Path(sys.executable).parent / "kubectl"
#: The URLs kubectl names in its request log (-v=6), whatever the scheme.
URL = re.compile(r"\b(?:https?|wss?)://[^\s\"']+")


def kubectl(stack, *args: str, verbose: bool = False) -> subprocess.CompletedProcess:
    """Run the venv's kubectl with the admin kubeconfig the stack prints for people."""
    # -v=6: one log line per HTTP request, with its URL (before the args: `exec … --`)
    flags = ["-v=6"] if verbose else []
    cmd = [str(KUBECTL), f"--kubeconfig={stack.control_plane.admin_kubeconfig}", *flags, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def assert_only_the_api_server(stack, log: str) -> None:
    """Every request kubectl made went to the API server."""
    urls = URL.findall(log)
    assert urls, log[-2000:]
    api = urlsplit(stack.control_plane.api_url).netloc
    assert not [u for u in urls if urlsplit(u).netloc != api], (api, urls)


@pytest.fixture
def gpu_notebook(stack):
    """A user's 2 × A100 notebook pod, started through the hub, stopped afterwards."""
    hub, kube = stack.hub, stack.control_plane.admin_api()
    user = "kubectl-user"
    _start_gpu_server(hub, user, gpus=2)
    try:
        _wait_ready(hub, user)
        yield pod_of(kube, user)
    finally:
        stop_server(hub, user)
        wait_for(lambda: not user_pods(kube, user), 90, what=f"{user}'s pod to be deleted")


def test_kubectl_is_the_clusters_release(stack):
    client = kubectl(stack, "version", "--client")
    assert client.returncode == 0, client.stderr
    both = kubectl(stack, "version", "-o", "json")
    assert both.returncode == 0, both.stderr
    server = stack.control_plane.admin_api().get("/version")["gitVersion"]
    assert f"Client Version: {server}" in client.stdout
    assert f'"gitVersion": "{server}"' in both.stdout  # client and server alike


def test_get_nodes_lists_the_clusters_nodes(stack):
    shown = kubectl(stack, "get", "nodes", verbose=True)
    assert shown.returncode == 0, shown.stderr
    header, *rows = shown.stdout.splitlines()
    assert header.split()[:2] == ["NAME", "STATUS"]
    assert {row.split()[0]: row.split()[1] for row in rows} == {
        node.name: "Ready" for node in load_topology(None).nodes
    }
    assert_only_the_api_server(stack, shown.stderr)


def test_exec_nvidia_smi_lists_exactly_the_pods_gpus_and_logs_show_its_check(stack, gpu_notebook):
    pod = gpu_notebook
    name = pod["metadata"]["name"]
    allocated = sorted(_held(stack.nodes, pod, "nvidia.com/gpu"))
    assert len(allocated) == 2

    command = ["exec", name, "-c", "notebook", "--", "nvidia-smi", "-L"]
    listed = kubectl(stack, "-n", HUB_NAMESPACE, *command, verbose=True)
    assert listed.returncode == 0, listed.stderr[-2000:]
    lines = listed.stdout.splitlines()
    assert len(lines) == 2, listed.stdout
    uuids = sorted(line.rsplit("UUID: ", 1)[1].rstrip(")") for line in lines)
    assert uuids == allocated
    # the exec went to the API server (which forwards it to the kubelet), nowhere else
    assert any("/exec?" in u for u in URL.findall(listed.stderr)), listed.stderr[-2000:]
    assert_only_the_api_server(stack, listed.stderr)

    # The GPU check's output, from its init container's log, through the API server.
    command = ["logs", name, "-c", labels.VALIDATION_CONTAINER_NAME]
    log = kubectl(stack, "-n", HUB_NAMESPACE, *command, verbose=True)
    assert log.returncode == 0, log.stderr[-2000:]
    assert "nvidia-smi sees 2 GPUs" in log.stdout, log.stdout
    assert log.stdout.rstrip().endswith("GPU check passed."), log.stdout
    assert_only_the_api_server(stack, log.stderr)
