"""The emulated DCGM exporter on a real GPU node, scraped by a real Prometheus.

One GPU node (four A100s, device list strategy ``envvar``) runs as a real node
with its exporter (``sandbox/go/cmd/dcgm-exporter``) beside the kubelet. A pod
holds two GPUs through the kubelet's own device manager; the exporter learns
which through the kubelet's PodResources API, as NVIDIA's exporter does. Its
exposition and label mapping are unit-tested in Go (``sandbox/go/dcgm``); these
tests prove it against the real kubelet and a real Prometheus (Debian's package).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpuspawner_sandbox import gpudriver, hoststate, nodeconfig, nodes, testing
from gpuspawner_sandbox.topology import GPU_RESOURCE, parse_topology
from tests.culler.promserver import Prometheus, start_prometheus

NODE = "dcgm-gpu-0"
MIG_NODE = "dcgm-mig-0"
TOPOLOGY = parse_topology(
    {
        "nodes": [
            {"name": NODE, "gpu": {"model": "A100-SXM4-80GB", "count": 4}},
            {
                "name": MIG_NODE,
                "gpu": {"model": "A100-SXM4-80GB", "count": 1},
                "mig": {"strategy": "mixed", "profiles": {"3g.40gb": 1, "1g.10gb": 2}},
            },
        ]
    }
)
MIG_RESOURCE = "nvidia.com/mig-1g.10gb"
#: Keeps the other tests' pods (which may tolerate nvidia.com/gpu) off this node.
TAINT_KEY = "gpuspawner.test/dcgm"
UTIL = "DCGM_FI_DEV_GPU_UTIL"
#: The notebook images' gpu-burn-emulated (a standard-library script).
GPU_BURN = Path(__file__).resolve().parents[2] / "images" / "common" / "gpu-burn-emulated"

wait_for = functools.partial(testing.wait_for, timeout=120, interval=0.3)


@dataclass
class Running:
    nodes: nodes.RealNodes
    prometheus: Prometheus
    before: dict
    roots: list[str]


@pytest.fixture(scope="module")
def gpu_node(pytestconfig, control_plane, tmp_path_factory):
    testing.node_binaries(pytestconfig)  # build (with progress) before the snapshot
    state_dir = tmp_path_factory.mktemp("dcgm-node")
    roots = [nodeconfig.cgroup_root(n.name) for n in TOPOLOGY.nodes]
    before = hoststate.snapshot(state_dir / "nodes", roots)
    with testing.running_real_nodes(
        state_dir,
        control_plane,
        [NODE, MIG_NODE],
        pytestconfig,
        taints=(f"{TAINT_KEY}=true:NoSchedule",),
        specs={n.name: n for n in TOPOLOGY.nodes},
        device_list_strategy="envvar",
    ) as running:
        prometheus = start_prometheus(
            tmp_path_factory.mktemp("dcgm-prometheus"), running.dcgm_exporter(NODE)
        )
        try:
            yield Running(running, prometheus, before, roots)
        finally:
            prometheus.stop()


@dataclass
class Burner:
    namespace: str
    pod: dict
    #: NVIDIA_VISIBLE_DEVICES as the kubelet put it in the container's spec (from the
    #: plugin's Allocate); NVIDIA's runtime consumes it (the process sees ``void``).
    visible: list[str]
    #: The container's process on the host (its root: /proc/<pid>/root).
    pid: int


def _spec_environment(gpu_node: Running, container_id: str) -> dict[str, str]:
    """The container's environment in containerd's record (``ctr containers info``)."""
    holder = gpu_node.nodes.state["nodes"][NODE]["pids"]["holder"]
    paths = gpu_node.nodes.paths(NODE)
    result = subprocess.run(
        [
            "nsenter",
            f"--mount=/proc/{holder}/ns/mnt",
            "--",
            str(gpu_node.nodes.binaries.ctr),
            "--address",
            str(paths.containerd_socket),
            "-n",
            "k8s.io",
            "containers",
            "info",
            container_id,
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    env = json.loads(result.stdout)["Spec"]["process"]["env"]
    return dict(item.split("=", 1) for item in env)


@pytest.fixture(scope="module")
def burner(gpu_node, control_plane):
    """A pod holding two GPUs."""
    with testing.temporary_namespace(control_plane, "dcgm") as namespace:
        api = control_plane.admin_api()
        api.post(f"/api/v1/namespaces/{namespace}/pods", _gpu_pod("burner", 2))

        pod = wait_for("pod burner to run", lambda: testing.running_pod(api, namespace, "burner"))
        container_id = pod["status"]["containerStatuses"][0]["containerID"].split("://", 1)[1]
        pids = wait_for(
            "the container's process", lambda: testing.container_pids(NODE, container_id)
        )
        env = _spec_environment(gpu_node, container_id)
        yield Burner(namespace, pod, env["NVIDIA_VISIBLE_DEVICES"].split(","), pids[0])


def _gpu_pod(name: str, gpus: int, node: str = NODE, resource: str = GPU_RESOURCE) -> dict:
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


def _by_uuid(result: list[dict]) -> dict[str, dict]:
    return {item["metric"]["UUID"]: item for item in result}


def _list_pod_resources(gpu_node: Running, node: str = NODE) -> list[dict]:
    """``dcgm-exporter --list-pod-resources`` in the node's mount namespace (its kubelet)."""
    return gpu_node.nodes.pod_resources(node)


