"""Check the GPUs a container was given, before the notebook starts.

This file runs inside the GPU pod's init container as ``python3 -c <this source> ARGS``
(see ``gpuspawner.validation.command``), in whatever image the notebook uses. So it must stay
one self-contained file that needs nothing but the Python standard library (Python >= 3.8:
notebook images carry python3 for ``jupyterhub-singleuser``, not always a recent one) and
``nvidia-smi``, which the NVIDIA container runtime mounts into every GPU container.

It runs ``nvidia-smi -L`` and two ``nvidia-smi --query-gpu=... --format=csv,noheader,nounits``
queries, prints a short report, and exits 0 when the GPUs are usable. Otherwise it exits
non-zero and prints a one-line reason, last on stderr and into the container's termination
message file, where the spawner picks it up and shows it to the user.

The whole check has one deadline (``--timeout``): a hung GPU makes nvidia-smi hang, and that is
what the check exists to report. At the deadline nvidia-smi is killed, and abandoned if it cannot
be reaped (stuck in the driver), and the check fails with the reason; a watchdog thread ends the
process should the main thread itself be stuck.

The parsing and the decision are pure functions (``parse_*``, ``evaluate``); ``main`` does the
I/O. Recorded real outputs of every format handled here are in ``tests/fixtures/nvidia-smi``.
"""

from __future__ import annotations

import argparse
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

PROG = "gpuspawner-check-gpus"

# Exit codes of this check. The spawner's pod watcher turns them into a reason when the
# termination message is missing, and the hub's metrics into a kind (see ``EXIT_CODES``), so
# they are part of the interface.
EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_USAGE = 2  # what argparse uses for bad arguments
EXIT_NO_NVIDIA_SMI = 3
EXIT_NVIDIA_SMI_FAILED = 4
EXIT_GPU_COUNT = 5
EXIT_DRIVER_TOO_OLD = 6
EXIT_GPU_UNHEALTHY = 7
EXIT_UNREADABLE_OUTPUT = 8

ASK_ADMIN_NODE = "ask an admin to check the node"

#: The one table of the check's failure exit codes: code -> (kind, reason). The kind is a short
#: fixed name (the hub's metrics label); the reason is the one line shown when the check could
#: not write its own message. The hub side (``podstatus``) imports it and adds the container
#: runtime's codes; it lives here because this file must stay importable on its own.
EXIT_CODES: dict[int, tuple[str, str]] = {
    EXIT_INTERNAL: (
        "check-crashed",
        "The GPU check crashed; ask an admin to look at the gpu-check container's log.",
    ),
    EXIT_USAGE: (
        "check-misconfigured",
        "The GPU check was started with invalid arguments; ask an admin to check the "
        "spawner's GPU check command.",
    ),
    EXIT_NO_NVIDIA_SMI: (
        "no-nvidia-smi",
        "nvidia-smi was not found in the container: the node's NVIDIA container runtime did "
        f"not mount the driver tools into it; {ASK_ADMIN_NODE}.",
    ),
    EXIT_NVIDIA_SMI_FAILED: (
        "nvidia-smi-failed",
        f"nvidia-smi failed in the container, so the GPUs cannot be used; {ASK_ADMIN_NODE}.",
    ),
    EXIT_GPU_COUNT: (
        "gpu-count",
        f"The container does not see the number of GPUs it requested; {ASK_ADMIN_NODE}.",
    ),
    EXIT_DRIVER_TOO_OLD: (
        "driver-too-old",
        "The node's NVIDIA driver is too old for this image's CUDA version; pick an image "
        "built for an older CUDA, or ask an admin to upgrade the node's driver.",
    ),
    EXIT_GPU_UNHEALTHY: (
        "gpu-unhealthy",
        "A GPU given to this container reports memory errors, or its health cannot be read; "
        "ask an admin to drain the node.",
    ),
    EXIT_UNREADABLE_OUTPUT: (
        "unreadable-output",
        "nvidia-smi printed output the GPU check does not understand; ask an admin to look at "
        "the gpu-check container's log.",
    ),
}

# nvidia-smi's exit codes: the man page's RETURN VALUE table (tests/fixtures/nvidia-smi/
# return-codes__nvidia-smi-manpage-RETURN-VALUE.txt), plus 18, which is NVML's
# LIB_RM_VERSION_MISMATCH and is what nvidia-smi returns on "Driver/library version mismatch"
# (two independent user reports). Each entry: what happened, and what to do about it.
NVIDIA_SMI_EXIT_CODES: dict[int, tuple[str, str]] = {
    2: ("nvidia-smi rejected an argument or flag", "ask an admin to check the GPU check command"),
    3: ("the requested operation is not available on the GPU", ASK_ADMIN_NODE),
    4: (
        "insufficient permissions to access the GPU",
        "ask an admin to check the device permissions (and SELinux labels) on the node",
    ),
    6: ("nvidia-smi could not find a GPU", ASK_ADMIN_NODE),
    8: ("a GPU's external power cables are not properly attached", ASK_ADMIN_NODE),
    9: ("the NVIDIA driver is not loaded on the node", "ask an admin to check the node's driver"),
    10: ("the NVIDIA kernel driver detected an interrupt issue with a GPU", ASK_ADMIN_NODE),
    12: (
        "the NVML library (libnvidia-ml.so) is missing in the container",
        "ask an admin to check the node's NVIDIA container runtime",
    ),
    13: ("the NVML library in the container is older than nvidia-smi", ASK_ADMIN_NODE),
    14: ("a GPU's infoROM is corrupted", ASK_ADMIN_NODE),
    15: (
        "a GPU has fallen off the bus or has otherwise become inaccessible",
        "ask an admin to drain and reboot the node",
    ),
    18: (
        "the NVIDIA driver does not match its user-space library (driver/library version mismatch)",
        "ask an admin to reboot the node after its driver upgrade",
    ),
    255: ("nvidia-smi hit an internal or driver error", ASK_ADMIN_NODE),
}

# Messages that identify a failure better than the exit code does (the "GPU is lost" and
# "Insufficient Permissions" samples come without one, and rc 255 covers many causes).
_MESSAGE_CODES = (
    ("GPU is lost", 15),
    ("Insufficient Permissions", 4),
    ("Driver/library version mismatch", 18),
    ("couldn't communicate with the NVIDIA driver", 9),
    ("couldn't find libnvidia-ml.so", 12),
)

NVIDIA_SMI_INVALID_ARGUMENT = 2
NVIDIA_SMI_NOT_FOUND = 6
NVIDIA_SMI_INFOROM_CORRUPTED = 14

# Fields every nvidia-smi since long before CUDA 10 knows. Checked in the ALLFIELDS captures.
CORE_FIELDS: tuple[str, ...] = (
    "index",
    "uuid",
    "name",
    "driver_version",
    "pci.bus_id",
    "memory.total",
)
# Health fields; some are newer (remapped_rows.* appeared with Ampere-era drivers) and an old
# nvidia-smi refuses the whole query with exit code 2 when it meets one it does not know.
# ``index`` leads every health query so that rows are matched by GPU index, not position.
HEALTH_FIELDS: tuple[str, ...] = (
    "ecc.mode.current",
    "ecc.errors.uncorrected.volatile.total",
    "retired_pages.pending",
    "remapped_rows.pending",
    "remapped_rows.failure",
    "mig.mode.current",
)
CSV_FORMAT = "--format=csv,noheader,nounits"

