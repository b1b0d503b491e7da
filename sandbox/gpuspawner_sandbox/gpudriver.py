"""The emulated NVIDIA driver of a real sandbox node: its state file.

Each real GPU node has one JSON file (``<node root>/gpu-driver.json``) that
stands for what the driver and NVML would report about the node's GPUs:
driver and CUDA versions, and per GPU its index, UUID, name, memory, PCI bus
id, device minor (``/dev/nvidia<minor>``), health, NVLink domain and MIG
devices. Our device plugin (``k8s device-plugin``, ``sandbox/go/deviceplugin``)
advertises and allocates from it and re-reads it whenever it changes, so a
health change here reaches the real kubelet through ``ListAndWatch``. It is
also what a per-node CDI spec is to be generated from (issue 11).

:func:`driver_state` is pure (topology in, document out); the rest is the thin
file layer, writing atomically so the plugin never reads half a file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .topology import NodeSpec

DRIVER_STATE_FILE = "gpu-driver.json"

# --- where the emulated driver meets containers (issue 11) ---------------------------------
# The layout below is shared by the CDI spec (what NVIDIA's runtime injects), the emulated
# nvidia-smi (what it reads inside a container) and the emulated DCGM exporter (what it
# reads on the node). Under <node root>/<DRIVER_DIR_NAME>/:
#   bin/nvidia-smi                  the static emulated nvidia-smi, mounted at SMI_CONTAINER_PATH
#   dev/nvidia<minor>, dev/nvidiactl, dev/nvidia-uvm, dev/nvidia-caps/nvidia-cap<N>
#                                   character devices (NVIDIA_MAJOR, ...): nothing can open them
#   view/driver/driver.json         driver-level facts (version, CUDA, loaded), read-only in every
#                                   GPU container at <CONTAINER_VIEW_ROOT>/driver/
#   view/gpus/<GPU-UUID>/gpu.json   one GPU's facts and state (health, ECC, remapping, MIG layout),
#                                   read-only at <CONTAINER_VIEW_ROOT>/gpus/<GPU-UUID>/, only in
#                                   containers given that GPU or one of its MIG devices
#   usage/<GPU-UUID>/usage.json     what workloads on that GPU report, writable (mode 1777) at
#                                   <CONTAINER_VIEW_ROOT>/usage/<GPU-UUID>/:
#                                   {"gpu_util_percent": 0-100, "fb_used_mib": int, "until": unix
#                                   time}; it counts only while now < until (a dead workload's
#                                   figures expire), otherwise the GPU is idle (0 %, 0 MiB used)
# Directories, never single files, are mounted: files are replaced atomically (rename), which a
# file bind mount would not follow.
DRIVER_DIR_NAME = "nvidia-driver"
CONTAINER_VIEW_ROOT = "/run/nvidia-emulated"
SMI_CONTAINER_PATH = "/usr/bin/nvidia-smi"
NVIDIA_MAJOR = 195
NVIDIACTL_MINOR = 255
# nvidia-uvm and nvidia-caps get dynamic majors from the kernel; these are ones real
# nodes show (/proc/devices), recorded so the device files and the CDI spec agree.
NVIDIA_UVM_MAJOR = 510
NVIDIA_UVM_MINOR = 0
NVIDIA_UVM_TOOLS_MINOR = 1
NVIDIA_CAPS_MAJOR = 511
HEALTHY = "healthy"
UNHEALTHY = "unhealthy"


class DriverStateError(ValueError):
    """The driver state cannot be changed as asked; the message says why."""


def driver_state(node: NodeSpec) -> dict[str, Any]:
    """The emulated driver's state for a topology node, every device healthy."""
    return {
        "node": node.name,
        "driver_version": node.driver,
        "cuda_version": node.cuda_version,
        "gpus": [
            {
                "index": gpu.index,
                "uuid": gpu.uuid,
                "name": gpu.model.name,
                "memory_mib": gpu.model.memory_mib,
                "bus_id": gpu.bus_id,
                "minor": gpu.index,
                "health": HEALTHY,
                "nvlink_domain": gpu.nvlink_domain,
                "mig": [
                    {
                        "index": mig.index,
                        "uuid": mig.uuid,
                        "profile": mig.profile.name,
                        "memory_mib": mig.profile.memory_mib,
                        "gi": mig.gi,
                        "ci": mig.ci,
                        "health": HEALTHY,
                    }
                    for mig in gpu.mig
                ],
            }
            for gpu in node.gpus
        ],
    }


def with_health(state: dict[str, Any], uuid: str, healthy: bool) -> dict[str, Any]:
    """A copy of ``state`` with one GPU's or MIG device's health set."""
    new = json.loads(json.dumps(state))
    for gpu in new["gpus"]:
        for device in (gpu, *gpu.get("mig", [])):
            if device["uuid"] == uuid:
                device["health"] = HEALTHY if healthy else UNHEALTHY
                return new
    raise DriverStateError(f"Node {state.get('node')} has no GPU or MIG device {uuid}.")


def write_driver_state(path: Path, state: dict[str, Any]) -> None:
    """Write the state file atomically (the plugin polls it)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(state, indent=2) + "\n")
    os.replace(tmp, path)


def read_driver_state(path: Path) -> dict[str, Any]:
    return json.loads(Path(path).read_text())


def set_health(path: Path, uuid: str, healthy: bool) -> None:
    """Mark a GPU or MIG device of a running node healthy or unhealthy."""
    write_driver_state(path, with_health(read_driver_state(path), uuid, healthy))
