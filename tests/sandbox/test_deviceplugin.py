"""Our device plugin (``k8s device-plugin``) on real nodes, through the real kubelet.

Three GPU nodes of a small topology run as real nodes: eight H100s in two
NVLink domains (device list strategy ``envvar``), two A100s in MIG's mixed
strategy (``cdi-cri``), and one A100 in MIG's single strategy. The kubelet's own
device manager allocates, checkpoints and withdraws devices; the plugin only
advertises what the node's emulated driver state says and answers Allocate
and GetPreferredAllocation. The plugin's logic is unit-tested in Go
(``sandbox/go/deviceplugin``); these tests prove it over the real API.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from dataclasses import dataclass
from typing import Any

import pytest

from gpuspawner_sandbox import gpudriver, hoststate, nodeconfig, nodes, testing
from gpuspawner_sandbox.topology import GPU_RESOURCE, extended_resources, parse_topology

NVLINK_NODE = "dp-nvlink-0"
MIG_NODE = "dp-mig-0"
SINGLE_NODE = "dp-single-0"
TOPOLOGY = parse_topology(
    {
        "nodes": [
            {
                "name": NVLINK_NODE,
                "gpu": {"model": "H100-80GB-HBM3", "count": 8, "nvlink_domains": 2},
            },
            {
                "name": MIG_NODE,
                "gpu": {"model": "A100-SXM4-80GB", "count": 2},
                "mig": {"strategy": "mixed", "profiles": {"3g.40gb": 1, "1g.10gb": 2}},
            },
            {
                "name": SINGLE_NODE,
                "gpu": {"model": "A100-SXM4-80GB", "count": 1},
                "mig": {"strategy": "single", "profiles": {"1g.10gb": 7}},
            },
        ]
    }
)
NAMES = [n.name for n in TOPOLOGY.nodes]
#: Keeps the other tests' pods (which may tolerate nvidia.com/gpu) off these nodes.
TAINT_KEY = "gpuspawner.test/device-plugin"

wait_for = functools.partial(testing.wait_for, timeout=120, interval=0.3)


@dataclass
class Running:
    nodes: nodes.RealNodes
    before: dict[str, Any]
    roots: list[str]


@pytest.fixture(scope="module")
def gpu_nodes(pytestconfig, control_plane, tmp_path_factory):
    testing.node_binaries(pytestconfig)  # build (with progress) before the snapshot
    state_dir = tmp_path_factory.mktemp("gpu-nodes")
    roots = [nodeconfig.cgroup_root(n) for n in NAMES]
    before = hoststate.snapshot(state_dir / "nodes", roots)
    with testing.running_real_nodes(
        state_dir,
        control_plane,
        NAMES,
        pytestconfig,
        taints=(f"{TAINT_KEY}=true:NoSchedule",),
        specs={n.name: n for n in TOPOLOGY.nodes},
        device_list_strategy={NVLINK_NODE: "envvar", MIG_NODE: "cdi-cri"},
    ) as running:
        yield Running(running, before, roots)


def _node(api, name: str) -> dict:
    return api.get(f"/api/v1/nodes/{name}")


def _allocatable(api, name: str, resource: str) -> str | None:
    return _node(api, name)["status"].get("allocatable", {}).get(resource)


def _gpu_pod(name: str, gpus: int, node: str = NVLINK_NODE, resource: str = GPU_RESOURCE) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": [{"operator": "Exists"}],
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "main",
                    "image": nodeconfig.TOOL_IMAGE,
                    "imagePullPolicy": "Never",
                    "args": ["sleep", "infinity"],
                    "resources": {"limits": {resource: str(gpus)}},
                }
            ],
        },
    }


def _visible_devices(api, namespace: str, pod_name: str) -> tuple[dict, list[str]]:
    """The running pod and the GPUs NVIDIA's runtime gave its container: the UUIDs of
    the /dev/nvidia<minor> entries in the container's /dev."""

    pod = wait_for(f"pod {pod_name} to run", lambda: testing.running_pod(api, namespace, pod_name))
    container_id = pod["status"]["containerStatuses"][0]["containerID"].split("://", 1)[1]
    pids = wait_for(
        "the container's process", lambda: testing.container_pids(NVLINK_NODE, container_id)
    )
    by_device = {f"nvidia{g.index}": g.uuid for g in TOPOLOGY.node(NVLINK_NODE).gpus}
    dev = os.listdir(f"/proc/{pids[0]}/root/dev")
    return pod, [by_device[name] for name in dev if name in by_device]