# Minimum Linux driver per CUDA version: the one table of them. gpuspawner.images.matrix reads it
# too (an image's driver floor may not be below it), so the images and this check agree; the check
# reaches the pod as this file's source, so the table lives here. A key "MAJOR" holds for every
# minor release of that major: from CUDA 11 on, any minor release runs on the driver of the major's
# first release ("minor version compatibility"). A key "MAJOR.MINOR" is a release with a driver
# of its own (before CUDA 11.1 every toolkit needed its own; 11.0 GA shipped with 450.36.06).
# Sources: the CUDA Toolkit Release Notes, tables "CUDA Toolkit and Minimum Required Driver Version
# for CUDA Minor Version Compatibility" and "CUDA Toolkit and Corresponding Driver Versions",
# https://docs.nvidia.com/cuda/cuda-toolkit-release-notes/ (13.0 GA >= 580.65.06, 12.x >=
# 525.60.13, 11.1-11.8 >= 450.80.02, 11.0 GA >= 450.36.06, 10.2 >= 440.33, 10.1 >= 418.39, 10.0 >=
# 410.48), and NVIDIA, "CUDA Compatibility", Minor Version Compatibility, table 1,
# https://docs.nvidia.com/deploy/cuda-compatibility/minor-version-compatibility.html, which rounds
# them to the branch (13.x >= 580, 12.x >= 525, 11.x >= 450). Each major's floor is its .0 GA
# release's driver: 580.65.06 is the first R580 driver, the one CUDA 13.0 shipped with.
DRIVER_FLOOR_BY_CUDA: dict[str, tuple[int, ...]] = {
    "13": (580, 65, 6),
    "12": (525, 60, 13),
    "11": (450, 80, 2),
    "11.0": (450, 36, 6),
    "10.2": (440, 33),
    "10.1": (418, 39),
    "10.0": (410, 48),
}

# How nvidia-smi prints a value the GPU or driver does not have: ``[N/A]``, ``N/A``,
# ``[Not Supported]``, ``[Requested functionality has been deprecated]``, ``[Function Not
# Found]`` (NVML_ERROR_FUNCTION_NOT_FOUND: this NVML lacks the call) and empty cells.
_NOT_AVAILABLE = {
    "",
    "n/a",
    "na",
    "none",
    "not supported",
    "requested functionality has been deprecated",
    "function not found",
}


# Bare words that mean the value could not be read, as opposed to not existing.
_UNKNOWN = {"unknown", "unknown error"}


def _bare(value: str) -> str:
    """``"[Unknown Error]"`` -> ``"unknown error"``: the text inside nvidia-smi's brackets."""
    if value.startswith("[") and value.endswith("]"):
        value = value[1:-1]
    return value.strip().lower()


def clean_value(raw: str | None) -> str | None:
    """Return a CSV cell's text, or None when nvidia-smi says the value does not exist.

    ``[N/A]``, ``N/A``, ``[Not Supported]``, ``[Requested functionality has been deprecated]``
    and empty cells all mean "not reported", never a failure. Any other bracketed text, e.g.
    ``[Unknown Error]`` or ``[GPU is lost]``, is an NVML error nvidia-smi printed in place of the
    value; it is kept as is so that ``is_error_value`` can tell it apart.
    """
    if raw is None:
        return None
    value = raw.strip()
    if _bare(value) in _NOT_AVAILABLE:
        return None
    return value


def is_error_value(value: str | None) -> bool:
    """True for a cell where nvidia-smi printed an NVML error instead of the value.

    nvidia-smi prints a failed NVML call as the bracketed ``nvmlErrorString``: ``[Unknown
    Error]`` (NVML_ERROR_UNKNOWN), ``[GPU is lost]``, ``[GPU requires reset]``, ``[Insufficient
    Permissions]``. Real CSV output with ``[Unknown Error]`` is recorded for ``fan.speed``
    (enkore/i3pystatus#850).
    """
    if value is None:
        return False
    value = value.strip()
    bracketed = value.startswith("[") and value.endswith("]")
    return (bracketed and _bare(value) not in _NOT_AVAILABLE) or _bare(value) in _UNKNOWN


def _whole_number(digits: str) -> int | None:
    """ASCII ``digits`` as an int, or None when Python refuses so long a number.

    Python 3.11+ refuses to convert more than 4300 digits (CVE-2020-10735); nvidia-smi never
    prints such a number, so it is not one.
    """
    try:
        return int(digits)
    except ValueError:
        return None


def parse_int(raw: str | None) -> int | None:
    """``"81559"`` or ``"81559 MiB"`` -> 81559; anything not a whole number -> None."""
    value = clean_value(raw)
    if value is None:
        return None
    # [0-9], not \d: nvidia-smi prints ASCII digits, and \d also matches e.g. Arabic-Indic ones.
    match = re.match(r"^([0-9]+)(?:\s+\S+)?$", value)
    return _whole_number(match.group(1)) if match else None


def parse_yes_no(raw: str | None) -> bool | None:
    """``Yes``/``No`` (how nvidia-smi prints pending flags) -> True/False; else None."""
    value = clean_value(raw)
    if value is None:
        return None
    lowered = value.lower()
    if lowered == "yes":
        return True
    if lowered == "no":
        return False
    return None


def parse_version(raw: str | None) -> tuple[int, ...] | None:
    """``"590.48.01"`` -> (590, 48, 1); ``"12.4"`` -> (12, 4); unparseable -> None."""
    value = clean_value(raw)
    if value is None or not re.match(r"^[0-9]+(\.[0-9]+)*$", value):
        return None
    parts = [_whole_number(part) for part in value.split(".")]
    if any(part is None for part in parts):
        return None
    return tuple(part for part in parts if part is not None)


def format_version(version: Sequence[int]) -> str:
    """(525, 60, 13) -> ``"525.60.13"``; driver patch numbers keep their two digits."""
    parts = [str(version[0])] + [f"{part:02d}" for part in version[1:]]
    return ".".join(parts)


class OutputError(ValueError):
    """nvidia-smi printed something this check cannot read."""


def split_warnings(text: str) -> tuple[list[str], list[str]]:
    """Split nvidia-smi output into (data lines, ``WARNING:`` lines), dropping blank lines.

    nvidia-smi appends e.g. ``WARNING: infoROM is corrupted at gpu 0000:0B:00.0`` (exit code 14)
    after otherwise normal output.
    """
    data: list[str] = []
    warnings: list[str] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        if line.startswith("WARNING:"):
            warnings.append(line.strip())
        else:
            data.append(line)
    return data, warnings


def parse_query_csv(text: str, fields: Sequence[str]) -> list[dict[str, str | None]]:
    """Parse ``--query-gpu=<fields> --format=csv,noheader,nounits`` output into one dict per GPU.

    Values are cleaned with ``clean_value`` (None = not reported). Raises OutputError when a
    row does not have one cell per requested field.
    """
    rows: list[dict[str, str | None]] = []
    lines, _ = split_warnings(text)
    for line in lines:
        # nvidia-smi separates cells with ", " and never quotes them; GPU names hold no commas.
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) != len(fields):
            raise OutputError(
                f"expected {len(fields)} comma-separated values per line for "
                f"{','.join(fields)}, got {len(cells)} in {line.strip()[:200]!r}"
            )
        rows.append({name: clean_value(cells[i]) for i, name in enumerate(fields)})
    return rows


@dataclass
class MigDevice:
    """One MIG device as ``nvidia-smi -L`` lists it under its parent GPU."""

    profile: str
    index: int
    uuid: str


@dataclass
class ListedGpu:
    """One physical GPU as ``nvidia-smi -L`` lists it, with its MIG devices."""

    index: int
    name: str
    uuid: str
    mig_devices: list[MigDevice] = field(default_factory=list)


