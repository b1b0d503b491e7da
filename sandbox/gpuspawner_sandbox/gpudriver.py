"""The emulated NVIDIA driver of a real sandbox node: its state and its projections.

Each real GPU node has one directory (:class:`DriverPaths`, layout below) whose
aggregate state file (``<driver dir>/gpu-driver.json``) stands for what the
driver and NVML would report about the node's GPUs: driver and CUDA versions,
injected faults, and per GPU its index, UUID, name, memory, PCI bus id, device
minor (``/dev/nvidia<minor>``), serial, model facts, health, NVLink domain and
MIG devices (with their ``/dev/nvidia-caps`` minors). Our device plugin
(``k8s device-plugin``, ``sandbox/go/deviceplugin``) advertises and allocates
from it and re-reads it whenever it changes, so a health change here reaches
the real kubelet through ``ListAndWatch``. The CDI spec is generated from it.

Writing the state also writes its projections, the only files containers see:
``view/driver/driver.json`` and ``view/gpus/<UUID>/gpu.json``, read by the
emulated nvidia-smi (``sandbox/go/nvidiasmi``). They carry the *effects* of the
faults (GPU lost, ECC counts, driver not loaded, ...), so the nvidia-smi never
interprets fault kinds itself.

Faults (:data:`FAULT_KINDS`) are injected into a running node with
:func:`inject_fault` and removed with :func:`clear_faults`. A fault that
NVIDIA's device plugin notices (an XID it treats as critical) also marks the
device and its MIG devices unhealthy, so the kubelet withdraws them.

:func:`driver_state`, :func:`with_fault`, :func:`without_faults` and
:func:`projections` are pure; the rest is the thin file layer, writing
atomically so readers never see half a file.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .topology import GPUSpec, NodeSpec, cuda_version_for

DRIVER_STATE_FILE = "gpu-driver.json"

# --- where the emulated driver meets containers (issue 11) ---------------------------------
# The layout below is shared by the CDI spec (what NVIDIA's runtime injects), the emulated
# nvidia-smi (what it reads inside a container) and the emulated DCGM exporter (what it
# reads on the node). Under <node root>/<DRIVER_DIR_NAME>/ (DriverPaths):
#   gpu-driver.json                 the aggregate state (DRIVER_STATE_FILE): the device plugin's
#                                   --driver-state and the CDI spec's source; never in a container
#   bin/nvidia-smi                  the static emulated nvidia-smi, mounted at SMI_CONTAINER_PATH
#   dev/nvidia<minor>, dev/nvidiactl, dev/nvidia-uvm, dev/nvidia-caps/nvidia-cap<N>
#                                   character devices (NVIDIA_MAJOR, ...): nothing can open them
#   view/driver/driver.json         driver-level facts (version, CUDA, loaded), read-only in every
#                                   GPU container at <CONTAINER_VIEW_ROOT>/driver/
#   view/gpus/<GPU-UUID>/gpu.json   one GPU's facts and state (health, ECC, remapping, MIG layout),
#                                   read-only at <CONTAINER_VIEW_ROOT>/gpus/<GPU-UUID>/, only in
#                                   containers given that GPU or one of its MIG devices
#   usage/<UUID>/usage.json         what workloads on that GPU or MIG device report (one
#                                   directory per whole GPU and per MIG device, so MIG neighbours
#                                   never share figures), writable (mode 1777) at
#                                   <CONTAINER_VIEW_ROOT>/usage/<UUID>/:
#                                   {"gpu_util_percent": 0-100, "fb_used_mib": int, "until": unix
#                                   time}; it counts only while now < until (a dead workload's
#                                   figures expire), otherwise the GPU is idle (0 %, 0 MiB used)
# A container sees a GPU in nvidia-smi when both its view/gpus/<GPU-UUID>/ is mounted and its
# /dev/nvidia<minor> exists; a MIG device of it when, in addition, /dev/nvidia-caps/
# nvidia-cap<gi_cap_minor> and nvidia-cap<ci_cap_minor> (recorded per MIG device) exist. So
# a MIG device's CDI entry gives the parent's /dev/nvidia<minor>, both caps nodes, the
# parent GPU's view directory and the MIG device's own usage directory.
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
# File names inside the directories above, and the test-only override of the container
# roots: the emulated nvidia-smi prefixes /dev and CONTAINER_VIEW_ROOT with it, so tests
# can run it on the host against a driver dir (never set it in a container).
VIEW_DRIVER_DIR = "driver"
VIEW_GPUS_DIR = "gpus"
USAGE_DIR = "usage"
DRIVER_VIEW_FILE = "driver.json"
GPU_VIEW_FILE = "gpu.json"
USAGE_FILE = "usage.json"
EMULATED_ROOT_ENV = "GPUSPAWNER_EMULATED_ROOT"
# /dev/nvidia-caps minors of MIG access rights, as the driver numbers them in
# /proc/driver/nvidia-caps/mig-minors: config 1, monitor 2, then per GPU 15 GPU instances of
# 9 minors each (gpu<g>/gi<i>/access, then gpu<g>/gi<i>/ci0..7/access).
MIG_CAPS_FIRST = 3
MIG_CAPS_PER_GI = 9
MIG_CAPS_PER_GPU = 15 * MIG_CAPS_PER_GI
NVIDIA_CAPS_DIR = "nvidia-caps"


# PCI device ids (device << 16 | vendor) as NVML reports them, per topology model key.
PCI_DEVICE_IDS = {
    "A100-SXM4-80GB": "0x20B210DE",
    "A100-SXM4-40GB": "0x20B010DE",
    "H100-80GB-HBM3": "0x233010DE",
    "L40S": "0x26B910DE",
    "L4": "0x27B810DE",
    "T4": "0x1EB810DE",
}


@dataclass(frozen=True)
class FaultKind:
    """What one kind of injected fault is, and what it does."""

    #: "gpu": on one GPU (or every GPU of the node when none is named); "driver": node-wide.
    scope: str
    #: Whether NVIDIA's device plugin notices it (a critical XID event) and reports the GPU
    #: and its MIG devices unhealthy, so the kubelet withdraws them. A fault may override it.
    withdraws: bool
    help: str


#: The fault kinds, each with what it does to the GPU and whether the plugin notices.
FAULT_KINDS: dict[str, FaultKind] = {
    "missing": FaultKind(
        "gpu",
        False,
        "The GPU has vanished from the PCI bus: nvidia-smi does not list it (and says "
        "'No devices were found', exit 6, when no GPU is left). The plugin's health check "
        "waits for XID events and does not notice.",
    ),
    "lost": FaultKind(
        "gpu",
        True,
        "The GPU has fallen off the bus (XID 79): every nvidia-smi call that reaches it "
        "fails with 'GPU is lost', exit 15.",
    ),
    "ecc": FaultKind(
        "gpu",
        True,
        "Uncorrectable (double-bit) ECC errors (XID 48): the volatile and aggregate "
        "uncorrected counts are the fault's value (default 1), and on a GPU without MIG a row "
        "remap is pending.",
    ),
    "row-remap-pending": FaultKind(
        "gpu",
        False,
        "A row remapping waits for the next GPU reset: remapped_rows.pending is Yes, with "
        "the uncorrectable remapped rows counted (the fault's value, default 1).",
    ),
    "driver-too-old": FaultKind(
        "driver",
        False,
        "The node runs an older driver than its topology says (the fault's value, default "
        "470.82.01): nvidia-smi's banner, version and layout are that driver's.",
    ),
    "driver-not-loaded": FaultKind(
        "driver",
        False,
        "The kernel module is not loaded: every nvidia-smi call fails with exit 9.",
    ),
    "hung": FaultKind(
        "gpu",
        False,
        "The GPU is hung in the driver: nvidia-smi in a container given it never answers "
        "(it blocks reading the GPU's view, a FIFO nobody writes, until it is killed). "
        "Clearing the fault lets any nvidia-smi still blocked go.",
    ),
}
DEFAULT_OLD_DRIVER = "470.82.01"


@dataclass(frozen=True)
class DriverPaths:
    """The files of one node's emulated driver, under ``<node root>/<DRIVER_DIR_NAME>/``."""

    root: Path

    @classmethod
    def of_node(cls, node_root: Path) -> DriverPaths:
        return cls(Path(node_root) / DRIVER_DIR_NAME)

    @property
    def state(self) -> Path:
        """The aggregate state (what the device plugin and the CDI generator read)."""
        return self.root / DRIVER_STATE_FILE

    @property
    def bin_dir(self) -> Path:
        return self.root / "bin"

    @property
    def nvidia_smi(self) -> Path:
        return self.bin_dir / "nvidia-smi"

    @property
    def dev_dir(self) -> Path:
        return self.root / "dev"

    @property
    def view_dir(self) -> Path:
        return self.root / "view"

    @property
    def driver_view(self) -> Path:
        """Mounted read-only at ``<CONTAINER_VIEW_ROOT>/driver/`` in every GPU container."""
        return self.view_dir / VIEW_DRIVER_DIR

    def gpu_view(self, uuid: str) -> Path:
        """Mounted read-only at ``<CONTAINER_VIEW_ROOT>/gpus/<uuid>/``."""
        return self.view_dir / VIEW_GPUS_DIR / uuid

    def usage_dir(self, uuid: str) -> Path:
        """Mounted writable at ``<CONTAINER_VIEW_ROOT>/usage/<uuid>/``."""
        return self.root / USAGE_DIR / uuid


