"""NVIDIA's container runtime on real GPU nodes: what reaches a container, and the seed's
security story, shown with NVIDIA's own code.

Four GPU nodes run as real nodes, each with ``nvidia-container-runtime`` (CDI mode, the
node's generated CDI spec) as containerd's default runtime and our device plugin:

- ``rt-open``: four A100s, device list strategy ``envvar``, NVIDIA's default runtime
  settings (an unprivileged container's ``NVIDIA_VISIBLE_DEVICES`` is honoured);
- ``rt-closed``: two A100s, ``envvar``, with
  ``accept-nvidia-visible-devices-envvar-when-unprivileged = false`` (from the topology);
- ``rt-annotations``: two A100s, ``cdi-annotations`` (NVIDIA's runtime resolves the names);
- ``rt-cri``: one A100 in MIG's mixed strategy, ``cdi-cri`` (containerd resolves them).

What a container was given is read where a program in it would look: the ``nvidia*``
entries of its ``/dev`` and the driver's view directories (through ``/proc/<pid>/root``),
and compared with what the kubelet's device manager checkpointed for it.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import re
import subprocess
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient
from kubespawner.objects import make_pod

from gpuspawner.core import labels
from gpuspawner.core.catalog import parse_catalog
from gpuspawner.core.options import resolve_selection
from gpuspawner.core.podspec import requests_gpu, trait_values, visible_devices_env
from gpuspawner_sandbox import cdi, gpudriver, hoststate, nodeconfig, nodes, testing
from gpuspawner_sandbox.topology import (
    ACCEPT_ENVVAR_KEY,
    GPU_RESOURCE,
    GPU_TAINT_KEY,
    RUNTIME_KEY,
    parse_topology,
)

OPEN = "rt-open"
CLOSED = "rt-closed"
ANNOTATIONS = "rt-annotations"
CRI = "rt-cri"
TOPOLOGY = parse_topology(
    {
        "nodes": [
            {"name": OPEN, "gpu": {"model": "A100-SXM4-80GB", "count": 4}},
            {
                "name": CLOSED,
                "gpu": {"model": "A100-SXM4-80GB", "count": 2},
                RUNTIME_KEY: {ACCEPT_ENVVAR_KEY: False},
            },
            {"name": ANNOTATIONS, "gpu": {"model": "A100-SXM4-80GB", "count": 2}},
            {
                "name": CRI,
                "gpu": {"model": "A100-SXM4-80GB", "count": 1},
                "mig": {"strategy": "mixed", "profiles": {"3g.40gb": 1, "1g.10gb": 2}},
            },
        ]
    }
)
NAMES = [n.name for n in TOPOLOGY.nodes]
STRATEGIES = {OPEN: "envvar", CLOSED: "envvar", ANNOTATIONS: "cdi-annotations", CRI: "cdi-cri"}
#: Keeps other tests' pods (which may tolerate nvidia.com/gpu) off these nodes.
TAINT_KEY = "gpuspawner.test/nvidia-runtime"
TOLERATIONS = [
    {"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"},
    {"key": GPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"},
]
#: The control and UVM devices every container the runtime edits gets.
SHARED = {n.name for n in cdi.shared_device_nodes()}

wait_for = functools.partial(testing.wait_for, timeout=120, interval=0.3)


@dataclass
class Running:
    nodes: nodes.RealNodes
    before: dict[str, Any]
    roots: list[str]


@pytest.fixture(scope="module")
def gpu_nodes(pytestconfig, control_plane, tmp_path_factory):
    testing.node_binaries(pytestconfig)  # build (with progress) before the snapshot
    state_dir = tmp_path_factory.mktemp("nvidia-runtime")
    roots = [nodeconfig.cgroup_root(n) for n in NAMES]
    before = hoststate.snapshot(state_dir / "nodes", roots)
    with testing.running_real_nodes(
        state_dir,
        control_plane,
        NAMES,
        pytestconfig,
        taints=(f"{TAINT_KEY}=true:NoSchedule",),
        specs={n.name: n for n in TOPOLOGY.nodes},
        device_list_strategy=STRATEGIES,
    ) as running:
        yield Running(running, before, roots)


# -- pods ---------------------------------------------------------------------------


def _manifest(pod) -> dict:
    """A kubernetes model as the API takes it (KubeSpawner's own serialisation)."""

    async def serialize():
        async with ApiClient() as client:
            return client.sanitize_for_serialization(pod)

    return asyncio.run(serialize())


def _on(node: str) -> dict[str, str]:
    return {"kubernetes.io/hostname": node}


def kubespawner_cpu_pod(name: str, node: str, security_context: dict | None = None) -> dict:
    """The pod plain KubeSpawner builds for a CPU-only server of an image that says
    NVIDIA_VISIBLE_DEVICES=all, on a GPU node (the admin's tolerations let it there)."""
    return _manifest(
        make_pod(
            name=name,
            cmd=["sleep", "infinity"],
            port=8888,
            image=nodeconfig.CUDA_TOOL_IMAGE,
            image_pull_policy="Never",
            node_selector=_on(node),
            tolerations=TOLERATIONS,
            env={"JUPYTERHUB_USER": "alice"},
            container_security_context=security_context,
        )
    )


CATALOG = parse_catalog(
    {
        "images": {"cuda": {"image": nodeconfig.CUDA_TOOL_IMAGE}},
        "gpu_types": {"a100": {}},
    }
)
ADMIN = {
    "image": nodeconfig.CUDA_TOOL_IMAGE,
    "cpu_guarantee": None,
    "cpu_limit": None,
    "mem_guarantee": None,
    "mem_limit": None,
    "extra_resource_limits": {},
    "extra_resource_guarantees": {},
    "node_selector": {},
    "tolerations": TOLERATIONS,
    "node_affinity_required": [],
    "environment": {"JUPYTERHUB_USER": "alice"},
    "init_containers": [],
}


def gpuspawner_cpu_pod(name: str, node: str) -> dict:
    """The same server as GPUSpawner builds it: its trait values for a CPU-only selection,
    KubeSpawner's builder, then the variable GPUSpawner enforces on the finished pod."""
    selection = resolve_selection({"profile": "cuda", "gpus": "0"}, CATALOG)
    values = trait_values(ADMIN, selection, CATALOG, check_container=None)
    manifest = _manifest(
        make_pod(
            name=name,
            cmd=["sleep", "infinity"],
            port=8888,
            image=values["image"],
            image_pull_policy="Never",
            node_selector={**values["node_selector"], **_on(node)},
            tolerations=values["tolerations"],
            env=values["environment"],
        )
    )
    container = manifest["spec"]["containers"][0]
    value = visible_devices_env(requests_gpu(container.get("resources"), {GPU_RESOURCE}))
    env = [e for e in container["env"] if e["name"] != labels.ENV_VISIBLE_DEVICES]
    container["env"] = [*env, {"name": labels.ENV_VISIBLE_DEVICES, "value": value}]
    return manifest


def gpu_pod(name: str, node: str, count: int, resource: str = GPU_RESOURCE, image=None) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": _on(node),
            "tolerations": TOLERATIONS,
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "main",
                    "image": image or nodeconfig.TOOL_IMAGE,
                    "imagePullPolicy": "Never",
                    "args": ["sleep", "infinity"],
                    "resources": {"limits": {resource: str(count)}},
                }
            ],
        },
    }