# Indexes of up to 9 ASCII digits: a longer one is no GPU's, and int() refuses thousands of digits.
_GPU_LINE = re.compile(
    r"^GPU\s+(?P<index>[0-9]{1,9}):\s+(?P<name>.*?)\s+\(UUID:\s*(?P<uuid>[^)\s]+)\)\s*$"
)
# R470+: "  MIG 3g.40gb     Device  0: (UUID: MIG-7089d0f3-...)"; R450: "  MIG 1g.5gb Device 0:
# (UUID: MIG-GPU-<gpu uuid>/7/0)". Only the spacing and the UUID form differ.
_MIG_LINE = re.compile(
    r"^\s+MIG\s+(?P<profile>\S+)\s+Device\s+(?P<index>[0-9]{1,9}):\s+\(UUID:\s*(?P<uuid>[^)\s]+)\)\s*$"
)
_NO_DEVICES = "No devices were found"
# "Unable to determine the device handle for GPU 0000:09:00.0: Unknown Error" (older drivers put
# a space before the bus id, newer ones do not) or "...: GPU is lost.  Reboot the system ...".
_NO_HANDLE = "Unable to determine the device handle for GPU"


def parse_list(text: str) -> list[ListedGpu]:
    """Parse ``nvidia-smi -L`` output. ``No devices were found`` gives an empty list.

    Raises OutputError on a line that is neither a GPU, a MIG device nor a warning.
    """
    gpus: list[ListedGpu] = []
    lines, _ = split_warnings(text)
    for line in lines:
        if line.strip() == _NO_DEVICES:
            continue
        gpu_match = _GPU_LINE.match(line)
        if gpu_match:
            gpus.append(
                ListedGpu(
                    index=int(gpu_match.group("index")),
                    name=gpu_match.group("name"),
                    uuid=gpu_match.group("uuid"),
                )
            )
            continue
        mig_match = _MIG_LINE.match(line)
        if mig_match and gpus:
            gpus[-1].mig_devices.append(
                MigDevice(
                    profile=mig_match.group("profile"),
                    index=int(mig_match.group("index")),
                    uuid=mig_match.group("uuid"),
                )
            )
            continue
        raise OutputError(f"unexpected line in nvidia-smi -L output: {line.strip()[:200]!r}")
    return gpus


# The CSV fields each GpuRecord attribute comes from.
_RECORD_FIELDS = {
    "uuid": "uuid",
    "name": "name",
    "driver_version": "driver_version",
    "pci_bus_id": "pci.bus_id",
    "ecc_mode": "ecc.mode.current",
    "mig_mode": "mig.mode.current",
}


@dataclass
class GpuRecord:
    """What the CSV queries report for one physical GPU; None means not reported.

    ``unreadable`` maps each field nvidia-smi printed an NVML error for (``[Unknown Error]``)
    to that text: such a field is unknown, not "not reported".
    """

    index: int | None = None
    uuid: str | None = None
    name: str | None = None
    driver_version: str | None = None
    pci_bus_id: str | None = None
    memory_total_mib: int | None = None
    ecc_mode: str | None = None
    ecc_uncorrected_volatile: int | None = None
    retired_pages_pending: bool | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failure: bool | None = None
    mig_mode: str | None = None
    unreadable: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_row(cls, row: dict[str, str | None]) -> GpuRecord:
        """Build a record from ``parse_query_csv`` rows (any subset of the known fields)."""
        unreadable = {name: value for name, value in row.items() if value and is_error_value(value)}
        texts = {
            attribute: None if name in unreadable else row.get(name)
            for attribute, name in _RECORD_FIELDS.items()
        }
        return cls(
            index=parse_int(row.get("index")),
            memory_total_mib=parse_int(row.get("memory.total")),
            ecc_uncorrected_volatile=parse_int(row.get("ecc.errors.uncorrected.volatile.total")),
            retired_pages_pending=parse_yes_no(row.get("retired_pages.pending")),
            remapped_rows_pending=parse_yes_no(row.get("remapped_rows.pending")),
            remapped_rows_failure=parse_yes_no(row.get("remapped_rows.failure")),
            unreadable=unreadable,
            **texts,
        )

    @property
    def mig_enabled(self) -> bool | None:
        """MIG mode from ``mig.mode.current``: True/False, None when not reported."""
        if self.mig_mode is None:
            return None
        return self.mig_mode.strip().lower() == "enabled"

    @property
    def label(self) -> str:
        """How the GPU is named in messages: ``GPU 1 (NVIDIA H100 80GB HBM3, GPU-...)``."""
        details = ", ".join(part for part in (self.name, self.uuid) if part)
        number = f"GPU {self.index}" if self.index is not None else "A GPU"
        return f"{number} ({details})" if details else number


def merge_rows(*row_sets: Sequence[dict[str, str | None]]) -> list[GpuRecord]:
    """Merge the rows of several queries into one record per GPU, matched by ``index``.

    Rows without an index are matched by position (the CSV order is the index order).
    """
    merged: dict[object, dict[str, str | None]] = {}
    order: list[object] = []
    for rows in row_sets:
        for position, row in enumerate(rows):
            key: object = row.get("index") if row.get("index") is not None else position
            if key not in merged:
                merged[key] = {}
                order.append(key)
            for name, value in row.items():
                # A field reported by one query must not be blanked by another.
                if value is not None or name not in merged[key]:
                    merged[key][name] = value
    return [GpuRecord.from_row(merged[key]) for key in order]


def driver_floor(cuda: tuple[int, ...]) -> tuple[int, ...] | None:
    """The minimum Linux driver for CUDA ``(major, minor)``, or None when no floor is known."""
    major = cuda[0]
    minor = cuda[1] if len(cuda) > 1 else 0
    found = DRIVER_FLOOR_BY_CUDA.get(f"{major}.{minor}")
    return found if found is not None else DRIVER_FLOOR_BY_CUDA.get(str(major))


# The device plugin's time-slicing with ``renameByDefault`` advertises ``nvidia.com/gpu.shared``;
# each unit is a replica, and a pod's replicas may share one physical GPU.
SHARED_SUFFIX = ".shared"


def mig_profile_of(resource: str) -> str | None:
    """``nvidia.com/mig-1g.10gb`` -> ``1g.10gb``; a whole-GPU resource -> None."""
    name = resource.rsplit("/", 1)[-1]
    return name[len("mig-") :] if name.startswith("mig-") else None


def resource_profile(listed_profile: str) -> str:
    """The profile as a MIG resource name spells it: ``1g.10gb+me`` -> ``1g.10gb.me``.

    Kubernetes resource names cannot hold ``+``, so the device plugin advertises the
    media-extension profile ``1g.10gb+me`` (as ``nvidia-smi -L`` prints it) as
    ``nvidia.com/mig-1g.10gb.me``.
    """
    return listed_profile.replace("+", ".")


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" + ("" if count == 1 else "s")


@dataclass
class CheckResult:
    """The outcome: ``ok``, the one-line ``reason`` when not, and report lines for the log."""

    ok: bool
    exit_code: int
    reason: str | None = None
    report: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _describe(record: GpuRecord) -> str:
    parts = [record.label]
    if record.pci_bus_id:
        parts.append("bus " + record.pci_bus_id)
    if record.driver_version:
        parts.append("driver " + record.driver_version)
    if record.memory_total_mib is not None:
        parts.append(f"{record.memory_total_mib} MiB")
    if record.ecc_mode is None:
        parts.append("ECC not reported")
    else:
        ecc = "ECC " + record.ecc_mode.lower()
        if record.ecc_uncorrected_volatile is not None:
            ecc += f", {record.ecc_uncorrected_volatile} uncorrectable errors"
        parts.append(ecc)
    if record.mig_mode is not None:
        parts.append("MIG " + record.mig_mode.lower())
    parts.extend(f"{name} {value}" for name, value in sorted(record.unreadable.items()))
    return ": ".join([parts[0], ", ".join(parts[1:])]) if len(parts) > 1 else parts[0]