class DriverStateError(ValueError):
    """The driver state cannot be changed as asked; the message says why."""


def mig_cap_minors(gpu_minor: int, gi: int, ci: int) -> tuple[int, int]:
    """The ``/dev/nvidia-caps/nvidia-cap<N>`` minors granting a GI and a CI of a GPU."""
    gi_minor = MIG_CAPS_FIRST + gpu_minor * MIG_CAPS_PER_GPU + gi * MIG_CAPS_PER_GI
    return gi_minor, gi_minor + 1 + ci


def _gpu_state(gpu: GPUSpec) -> dict[str, Any]:
    model = gpu.model
    minor = gpu.index
    return {
        "index": gpu.index,
        "uuid": gpu.uuid,
        "name": model.name,
        "memory_mib": model.memory_mib,
        "bus_id": gpu.bus_id,
        "minor": minor,
        "health": HEALTHY,
        "nvlink_domain": gpu.nvlink_domain,
        "serial": gpu.serial,
        "pci_device_id": PCI_DEVICE_IDS.get(model.key, ""),
        "compute_cap": model.compute_cap,
        "ecc": model.ecc,
        "idle_power_w": model.idle_power_w,
        "power_cap_w": model.power_cap_w,
        "mig_enabled": gpu.mig_enabled,
        "faults": [],
        "mig": [
            {
                "index": mig.index,
                "uuid": mig.uuid,
                "profile": mig.profile.name,
                "memory_mib": mig.profile.memory_mib,
                "gi": mig.gi,
                "ci": mig.ci,
                "health": HEALTHY,
                "gi_cap_minor": mig_cap_minors(minor, mig.gi, mig.ci)[0],
                "ci_cap_minor": mig_cap_minors(minor, mig.gi, mig.ci)[1],
                "multiprocessors": mig.profile.multiprocessors,
                "bar1_mib": mig.profile.bar1_mib,
                "copy_engines": mig.profile.copy_engines,
                "decoders": mig.profile.decoders,
                "encoders": mig.profile.encoders,
                "jpeg": mig.profile.jpeg,
                "ofa": mig.profile.ofa,
            }
            for mig in gpu.mig
        ],
    }


