"""The CDI spec of a GPU node, generated from its emulated driver's state (pure).

On a real GPU node ``nvidia-ctk cdi generate`` asks NVML which GPUs exist and
writes a Container Device Interface spec (kind ``nvidia.com/gpu``) naming each
device by index and UUID (MIG devices by ``<gpu>:<mig>`` and their ``MIG-``
UUID) plus ``all``. NVIDIA's container runtime in CDI mode, and containerd's
own CDI support, turn a requested name into the edits below. We have no NVML,
so :func:`cdi_spec` writes the same shape from the driver state
(:mod:`gpuspawner_sandbox.gpudriver`): per device its ``/dev/nvidia<minor>``
(and, for a MIG device, its ``/dev/nvidia-caps`` access rights) and the
driver's per-GPU view and usage directories; for every GPU container the
control and UVM devices, the emulated ``nvidia-smi``, the driver's view, and
``NVIDIA_VISIBLE_DEVICES=void`` (as NVIDIA's generated specs set it, so that
nothing downstream injects devices a second time).

Host paths come from :class:`gpudriver.DriverPaths`; the device files under its
``dev/`` are made by :mod:`gpuspawner_sandbox.nodes` from :func:`device_nodes`.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import Any

from .gpudriver import (
    CONTAINER_VIEW_ROOT,
    NVIDIA_CAPS_DIR,
    NVIDIA_CAPS_MAJOR,
    NVIDIA_MAJOR,
    NVIDIA_UVM_MAJOR,
    NVIDIA_UVM_MINOR,
    NVIDIA_UVM_TOOLS_MINOR,
    NVIDIACTL_MINOR,
    SMI_CONTAINER_PATH,
    USAGE_DIR,
    VIEW_DRIVER_DIR,
    VIEW_GPUS_DIR,
    DriverPaths,
)

#: The CDI kind of the node's GPUs (vendor/class), as NVIDIA's tools write it.
CDI_KIND = "nvidia.com/gpu"
#: hostPath in device nodes needs 0.5.0; nothing here needs more, and both
#: NVIDIA's runtime and containerd read it.
CDI_VERSION = "0.5.0"
#: The spec file's name in the node's CDI directory (CDI reads *.json and *.yaml).
CDI_SPEC_FILE = "nvidia.com-gpu.json"
#: The device every GPU container may name to get all of the node's GPUs.
ALL_DEVICES = "all"
#: What NVIDIA's generated specs set in every container they edit.
VISIBLE_DEVICES_ENV = "NVIDIA_VISIBLE_DEVICES"
VOID = "void"
#: crw-rw-rw-, as the driver's device files are on real nodes.
DEVICE_FILE_MODE = 0o666

_READ_ONLY = ["ro", "nosuid", "nodev", "bind"]
_WRITABLE = ["rw", "nosuid", "nodev", "bind"]


@dataclass(frozen=True)
class DeviceNode:
    """A character device of the emulated driver: its name under /dev, major, minor."""

    name: str  # e.g. "nvidia0", "nvidia-caps/nvidia-cap12"
    major: int
    minor: int

    @property
    def container_path(self) -> str:
        return "/dev/" + self.name


def _gpu_node(gpu: dict[str, Any]) -> DeviceNode:
    return DeviceNode(f"nvidia{gpu['minor']}", NVIDIA_MAJOR, gpu["minor"])


def _cap_node(minor: int) -> DeviceNode:
    return DeviceNode(f"{NVIDIA_CAPS_DIR}/nvidia-cap{minor}", NVIDIA_CAPS_MAJOR, minor)


def _mig_nodes(gpu: dict[str, Any], mig: dict[str, Any]) -> list[DeviceNode]:
    # The parent GPU's device, and the caps granting access to its GPU and compute instance.
    return [_gpu_node(gpu), _cap_node(mig["gi_cap_minor"]), _cap_node(mig["ci_cap_minor"])]


def shared_device_nodes() -> list[DeviceNode]:
    """The control and UVM devices every GPU container gets."""
    return [
        DeviceNode("nvidiactl", NVIDIA_MAJOR, NVIDIACTL_MINOR),
        DeviceNode("nvidia-uvm", NVIDIA_UVM_MAJOR, NVIDIA_UVM_MINOR),
        DeviceNode("nvidia-uvm-tools", NVIDIA_UVM_MAJOR, NVIDIA_UVM_TOOLS_MINOR),
    ]


def device_nodes(state: dict[str, Any]) -> list[DeviceNode]:
    """Every device file of the node's emulated driver, each once."""
    nodes = shared_device_nodes()
    for gpu in state["gpus"]:
        nodes.append(_gpu_node(gpu))
        for mig in gpu.get("mig", []):
            nodes += _mig_nodes(gpu, mig)
    return _unique(nodes)