def _checkpointed(gpu_nodes: Running, pod_uid: str) -> list[str]:
    """The device ids the kubelet's device manager checkpointed for a pod's container."""
    path = gpu_nodes.nodes.paths(NVLINK_NODE).device_plugins / "kubelet_internal_checkpoint"
    entries = json.loads(path.read_text())["Data"]["PodDeviceEntries"]
    ids = []
    for entry in entries:
        if entry["PodUID"] == pod_uid and entry["ContainerName"] == "main":
            assert entry["ResourceName"] == GPU_RESOURCE
            for numa_ids in entry["DeviceIDs"].values():
                ids += numa_ids
    return ids


def test_gpu_nodes_advertise_their_gpus_with_gfd_labels_and_the_taint(gpu_nodes, control_plane):
    api = control_plane.admin_api()
    expected = {
        NVLINK_NODE: {GPU_RESOURCE: 8},
        MIG_NODE: {"nvidia.com/mig-3g.40gb": 2, "nvidia.com/mig-1g.10gb": 4},
        # Single strategy: the seven MIG devices are nvidia.com/gpu.
        SINGLE_NODE: {GPU_RESOURCE: 7},
    }
    for spec in TOPOLOGY.nodes:
        node = _node(api, spec.name)
        assert extended_resources(spec) == expected[spec.name]
        for resource, count in expected[spec.name].items():
            assert node["status"]["allocatable"][resource] == str(count)
            assert node["status"]["capacity"][resource] == str(count)
        advertised = {k for k in node["status"]["allocatable"] if k.startswith("nvidia.com/")}
        assert advertised == set(expected[spec.name])
        labels = node["metadata"]["labels"]
        for key, value in nodeconfig.gpu_feature_labels(spec).items():
            assert labels[key] == value, key
        assert {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"} in node[
            "spec"
        ]["taints"]
    nvlink = _node(api, NVLINK_NODE)["metadata"]["labels"]
    assert nvlink["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert nvlink["nvidia.com/gpu.count"] == "8"
    assert nvlink["nvidia.com/cuda.driver.major"] == "580"
    mig = _node(api, MIG_NODE)["metadata"]["labels"]
    assert mig["nvidia.com/mig.strategy"] == "mixed"
    assert mig["nvidia.com/mig-1g.10gb.count"] == "4"
    single = _node(api, SINGLE_NODE)["metadata"]["labels"]
    assert single["nvidia.com/mig.strategy"] == "single"
    assert single["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb"
    assert single["nvidia.com/gpu.count"] == "7"


def test_gpu_pods_get_exactly_their_devices_in_one_nvlink_domain(
    gpu_nodes, control_plane, namespace
):
    api = control_plane.admin_api()
    spec = TOPOLOGY.node(NVLINK_NODE)
    domain = {g.uuid: g.nvlink_domain for g in spec.gpus}

    api.post(f"/api/v1/namespaces/{namespace}/pods", _gpu_pod("two", 2))
    pod, two = _visible_devices(api, namespace, "two")
    assert len(two) == 2 and len(set(two)) == 2 and set(two) <= set(domain)
    # The kubelet's device manager recorded the same two devices.
    assert sorted(_checkpointed(gpu_nodes, pod["metadata"]["uid"])) == sorted(two)
    assert len({domain[u] for u in two}) == 1, (
        "the plugin's preferred allocation keeps NVLink peers"
    )

    # Four more: only the other domain still has four free GPUs, and
    # GetPreferredAllocation steers the kubelet there (of the 15 ways to pick
    # 4 of the 6 free GPUs, one is that domain).
    api.post(f"/api/v1/namespaces/{namespace}/pods", _gpu_pod("four", 4))
    pod, four = _visible_devices(api, namespace, "four")
    other = {u for u, d in domain.items() if d != domain[two[0]]}
    assert set(four) == other
    assert sorted(_checkpointed(gpu_nodes, pod["metadata"]["uid"])) == sorted(four)


def test_an_unhealthy_gpu_leaves_allocatable_through_the_kubelet(gpu_nodes, control_plane):
    api = control_plane.admin_api()
    spec = TOPOLOGY.node(MIG_NODE)
    state = gpu_nodes.nodes.paths(MIG_NODE).driver_state
    broken = spec.gpus[1].uuid
    try:
        gpudriver.set_health(state, broken, healthy=False)
        # Its MIG devices go with it: one 3g.40gb and two 1g.10gb.
        wait_for(
            "the unhealthy GPU's MIG devices to leave allocatable",
            lambda: (
                _allocatable(api, MIG_NODE, "nvidia.com/mig-3g.40gb") == "1"
                and _allocatable(api, MIG_NODE, "nvidia.com/mig-1g.10gb") == "2"
            ),
        )
        capacity = _node(api, MIG_NODE)["status"]["capacity"]
        assert (
            capacity["nvidia.com/mig-3g.40gb"] == "2" and capacity["nvidia.com/mig-1g.10gb"] == "4"
        )
    finally:
        gpudriver.set_health(state, broken, healthy=True)
    wait_for(
        "the healthy GPU to return",
        lambda: _allocatable(api, MIG_NODE, "nvidia.com/mig-1g.10gb") == "4",
    )


def test_an_injected_xid_fault_withdraws_the_gpu_and_clearing_it_brings_it_back(
    gpu_nodes, control_plane
):
    """A GPU fallen off the bus (XID 79) is one NVIDIA's plugin reports unhealthy; a
    pending row remap is not. The driver's files are there for containers."""
    api = control_plane.admin_api()
    driver = gpu_nodes.nodes.paths(NVLINK_NODE).driver
    gpus = TOPOLOGY.node(NVLINK_NODE).gpus
    assert driver.nvidia_smi.stat().st_mode & 0o111
    assert [p.name for p in sorted((driver.view_dir / gpudriver.VIEW_GPUS_DIR).iterdir())] == (
        sorted(g.uuid for g in gpus)
    )
    try:
        gpudriver.inject_fault(driver.state, "row-remap-pending", gpus[0].uuid)
        gpudriver.inject_fault(driver.state, "lost", gpus[1].uuid)
        wait_for(
            "the lost GPU to leave allocatable",
            lambda: _allocatable(api, NVLINK_NODE, GPU_RESOURCE) == str(len(gpus) - 1),
        )
    finally:
        gpudriver.clear_faults(driver.state)
    wait_for(
        "the GPU to return once the fault is cleared",
        lambda: _allocatable(api, NVLINK_NODE, GPU_RESOURCE) == str(len(gpus)),
    )


def test_the_cdi_strategy_hands_cdi_device_names_to_the_runtime(
    gpu_nodes, control_plane, namespace
):
    """With cdi-cri the kubelet passes the plugin's CDI names to containerd, whose
    own CDI support resolves them against the node's generated spec: the container
    gets its MIG device's parent GPU and the access rights of that MIG device only."""
    api = control_plane.admin_api()
    resource = "nvidia.com/mig-1g.10gb"
    api.post(f"/api/v1/namespaces/{namespace}/pods", _gpu_pod("cdi", 1, MIG_NODE, resource))

    pod = wait_for("the CDI pod to run", lambda: testing.running_pod(api, namespace, "cdi"))
    container_id = pod["status"]["containerStatuses"][0]["containerID"].split("://", 1)[1]
    pids = wait_for(
        "the container's process", lambda: testing.container_pids(MIG_NODE, container_id)
    )
    state = gpudriver.read_driver_state(gpu_nodes.nodes.paths(MIG_NODE).driver_state)
    caps_dir = f"/proc/{pids[0]}/root/dev/{gpudriver.NVIDIA_CAPS_DIR}"
    caps = {int(n.removeprefix("nvidia-cap")) for n in os.listdir(caps_dir)}
    (given,) = [
        (g, m)
        for g in state["gpus"]
        for m in g["mig"]
        if {m["gi_cap_minor"], m["ci_cap_minor"]} == caps
    ]
    assert given[1]["profile"] == "1g.10gb"
    dev = os.listdir(f"/proc/{pids[0]}/root/dev")
    assert sorted(n for n in dev if n.startswith("nvidia") and n[6:].isdigit()) == [
        f"nvidia{given[0]['minor']}"
    ]


def test_the_plugin_registers_again_after_a_kubelet_restart(gpu_nodes, control_plane):
    api = control_plane.admin_api()
    log = gpu_nodes.nodes.paths(NVLINK_NODE).logs / "device-plugin.log"

    def registrations() -> int:
        return log.read_text().count("registered with the kubelet")

    before = registrations()
    assert before >= 1
    gpu_nodes.nodes.restart_kubelet(NVLINK_NODE)
    wait_for("the plugin to register with the new kubelet", lambda: registrations() > before)
    wait_for(
        "all GPUs back in allocatable", lambda: _allocatable(api, NVLINK_NODE, GPU_RESOURCE) == "8"
    )
    # The new kubelet's ListAndWatch stream is live: a health change reaches it.
    state = gpu_nodes.nodes.paths(NVLINK_NODE).driver_state
    gpu = TOPOLOGY.node(NVLINK_NODE).gpus[3].uuid
    try:
        gpudriver.set_health(state, gpu, healthy=False)
        wait_for("7 GPUs allocatable", lambda: _allocatable(api, NVLINK_NODE, GPU_RESOURCE) == "7")
    finally:
        gpudriver.set_health(state, gpu, healthy=True)
    wait_for("8 GPUs allocatable", lambda: _allocatable(api, NVLINK_NODE, GPU_RESOURCE) == "8")


def test_down_restores_the_host(gpu_nodes):
    """Runs last in this module: it stops the GPU nodes, plugins included."""
    state_dir = gpu_nodes.nodes.state_dir
    status = nodes.status(state_dir)
    assert all(status[n]["device-plugin"] for n in NAMES)
    gpu_nodes.nodes.stop()
    after = hoststate.snapshot(state_dir / "nodes", gpu_nodes.roots)
    assert hoststate.differences(gpu_nodes.before, after) == []
    assert testing.processes_mentioning(str(state_dir / "nodes")) == []


def test_a_device_plugin_that_fails_fails_the_start_and_leaves_the_host(
    pytestconfig, control_plane, tmp_path
):
    """After the module's nodes are down: a GPU node whose plugin exits at once."""
    binaries = testing.node_binaries(pytestconfig)
    wrapper = tmp_path / "k8s"
    # The real kubelet, but a device plugin that finds no driver.
    wrapper.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = device-plugin ]; then echo "no NVIDIA driver" >&2; exit 3; fi\n'
        f'exec {binaries.k8s} "$@"\n'
    )
    wrapper.chmod(0o755)
    spec = TOPOLOGY.node(MIG_NODE)
    running = nodes.RealNodes(
        tmp_path / "state",
        control_plane,
        dataclasses.replace(binaries, k8s=wrapper),
        [spec.name],
        specs={spec.name: spec},
    )
    error = testing.failed_start(running, rf"device-plugin of node {spec.name} exited with code 3")
    assert "no NVIDIA driver" in str(error)