def _health_problems(record: GpuRecord) -> list[str]:
    problems = []
    # An NVML error in a health field fails the check. NVML documents NVML_ERROR_UNKNOWN
    # ("[Unknown Error]") as "an internal driver error occurred", the same words the nvidia-smi
    # man page uses for exit code 255, which fails the whole check; the others mean the GPU is
    # lost, needs a reset, or cannot be read by this container. In every case the driver could
    # not say whether the memory is healthy, and passing would print "no uncorrectable ECC
    # errors" for a count nobody read.
    for name in HEALTH_FIELDS:
        if name in record.unreadable:
            problems.append(
                f"{record.label} could not report {name}: nvidia-smi printed "
                f"{record.unreadable[name]} (an NVML error from the driver), so this GPU's health "
                "is unknown; ask an admin to check the node's kernel log for Xid errors and to "
                "reset the GPU or drain the node."
            )
    if record.ecc_uncorrected_volatile:
        errors = _plural(record.ecc_uncorrected_volatile, "uncorrectable ECC error")
        problems.append(
            f"{record.label} has {errors} since the driver loaded, so its memory cannot be "
            "trusted; ask an admin to drain the node and reset the GPU."
        )
    if record.retired_pages_pending:
        problems.append(
            f"{record.label} has a memory page retirement pending that only takes effect "
            "after a GPU reset; ask an admin to drain the node and reset the GPU."
        )
    if record.remapped_rows_failure:
        problems.append(
            f"{record.label} failed to remap a faulty memory row and needs service; ask an "
            "admin to take the GPU out of use."
        )
    elif record.remapped_rows_pending:
        problems.append(
            f"{record.label} has a memory row remapping pending that only takes effect after "
            "a GPU reset; ask an admin to drain the node and reset the GPU."
        )
    return problems


@dataclass
class UnitCount:
    """What the container sees of the requested resource.

    ``seen``: units of the requested kind. ``empty_mig``: GPUs in MIG mode without MIG devices
    (CUDA cannot use them). ``others``: units visible but not of the requested kind (MIG
    devices of another profile, or whole GPUs, for a MIG request). ``uncounted``: GPUs in MIG
    mode whose MIG devices could not be counted because ``nvidia-smi -L`` was unreadable.
    """

    seen: int = 0
    empty_mig: list[str] = field(default_factory=list)
    others: list[str] = field(default_factory=list)
    uncounted: list[str] = field(default_factory=list)


def _record_for(gpu: ListedGpu, records: Sequence[GpuRecord]) -> GpuRecord | None:
    for record in records:
        if record.uuid and record.uuid == gpu.uuid:
            return record
    for record in records:
        if record.uuid is None and record.index == gpu.index:
            return record
    return None


def count_units(
    resource: str, listing: list[ListedGpu] | None, records: list[GpuRecord]
) -> UnitCount:
    """Count what the container sees of ``resource``, from ``-L`` and the CSV's MIG mode.

    For a MIG resource (``nvidia.com/mig-<profile>``) only MIG devices of that profile count.
    For a whole-GPU resource a GPU counts as itself, or as its MIG devices when it has some
    (the device plugin's "single" MIG strategy hands out MIG devices as ``nvidia.com/gpu``).
    A GPU in MIG mode without MIG devices counts as nothing: CUDA cannot use it. MIG mode is
    read from the CSV's ``mig.mode.current``, so it is known even when ``-L`` was unreadable
    (``listing`` None); then MIG devices cannot be counted at all.
    """
    profile = mig_profile_of(resource)
    count = UnitCount()
    if listing is None:
        for record in records:
            if record.mig_enabled or (profile is not None and record.mig_enabled is None):
                count.uncounted.append(record.label)
            elif profile is None:
                count.seen += 1
            else:
                count.others.append(f"{record.label} as a whole GPU")
        return count
    for gpu in listing:
        record = _record_for(gpu, records)
        label = f"GPU {gpu.index} ({gpu.name})"
        if gpu.mig_devices:
            for device in gpu.mig_devices:
                if profile is None or resource_profile(device.profile) == profile:
                    count.seen += 1
                else:
                    count.others.append(f"a {device.profile} MIG device")
        elif record is not None and record.mig_enabled:
            count.empty_mig.append(label)
        elif profile is None:
            count.seen += 1
        else:
            count.others.append(f"{label} as a whole GPU")
    return count


def _count_problem(
    expected: int,
    resource: str,
    listing: list[ListedGpu] | None,
    records: list[GpuRecord],
    no_devices: str | None = None,
) -> tuple[tuple[int, str] | None, str]:
    """((exit code, reason) or None, report line) for the number of units visible."""
    count = count_units(resource, listing, records)
    profile = mig_profile_of(resource)
    unit = "GPU" if profile is None else "MIG device"
    kind = "" if profile is None else f" ({profile})"

    def units(number: int, prefix: str = "") -> str:
        return _plural(number, prefix + unit) + kind

    seen = count.seen
    line = f"{units(seen)} visible, {expected} requested ({resource})."
    if count.uncounted:
        return (
            EXIT_UNREADABLE_OUTPUT,
            f"{count.uncounted[0]} has MIG mode enabled or not reported, but nvidia-smi -L "
            "printed output the GPU check does not understand, so the MIG devices this "
            "container was given cannot be counted; ask an admin to look at the gpu-check "
            "container's log.",
        ), line
    shown = ", ".join(count.others[:3]) + (", …" if len(count.others) > 3 else "")
    instead = f" (it sees {shown} instead)" if count.others else ""
    shared_ok = resource.endswith(SHARED_SUFFIX) and 0 < seen < expected
    if not count.others and seen == expected:
        return None, f"OK: {units(seen)} visible, as requested ({resource})."
    if not count.others and shared_ok:
        # Time-sliced replicas: several may land on the same physical GPU.
        return None, (
            f"OK: {units(seen)} visible for {expected} time-sliced replicas ({resource})."
        )
    were = "was" if expected == 1 else "were"
    if count.empty_mig and seen < expected:
        reason = (
            f"{count.empty_mig[0]} has MIG mode enabled but no MIG devices, so CUDA cannot use "
            "it; ask an admin to check the node's MIG configuration."
        )
    elif seen == 0 and no_devices:
        reason = (
            f'nvidia-smi finds no GPU in this container ("{no_devices}"), although '
            f"{units(expected)} {were} requested: the node's device plugin or container runtime "
            f"did not give it any, or the driver cannot use them; {ASK_ADMIN_NODE}."
        )
    elif seen == 0:
        reason = (
            f"No {unit}{kind} is visible in this container{instead}, although {expected} "
            f"{were} requested: the node's device plugin or container runtime did not give it "
            f"any; {ASK_ADMIN_NODE}."
        )
    elif seen < expected:
        reason = (
            f"Only {seen} of the {units(expected, 'requested ')} is visible{instead}: the "
            f"node's device plugin gave this container fewer {unit}s than it asked for; "
            f"{ASK_ADMIN_NODE}."
        )
    else:
        are = "is" if seen == 1 else "are"
        if seen > expected:
            what = f"{units(seen)} {are} visible but only {expected} {were} requested"
        else:
            also = "is" if len(count.others) == 1 else "are"
            what = f"The {units(expected, 'requested ')} {are} visible, but so {also} {shown}"
        reason = (
            f"{what}: this container can use devices it was not given (the image may set "
            "NVIDIA_VISIBLE_DEVICES=all, or the node's runtime ignores the device plugin); ask "
            "an admin to check the image and the node."
        )
    return (EXIT_GPU_COUNT, reason), line