# -- what a container sees -----------------------------------------------------------


@dataclass
class Seen:
    pod: dict
    pid: int
    devices: set[str]  # nvidia* entries of the container's /dev (nvidia-caps/… included)
    views: set[str]  # GPU UUIDs whose view directory is mounted
    env: dict[str, str]


def _nvidia_devices(root: str) -> set[str]:
    dev = os.path.join(root, "dev")
    found = {n for n in os.listdir(dev) if n.startswith("nvidia")}
    caps = os.path.join(dev, gpudriver.NVIDIA_CAPS_DIR)
    if os.path.isdir(caps):
        found.discard(gpudriver.NVIDIA_CAPS_DIR)
        found |= {f"{gpudriver.NVIDIA_CAPS_DIR}/{n}" for n in os.listdir(caps)}
    return found


def seen(api, namespace: str, name: str) -> Seen:
    def running():
        pod = api.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
        statuses = pod["status"].get("containerStatuses", [])
        if statuses and "waiting" in statuses[0]["state"]:
            waiting = statuses[0]["state"]["waiting"]
            assert waiting.get("reason") not in ("CreateContainerError", "RunContainerError"), (
                waiting
            )
        return pod if statuses and "running" in statuses[0]["state"] else None

    pod = wait_for(f"pod {name} to run", running)
    node = pod["spec"]["nodeName"]
    container_id = pod["status"]["containerStatuses"][0]["containerID"].split("://", 1)[1]
    pid = wait_for("the container's process", lambda: testing.container_pids(node, container_id))[0]
    root = f"/proc/{pid}/root"
    gpus = os.path.join(root, gpudriver.CONTAINER_VIEW_ROOT.strip("/"), gpudriver.VIEW_GPUS_DIR)
    views = set(os.listdir(gpus)) if os.path.isdir(gpus) else set()
    return Seen(pod, pid, _nvidia_devices(root), views, testing.process_environment(pid))