def driver_state(node: NodeSpec) -> dict[str, Any]:
    """The emulated driver's state for a topology node, every device healthy, no faults."""
    return {
        "node": node.name,
        "driver_version": node.driver,
        "cuda_version": node.cuda_version,
        "faults": [],
        "gpus": [_gpu_state(gpu) for gpu in node.gpus],
    }


def _copy(state: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(state))


def _find_gpu(state: dict[str, Any], gpu: str) -> dict[str, Any]:
    for g in state["gpus"]:
        if gpu in (g["uuid"], str(g["index"])):
            return g
    raise DriverStateError(f"Node {state.get('node')} has no GPU {gpu}.")


def with_health(state: dict[str, Any], uuid: str, healthy: bool) -> dict[str, Any]:
    """A copy of ``state`` with one GPU's or MIG device's health set."""
    new = _copy(state)
    for gpu in new["gpus"]:
        for device in (gpu, *gpu.get("mig", [])):
            if device["uuid"] == uuid:
                device["health"] = HEALTHY if healthy else UNHEALTHY
                return new
    raise DriverStateError(f"Node {state.get('node')} has no GPU or MIG device {uuid}.")


def _withdrawn(fault: dict[str, Any]) -> bool:
    withdraw = fault.get("withdraw")
    return FAULT_KINDS[fault["kind"]].withdraws if withdraw is None else bool(withdraw)


