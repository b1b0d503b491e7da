"""Per-pod helpers of the local kubelet that need no cluster."""

import asyncio
import json
import subprocess

import pytest

from gpuspawner_sandbox.devices import container_device_state, node_devices
from gpuspawner_sandbox.kubelet import is_loopback_url
from gpuspawner_sandbox.pods import (
    AddressPool,
    extended_resource_names,
    image_id,
    pod_device_requests,
    run_probe,
    termination_message,
    write_smi_wrapper,
)
from gpuspawner_sandbox.topology import parse_topology

GPU = "nvidia.com/gpu"


def test_addresses_skip_the_host_and_are_reused_last():
    pool = AddressPool("127.0.0.0/29")
    got = [pool.allocate() for _ in range(5)]
    assert got == ["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5", "127.0.0.6"]
    pool.release("127.0.0.3")
    assert pool.allocate() == "127.0.0.3"
    with pytest.raises(RuntimeError):
        pool.allocate()


def test_address_range_must_be_loopback():
    with pytest.raises(ValueError, match=r"not inside 127\.0\.0\.0/8"):
        AddressPool("10.0.0.0/24")


@pytest.mark.parametrize(
    ("url", "want"),
    [
        ("https://127.0.0.1:6443", True),
        ("https://127.4.5.6:1", True),
        ("https://localhost:6443", True),
        ("https://[::1]:6443", True),
        ("https://10.0.0.1:443", False),
        ("https://api.example.com", False),
    ],
)
def test_loopback_url(url, want):
    assert is_loopback_url(url) is want


def test_pod_request_is_max_of_init_and_sum_of_containers():
    pod = {
        "spec": {
            "initContainers": [
                {"name": "check", "resources": {"limits": {GPU: "2"}}},
                {"name": "other"},
            ],
            "containers": [
                {"name": "a", "resources": {"limits": {GPU: "1"}}},
                {"name": "b", "resources": {"requests": {GPU: "0"}}},
            ],
        }
    }
    assert pod_device_requests(pod, {GPU}) == {GPU: 2}
    pod["spec"]["containers"][1]["resources"] = {"limits": {GPU: "3"}}
    assert pod_device_requests(pod, {GPU}) == {GPU: 4}
    assert pod_device_requests(pod, {"nvidia.com/mig-1g.10gb"}) == {}


def test_image_id_is_a_plausible_digest_reference():
    assert image_id("quay.io/jupyter/pytorch-notebook:cuda12").startswith(
        "quay.io/jupyter/pytorch-notebook@sha256:"
    )
    assert image_id("busybox").startswith("docker.io/library/busybox@sha256:")
    assert image_id("jupyterhub/singleuser:5").startswith("docker.io/jupyterhub/singleuser@sha256:")


def test_termination_message_file_wins_and_logs_are_the_fallback(tmp_path):
    log = tmp_path / "0.log"
    log.write_text("".join(f"line {i}\n" for i in range(200)))
    (tmp_path / "termination-log").write_text("")
    spec = {"terminationMessagePolicy": "FallbackToLogsOnError"}
    fallback = termination_message(spec, tmp_path, log, 1)
    assert fallback.splitlines()[-1] == "line 199"
    assert len(fallback.splitlines()) == 80
    assert termination_message(spec, tmp_path, log, 0) == ""
    assert termination_message({}, tmp_path, log, 1) == ""
    (tmp_path / "termination-log").write_text("x" * 5000)
    assert termination_message(spec, tmp_path, log, 1) == "x" * 4096


def test_nvidia_smi_wrapper_runs_the_emulator_with_the_container_state(tmp_path):
    node = parse_topology({"nodes": [{"name": "n", "gpu": {"model": "T4", "count": 2}}]}).nodes[0]
    state = tmp_path / "devices.json"
    devices = node_devices(node)[1:]
    state.write_text(json.dumps(container_device_state(node, devices, tmp_path / "faults.json")))
    wrapper = tmp_path / "nvidia-smi"
    write_smi_wrapper(wrapper, state)
    out = subprocess.run([str(wrapper), "-L"], capture_output=True, text=True, env={}, check=True)
    assert out.stdout == f"GPU 0: Tesla T4 (UUID: {node.gpus[1].uuid})\n"


def test_probes_never_leave_loopback():
    probe = {"httpGet": {"host": "10.1.2.3", "port": 80, "path": "/"}}
    assert asyncio.run(run_probe(probe, {}, "127.0.0.5", 1)) is False


def test_extended_resource_names():
    pod = {
        "spec": {
            "initContainers": [
                {"name": "i", "resources": {"limits": {"nvidia.com/mig-1g.10gb": "1"}}}
            ],
            "containers": [
                {"name": "a", "resources": {"limits": {"cpu": "1", GPU: "0"}}},
                {
                    "name": "b",
                    "resources": {"requests": {"example.com/fpga": "2", "memory": "1Gi"}},
                },
            ],
        }
    }
    assert extended_resource_names(pod) == {"nvidia.com/mig-1g.10gb", "example.com/fpga"}