def smi_gpus(pid: int) -> set[str]:
    """The GPU UUIDs ``nvidia-smi -L`` lists, run inside the container's filesystem
    (its /dev, its mounts)."""
    result = subprocess.run(
        ["nsenter", f"--target={pid}", "--mount", "--", gpudriver.SMI_CONTAINER_PATH, "-L"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return set(re.findall(r"^GPU \d+: .*\(UUID: (GPU-[0-9a-f-]+)\)$", result.stdout, re.M))


def checkpointed(gpu_nodes: Running, node: str, pod: dict) -> list[str]:
    """The device ids the kubelet's device manager checkpointed for the pod's container."""
    path = gpu_nodes.nodes.paths(node).device_plugins / "kubelet_internal_checkpoint"
    entries = json.loads(path.read_text())["Data"]["PodDeviceEntries"]
    ids = []
    for entry in entries:
        if entry["PodUID"] == pod["metadata"]["uid"]:
            for numa_ids in entry["DeviceIDs"].values():
                ids += numa_ids
    return ids


def _state(gpu_nodes: Running, node: str) -> dict:
    return gpudriver.read_driver_state(gpu_nodes.nodes.paths(node).driver_state)


def gpu_devices(gpu_nodes: Running, node: str, uuids) -> set[str]:
    """The /dev entries of whole GPUs, from the node's driver state."""
    minors = {g["uuid"]: g["minor"] for g in _state(gpu_nodes, node)["gpus"]}
    return {f"nvidia{minors[u]}" for u in uuids}


def all_gpus(node: str) -> set[str]:
    return {g.uuid for g in TOPOLOGY.node(node).gpus}


# -- tests ---------------------------------------------------------------------------


def test_each_nodes_cdi_spec_is_valid_for_nvidias_tools(gpu_nodes, pytestconfig):
    ctk = testing.node_binaries(pytestconfig).nvidia_ctk
    for name in NAMES:
        listed = subprocess.run(
            [str(ctk), "cdi", "list", f"--spec-dir={gpu_nodes.nodes.paths(name).cdi_dir}"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        names = {line.strip() for line in listed.stdout.splitlines() if "=" in line}
        expected = {f"{cdi.CDI_KIND}={d}" for d in cdi.device_names(_state(gpu_nodes, name))}
        assert names == expected, listed.stderr


def test_an_envvar_pod_sees_exactly_its_two_gpus(gpu_nodes, control_plane, namespace):
    api = control_plane.admin_api()
    api.post(f"/api/v1/namespaces/{namespace}/pods", gpu_pod("two", OPEN, 2))
    got = seen(api, namespace, "two")
    allocated = checkpointed(gpu_nodes, OPEN, got.pod)
    assert len(set(allocated)) == 2
    assert got.devices == gpu_devices(gpu_nodes, OPEN, allocated) | SHARED
    assert got.views == set(allocated)
    # The spec's own edit, as NVIDIA's generated specs carry it.
    assert got.env[labels.ENV_VISIBLE_DEVICES] == cdi.VOID
    assert smi_gpus(got.pid) == set(allocated)


def test_the_hole_kubespawners_cpu_pod_gets_every_gpu_of_the_node(
    gpu_nodes, control_plane, namespace
):
    """(a) No GPU requested, but the image says NVIDIA_VISIBLE_DEVICES=all."""
    api = control_plane.admin_api()
    manifest = kubespawner_cpu_pod("kubespawner-cpu", OPEN)
    container = manifest["spec"]["containers"][0]
    assert "resources" not in container or not requests_gpu(container["resources"], {GPU_RESOURCE})
    assert all(e["name"] != labels.ENV_VISIBLE_DEVICES for e in container.get("env", []))
    api.post(f"/api/v1/namespaces/{namespace}/pods", manifest)
    got = seen(api, namespace, "kubespawner-cpu")
    assert checkpointed(gpu_nodes, OPEN, got.pod) == []
    assert got.devices == gpu_devices(gpu_nodes, OPEN, all_gpus(OPEN)) | SHARED
    assert got.views == all_gpus(OPEN)
    assert smi_gpus(got.pid) == all_gpus(OPEN)


def test_gpuspawners_void_closes_it(gpu_nodes, control_plane, namespace):
    """(b) The same server built by GPUSpawner: NVIDIA_VISIBLE_DEVICES=void."""
    api = control_plane.admin_api()
    manifest = gpuspawner_cpu_pod("gpuspawner-cpu", OPEN)
    env = {e["name"]: e.get("value") for e in manifest["spec"]["containers"][0]["env"]}
    assert env[labels.ENV_VISIBLE_DEVICES] == "void"
    api.post(f"/api/v1/namespaces/{namespace}/pods", manifest)
    got = seen(api, namespace, "gpuspawner-cpu")
    assert got.devices == set()
    assert got.views == set()
    assert not os.path.exists(f"/proc/{got.pid}/root{gpudriver.SMI_CONTAINER_PATH}")


def test_the_node_level_setting_closes_it(gpu_nodes, control_plane, namespace):
    """(c) accept-nvidia-visible-devices-envvar-when-unprivileged = false on the node."""
    config = gpu_nodes.nodes.paths(CLOSED).nvidia_runtime_config.read_text()
    assert f"{ACCEPT_ENVVAR_KEY} = false" in config
    api = control_plane.admin_api()
    api.post(f"/api/v1/namespaces/{namespace}/pods", kubespawner_cpu_pod("closed-cpu", CLOSED))
    got = seen(api, namespace, "closed-cpu")
    assert got.env[labels.ENV_VISIBLE_DEVICES] == "all"  # the image's, untouched
    assert got.devices == set()
    assert got.views == set()
    assert not os.path.exists(f"/proc/{got.pid}/root{gpudriver.SMI_CONTAINER_PATH}")


def test_a_privileged_container_bypasses_the_node_level_setting(
    gpu_nodes, control_plane, namespace
):
    """NVIDIA's runtime counts a container with CAP_SYS_ADMIN as privileged, and honours
    its variable whatever the node says: the setting is no defence against pods that may
    ask for that capability (admission has to stop those)."""
    api = control_plane.admin_api()
    manifest = kubespawner_cpu_pod(
        "closed-admin", CLOSED, security_context={"capabilities": {"add": ["SYS_ADMIN"]}}
    )
    api.post(f"/api/v1/namespaces/{namespace}/pods", manifest)
    got = seen(api, namespace, "closed-admin")
    assert got.devices == gpu_devices(gpu_nodes, CLOSED, all_gpus(CLOSED)) | SHARED
    assert smi_gpus(got.pid) == all_gpus(CLOSED)


def test_with_cdi_annotations_the_images_variable_is_ignored(gpu_nodes, control_plane, namespace):
    """(d) A one-GPU pod of the image that says =all, on a cdi-annotations node:
    NVIDIA's runtime takes the plugin's annotation and ignores the variable."""
    api = control_plane.admin_api()
    pod = gpu_pod("annotated", ANNOTATIONS, 1, image=nodeconfig.CUDA_TOOL_IMAGE)
    api.post(f"/api/v1/namespaces/{namespace}/pods", pod)
    got = seen(api, namespace, "annotated")
    (allocated,) = checkpointed(gpu_nodes, ANNOTATIONS, got.pod)
    assert got.devices == gpu_devices(gpu_nodes, ANNOTATIONS, [allocated]) | SHARED
    assert got.views == {allocated}
    assert smi_gpus(got.pid) == {allocated}


def test_on_a_cdi_node_a_cpu_pod_of_that_image_still_gets_every_gpu(
    gpu_nodes, control_plane, namespace
):
    """What the CDI strategies do not close: a pod given no devices has no annotation,
    so NVIDIA's runtime (with its defaults) reads the image's variable after all."""
    api = control_plane.admin_api()
    manifest = kubespawner_cpu_pod("cdi-node-cpu", ANNOTATIONS)
    api.post(f"/api/v1/namespaces/{namespace}/pods", manifest)
    got = seen(api, namespace, "cdi-node-cpu")
    assert checkpointed(gpu_nodes, ANNOTATIONS, got.pod) == []
    assert got.devices == gpu_devices(gpu_nodes, ANNOTATIONS, all_gpus(ANNOTATIONS)) | SHARED


def test_a_cdi_cri_mig_pod_sees_exactly_its_mig_devices(gpu_nodes, control_plane, namespace):
    """cdi-cri: containerd resolves the plugin's CDI names itself; the image's =all does
    nothing, since the spec's edit leaves the runtime NVIDIA_VISIBLE_DEVICES=void (d)."""
    api = control_plane.admin_api()
    pod = gpu_pod("mig", CRI, 2, "nvidia.com/mig-1g.10gb", image=nodeconfig.CUDA_TOOL_IMAGE)
    api.post(f"/api/v1/namespaces/{namespace}/pods", pod)
    got = seen(api, namespace, "mig")
    allocated = set(checkpointed(gpu_nodes, CRI, got.pod))
    (gpu,) = _state(gpu_nodes, CRI)["gpus"]
    migs = [m for m in gpu["mig"] if m["uuid"] in allocated]
    assert len(migs) == 2 and {m["profile"] for m in migs} == {"1g.10gb"}
    caps = {
        f"{gpudriver.NVIDIA_CAPS_DIR}/nvidia-cap{m[key]}"
        for m in migs
        for key in ("gi_cap_minor", "ci_cap_minor")
    }
    # The parent GPU's device, and the access rights of exactly those two MIG devices.
    assert got.devices == {f"nvidia{gpu['minor']}"} | caps | SHARED
    assert got.views == {gpu["uuid"]}
    assert got.env[labels.ENV_VISIBLE_DEVICES] == cdi.VOID


def test_down_restores_the_host(gpu_nodes):
    """Runs last in this module: it stops the GPU nodes."""
    state_dir = gpu_nodes.nodes.state_dir
    gpu_nodes.nodes.stop()
    after = hoststate.snapshot(state_dir / "nodes", gpu_nodes.roots)
    assert hoststate.differences(gpu_nodes.before, after) == []
    assert testing.processes_mentioning(str(state_dir / "nodes")) == []


def test_device_files_that_cannot_be_made_fail_the_start_and_leave_the_host(
    pytestconfig, control_plane, tmp_path, monkeypatch
):
    """After the module's nodes are down: mknod refused (no CAP_MKNOD, a nodev mount)."""
    binaries = testing.node_binaries(pytestconfig)
    spec = TOPOLOGY.node(CLOSED)

    def refused(*args, **kwargs):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(nodes.os, "mknod", refused)
    running = nodes.RealNodes(
        tmp_path / "state", control_plane, binaries, [spec.name], specs={spec.name: spec}
    )
    error = str(testing.failed_start(running, timeout=60))
    assert error.startswith("Cannot make the emulated driver's device file ")
    assert "(Operation not permitted): GPU nodes need root with CAP_MKNOD" in error