def _driver_problem(
    records: list[GpuRecord], cuda: str | None, report: list[str], warnings: list[str]
) -> str | None:
    if not cuda:
        return None
    wanted = parse_version(cuda)
    if wanted is None:
        warnings.append(f"CUDA version {cuda!r} is not of the form X.Y; driver not checked.")
        return None
    cuda_text = ".".join(str(part) for part in wanted[:2])
    drivers = [r.driver_version for r in records if r.driver_version]
    driver = parse_version(drivers[0]) if drivers else None
    if driver is None:
        warnings.append(f"nvidia-smi did not report the driver version; CUDA {cuda} not checked.")
        return None
    floor = driver_floor(wanted)
    if floor is None:
        warnings.append(
            f"No minimum driver is known for CUDA {cuda_text}; driver {drivers[0]} not checked."
        )
        return None
    if driver < floor:
        return (
            f"The node's NVIDIA driver {drivers[0]} is too old for this image's CUDA {cuda_text}, "
            f"which needs driver {format_version(floor)} or newer: pick an image built for an "
            "older CUDA, or ask an admin to upgrade the node's driver."
        )
    report.append(
        f"OK: driver {drivers[0]} runs CUDA {cuda_text} (needs {format_version(floor)} or newer)."
    )
    return None


def evaluate(
    expected: int,
    resource: str,
    listing: list[ListedGpu] | None,
    records: list[GpuRecord],
    cuda: str | None = None,
    warnings: Sequence[str] = (),
    no_devices: str | None = None,
) -> CheckResult:
    """Decide whether the GPUs are usable. Pure: takes parsed nvidia-smi data, returns a result.

    ``listing`` is ``parse_list`` output (None when ``-L`` was unreadable): with it, GPUs
    are counted as the container sees them, MIG devices in place of MIG-enabled GPUs.
    ``records`` come from the CSV queries (``merge_rows``). ``no_devices`` is the line
    nvidia-smi printed when it found no GPU at all, quoted in the reason.
    """
    report: list[str] = []
    notes = list(warnings)
    drivers = sorted({r.driver_version for r in records if r.driver_version})
    gpu_count = len(listing) if listing is not None else len(records)
    driver_note = f" (driver {', '.join(drivers)})" if drivers else ""
    report.append(f"nvidia-smi sees {_plural(gpu_count, 'GPU')}{driver_note}.")
    if no_devices:
        report.append(f"nvidia-smi said: {no_devices}")
    if listing is not None:
        for gpu in listing:
            record = _record_for(gpu, records) or GpuRecord(gpu.index)
            # -L names every GPU even when the CSV query could not.
            shown = replace(record, name=record.name or gpu.name, uuid=record.uuid or gpu.uuid)
            report.append(_describe(shown))
            for device in gpu.mig_devices:
                report.append(f"  MIG {device.profile} device {device.index}: {device.uuid}")
    else:
        report.extend(_describe(r) for r in records)
    for record in records:
        for name, value in sorted(record.unreadable.items()):
            if name not in HEALTH_FIELDS:
                notes.append(f"{record.label}: nvidia-smi printed {value} for {name}.")

    count_failure, count_line = _count_problem(expected, resource, listing, records, no_devices)
    report.append(count_line)
    driver_reason = _driver_problem(records, cuda, report, notes)
    health = [problem for record in records for problem in _health_problems(record)]
    if not health:
        report.append(
            "OK: no uncorrectable ECC errors, pending retirements or row remaps reported."
        )

    failures: list[tuple[int, str]] = []
    if count_failure:
        failures.append(count_failure)
    if driver_reason:
        failures.append((EXIT_DRIVER_TOO_OLD, driver_reason))
    failures.extend((EXIT_GPU_UNHEALTHY, problem) for problem in health)
    report.extend("warning: " + note for note in notes)
    if not failures:
        return CheckResult(ok=True, exit_code=EXIT_OK, report=report, warnings=notes)
    report.extend("FAILED: " + reason for _, reason in failures)
    exit_code, reason = failures[0]
    if len(failures) > 1:
        more = _plural(len(failures) - 1, "problem").replace(" ", " more ", 1)
        reason = f"{reason} ({more} in the gpu-check log)"
    return CheckResult(ok=False, exit_code=exit_code, reason=reason, report=report, warnings=notes)


def first_message(output: str) -> str:
    """The first non-empty line of ``output``, for quoting in a reason."""
    for line in output.splitlines():
        if line.strip():
            return line.strip()[:300]
    return ""


@dataclass
class CommandResult:
    """One nvidia-smi run: its exit code, stdout (the data) and stderr (kept for the report)."""

    returncode: int
    stdout: str
    stderr: str = ""

    @property
    def messages(self) -> str:
        """Both streams, for recognising failure messages: nvidia-smi prints some on stdout,
        some on stderr, and some on both (tests/fixtures/nvidia-smi/INDEX.md)."""
        return self.stdout + "\n" + self.stderr

    def said(self) -> str:
        """What to quote from a failed run: stdout's first line, else stderr's last (a loader
        warning may come before the error there)."""
        quoted = first_message(self.stdout)
        if quoted:
            return quoted
        lines = [line.strip() for line in self.stderr.splitlines() if line.strip()]
        return lines[-1][:300] if lines else ""


def classify_exit(returncode: int, output: str) -> int:
    """The nvidia-smi exit code that best explains a failure, reading the message too."""
    for text, code in _MESSAGE_CODES:
        if text in output:
            return code
    return returncode


def nvidia_smi_failure(result: CommandResult) -> str:
    """A one-line reason for a failed nvidia-smi run."""
    code = classify_exit(result.returncode, result.messages)
    what, action = NVIDIA_SMI_EXIT_CODES.get(
        code, ("nvidia-smi failed with an undocumented exit code", ASK_ADMIN_NODE)
    )
    reason = (
        f"nvidia-smi failed with exit code {result.returncode} ({what}), so the GPUs cannot be "
        f"used; {action}."
    )
    said = result.said()
    if said:
        reason += " nvidia-smi said: " + said
    return reason


class CheckFailed(Exception):
    """Stops the check with an exit code and a one-line reason."""

    def __init__(self, exit_code: int, reason: str) -> None:
        super().__init__(reason)
        self.exit_code = exit_code
        self.reason = reason


if TYPE_CHECKING:
    # Only for annotations: subscripting collections.abc.Callable fails at runtime on 3.8.
    Runner = Callable[[list[str]], CommandResult]


def note_stderr(result: CommandResult, warnings: list[str]) -> None:
    """Keep what a run wrote on stderr for the report, once per distinct line.

    stderr is never parsed: a dynamic-loader warning there (``nvidia-smi: ...libnvidia-ml.so.1:
    no version information available``) says nothing about the GPUs.
    """
    for line in result.stderr.splitlines():
        if line.strip():
            note = "nvidia-smi wrote on stderr: " + line.strip()[:300]
            if note not in warnings:
                warnings.append(note)