def _unique(items: list) -> list:
    return list(dict.fromkeys(items))


def _device_node_edit(node: DeviceNode, driver: DriverPaths) -> dict[str, Any]:
    return {
        "path": node.container_path,
        "hostPath": str(driver.dev_dir / node.name),
        "type": "c",
        "major": node.major,
        "minor": node.minor,
        "fileMode": DEVICE_FILE_MODE,
    }


def _view_mount(gpu_uuid: str, driver: DriverPaths) -> dict[str, Any]:
    return {
        "hostPath": str(driver.gpu_view(gpu_uuid)),
        "containerPath": posixpath.join(CONTAINER_VIEW_ROOT, VIEW_GPUS_DIR, gpu_uuid),
        "options": _READ_ONLY,
    }


def _usage_mount(uuid: str, driver: DriverPaths) -> dict[str, Any]:
    return {
        "hostPath": str(driver.usage_dir(uuid)),
        "containerPath": posixpath.join(CONTAINER_VIEW_ROOT, USAGE_DIR, uuid),
        "options": _WRITABLE,
    }


def _edits(
    nodes: list[DeviceNode], views: list[str], usages: list[str], driver: DriverPaths
) -> dict[str, Any]:
    """Device nodes, the views of the GPUs in ``views`` and the usage dirs in ``usages``."""
    return {
        "deviceNodes": [_device_node_edit(n, driver) for n in _unique(nodes)],
        "mounts": [_view_mount(uuid, driver) for uuid in _unique(views)]
        + [_usage_mount(uuid, driver) for uuid in _unique(usages)],
    }


def device_names(state: dict[str, Any]) -> list[str]:
    """Every device name the spec defines (without the kind), in the spec's order."""
    names = []
    for gpu in state["gpus"]:
        names += [str(gpu["index"]), gpu["uuid"]]
        for mig in gpu.get("mig", []):
            names += [f"{gpu['index']}:{mig['index']}", mig["uuid"]]
    return [*names, ALL_DEVICES]


def cdi_spec(state: dict[str, Any], driver: DriverPaths) -> dict[str, Any]:
    """The node's CDI spec (a JSON document) for its driver state."""
    devices = []
    all_nodes: list[DeviceNode] = []
    all_views: list[str] = []
    all_usages: list[str] = []
    for gpu in state["gpus"]:
        nodes, views = [_gpu_node(gpu)], [gpu["uuid"]]
        edits = _edits(nodes, views, views, driver)
        devices += [{"name": n, "containerEdits": edits} for n in (str(gpu["index"]), gpu["uuid"])]
        all_nodes += nodes
        all_views += views
        all_usages += views
        for mig in gpu.get("mig", []):
            # A MIG device shows its parent GPU's state, as nvidia-smi shows the
            # parent of a MIG device, and has its own usage directory.
            nodes = _mig_nodes(gpu, mig)
            edits = _edits(nodes, views, [mig["uuid"]], driver)
            devices += [
                {"name": n, "containerEdits": edits}
                for n in (f"{gpu['index']}:{mig['index']}", mig["uuid"])
            ]
            all_nodes += nodes
            all_usages.append(mig["uuid"])
    devices.append(
        {"name": ALL_DEVICES, "containerEdits": _edits(all_nodes, all_views, all_usages, driver)}
    )
    return {
        "cdiVersion": CDI_VERSION,
        "kind": CDI_KIND,
        "devices": devices,
        "containerEdits": {
            "env": [f"{VISIBLE_DEVICES_ENV}={VOID}"],
            "deviceNodes": [_device_node_edit(n, driver) for n in shared_device_nodes()],
            "mounts": [
                {
                    "hostPath": str(driver.nvidia_smi),
                    "containerPath": SMI_CONTAINER_PATH,
                    "options": _READ_ONLY,
                },
                {
                    "hostPath": str(driver.driver_view),
                    "containerPath": posixpath.join(CONTAINER_VIEW_ROOT, VIEW_DRIVER_DIR),
                    "options": _READ_ONLY,
                },
            ],
        },
    }
