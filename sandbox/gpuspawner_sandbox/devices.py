"""Emulated GPUs on the sandbox nodes: the device plugin and the kubelet's device manager.

Per node, :class:`DevicePool` holds the devices a device plugin would advertise
(whole GPUs, or MIG devices under a MIG strategy), hands concrete device ids to
a container the way the kubelet's device manager plus the plugin's
``Allocate`` do (the answer is ``NVIDIA_VISIBLE_DEVICES=<uuids>``), takes them
back when the pod ends, and withdraws unhealthy devices from the node's
allocatable the way ``ListAndWatch`` reporting ``Unhealthy`` does — a pod
already holding such a device keeps it.

Faults are injected through a JSON file in the sandbox state directory
(``faults.json``), read by the local kubelet (health) and by every emulated
``nvidia-smi`` call (what the container sees). ``python -m
gpuspawner_sandbox.devices inject|clear|list`` edits it; tests may call
:func:`inject_fault` / :func:`clear_faults` directly.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .topology import GPU_RESOURCE, NodeSpec

FAULTS_FILE = "faults.json"

#: Fault kinds, what they do to nvidia-smi, and whether the device plugin
#: notices them by default (marks the device unhealthy).
FAULT_KINDS = {
    # The device is gone from the PCI bus listing: nvidia-smi does not show it.
    "missing": True,
    # Uncorrectable (double-bit) ECC errors: counts > 0, rows pending remap (XID 48).
    "ecc": True,
    # The GPU has fallen off the bus: nvidia-smi fails with "GPU is lost" (XID 79).
    "lost": True,
    # The node runs an older driver than the topology says (the plugin does not care).
    "driver-too-old": False,
    # The kernel module is not loaded: every nvidia-smi call fails with rc 9.
    "driver-not-loaded": False,
}
NODE_ONLY_KINDS = ("driver-too-old", "driver-not-loaded")
DEFAULT_OLD_DRIVER = "470.82.01"


class DeviceError(RuntimeError):
    """A device request the node cannot satisfy (the kubelet rejects the pod)."""


@dataclass(frozen=True)
class Fault:
    """One injected fault, on a whole node (``gpu`` None) or one GPU (index or UUID)."""

    node: str
    kind: str
    gpu: str | None = None
    #: Whether the device plugin reports the device unhealthy (None: the kind's default).
    #: False emulates a fault the plugin's health check has not caught, so only the
    #: spawner's own validation can see it.
    withdraw: bool | None = None
    #: For "ecc": the uncorrected error count; for "driver-too-old": the driver version.
    value: str | None = None

    def matches(self, node: str, index: int, uuid: str) -> bool:
        if self.node != node:
            return False
        return self.gpu is None or self.gpu in (str(index), uuid)

    @property
    def withdraws(self) -> bool:
        return FAULT_KINDS[self.kind] if self.withdraw is None else self.withdraw


def validate_fault(fault: Fault) -> None:
    if fault.kind not in FAULT_KINDS:
        raise ValueError(
            f"Unknown fault kind {fault.kind!r}; known kinds: {', '.join(FAULT_KINDS)}."
        )
    if fault.kind in NODE_ONLY_KINDS and fault.gpu is not None:
        raise ValueError(f"The {fault.kind!r} fault applies to a whole node, not to one GPU.")


def effective_driver(node: str, configured: str, faults: list[Fault]) -> str:
    """The driver a node really runs: its configured one unless "driver-too-old" is injected."""
    for f in faults:
        if f.node == node and f.gpu is None and f.kind == "driver-too-old":
            return f.value or DEFAULT_OLD_DRIVER
    return configured


def faults_path(state_dir: Path | str) -> Path:
    return Path(state_dir) / FAULTS_FILE


def load_faults(path: Path | str) -> list[Fault]:
    """Read the faults file; a missing or empty file means no faults."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return []
    if not text.strip():
        return []
    data = json.loads(text)
    return [Fault(**entry) for entry in data.get("faults", [])]