def _with_fault_health(state: dict[str, Any], gpus: list[dict[str, Any]]) -> dict[str, Any]:
    """Set the health of ``gpus`` (whose faults changed) and their MIG devices from the
    faults: unhealthy while a withdrawing fault lasts. Other GPUs keep theirs, which
    :func:`with_health` may have set."""
    node_wide = any(_withdrawn(f) for f in state.get("faults", []))
    for gpu in gpus:
        bad = node_wide or any(_withdrawn(f) for f in gpu.get("faults", []))
        for device in (gpu, *gpu.get("mig", [])):
            device["health"] = UNHEALTHY if bad else HEALTHY
    return state


def with_fault(
    state: dict[str, Any],
    kind: str,
    gpu: str | None = None,
    value: str | None = None,
    withdraw: bool | None = None,
) -> dict[str, Any]:
    """A copy of ``state`` with a fault injected.

    ``gpu`` (a GPU's UUID or index) names the GPU of a per-GPU kind; None means every GPU
    of the node. ``withdraw`` overrides whether the device plugin notices the fault.
    """
    known = FAULT_KINDS.get(kind)
    if known is None:
        raise DriverStateError(
            f"Unknown fault kind {kind!r}; known kinds: {', '.join(FAULT_KINDS)}."
        )
    if known.scope == "driver" and gpu is not None:
        raise DriverStateError(f"The {kind!r} fault applies to a whole node, not to one GPU.")
    fault = {"kind": kind, "value": value, "withdraw": withdraw}
    new = _copy(state)
    hit = [_find_gpu(new, gpu)] if gpu is not None else new["gpus"]
    if known.scope == "driver":
        new.setdefault("faults", []).append(fault)
    else:
        for g in hit:
            g.setdefault("faults", []).append(dict(fault))
    return _with_fault_health(new, hit)


def without_faults(
    state: dict[str, Any], kind: str | None = None, gpu: str | None = None
) -> dict[str, Any]:
    """A copy of ``state`` without the faults of ``kind`` (all kinds when None).

    ``gpu`` limits it to one GPU's faults (node-wide ones stay). Devices without a
    withdrawing fault left are healthy again.
    """
    new = _copy(state)

    def keep(fault: dict[str, Any]) -> bool:
        return kind is not None and fault["kind"] != kind

    if gpu is None:
        new["faults"] = [f for f in new.get("faults", []) if keep(f)]
    hit = [_find_gpu(new, gpu)] if gpu is not None else new["gpus"]
    for g in hit:
        g["faults"] = [f for f in g.get("faults", []) if keep(f)]
    return _with_fault_health(new, hit)


def _value(fault: dict[str, Any], default: str) -> str:
    return str(fault.get("value") or default)


def projections(state: dict[str, Any]) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """What containers see: the driver's document and each GPU's, with faults as effects.

    The GPU documents keep the state's GPU fields and add ``missing``, ``lost``, ``hung``,
    ``ecc_errors_uncorrected``, ``remapped_rows_uncorrectable`` and
    ``remapped_rows_pending``; they drop the fault list itself. A ``hung`` document is never
    read: :func:`write_driver_state` writes it as a FIFO.
    """
    node_faults = {f["kind"]: f for f in state.get("faults", [])}
    driver_version = state["driver_version"]
    if "driver-too-old" in node_faults:
        driver_version = _value(node_faults["driver-too-old"], DEFAULT_OLD_DRIVER)
    driver = {
        "node": state["node"],
        "driver_version": driver_version,
        "cuda_version": cuda_version_for(driver_version),
        "loaded": "driver-not-loaded" not in node_faults,
    }
    gpus = {}
    for g in state["gpus"]:
        faults = g.get("faults", [])
        kinds = {f["kind"] for f in faults}
        ecc = sum(int(_value(f, "1")) for f in faults if f["kind"] == "ecc")
        remap = sum(int(_value(f, "1")) for f in faults if f["kind"] == "row-remap-pending")
        if not g["mig_enabled"]:
            # Hopper and Ampere remap a row for each uncorrectable error (not in MIG mode,
            # where nvidia-smi reports remapped rows as N/A).
            remap += ecc
        view = {k: v for k, v in g.items() if k != "faults"}
        view.update(
            missing="missing" in kinds,
            lost="lost" in kinds,
            hung="hung" in kinds,
            ecc_errors_uncorrected=ecc,
            remapped_rows_uncorrectable=remap,
            remapped_rows_pending=remap > 0,
        )
        gpus[g["uuid"]] = view
    return driver, gpus