def accept(result: CommandResult, warnings: list[str]) -> CommandResult:
    """Pass a successful run through; exit code 14 (infoROM corrupted) only adds a warning.

    NVIDIA's GPU Operator treats 14 as a warning too: the output is complete and the GPU
    works (pytorch/pytorch#87464, NVIDIA/gpu-operator#285). Any other failure raises.
    """
    if result.returncode not in (0, NVIDIA_SMI_INFOROM_CORRUPTED):
        raise CheckFailed(EXIT_NVIDIA_SMI_FAILED, nvidia_smi_failure(result))
    # Whatever the exit code, a GPU nvidia-smi cannot open is unusable.
    for line in result.messages.splitlines():
        if line.startswith(_NO_HANDLE):
            code = classify_exit(255, result.messages)
            action = NVIDIA_SMI_EXIT_CODES[code][1]
            raise CheckFailed(
                EXIT_NVIDIA_SMI_FAILED,
                f"nvidia-smi cannot open a GPU given to this container, so it cannot be used; "
                f"{action}. nvidia-smi said: {line.strip()[:300]}",
            )
    if result.returncode == NVIDIA_SMI_INFOROM_CORRUPTED:
        _, lines = split_warnings(result.messages)
        for line in lines or ["nvidia-smi reports a corrupted infoROM (exit code 14)."]:
            if line not in warnings:
                warnings.append(line)
    note_stderr(result, warnings)
    return result


def unreadable(error: OutputError) -> CheckFailed:
    return CheckFailed(
        EXIT_UNREADABLE_OUTPUT,
        f"nvidia-smi printed output the GPU check does not understand ({error}); ask an admin to "
        "look at the gpu-check container's log.",
    )


def read_query(
    result: CommandResult, fields: Sequence[str], warnings: list[str]
) -> list[dict[str, str | None]]:
    """Accept a ``--query-gpu`` run and parse its stdout, raising CheckFailed when that fails."""
    accept(result, warnings)
    try:
        return parse_query_csv(result.stdout, fields)
    except OutputError as error:
        raise unreadable(error) from None


def query_args(fields: Sequence[str]) -> list[str]:
    """The nvidia-smi arguments for a machine-readable query of ``fields``."""
    return ["--query-gpu=" + ",".join(fields), CSV_FORMAT]


def query_health(run: Runner, warnings: list[str]) -> list[dict[str, str | None]]:
    """Query the health fields; if this nvidia-smi rejects one, ask for each field on its own."""
    fields = ("index", *HEALTH_FIELDS)
    first = run(query_args(fields))
    if first.returncode != NVIDIA_SMI_INVALID_ARGUMENT:
        return read_query(first, fields, warnings)
    rows: list[dict[str, str | None]] = []
    missing: list[str] = []
    for name in HEALTH_FIELDS:
        single = ("index", name)
        result = run(query_args(single))
        if result.returncode == NVIDIA_SMI_INVALID_ARGUMENT:
            missing.append(name)
            continue
        rows.extend(read_query(result, single, warnings))
    if missing:
        warnings.append("This nvidia-smi does not know {}; not checked.".format(", ".join(missing)))
    return rows


@dataclass
class Collected:
    """The parsed answers of the nvidia-smi runs, for ``evaluate``.

    ``listing`` is None when ``-L`` printed something unreadable; ``no_devices`` is the line
    nvidia-smi printed when it found no GPU at all (then nothing else was run).
    """

    listing: list[ListedGpu] | None
    records: list[GpuRecord]
    warnings: list[str]
    no_devices: str | None = None


def collect(run: Runner) -> Collected:
    """Run the nvidia-smi commands and parse them.

    ``-L`` goes first: it is the cheapest proof that nvidia-smi works at all.
    """
    warnings: list[str] = []
    listed = run(["-L"])
    if listed.returncode in (0, NVIDIA_SMI_NOT_FOUND):
        for line in listed.messages.splitlines():
            if line.strip() == _NO_DEVICES:
                note_stderr(listed, warnings)
                return Collected([], [], warnings, no_devices=line.strip())
    accept(listed, warnings)
    listing: list[ListedGpu] | None
    try:
        listing = parse_list(listed.stdout)
    except OutputError as error:
        warnings.append(f"{error}; GPUs counted from the CSV query instead.")
        listing = None
    core_result = run(query_args(CORE_FIELDS))
    core: list[dict[str, str | None]] = []
    if core_result.returncode == NVIDIA_SMI_INVALID_ARGUMENT and listing is not None:
        # Counting still works from -L; only the report loses detail.
        warnings.append("This nvidia-smi rejected the basic GPU query; details are missing.")
    else:
        core = read_query(core_result, CORE_FIELDS, warnings)
    health = query_health(run, warnings)
    return Collected(listing, merge_rows(core, health), warnings)


#: How long the whole check may take by default, every nvidia-smi run together. A healthy
#: nvidia-smi answers within seconds even on 8 GPUs without persistence mode; a hung one never
#: does. Well under JupyterHub's default start_timeout (60 s), so a hung GPU fails the spawn with
#: this check's reason rather than with the hub's timeout.
DEFAULT_TIMEOUT = 30.0
#: How long a killed nvidia-smi gets to be reaped after the deadline before it is abandoned:
#: one stuck in the driver (uninterruptible sleep) does not die until the driver lets it go.
KILL_GRACE = 1.0
#: How long after the deadline and KILL_GRACE the watchdog ends the check from another thread,
#: if the main thread is still stuck (e.g. starting nvidia-smi from a hung mount).
WATCHDOG_GRACE = 3.0
#: The most nvidia-smi may print on one stream in one run. Real output is a few kB; more means
#: it is looping, and the check must not hold it all in memory until the deadline.
MAX_OUTPUT = 1 << 20
_POLL_INTERVAL = 0.02


def _limit(seconds: float) -> str:
    """``30`` -> ``30-second limit``."""
    return f"{seconds:g}-second limit"


class Deadline:
    """The one point in time by which the whole check must be over."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds = seconds
        self._clock = clock
        self.at = clock() + seconds

    def remaining(self) -> float:
        """Seconds left, never below 0."""
        return max(0.0, self.at - self._clock())

    def passed(self) -> bool:
        return self.remaining() <= 0


def command_name(args: Sequence[str]) -> str:
    """How a run is named in a reason: ``nvidia-smi -L``, ``nvidia-smi --query-gpu``."""
    first = args[0].split("=", 1)[0] if args else ""
    return f"nvidia-smi {first}".strip()


@dataclass
class Unfinished:
    """A run the deadline cut short: what it printed, and whether its output had ended."""

    args: list[str]
    stdout: bytes = b""
    stderr: bytes = b""
    output_ended: bool = False
    started: bool = True


def hung_reason(seconds: float, run: Unfinished) -> str:
    """The one-line reason for a check that ran out of time in ``run``."""
    name = command_name(run.args)
    printed = len(decode_output(run.stdout + run.stderr).splitlines())
    if not run.started:
        what = f"the runs before {name} took all of it"
    elif run.output_ended:
        what = f"{name} printed its output but never exited"
    elif printed:
        what = f"{name} stopped answering after printing {_plural(printed, 'line')}"
    else:
        what = f"{name} printed nothing"
    return (
        f"nvidia-smi did not finish within the GPU check's {_limit(seconds)} ({what}), "
        f"so the GPU or its driver is hung; {ASK_ADMIN_NODE}."
    )


def watchdog_reason(seconds: float, doing: str) -> str:
    """The reason the watchdog writes when the check's main thread never came back."""
    return (
        f"The GPU check did not finish within its {_limit(seconds)} (it was stuck "
        f"{doing}), so the GPU or its driver is hung; {ASK_ADMIN_NODE}."
    )