def _checkpointed(gpu_node: Running, pod_uid: str) -> list[str]:
    """The GPU ids the kubelet's device manager checkpointed for a pod."""
    path = gpu_node.nodes.paths(NODE).device_plugins / "kubelet_internal_checkpoint"
    ids = []
    for entry in json.loads(path.read_text())["Data"]["PodDeviceEntries"]:
        if entry["PodUID"] == pod_uid and entry["ResourceName"] == GPU_RESOURCE:
            for numa_ids in entry["DeviceIDs"].values():
                ids += numa_ids
    return sorted(ids)


def test_the_exporter_serves_on_the_node_ip_only(gpu_node):
    address = gpu_node.nodes.dcgm_exporter(NODE)
    ip, port = address.rsplit(":", 1)
    assert ip == gpu_node.nodes.node_ip(NODE)
    pid = gpu_node.nodes.state["nodes"][NODE]["pids"]["dcgm-exporter"]
    assert testing.listening_addresses(pid) == [(ip, int(port))]


def test_prometheus_sees_the_pods_two_gpus_with_its_labels_and_the_others_without(gpu_node, burner):
    namespace, visible = burner.namespace, burner.visible
    assert len(visible) == 2
    all_uuids = {gpu.uuid for gpu in TOPOLOGY.node(NODE).gpus}
    assert set(visible) < all_uuids

    def mapped(result):
        series = _by_uuid(result)
        return set(series) == all_uuids and {
            u for u, s in series.items() if s["metric"].get("pod")
        } == set(visible)

    result = _by_uuid(gpu_node.prometheus.wait_for(f'{UTIL}{{Hostname="{NODE}"}}', mapped))
    driver = gpudriver.driver_state(TOPOLOGY.node(NODE))
    for gpu in driver["gpus"]:
        labels = result[gpu["uuid"]]["metric"]
        assert labels["gpu"] == str(gpu["index"])
        assert labels["device"] == f"nvidia{gpu['minor']}"
        assert labels["pci_bus_id"] == gpu["bus_id"]
        assert labels["modelName"] == gpu["name"]
        assert labels["DCGM_FI_DRIVER_VERSION"] == driver["driver_version"]
        owner = (labels.get("namespace"), labels.get("pod"), labels.get("container"))
        if gpu["uuid"] in visible:
            assert owner == (namespace, "burner", "main")
        else:
            # Prometheus drops empty labels: a free GPU has none of the three.
            assert owner == (None, None, None)


