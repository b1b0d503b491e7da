"""The local kubelet against the real control plane: nodes, the real scheduler, pods as processes."""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
import yaml

from gpuspawner_sandbox import testing
from gpuspawner_sandbox.devices import Fault, clear_faults, inject_fault
from gpuspawner_sandbox.kubeapi import ApiError
from gpuspawner_sandbox.kubelet import READY_FILE
from gpuspawner_sandbox.topology import parse_topology

GPU = "nvidia.com/gpu"
TOLERATE_GPU = [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}]
SUFFIX = uuid.uuid4().hex[:6]
# Its own loopback range, so another kubelet in the same test session never hands out the same IPs.
POD_RANGE = f"127.{100 + int(SUFFIX, 16) % 100}.0.0/16"
GPU_NODE = f"kt-a100-{SUFFIX}"
MIG_NODE = f"kt-mig-{SUFFIX}"
CPU_NODE = f"kt-cpu-{SUFFIX}"
TOPOLOGY = {
    "driver": "580.95.05",
    "nodes": [
        {"name": GPU_NODE, "gpu": {"model": "A100-SXM4-80GB", "count": 4}},
        {
            "name": MIG_NODE,
            "gpu": {"model": "H100-80GB-HBM3", "count": 1},
            "mig": {"strategy": "mixed", "profiles": {"3g.40gb": 1, "1g.10gb": 2}},
        },
        {"name": CPU_NODE},
    ],
    "image_env": {"*cuda*": {"NVIDIA_VISIBLE_DEVICES": "all"}},
}


# This module's waits: the shared poller with its own default timeout.
wait_for = functools.partial(testing.wait_for, timeout=90, interval=0.3)