def decode_output(data: bytes) -> str:
    """nvidia-smi's bytes as text; bytes that are not UTF-8 become U+FFFD, never an error."""
    return data.decode("utf-8", errors="replace")


#: Process ids of nvidia-smi runs that could not be reaped (see ``stop``).
ABANDONED: list[int] = []


def stop(process: subprocess.Popen[bytes], grace: float | None = None) -> bool:
    """Kill nvidia-smi and whatever it started; True once it is reaped.

    Never waits longer than ``grace`` (default KILL_GRACE): an nvidia-smi stuck in the driver
    ignores even SIGKILL until the driver returns, and waiting for it would hang the check in
    exactly the case it exists for. Such a process is left behind (``ABANDONED``).
    """
    grace = KILL_GRACE if grace is None else grace
    try:
        # Its own session (start_new_session), so its group is its own: killing the group also
        # ends children that would otherwise keep the pipes open.
        os.killpg(process.pid, signal.SIGKILL)
    except OSError:
        pass  # already gone
    end = time.monotonic() + grace
    while process.poll() is None:
        if time.monotonic() >= end:
            ABANDONED.append(process.pid)
            return False
        time.sleep(_POLL_INTERVAL)
    return True


def communicate(
    process: subprocess.Popen[bytes], deadline: Deadline, limit: int = MAX_OUTPUT
) -> tuple[bytes, bytes, str]:
    """Read ``process``'s stdout and stderr until it exits or ``deadline`` passes.

    Returns (stdout, stderr, how): ``how`` is ``"exited"``, ``"too-much"`` (a stream passed
    ``limit`` bytes), ``"hung"`` (the deadline passed before the output ended) or
    ``"hung-after-output"``. Unlike ``Popen.communicate``, nothing here waits without a limit.
    """
    assert process.stdout is not None and process.stderr is not None
    buffers = {process.stdout.fileno(): bytearray(), process.stderr.fileno(): bytearray()}
    out, err = buffers.values()

    def result(how: str) -> tuple[bytes, bytes, str]:
        return bytes(out), bytes(err), how

    with selectors.DefaultSelector() as selector:
        for stream in (process.stdout, process.stderr):
            selector.register(stream, selectors.EVENT_READ)
        while selector.get_map():
            if deadline.passed():
                return result("hung")
            for key, _ in selector.select(deadline.remaining()):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    selector.unregister(key.fileobj)
                    continue
                buffers[key.fd] += chunk
                if len(buffers[key.fd]) > limit:
                    return result("too-much")
    while process.poll() is None:
        if deadline.passed():
            return result("hung-after-output")
        time.sleep(min(_POLL_INTERVAL, deadline.remaining()))
    return result("exited")