def write_faults(path: Path | str, faults: list[Fault]) -> None:
    """Replace the faults file atomically, so readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = json.dumps({"faults": [asdict(f) for f in faults]}, indent=2)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".faults-")
    with os.fdopen(fd, "w") as f:
        f.write(payload)
    os.replace(tmp, path)


def inject_fault(state_dir: Path | str, fault: Fault) -> None:
    """Add ``fault`` to the sandbox's faults file."""
    validate_fault(fault)
    path = faults_path(state_dir)
    write_faults(path, [*load_faults(path), fault])


def clear_faults(state_dir: Path | str, node: str | None = None, gpu: str | None = None) -> None:
    """Remove the faults of ``node`` (and ``gpu``), or all faults when ``node`` is None."""
    path = faults_path(state_dir)
    keep = [
        f
        for f in load_faults(path)
        if node is not None and (f.node != node or (gpu is not None and f.gpu != gpu))
    ]
    write_faults(path, keep)


@dataclass(frozen=True)
class Device:
    """One allocatable device as the device plugin advertises it."""

    id: str  # the GPU or MIG UUID, as in NVIDIA_VISIBLE_DEVICES
    resource: str
    gpu_index: int  # index of the physical GPU on the node
    gpu_uuid: str
    mig_index: int | None = None


def node_devices(node: NodeSpec) -> list[Device]:
    """Every device the node's device plugin would advertise, in a stable order."""
    devices = []
    for gpu in node.gpus:
        if not gpu.mig:
            devices.append(Device(gpu.uuid, GPU_RESOURCE, gpu.index, gpu.uuid))
            continue
        for mig in gpu.mig:
            resource = (
                GPU_RESOURCE
                if node.mig_strategy == "single"
                else f"nvidia.com/mig-{mig.profile.name}"
            )
            devices.append(Device(mig.uuid, resource, gpu.index, gpu.uuid, mig.index))
    return devices