def test_list_pod_resources_agrees_with_the_checkpoint_and_the_environment(gpu_node, burner):
    namespace, pod, visible = burner.namespace, burner.pod, burner.visible
    listed = [
        a
        for a in _list_pod_resources(gpu_node)
        if a["namespace"] == namespace and a["pod"] == "burner"
    ]
    assert listed == [
        {
            "namespace": namespace,
            "pod": "burner",
            "container": "main",
            "resource": GPU_RESOURCE,
            "device_ids": sorted(visible),
        }
    ]
    assert _checkpointed(gpu_node, pod["metadata"]["uid"]) == sorted(visible)


def test_a_usage_file_raises_exactly_its_gpus_utilisation_until_it_expires(gpu_node, burner):
    visible = burner.visible
    busy = visible[0]
    usage_file = gpu_node.nodes.paths(NODE).driver.usage_dir(busy) / gpudriver.USAGE_FILE
    usage_file.parent.mkdir(parents=True, exist_ok=True)
    # long enough for the exporter and Prometheus (1 s scrapes) to see it first
    until = time.time() + 8
    tmp = usage_file.with_name("usage.json.tmp")
    # As a workload writes it: atomically, with an expiry.
    tmp.write_text(json.dumps({"gpu_util_percent": 73, "fb_used_mib": 1234, "until": until}))
    tmp.replace(usage_file)
    try:
        query = f'{UTIL}{{Hostname="{NODE}"}}'
        result = _by_uuid(
            gpu_node.prometheus.wait_for(
                query, lambda r: _by_uuid(r).get(busy, {}).get("value", [0, "0"])[1] == "73"
            )
        )
        assert {u for u, s in result.items() if s["value"][1] != "0"} == {busy}
        used = _by_uuid(
            gpu_node.prometheus.query(f'DCGM_FI_DEV_FB_USED{{UUID="{busy}"}}')["data"]["result"]
        )
        assert used[busy]["value"][1] == "1234"
        # After `until` the figures no longer count: the GPU is idle again.
        gpu_node.prometheus.wait_for(
            query,
            lambda r: len(r) == 4 and all(s["value"][1] == "0" for s in r),
            timeout=60,
        )
        assert time.time() >= until
    finally:
        usage_file.unlink(missing_ok=True)