def run_nvidia_smi(
    binary: str, deadline: Deadline, on_run: Callable[[str], None] | None = None
) -> Runner:
    """A Runner that executes ``binary``, keeping stdout and stderr apart, within ``deadline``.

    ``on_run`` is told what is about to run (for the watchdog's reason).
    """

    def run(args: list[str]) -> CommandResult:
        if on_run is not None:
            on_run(f"starting {command_name(args)}")
        if deadline.passed():
            unstarted = Unfinished(list(args), started=False)
            raise CheckFailed(EXIT_NVIDIA_SMI_FAILED, hung_reason(deadline.seconds, unstarted))
        try:
            process = subprocess.Popen(
                [binary, *args],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as error:
            raise CheckFailed(
                EXIT_NO_NVIDIA_SMI,
                f"nvidia-smi ({binary}) could not be started in the container "
                f"({error.strerror or error}): the node's NVIDIA container runtime did not mount "
                f"the driver tools properly; {ASK_ADMIN_NODE}.",
            ) from None
        if on_run is not None:
            on_run(f"in {command_name(args)}")
        how = "failed"
        try:
            stdout, stderr, how = communicate(process, deadline)
        finally:
            if how != "exited":  # also when reading failed: no nvidia-smi outlives its run
                stop(process)
            for stream in (process.stdout, process.stderr):
                if stream is not None:
                    stream.close()
        if how == "too-much":
            raise unreadable(
                OutputError(
                    f"{command_name(args)} printed more than {MAX_OUTPUT // (1 << 20)} MiB "
                    "without finishing"
                )
            )
        if how != "exited":
            unfinished = Unfinished(list(args), stdout, stderr, how == "hung-after-output")
            raise CheckFailed(EXIT_NVIDIA_SMI_FAILED, hung_reason(deadline.seconds, unfinished))
        assert process.returncode is not None
        return CommandResult(process.returncode, decode_output(stdout), decode_output(stderr))

    return run


# Where nvidia-smi is when it is not on PATH, tried in this order: managed Kubernetes and the
# docker-stacks CUDA images have the driver tools under /usr/local/nvidia/bin, and the GPU
# Operator's driver container installs the driver under /run/nvidia/driver.
DRIVER_BIN_DIRS: tuple[str, ...] = ("/usr/local/nvidia/bin", "/run/nvidia/driver/usr/bin")


def find_nvidia_smi(
    name: str, path: str | None = None, known_dirs: Sequence[str] = DRIVER_BIN_DIRS
) -> tuple[str, str] | None:
    """(the binary to run, where it was found), or None when there is none.

    ``name`` with a slash is used as given. A bare name is looked up on ``path`` (default:
    ``$PATH``), then in ``known_dirs``.
    """
    if os.sep in name:
        return (name, "as given") if os.path.exists(name) else None
    found = shutil.which(name, path=path)
    if found:
        return found, "on PATH"
    for directory in known_dirs:
        candidate = os.path.join(directory, name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate, f"not on PATH; found in {directory}"
    return None


def check(
    args: argparse.Namespace, deadline: Deadline | None = None, outcome: Outcome | None = None
) -> CheckResult:
    """Run the whole check with the parsed command line, within ``deadline`` (default: now
    plus ``args.timeout``); ``outcome`` is kept told what the check is doing."""
    deadline = Deadline(args.timeout) if deadline is None else deadline
    outcome = Outcome() if outcome is None else outcome
    outcome.doing = "looking for nvidia-smi"
    found = find_nvidia_smi(args.nvidia_smi, known_dirs=DRIVER_BIN_DIRS)
    if found is None:
        where = (
            repr(args.nvidia_smi)
            if os.sep in args.nvidia_smi
            else f"{args.nvidia_smi!r} not on PATH nor in " + " or ".join(DRIVER_BIN_DIRS)
        )
        return CheckResult(
            ok=False,
            exit_code=EXIT_NO_NVIDIA_SMI,
            reason="nvidia-smi was not found in the container: the node's NVIDIA container "
            f"runtime did not mount the driver tools into it ({where}); {ASK_ADMIN_NODE}.",
        )
    binary, where = found
    used = f"Using nvidia-smi at {binary} ({where})."
    try:
        collected = collect(run_nvidia_smi(binary, deadline, outcome.tell))
    except CheckFailed as failure:
        return CheckResult(
            ok=False, exit_code=failure.exit_code, reason=failure.reason, report=[used]
        )
    outcome.doing = "after nvidia-smi answered"
    result = evaluate(
        args.expect,
        args.resource,
        collected.listing,
        collected.records,
        args.cuda,
        collected.warnings,
        collected.no_devices,
    )
    result.report.insert(0, used)
    return result


def write_termination_message(path: str, message: str) -> None:
    """Write ``message`` where Kubernetes reads the termination message; skip if impossible.

    The kubelet creates the default file in every container; outside one (a run by hand) the
    check does not create it in /dev.
    """
    if not path or (path == DEFAULT_TERMINATION_LOG and not os.path.exists(path)):
        return
    try:
        with open(path, "w", encoding="utf-8") as stream:
            # Kubernetes keeps at most 4096 bytes of a termination message.
            stream.write(message.encode("utf-8")[:4000].decode("utf-8", errors="ignore") + "\n")
    except OSError:
        pass


DEFAULT_TERMINATION_LOG = "/dev/termination-log"
_TERMINATION_LOG_OPTION = "--termination-log"


class UsageError(Exception):
    """A bad command line (argparse's message)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        # argparse would print usage and exit(2) here, before the termination log is written.
        raise UsageError(message)


def termination_log_of(argv: Sequence[str]) -> str:
    """The termination log named on a command line, read without argparse so that it is known
    even when the rest of the command line is bad."""
    path = DEFAULT_TERMINATION_LOG
    for position, arg in enumerate(argv):
        if arg == _TERMINATION_LOG_OPTION and position + 1 < len(argv):
            path = argv[position + 1]
        elif arg.startswith(_TERMINATION_LOG_OPTION + "="):
            path = arg.split("=", 1)[1]
    return path


def build_parser() -> argparse.ArgumentParser:
    """The command line; see ``--help``."""
    parser = _Parser(
        prog=PROG,
        # Abbreviations would let "--termination" name the log without termination_log_of
        # seeing it.
        allow_abbrev=False,
        description="Check with nvidia-smi that this container sees the GPUs it requested, that "
        "they are healthy and that the driver suits the image's CUDA version.",
    )
    parser.add_argument(
        "--expect", type=int, required=True, help="number of GPUs (or MIG devices) requested"
    )
    parser.add_argument(
        "--resource",
        default="nvidia.com/gpu",
        help="Kubernetes resource name requested, e.g. nvidia.com/mig-1g.10gb (MIG devices of "
        "that profile are counted then); default: %(default)s",
    )
    parser.add_argument("--cuda", default=None, help="the image's CUDA version X.Y (optional)")
    parser.add_argument(
        _TERMINATION_LOG_OPTION,
        default=DEFAULT_TERMINATION_LOG,
        help="file to write the outcome to, a one-line reason on failure; default: %(default)s",
    )
    parser.add_argument(
        "--nvidia-smi",
        default="nvidia-smi",
        help="nvidia-smi to run: a path, or a name looked up on PATH and then in "
        + ", ".join(DRIVER_BIN_DIRS)
        + "; default: %(default)s",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT,
        help="seconds the whole check may take, every nvidia-smi run together; when they pass, "
        "nvidia-smi is killed (and left behind if it cannot be) and the check fails; "
        "default: %(default)g",
    )
    return parser


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """Parse the command line; raises UsageError (``--help`` still exits 0 via argparse)."""
    parser = build_parser()
    args = parser.parse_args(list(argv))
    if args.expect < 1:
        parser.error("--expect must be at least 1")
    # "not > 0" also refuses nan; inf would mean no deadline at all.
    if not args.timeout > 0 or args.timeout == float("inf"):
        parser.error("--timeout must be a number of seconds above 0")
    return args


class Outcome:
    """Who writes the check's outcome: the main thread when it finishes, or the watchdog when
    it does not. Whoever claims it first writes it; the other then writes nothing."""

    def __init__(self) -> None:
        self._claim = threading.Lock()
        self.written = threading.Event()
        self.exit_code = EXIT_INTERNAL
        #: what the check is doing, for the watchdog's reason ("in nvidia-smi -L")
        self.doing = "starting"

    def tell(self, doing: str) -> None:
        self.doing = doing

    def claim(self) -> bool:
        return self._claim.acquire(blocking=False)


def _hard_exit(code: int) -> None:
    """End the process at once. Tests replace it; in a pod it must not return."""
    os._exit(code)


def start_watchdog(deadline: Deadline, termination_log: str, outcome: Outcome) -> threading.Timer:
    """End the check shortly after ``deadline`` even if its main thread is stuck.

    The main thread stops nvidia-smi at the deadline by itself; this is for anywhere else it
    could block without limit (``Popen`` waits for the exec of a binary on a hung mount, for
    one). It writes the outcome and exits the process without the interpreter's shutdown.
    """

    def fire() -> None:
        if not outcome.claim():
            return
        reason = watchdog_reason(deadline.seconds, outcome.doing)
        outcome.exit_code = EXIT_NVIDIA_SMI_FAILED
        try:
            print(reason, file=sys.stderr, flush=True)
        except (OSError, ValueError):
            pass  # the termination log below is what the spawner reads
        write_termination_message(termination_log, reason)
        outcome.written.set()
        _hard_exit(EXIT_NVIDIA_SMI_FAILED)

    timer = threading.Timer(deadline.remaining() + KILL_GRACE + WATCHDOG_GRACE, fire)
    timer.daemon = True
    timer.start()
    return timer


def finish(result: CheckResult, termination_log: str, outcome: Outcome | None = None) -> int:
    """Print the report and the outcome, write the termination log, return the exit code.

    When the watchdog has claimed ``outcome`` already, it writes nothing and returns the
    watchdog's exit code.
    """
    if outcome is not None and not outcome.claim():
        outcome.written.wait(KILL_GRACE + WATCHDOG_GRACE)
        return outcome.exit_code
    for line in result.report:
        print(line)
    sys.stdout.flush()
    if result.ok:
        print("GPU check passed.")
        sys.stdout.flush()
        write_termination_message(termination_log, "GPU check passed.")
        return EXIT_OK
    reason = result.reason or EXIT_CODES.get(result.exit_code, ("", "The GPU check failed."))[1]
    print(reason, file=sys.stderr)
    sys.stderr.flush()
    write_termination_message(termination_log, reason)
    return result.exit_code


def main(argv: Sequence[str] | None = None) -> int:
    """Run the check, print the report, write the termination log, and return the exit code."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    termination_log = termination_log_of(arguments)
    outcome = Outcome()
    watchdog = None
    try:
        args = parse_args(arguments)
        deadline = Deadline(args.timeout)
        watchdog = start_watchdog(deadline, termination_log, outcome)
        result = check(args, deadline, outcome)
    except UsageError as error:
        print(build_parser().format_usage().rstrip(), file=sys.stderr)
        result = CheckResult(
            ok=False,
            exit_code=EXIT_USAGE,
            reason=f"The GPU check was started with invalid arguments ({PROG}: error: {error}); "
            "ask an admin to check the spawner's GPU check command.",
        )
    except Exception as error:  # the user must get one line, never a traceback
        result = CheckResult(
            ok=False,
            exit_code=EXIT_INTERNAL,
            reason=f"The GPU check crashed ({type(error).__name__}: {error}); ask an admin to "
            "look at the gpu-check container's log.",
        )
    code = finish(result, termination_log, outcome)
    if watchdog is not None:
        watchdog.cancel()
    return code


def run_as_script() -> None:
    """``python3 -c <source>``: run ``main`` and exit with its code."""
    code = main()
    if ABANDONED:
        # An nvidia-smi left stuck in the driver: exit without the interpreter's shutdown, so
        # that no finalizer or atexit hook can touch it; the outcome is written and flushed.
        sys.stdout.flush()
        sys.stderr.flush()
        _hard_exit(code)
    sys.exit(code)


if __name__ == "__main__":
    run_as_script()