@pytest.fixture(scope="module")
def kubelet(control_plane, tmp_path_factory):
    """The local kubelet serving a small test topology; its nodes are removed afterwards."""
    state = tmp_path_factory.mktemp("kubelet")
    topology = state / "topology.yaml"
    topology.write_text(yaml.safe_dump(TOPOLOGY))
    log = (state / "kubelet.log").open("wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpuspawner_sandbox.kubelet",
            "--kubeconfig",
            str(control_plane.admin_kubeconfig),
            "--topology",
            str(topology),
            "--state-dir",
            str(state),
            "--backoff-initial",
            "1",
            "--pod-ip-range",
            POD_RANGE,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )

    def ready():
        if proc.poll() is not None:
            pytest.fail(f"kubelet exited: {(state / 'kubelet.log').read_text()[-2000:]}")
        return (state / READY_FILE).exists()

    wait_for("the kubelet to register its nodes", ready)
    api = control_plane.admin_api()
    try:
        yield {"state": state, "api": api, "proc": proc, "topology": parse_topology(TOPOLOGY)}
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        for name in (GPU_NODE, MIG_NODE, CPU_NODE):
            with contextlib.suppress(ApiError):
                api.delete(f"/api/v1/nodes/{name}")
            with contextlib.suppress(ApiError):
                api.delete(f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{name}")
        # No pod process may outlive the kubelet.
        assert pod_processes(str(state / "pods")) == []


def pod_processes(marker: str) -> list[int]:
    """Pids of live processes started for a pod: their HOME lies in the pod's directory."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if marker.encode() in (entry / "environ").read_bytes():
                    pids.append(int(entry.name))
    return pids


def create_pod(api, namespace: str, name: str, spec: dict) -> dict:
    return api.post(
        f"/api/v1/namespaces/{namespace}/pods",
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec},
    )


def get_pod(api, namespace: str, name: str) -> dict | None:
    try:
        return api.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
    except ApiError as e:
        if e.status == 404:
            return None
        raise


def wait_phase(api, namespace: str, name: str, *phases: str) -> dict:
    def check():
        pod = get_pod(api, namespace, name)
        return pod if pod and pod.get("status", {}).get("phase") in phases else None

    return wait_for(f"pod {name} to reach {'/'.join(phases)}", check)


def container_log(kubelet, pod: dict, container: str, restart: int = 0) -> str:
    """The container's log so far ("" until the kubelet has created the file)."""
    meta = pod["metadata"]
    pod_dir = kubelet["state"] / "pods" / f"{meta['namespace']}_{meta['name']}_{meta['uid'][:8]}"
    path = pod_dir / "containers" / container / f"{restart}.log"
    # "Running" is reported as the process is started; the file may follow a moment later.
    return path.read_text() if path.exists() else ""


def on_node(node: str, **spec) -> dict:
    return {"nodeSelector": {"kubernetes.io/hostname": node}, **spec}


def events(api, namespace: str, name: str) -> list[dict]:
    items = api.get(f"/api/v1/namespaces/{namespace}/events")["items"]
    return [e for e in items if e["involvedObject"]["name"] == name]


def allocatable_gpus(api, node: str) -> int:
    return int(api.get(f"/api/v1/nodes/{node}")["status"]["allocatable"].get(GPU, "0"))


def test_nodes_are_registered_like_gpu_nodes(kubelet):
    api = kubelet["api"]
    node = api.get(f"/api/v1/nodes/{GPU_NODE}")
    assert node["status"]["capacity"][GPU] == "4"
    assert node["status"]["allocatable"][GPU] == "4"
    assert node["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB"
    assert node["metadata"]["labels"]["nvidia.com/gpu.count"] == "4"
    assert {"key": GPU, "value": "present", "effect": "NoSchedule"} in node["spec"]["taints"]
    ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
    assert ready[0]["status"] == "True"
    assert node["status"]["addresses"][0] == {"type": "InternalIP", "address": "127.0.0.1"}
    lease = api.get(f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{GPU_NODE}")
    assert lease["spec"]["holderIdentity"] == GPU_NODE
    mig = api.get(f"/api/v1/nodes/{MIG_NODE}")["status"]["allocatable"]
    assert (mig["nvidia.com/mig-3g.40gb"], mig["nvidia.com/mig-1g.10gb"]) == ("1", "2")
    cpu = api.get(f"/api/v1/nodes/{CPU_NODE}")
    assert GPU not in cpu["status"]["capacity"]
    assert not cpu["spec"].get("taints")


def test_gpu_pod_sees_exactly_its_two_gpus(kubelet, namespace):
    api = kubelet["api"]
    script = (
        'echo "VISIBLE=$NVIDIA_VISIBLE_DEVICES"; nvidia-smi -L; '
        "nvidia-smi --query-gpu=uuid --format=csv,noheader; echo IP=$(POD_IP); "
        # A Jupyter terminal is a login shell, which reads the host's /etc/profile.
        "sh -lc 'echo LOGIN-SHELL-GPUS=$(nvidia-smi -L | wc -l)'"
    )
    create_pod(
        api,
        namespace,
        "two-gpus",
        on_node(
            GPU_NODE,
            restartPolicy="Never",
            tolerations=TOLERATE_GPU,
            containers=[
                {
                    "name": "main",
                    "image": "nvidia/cuda:12.4.1-base",
                    "command": ["sh", "-c", script],
                    "env": [
                        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
                    ],
                    "resources": {"limits": {GPU: "2"}},
                }
            ],
        ),
    )
    pod = wait_phase(api, namespace, "two-gpus", "Succeeded", "Failed")
    assert pod["status"]["phase"] == "Succeeded"
    assert pod["spec"]["nodeName"] == GPU_NODE  # bound by the real scheduler
    pod_ip = pod["status"]["podIP"]
    assert ipaddress.ip_address(pod_ip) in ipaddress.ip_network(POD_RANGE)
    out = container_log(kubelet, pod, "main").splitlines()
    visible = out[0].removeprefix("VISIBLE=").split(",")
    node_uuids = {g.uuid for g in kubelet["topology"].node(GPU_NODE).gpus}
    assert len(set(visible)) == 2 and set(visible) <= node_uuids
    listed = [line.split("(UUID: ")[1].rstrip(")") for line in out if line.startswith("GPU ")]
    assert listed == visible
    assert [line for line in out if line.startswith("GPU-")] == visible
    assert f"IP={pod_ip}" in out
    assert "LOGIN-SHELL-GPUS=2" in out
    status = pod["status"]["containerStatuses"][0]
    assert status["state"]["terminated"]["exitCode"] == 0
    assert status["image"] == "nvidia/cuda:12.4.1-base"
    assert status["containerID"].startswith("containerd://")
    listed = [
        e for e in events(api, namespace, "two-gpus") if e["source"].get("component") == "kubelet"
    ]
    # Named like the kubelet's (pod + hex nanoseconds), so a listing is in order.
    assert [e["reason"] for e in listed] == ["Pulled", "Created", "Started"]
    assert any(e["reason"] == "Scheduled" for e in events(api, namespace, "two-gpus"))


def test_kubelet_rejects_a_pod_bound_to_a_node_without_the_resource(kubelet, namespace):
    api = kubelet["api"]
    create_pod(
        api,
        namespace,
        "bypass",
        {
            "nodeName": CPU_NODE,  # bound directly, without the scheduler
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "main",
                    "image": "x",
                    "command": ["true"],
                    "resources": {"limits": {GPU: "1"}},
                }
            ],
        },
    )
    pod = wait_phase(api, namespace, "bypass", "Failed")
    assert pod["status"]["reason"] == "OutOfnvidia.com/gpu"
    assert "Node didn't have enough resource: nvidia.com/gpu" in pod["status"]["message"]


def test_mig_pod_gets_a_mig_device(kubelet, namespace):
    api = kubelet["api"]
    create_pod(
        api,
        namespace,
        "mig",
        on_node(
            MIG_NODE,
            restartPolicy="Never",
            tolerations=TOLERATE_GPU,
            containers=[
                {
                    "name": "main",
                    "image": "x",
                    "command": ["sh", "-c", "echo $NVIDIA_VISIBLE_DEVICES; nvidia-smi -L"],
                    "resources": {"limits": {"nvidia.com/mig-1g.10gb": "1"}},
                }
            ],
        ),
    )
    pod = wait_phase(api, namespace, "mig", "Succeeded", "Failed")
    out = container_log(kubelet, pod, "main").splitlines()
    assert out[0].startswith("MIG-")
    assert out[1].startswith("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-")
    assert out[2:] == [f"  MIG 1g.10gb     Device  0: (UUID: {out[0]})"]


def test_failing_init_container_backs_off_with_its_termination_message(kubelet, namespace):
    api = kubelet["api"]
    create_pod(
        api,
        namespace,
        "init-fails",
        on_node(
            GPU_NODE,
            restartPolicy="OnFailure",
            tolerations=TOLERATE_GPU,
            initContainers=[
                {
                    "name": "check",
                    "image": "x",
                    "command": [
                        "sh",
                        "-c",
                        "echo 'GPU 1 has ECC errors' > /dev/termination-log; exit 3",
                    ],
                    "resources": {"limits": {GPU: "1"}},
                }
            ],
            containers=[{"name": "main", "image": "x", "command": ["sleep", "60"]}],
        ),
    )

    def restarted_twice():
        pod = get_pod(api, namespace, "init-fails")
        statuses = (pod or {}).get("status", {}).get("initContainerStatuses") or []
        return pod if statuses and statuses[0]["restartCount"] >= 2 else None

    pod = wait_for("the init container to be restarted twice", restarted_twice)
    status = pod["status"]["initContainerStatuses"][0]
    assert pod["status"]["phase"] == "Pending"
    last = status["lastState"]["terminated"]
    assert (last["exitCode"], last["reason"], last["message"]) == (
        3,
        "Error",
        "GPU 1 has ECC errors\n",
    )
    # Between restarts the container waits in CrashLoopBackOff; "main" never started.
    assert "running" not in pod["status"]["containerStatuses"][0]["state"]

    # Repeated events are one object with a count, as the event correlator makes them.
    def started_counts():
        found = events(api, namespace, "init-fails")
        return [e["count"] for e in found if e["reason"] == "Started"]

    wait_for(
        "the Started event to be counted 3 times", lambda: max(started_counts(), default=0) >= 3
    )
    assert len(started_counts()) == 1
    wait_for(
        "a BackOff event",
        lambda: any(e["reason"] == "BackOff" for e in events(api, namespace, "init-fails")),
    )


def test_fallback_to_logs_and_missing_command(kubelet, namespace):
    api = kubelet["api"]
    create_pod(
        api,
        namespace,
        "no-such-cmd",
        on_node(
            CPU_NODE,
            restartPolicy="Never",
            initContainers=[
                {
                    "name": "logs",
                    "image": "x",
                    "command": ["sh", "-c", "echo first; echo the reason >&2; exit 4"],
                    "terminationMessagePolicy": "FallbackToLogsOnError",
                }
            ],
            containers=[{"name": "main", "image": "x", "command": ["sleep", "1"]}],
        ),
    )
    pod = wait_phase(api, namespace, "no-such-cmd", "Failed")
    term = pod["status"]["initContainerStatuses"][0]["state"]["terminated"]
    assert term["exitCode"] == 4
    assert term["message"].splitlines()[-1] == "the reason"

    create_pod(
        api,
        namespace,
        "missing",
        on_node(
            CPU_NODE,
            restartPolicy="Never",
            containers=[{"name": "main", "image": "x", "command": ["definitely-not-installed"]}],
        ),
    )
    pod = wait_phase(api, namespace, "missing", "Failed")
    term = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (term["exitCode"], term["reason"]) == (128, "StartError")
    assert '"definitely-not-installed": executable file not found in $PATH' in term["message"]


def test_deletion_kills_the_process_and_frees_the_gpus(kubelet, namespace):
    api = kubelet["api"]
    holder = on_node(
        GPU_NODE,
        tolerations=TOLERATE_GPU,
        terminationGracePeriodSeconds=2,
        containers=[
            {
                "name": "main",
                "image": "x",
                # Ignores SIGTERM: only the SIGKILL after the grace period ends it.
                "command": ["sh", "-c", "trap '' TERM; echo started; while true; do sleep 1; done"],
                "resources": {"limits": {GPU: "4"}},
            }
        ],
    )
    create_pod(api, namespace, "holder", holder)
    pod = wait_phase(api, namespace, "holder", "Running")
    marker = f"{namespace}_holder_{pod['metadata']['uid'][:8]}"
    wait_for("the process to start", lambda: "started" in container_log(kubelet, pod, "main"))

    waiting = dict(holder, terminationGracePeriodSeconds=1)
    create_pod(api, namespace, "waiter", waiting)
    time.sleep(2)
    # The real scheduler keeps it Pending: the node's 4 GPUs are taken.
    pending = get_pod(api, namespace, "waiter")
    assert pending["status"]["phase"] == "Pending"
    assert not pending["spec"].get("nodeName")

    api.delete(f"/api/v1/namespaces/{namespace}/pods/holder")
    wait_for("the pod object to be removed", lambda: get_pod(api, namespace, "holder") is None)
    assert pod_processes(marker) == []
    # The GPUs came back: the waiting pod is admitted and runs with all four.
    wait_phase(api, namespace, "waiter", "Running")
    assert any(e["reason"] == "Killing" for e in events(api, namespace, "holder"))


def test_unhealthy_gpu_leaves_allocatable(kubelet):
    api = kubelet["api"]
    state = kubelet["state"]
    try:
        inject_fault(state, Fault(GPU_NODE, "ecc", gpu="1"))
        wait_for("allocatable to drop to 3", lambda: allocatable_gpus(api, GPU_NODE) == 3)
        assert api.get(f"/api/v1/nodes/{GPU_NODE}")["status"]["capacity"][GPU] == "4"
        # A fault the device plugin does not notice leaves the GPU schedulable.
        inject_fault(state, Fault(GPU_NODE, "ecc", gpu="2", withdraw=False))
        time.sleep(2)
        assert allocatable_gpus(api, GPU_NODE) == 3
    finally:
        clear_faults(state, GPU_NODE)
    wait_for("allocatable to recover", lambda: allocatable_gpus(api, GPU_NODE) == 4)


def test_cpu_pod_with_void_sees_no_gpu_even_if_the_image_says_all(kubelet, namespace):
    api = kubelet["api"]
    script = 'echo "VISIBLE=$NVIDIA_VISIBLE_DEVICES"; command -v nvidia-smi || echo NO-SMI'
    for name, env in (("void", [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]), ("all", [])):
        create_pod(
            api,
            namespace,
            name,
            on_node(
                GPU_NODE,
                restartPolicy="Never",
                tolerations=TOLERATE_GPU,
                containers=[
                    {
                        "name": "main",
                        "image": "nvidia/cuda:12.4",
                        "command": ["sh", "-c", script],
                        "env": env,
                    }
                ],
            ),
        )
    void = container_log(kubelet, wait_phase(api, namespace, "void", "Succeeded"), "main")
    assert void.splitlines() == ["VISIBLE=void", "NO-SMI"]
    # Without the override, the CUDA image's own NVIDIA_VISIBLE_DEVICES=all exposes every GPU
    # of the node, as with the NVIDIA runtime's envvar strategy: the hazard "void" prevents.
    everything = container_log(kubelet, wait_phase(api, namespace, "all", "Succeeded"), "main")
    assert everything.splitlines()[0] == "VISIBLE=all"
    assert everything.splitlines()[1].endswith("/nvidia-smi")


def test_server_binding_all_addresses_listens_on_its_pod_ip_only(kubelet, namespace):
    api = kubelet["api"]
    server = (
        "import os, http.server, urllib.parse as u\n"
        "url = u.urlsplit(os.environ['JUPYTERHUB_SERVICE_URL'])\n"
        "http.server.HTTPServer((url.hostname, url.port), http.server.SimpleHTTPRequestHandler)"
        ".serve_forever()\n"
    )
    create_pod(
        api,
        namespace,
        "server",
        on_node(
            CPU_NODE,
            terminationGracePeriodSeconds=1,
            containers=[
                {
                    "name": "notebook",
                    "image": "x",
                    "command": ["python3", "-c", server],
                    "env": [
                        {
                            "name": "JUPYTERHUB_SERVICE_URL",
                            "value": "http://0.0.0.0:8888/user/alice/",
                        }
                    ],
                    "ports": [{"name": "notebook-port", "containerPort": 8888}],
                    "readinessProbe": {
                        "httpGet": {"path": "/", "port": "notebook-port"},
                        "periodSeconds": 1,
                    },
                }
            ],
        ),
    )

    def ready():
        pod = get_pod(api, namespace, "server")
        conds = {
            c["type"]: c["status"] for c in (pod or {}).get("status", {}).get("conditions", [])
        }
        return pod if conds.get("Ready") == "True" else None

    pod = wait_for("the server pod to become Ready", ready)
    pod_ip = pod["status"]["podIP"]
    with urllib.request.urlopen(f"http://{pod_ip}:8888/", timeout=5) as resp:
        assert resp.status == 200
    marker = f"{namespace}_server_{pod['metadata']['uid'][:8]}"
    pids = pod_processes(marker)
    assert pids
    listening = {addr for pid in pids for addr in testing.listening_addresses(pid)}
    assert listening == {(pod_ip, 8888)}


def test_old_driver_is_relabelled_as_gpu_feature_discovery_would(kubelet):
    api = kubelet["api"]

    def driver_major():
        return api.get(f"/api/v1/nodes/{MIG_NODE}")["metadata"]["labels"][
            "nvidia.com/cuda.driver.major"
        ]

    assert driver_major() == "580"
    try:
        inject_fault(kubelet["state"], Fault(MIG_NODE, "driver-too-old", value="535.104.12"))
        wait_for("the driver labels to follow the driver", lambda: driver_major() == "535")
        labels = api.get(f"/api/v1/nodes/{MIG_NODE}")["metadata"]["labels"]
        assert labels["nvidia.com/cuda.runtime.major"] == "12"
        # Driver faults do not make the device plugin withdraw anything.
        assert (
            api.get(f"/api/v1/nodes/{MIG_NODE}")["status"]["allocatable"]["nvidia.com/mig-1g.10gb"]
            == "2"
        )
    finally:
        clear_faults(kubelet["state"], MIG_NODE)
    wait_for("the labels to recover", lambda: driver_major() == "580")