class DevicePool:
    """The devices of one node, who holds them, and which are healthy."""

    def __init__(self, node: NodeSpec):
        self.node = node
        self.devices = node_devices(node)
        self._owner: dict[str, str] = {}  # device id -> owner key
        self._unhealthy: set[str] = set()

    @property
    def resources(self) -> set[str]:
        return {d.resource for d in self.devices}

    def capacity(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for d in self.devices:
            counts[d.resource] = counts.get(d.resource, 0) + 1
        return counts

    def allocatable(self) -> dict[str, int]:
        """Capacity less unhealthy devices (allocated ones still count, as in the kubelet)."""
        counts = dict.fromkeys(self.capacity(), 0)
        for d in self.devices:
            if d.id not in self._unhealthy:
                counts[d.resource] += 1
        return counts

    def set_faults(self, faults: list[Fault]) -> bool:
        """Recompute health from the current faults; True when allocatable changed."""
        before = set(self._unhealthy)
        self._unhealthy = {
            d.id
            for d in self.devices
            for f in faults
            if f.withdraws and f.matches(self.node.name, d.gpu_index, d.gpu_uuid)
        }
        return before != self._unhealthy

    def is_healthy(self, device_id: str) -> bool:
        return device_id not in self._unhealthy

    def allocated_to(self, owner: str) -> list[Device]:
        return [d for d in self.devices if self._owner.get(d.id) == owner]

    def allocate(self, owner: str, resource: str, count: int) -> list[Device]:
        """Give ``count`` free healthy devices of ``resource`` to ``owner``.

        The same owner asking again gets the devices it already holds (a restarted
        container keeps its GPUs, as with the kubelet's checkpointed assignments).
        """
        held = [d for d in self.allocated_to(owner) if d.resource == resource]
        if len(held) >= count:
            return held[:count]
        free = [
            d
            for d in self.devices
            if d.resource == resource and d.id not in self._owner and d.id not in self._unhealthy
        ]
        if len(free) < count - len(held):
            raise DeviceError(
                f"Requested {count} of {resource}, but only {len(free) + len(held)} healthy "
                f"and free on node {self.node.name}."
            )
        chosen = free[: count - len(held)]
        for d in chosen:
            self._owner[d.id] = owner
        return held + chosen

    def free_count(self, resource: str) -> int:
        """Healthy devices of ``resource`` that nobody holds."""
        return sum(
            1
            for d in self.devices
            if d.resource == resource and d.id not in self._owner and d.id not in self._unhealthy
        )

    def release(self, owner: str) -> list[Device]:
        freed = self.allocated_to(owner)
        for d in freed:
            del self._owner[d.id]
        return freed

    def owners(self) -> set[str]:
        return set(self._owner.values())


def visible_devices_env(devices: list[Device]) -> dict[str, str]:
    """What the NVIDIA device plugin's ``Allocate`` answers (the envvar strategy)."""
    return {"NVIDIA_VISIBLE_DEVICES": ",".join(d.id for d in devices)}


def resolve_visible(node: NodeSpec, value: str | None) -> tuple[bool, list[Device]]:
    """What the NVIDIA container runtime makes of ``NVIDIA_VISIBLE_DEVICES``.

    Returns (driver injected, devices). Unset, empty or ``void``: nothing is
    injected (no nvidia-smi). ``none``: the driver and tools, no device.
    ``all``: every device of the node. Otherwise a comma list of UUIDs or indices.
    """
    if not node.gpus or value is None or value.strip() in ("", "void"):
        return False, []
    value = value.strip()
    if value == "none":
        return True, []
    devices = node_devices(node)
    if value == "all":
        # With MIG enabled, "all" shows every MIG device of every GPU.
        return True, devices
    by_id = {d.id: d for d in devices}
    by_gpu = {str(g.index): g.uuid for g in node.gpus}
    chosen = []
    for item in value.split(","):
        item = item.strip()
        if item in by_gpu:
            item = by_gpu[item]
        if item in by_id:
            chosen.append(by_id[item])
        else:
            chosen.extend(d for d in devices if d.gpu_uuid == item)
    return True, chosen


def container_device_state(node: NodeSpec, devices: list[Device], faults_file: Path) -> dict:
    """The JSON the emulated nvidia-smi of one container reads: its GPUs and where faults live."""
    gpus: dict[int, dict[str, Any]] = {}
    for d in devices:
        spec = node.gpus[d.gpu_index]
        entry = gpus.setdefault(
            d.gpu_index,
            {
                "index": spec.index,
                "uuid": spec.uuid,
                "model": spec.model.key,
                "bus_id": spec.bus_id,
                "serial": spec.serial,
                "mig_enabled": spec.mig_enabled,
                "mig": [],
            },
        )
        if d.mig_index is not None:
            mig = spec.mig[d.mig_index]
            entry["mig"].append(
                {"uuid": mig.uuid, "profile": mig.profile.name, "gi": mig.gi, "ci": mig.ci}
            )
    return {
        "node": node.name,
        "driver": node.driver,
        "faults_file": str(faults_file),
        "gpus": [gpus[i] for i in sorted(gpus)],
    }


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gpuspawner_sandbox.devices",
        description="Inject or clear emulated GPU faults in a running sandbox.",
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    inject = sub.add_parser("inject", help="add a fault")
    inject.add_argument("--state-dir", required=True)
    inject.add_argument("--node", required=True)
    inject.add_argument("--gpu", help="GPU index or UUID (default: the whole node)")
    inject.add_argument("--kind", required=True, choices=sorted(FAULT_KINDS))
    inject.add_argument("--value", help="ECC error count, or the old driver version")
    inject.add_argument(
        "--withdraw",
        choices=("default", "yes", "no"),
        default="default",
        help="whether the device plugin marks the GPU unhealthy",
    )
    clear = sub.add_parser("clear", help="remove faults")
    clear.add_argument("--state-dir", required=True)
    clear.add_argument("--node")
    clear.add_argument("--gpu")
    show = sub.add_parser("list", help="print the current faults")
    show.add_argument("--state-dir", required=True)
    args = parser.parse_args(argv)
    try:
        if args.cmd == "inject":
            withdraw = {"default": None, "yes": True, "no": False}[args.withdraw]
            inject_fault(
                args.state_dir, Fault(args.node, args.kind, args.gpu, withdraw, args.value)
            )
        elif args.cmd == "clear":
            clear_faults(args.state_dir, args.node, args.gpu)
        else:
            for f in load_faults(faults_path(args.state_dir)):
                print(json.dumps(asdict(f)))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(_main())