def test_gpu_burn_emulated_in_the_pods_container_drives_exactly_its_gpus(gpu_node, burner):
    """The notebook images' command, on the usage directories NVIDIA's runtime mounted
    into the pod's container (seen through the container's root), not the host's."""
    visible = burner.visible
    view = f"/proc/{burner.pid}/root{gpudriver.CONTAINER_VIEW_ROOT}/{gpudriver.USAGE_DIR}"
    # NVIDIA's runtime mounted exactly the pod's GPUs' usage directories.
    assert sorted(os.listdir(view)) == sorted(visible)
    burn = subprocess.Popen(
        [sys.executable, str(GPU_BURN), "300", "80"],
        env={**os.environ, "GPU_BURN_USAGE_DIR": view},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    query = f'{UTIL}{{Hostname="{NODE}"}}'
    try:
        result = _by_uuid(
            gpu_node.prometheus.wait_for(
                query,
                lambda r: (
                    {u for u, s in _by_uuid(r).items() if s["value"][1] == "80"} == set(visible)
                ),
            )
        )
        assert {u for u, s in result.items() if s["value"][1] != "0"} == set(visible)
    finally:
        burn.terminate()
        out, err = burn.communicate(timeout=30)
    assert burn.returncode == 0, err
    # It saw exactly the container's two GPUs.
    assert f"Burning {', '.join(sorted(visible))} at 80%" in out
    # Ended (here by SIGTERM): idle at once, long before its 300 s.
    gpu_node.prometheus.wait_for(
        query, lambda r: len(r) == 4 and all(s["value"][1] == "0" for s in r)
    )


_SERIES = re.compile(r"^(\w+)\{(.*)\} (\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def _scrape(address: str) -> list[tuple[str, dict[str, str], str]]:
    """One scrape of an exporter's /metrics: (metric, labels, value) per series."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as response:
        text = response.read().decode()
    series = []
    for line in text.splitlines():
        if m := _SERIES.match(line):
            series.append((m.group(1), dict(_LABEL.findall(m.group(2))), m.group(3)))
    return series


def test_a_mig_node_is_reported_per_mig_instance_with_its_pod(gpu_node, control_plane):
    (gpu,) = TOPOLOGY.node(MIG_NODE).gpus
    with testing.temporary_namespace(control_plane, "dcgm-mig") as namespace:
        api = control_plane.admin_api()
        api.post(f"/api/v1/namespaces/{namespace}/pods", _gpu_pod("mig", 1, MIG_NODE, MIG_RESOURCE))

        def allocated():
            return [
                a
                for a in _list_pod_resources(gpu_node, MIG_NODE)
                if a["namespace"] == namespace and a["pod"] == "mig"
            ]

        (assignment,) = wait_for("the MIG device's allocation", allocated)
        assert assignment["resource"] == MIG_RESOURCE
        (held,) = assignment["device_ids"]
        mig = next(m for m in gpu.mig if m.uuid == held)

        series = _scrape(gpu_node.nodes.dcgm_exporter(MIG_NODE))
        metrics = {metric for metric, _, _ in series}
        # NVML has no utilisation per MIG device: its activity is GR_ENGINE_ACTIVE.
        assert "DCGM_FI_DEV_GPU_UTIL" not in metrics
        assert {"DCGM_FI_DEV_FB_USED", "DCGM_FI_PROF_GR_ENGINE_ACTIVE"} <= metrics
        used = [labels for metric, labels, _ in series if metric == "DCGM_FI_DEV_FB_USED"]
        assert len(used) == len(gpu.mig) == 3
        for labels in used:
            # Each instance carries its parent GPU's identity.
            assert (labels["gpu"], labels["UUID"]) == (str(gpu.index), gpu.uuid)
            assert labels["Hostname"] == MIG_NODE
        assert sorted((lab["GPU_I_PROFILE"], lab["GPU_I_ID"]) for lab in used) == sorted(
            (m.profile.name, str(m.gi)) for m in gpu.mig
        )
        owned = [labels for labels in used if labels["pod"]]
        assert len(owned) == 1
        assert (owned[0]["GPU_I_PROFILE"], owned[0]["GPU_I_ID"]) == (mig.profile.name, str(mig.gi))
        assert (owned[0]["namespace"], owned[0]["pod"], owned[0]["container"]) == (
            namespace,
            "mig",
            "main",
        )


def test_down_stops_the_exporters_and_restores_the_host(gpu_node):
    """Runs late in this module: it stops the GPU nodes, exporters included."""
    state_dir = gpu_node.nodes.state_dir
    assert all(nodes.status(state_dir)[n.name]["dcgm-exporter"] for n in TOPOLOGY.nodes)
    address = gpu_node.nodes.dcgm_exporter(NODE)
    gpu_node.nodes.stop()
    after = hoststate.snapshot(state_dir / "nodes", gpu_node.roots)
    assert hoststate.differences(gpu_node.before, after) == []
    assert testing.processes_mentioning(str(state_dir / "nodes")) == []
    with pytest.raises(OSError):
        _scrape(address)


def test_an_exporter_that_fails_fails_the_start_and_leaves_the_host(
    pytestconfig, control_plane, tmp_path
):
    """After the module's nodes are down: a GPU node whose exporter exits at once."""
    binaries = testing.node_binaries(pytestconfig)
    broken = tmp_path / "dcgm-exporter"
    broken.write_text('#!/bin/sh\necho "no DCGM here" >&2\nexit 3\n')
    broken.chmod(0o755)
    spec = TOPOLOGY.node(NODE)
    running = nodes.RealNodes(
        tmp_path / "state",
        control_plane,
        dataclasses.replace(binaries, dcgm_exporter=broken),
        [spec.name],
        specs={spec.name: spec},
    )
    error = testing.failed_start(running, rf"dcgm-exporter of node {spec.name} exited with code 3")
    assert "no DCGM here" in str(error)