def _write_json(path: Path, document: dict[str, Any]) -> None:
    """Replace ``path`` atomically, so a reader never sees half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(document, indent=2) + "\n")
    # A hung GPU's FIFO (_write_hung) is held open as a writer while it is replaced: whoever is
    # blocked opening it gets in, and reads an empty file at the close, instead of blocking on
    # an unlinked FIFO for good. O_RDWR, because a FIFO opened so never blocks (Linux).
    holder = os.open(path, os.O_RDWR | os.O_NONBLOCK) if path.is_fifo() else None
    try:
        os.replace(tmp, path)
    finally:
        if holder is not None:
            os.close(holder)


def _write_hung(path: Path) -> None:
    """Replace ``path`` with a FIFO nobody writes: opening it blocks, as a hung GPU's calls do.

    A FIFO, not a file that sleeps: the emulated nvidia-smi stays unchanged, and a blocked open
    is killable, so the GPU check's deadline can end it, like a hung driver call that returns
    on SIGKILL.
    """
    if path.is_fifo():
        return
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    os.mkfifo(tmp, 0o644)
    os.replace(tmp, path)


def usage_uuids(state: dict[str, Any]) -> list[str]:
    """The devices that have a usage directory: every whole GPU and every MIG device."""
    return [
        uuid
        for gpu in state["gpus"]
        for uuid in (gpu["uuid"], *(mig["uuid"] for mig in gpu.get("mig", [])))
    ]


def write_driver_state(path: Path, state: dict[str, Any]) -> None:
    """Write the state file and its projections (the state file is in the driver dir).

    Also creates each GPU's and each MIG device's usage directory, world-writable and
    sticky (mode 1777) as /tmp is, since workloads in containers of any user write their
    figures there.
    """
    paths = DriverPaths(Path(path).parent)
    driver, gpus = projections(state)
    paths.driver_view.mkdir(parents=True, exist_ok=True)
    for uuid, view in gpus.items():
        paths.gpu_view(uuid).mkdir(parents=True, exist_ok=True)
        if view["hung"]:
            _write_hung(paths.gpu_view(uuid) / GPU_VIEW_FILE)
        else:
            _write_json(paths.gpu_view(uuid) / GPU_VIEW_FILE, view)
    for uuid in usage_uuids(state):
        usage = paths.usage_dir(uuid)
        usage.mkdir(parents=True, exist_ok=True)
        usage.chmod(0o1777)
    _write_json(paths.driver_view / DRIVER_VIEW_FILE, driver)
    # The aggregate last: the plugin acts on it, and by then the views agree with it.
    _write_json(Path(path), state)


def read_driver_state(path: Path) -> dict[str, Any]:
    return json.loads(Path(path).read_text())


def set_health(path: Path, uuid: str, healthy: bool) -> None:
    """Mark a GPU or MIG device of a running node healthy or unhealthy."""
    write_driver_state(path, with_health(read_driver_state(path), uuid, healthy))


def inject_fault(
    path: Path,
    kind: str,
    uuid: str | None = None,
    value: str | None = None,
    withdraw: bool | None = None,
) -> None:
    """Inject a fault into a running node's driver (``path``: its state file).

    See :data:`FAULT_KINDS`; ``uuid`` (or a GPU index) names the GPU, None every GPU.
    """
    write_driver_state(path, with_fault(read_driver_state(path), kind, uuid, value, withdraw))


def clear_faults(path: Path, kind: str | None = None, uuid: str | None = None) -> None:
    """Remove injected faults from a running node's driver (all of them by default)."""
    write_driver_state(path, without_faults(read_driver_state(path), kind, uuid))
