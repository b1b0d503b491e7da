"""An emulated ``nvidia-smi`` for the processes of sandbox containers.

The local kubelet puts a wrapper named ``nvidia-smi`` first on the PATH of a
container that the NVIDIA runtime would have given the driver (one whose
``NVIDIA_VISIBLE_DEVICES`` is neither unset, empty nor ``void``). The wrapper
runs this module with ``GPUSPAWNER_SANDBOX_SMI_STATE`` pointing at the
container's device state (see :func:`devices.container_device_state`), and it
reports exactly the GPUs of that container.

The output formats are taken from recorded real runs (the fixtures under
``tests/fixtures/nvidia-smi/``): the R580+ default table (and the narrow layout
of drivers before R530, so an injected old driver looks old), ``-L`` with MIG
lines, ``--version``, and ``--query-gpu=… --format=csv[,noheader][,nounits]``
whose valid fields, header names, units and recorded values come from a
complete ``--query-gpu`` capture (``sandbox/go/nvidiasmi/capture.json``, which
the Go nvidia-smi of real nodes embeds: one copy of the data). Faults
injected in the sandbox's ``faults.json`` are read at every call.

This renderer serves the old emulated kubelet only and goes with it; real
nodes run the Go port (``sandbox/go/nvidiasmi``).

This module must not import the spawner's validation code: the sandbox tests
that code, it is not built from it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from .build import GO_MODULE_DIR
from .devices import Fault, effective_driver, load_faults
from .gpudriver import PCI_DEVICE_IDS
from .topology import GPU_MODELS, GPUModel, cuda_version_for

STATE_ENV = "GPUSPAWNER_SANDBOX_SMI_STATE"
CAPTURE_FILE = GO_MODULE_DIR / "nvidiasmi" / "capture.json"

# Return codes from the nvidia-smi man page (NVML's nvmlReturn_t).
RC_INVALID_ARGUMENT = 2
RC_NOT_FOUND = 6
RC_DRIVER_NOT_LOADED = 9
RC_GPU_LOST = 15

DRIVER_NOT_LOADED = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running."
)
NO_DEVICES = "No devices were found"
GPU_LOST = "Unable to determine the device handle for GPU{bus}: GPU is lost.  Reboot the system to recover this GPU"
INVALID_FIELD = 'Field "{field}" is not a valid field to query.'
INVALID_ARGS = "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help."

# Old names nvidia-smi still accepts for a field; the header echoes the canonical name.
FIELD_ALIASES = {
    "gpu_name": "name",
    "gpu_serial": "serial",
    "gpu_uuid": "uuid",
    "gpu_bus_id": "pci.bus_id",
    "clocks.gr": "clocks.current.graphics",
    "clocks.sm": "clocks.current.sm",
    "clocks.mem": "clocks.current.memory",
    "clocks.video": "clocks.current.video",
    "clocks.max.gr": "clocks.max.graphics",
    "clocks.max.mem": "clocks.max.memory",
    "clocks.applications.gr": "clocks.applications.graphics",
    "clocks.applications.mem": "clocks.applications.memory",
    "clocks.default_applications.gr": "clocks.default_applications.graphics",
    "clocks.default_applications.mem": "clocks.default_applications.memory",
    "enforced.power.limit": "enforced.power.limit",
}
_THROTTLE = "clocks_throttle_reasons."


@dataclass
class MigView:
    uuid: str
    profile: str
    gi: int
    ci: int


@dataclass
class GPUView:
    """One GPU as this container's nvidia-smi sees it."""

    index: int  # index inside the container (0..n-1)
    uuid: str
    model: GPUModel
    bus_id: str
    serial: str
    mig_enabled: bool
    mig: list[MigView] = field(default_factory=list)
    ecc_uncorrected: int = 0
    lost: bool = False


@dataclass
class View:
    driver: str
    gpus: list[GPUView]
    driver_loaded: bool = True
    had_gpus: bool = False

    @property
    def cuda(self) -> str:
        return cuda_version_for(self.driver)

    @property
    def driver_major(self) -> int:
        return int(self.driver.split(".", 1)[0])


def build_view(state: dict, faults: list[Fault]) -> View:
    """Apply the injected faults to a container's device state."""
    node = state["node"]
    driver = effective_driver(node, state["driver"], faults)
    loaded = not any(
        f.node == node and f.gpu is None and f.kind == "driver-not-loaded" for f in faults
    )
    gpus = []
    for g in state["gpus"]:
        mine = [f for f in faults if f.matches(node, g["index"], g["uuid"])]
        kinds = {f.kind for f in mine}
        if "missing" in kinds:
            continue
        ecc = sum(int(f.value or 1) for f in mine if f.kind == "ecc")
        gpus.append(
            GPUView(
                index=len(gpus),
                uuid=g["uuid"],
                model=GPU_MODELS[g["model"]],
                bus_id=g["bus_id"],
                serial=g["serial"],
                mig_enabled=g["mig_enabled"],
                mig=[MigView(**m) for m in g["mig"]],
                ecc_uncorrected=ecc,
                lost="lost" in kinds,
            )
        )
    return View(driver=driver, gpus=gpus, driver_loaded=loaded, had_gpus=bool(state["gpus"]))


# --- --query-gpu -------------------------------------------------------------------------


@dataclass(frozen=True)
class Capture:
    """The recorded ``--query-gpu`` capture: field -> (header text, unit, recorded value)."""

    fields: dict[str, tuple[str, str, str]]
    mig_values: dict[str, str]


def load_capture(path: Path = CAPTURE_FILE) -> Capture:
    data = json.loads(path.read_text())
    fields = {}
    for header, value in zip(
        data["gpu"]["header"].split(", "), data["gpu"]["row"].split(", "), strict=True
    ):
        name, _, unit = header.partition(" [")
        fields[name] = (header, unit.rstrip("]"), value)
    mig_values = dict(
        zip(
            [h.partition(" [")[0] for h in data["mig"]["header"].split(", ")],
            data["mig"]["row"].split(", "),
            strict=True,
        )
    )
    return Capture(fields, mig_values)


def canonical_field(name: str, capture: Capture) -> str | None:
    name = name.strip()
    name = FIELD_ALIASES.get(name, name)
    if name.startswith(_THROTTLE):
        name = "clocks_event_reasons." + name[len(_THROTTLE) :]
    return name if name in capture.fields else None


def _with_unit(number: float | int, unit: str) -> str:
    return f"{number} {unit}"


def gpu_values(gpu: GPUView, view: View, capture: Capture) -> dict[str, str]:
    """Every field's value for one GPU: the recorded capture, with what we know replaced."""
    values = {name: value for name, (_, _, value) in capture.fields.items()}
    if gpu.mig_enabled:
        values.update(capture.mig_values)
    model = gpu.model
    bus = gpu.bus_id.split(":")
    # Keep the recorded free/reserved relation (NVML rounds each figure on its own).
    recorded_total = int(values["memory.total"].split()[0])
    recorded_free = int(values["memory.free"].split()[0])
    values.update(
        {
            "timestamp": time.strftime("%Y/%m/%d %H:%M:%S.")
            + f"{int(time.time() * 1000) % 1000:03d}",
            "driver_version": view.driver,
            "count": str(len(view.gpus)),
            "name": model.name,
            "serial": gpu.serial,
            "uuid": gpu.uuid,
            "pci.bus_id": gpu.bus_id,
            "pci.domain": f"0x{bus[0][-4:]}",
            "pci.bus": f"0x{bus[1]}",
            "pci.device": f"0x{bus[2].split('.')[0]}",
            "pci.device_id": PCI_DEVICE_IDS.get(model.key, values["pci.device_id"]),
            "index": str(gpu.index),
            "compute_cap": model.compute_cap,
            "memory.total": _with_unit(model.memory_mib, "MiB"),
            "memory.free": _with_unit(recorded_free + model.memory_mib - recorded_total, "MiB"),
            "ecc.mode.current": "Enabled" if model.ecc else "Disabled",
            "ecc.mode.pending": "Enabled" if model.ecc else "Disabled",
            "power.draw": _with_unit(f"{model.idle_power_w:.2f}", "W"),
            "power.draw.average": _with_unit(f"{model.idle_power_w:.2f}", "W"),
            "power.draw.instant": _with_unit(f"{model.idle_power_w:.2f}", "W"),
            "power.limit": _with_unit(f"{model.power_cap_w:.2f}", "W"),
            "enforced.power.limit": _with_unit(f"{model.power_cap_w:.2f}", "W"),
            "power.default_limit": _with_unit(f"{model.power_cap_w:.2f}", "W"),
            "power.max_limit": _with_unit(f"{model.power_cap_w:.2f}", "W"),
        }
    )
    if gpu.ecc_uncorrected:
        n = str(gpu.ecc_uncorrected)
        for scope in ("volatile", "aggregate"):
            for part in ("device_memory", "dram", "total"):
                values[f"ecc.errors.uncorrected.{scope}.{part}"] = n
        if not gpu.mig_enabled:
            values["remapped_rows.uncorrectable"] = n
            values["remapped_rows.pending"] = "Yes"
    return values


def query_gpu(view: View, fields_arg: str, fmt: str, capture: Capture) -> tuple[str, int]:
    """``--query-gpu=<fields> --format=<fmt>``: (stdout, return code)."""
    names = [f for f in fields_arg.split(",") if f.strip()]
    canonical = []
    for name in names:
        c = canonical_field(name, capture)
        if c is None:
            return INVALID_FIELD.format(field=name.strip()) + "\n\n", RC_INVALID_ARGUMENT
        canonical.append(c)
    options = [o.strip() for o in fmt.split(",")]
    if "csv" not in options or set(options) - {"csv", "noheader", "nounits"}:
        return INVALID_ARGS + "\n", RC_INVALID_ARGUMENT
    lines = []
    if "noheader" not in options:
        lines.append(", ".join(capture.fields[c][0] for c in canonical))
    for gpu in view.gpus:
        values = gpu_values(gpu, view, capture)
        row = []
        for c in canonical:
            value = values[c]
            unit = capture.fields[c][1]
            if "nounits" in options and unit and value.endswith(" " + unit):
                value = value[: -len(unit) - 1]
            row.append(value)
        lines.append(", ".join(row))
    return "".join(line + "\n" for line in lines), 0


# --- the default table -------------------------------------------------------------------


def _table_name(name: str, width: int) -> str:
    return name if len(name) <= width else name[: width - 3] + "..."


def _modern_table(view: View, capture: Capture) -> list[str]:
    """The 91-column layout of R530+ drivers (the R580+ variant from R580 on)."""
    plus = view.driver_major >= 580
    lines = [
        "+" + "-" * 89 + "+",
        f"| NVIDIA-SMI {view.driver:<23}Driver Version: {view.driver:<15}"
        f"CUDA Version: {view.cuda:<9}|",
        ("+" if plus else "|") + "-" * 41 + "+" + "-" * 24 + "+" + "-" * 22 + "+",
        "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |",
        "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |",
        "|                                         |                        |               MIG M. |",
        "|" + "=" * 41 + "+" + "=" * 24 + "+" + "=" * 22 + "|",
    ]
    separator = "+" + "-" * 41 + "+" + "-" * 24 + "+" + "-" * 22 + "+"
    for gpu in view.gpus:
        v = gpu_values(gpu, view, capture)
        used = int(v["memory.used"].split()[0])
        ecc = "On" if gpu.mig_enabled else (str(gpu.ecc_uncorrected) if gpu.model.ecc else "N/A")
        util = "N/A" if gpu.mig_enabled else v["utilization.gpu"].replace(" ", "")
        temp = v["temperature.gpu"]
        lines += [
            f"|{gpu.index:>4}  {_table_name(gpu.model.name, 31):<31}{'On':<3} |"
            f"{gpu.bus_id:>19} {'Off':>3} |{ecc:>21} |",
            f"| {'N/A':>3}   {temp:>2}C    {'P0':<2}{gpu.model.idle_power_w:>15}W / "
            f"{gpu.model.power_cap_w:>4}W |{used:>8}MiB / {gpu.model.memory_mib:>6}MiB |"
            f"{util:>8}{'Default':>13} |",
            f"|{'':41}|{'':24}|{'Enabled' if gpu.mig_enabled else 'Disabled':>21} |",
            separator,
        ]
    spacer = "" if plus else " " * 89
    mig_rows = [(g, m) for g in view.gpus for m in g.mig]
    if mig_rows:
        lines += [spacer, *_mig_table(mig_rows)]
    wide_pid = view.driver_major >= 570
    lines += [
        spacer,
        "+" + "-" * 89 + "+",
        "| Processes:" + " " * 78 + "|",
        "|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |"
        if wide_pid
        else "|  GPU   GI   CI        PID   Type   Process name                              GPU Memory |",
        "|        ID   ID                                                               Usage      |",
        "|" + "=" * 89 + "|",
        "|  No running processes found" + " " * 61 + "|",
        "+" + "-" * 89 + "+",
    ]
    return lines


def _mig_table(rows: list[tuple[GPUView, MigView]]) -> list[str]:
    """The R590 "MIG devices" table, with the container's MIG devices only."""
    sep = "+" + "-" * 18 + "+" + "-" * 34 + "+" + "-" * 11 + "+" + "-" * 23 + "+"
    lines = [
        "+" + "-" * 89 + "+",
        "| MIG devices:" + " " * 76 + "|",
        sep,
        "| GPU  GI  CI  MIG |              Shared Memory-Usage |        Vol|        Shared         |",
        "|      ID  ID  Dev |                Shared BAR1-Usage | SM     Unc| CE ENC  DEC  OFA  JPG |",
        "|                  |                                  |        ECC|                       |",
        "|" + "=" * 18 + "+" + "=" * 34 + "+" + "=" * 11 + "+" + "=" * 23 + "|",
    ]
    per_gpu: dict[int, int] = {}
    for gpu, mig in rows:
        profile = gpu.model.mig_profiles[mig.profile]
        dev = per_gpu.get(gpu.index, 0)
        per_gpu[gpu.index] = dev + 1
        ecc = gpu.ecc_uncorrected
        lines += [
            f"|{gpu.index:>3}{mig.gi:>5}{mig.ci:>4}{dev:>4}  |"
            f"{0:>16}MiB / {profile.memory_mib:>5}MiB    |"
            f" {profile.multiprocessors:>2}{ecc:>7} |"
            f"{profile.copy_engines:>3}{profile.encoders:>4}{profile.decoders:>5}"
            f"{profile.ofa:>5}{profile.jpeg:>5} |",
            f"|{'':18}|{0:>16}MiB / {profile.bar1_mib:>5}MiB    |{'':11}|{'':23}|",
            sep,
        ]
    return lines


def _legacy_table(view: View) -> list[str]:
    """The 79-column layout of drivers before R530 (e.g. 470.82.01, 510.47.03)."""
    lines = [
        "+" + "-" * 77 + "+",
        f"| NVIDIA-SMI {view.driver:<13}Driver Version: {view.driver:<13}"
        f"CUDA Version: {view.cuda:<9}|",
        "|" + "-" * 31 + "+" + "-" * 22 + "+" + "-" * 22 + "+",
        "| GPU  Name        Persistence-M| Bus-Id        Disp.A | Volatile Uncorr. ECC |",
        "| Fan  Temp  Perf  Pwr:Usage/Cap|         Memory-Usage | GPU-Util  Compute M. |",
        "|                               |                      |               MIG M. |",
        "|" + "=" * 31 + "+" + "=" * 22 + "+" + "=" * 22 + "|",
    ]
    for gpu in view.gpus:
        ecc = "On" if gpu.mig_enabled else (str(gpu.ecc_uncorrected) if gpu.model.ecc else "N/A")
        lines += [
            f"|{gpu.index:>4}  {_table_name(gpu.model.name, 18):<18}  {'On':<3}  |"
            f" {gpu.bus_id} {'Off':>3} |{ecc:>21} |",
            f"| {'N/A':>3}   {41:>2}C    {'P0':<2}{gpu.model.idle_power_w:>6}W / "
            f"{gpu.model.power_cap_w:>3}W |{0:>7}MiB / {gpu.model.memory_mib:>5}MiB |"
            f"{'N/A' if gpu.mig_enabled else '0%':>8}{'Default':>13} |",
            f"|{'':31}|{'':22}|{'Enabled' if gpu.mig_enabled else 'Disabled':>21} |",
            "+" + "-" * 31 + "+" + "-" * 22 + "+" + "-" * 22 + "+",
        ]
    lines += [
        "",
        "+" + "-" * 77 + "+",
        "| Processes:" + " " * 66 + "|",
        "|  GPU   GI   CI        PID   Type   Process name                  GPU Memory |",
        "|        ID   ID                                                   Usage      |",
        "|" + "=" * 77 + "|",
        "|  No running processes found" + " " * 49 + "|",
        "+" + "-" * 77 + "+",
    ]
    return lines


def table(view: View, capture: Capture) -> str:
    """The default ``nvidia-smi`` output, timestamp line first."""
    stamp = time.strftime("%a %b %d %H:%M:%S %Y").ljust(31)
    body = _modern_table(view, capture) if view.driver_major >= 530 else _legacy_table(view)
    return "\n".join([stamp, *body]) + "\n"


def list_gpus(view: View) -> str:
    """``nvidia-smi -L``."""
    lines = []
    for gpu in view.gpus:
        lines.append(f"GPU {gpu.index}: {gpu.model.name} (UUID: {gpu.uuid})")
        for dev, mig in enumerate(gpu.mig):
            lines.append(f"  MIG {mig.profile:<12}Device {dev:>2}: (UUID: {mig.uuid})")
    return "".join(line + "\n" for line in lines)


def version(view: View) -> str:
    """``nvidia-smi --version`` (the R5xx form)."""
    nvml = ".".join(view.driver.split(".")[:2])
    return (
        f"NVIDIA-SMI version  : {view.driver}\n"
        f"NVML version        : {nvml}\n"
        f"DRIVER version      : {view.driver}\n"
        f"CUDA Version        : {view.cuda}\n"
    )


# --- command line ------------------------------------------------------------------------


@dataclass
class Args:
    mode: str = "table"  # table | list | version | query
    query: str = ""
    fmt: str = ""
    ids: list[str] | None = None


def parse_args(argv: list[str]) -> Args | None:
    """The subset of nvidia-smi's options the sandbox emulates; None for anything else."""
    args = Args()
    it = iter(argv)
    for arg in it:
        key, eq, value = arg.partition("=")
        if arg in ("-L", "--list-gpus"):
            args.mode = "list"
        elif arg in ("--version",):
            args.mode = "version"
        elif key in ("--query-gpu", "-q-gpu"):
            args.mode = "query"
            args.query = value if eq else next(it, "")
        elif key in ("--format",):
            args.fmt = value if eq else next(it, "")
        elif key in ("-i", "--id"):
            args.ids = (value if eq else next(it, "")).split(",")
        else:
            return None
    if args.mode == "query" and not args.fmt:
        return None
    return args


def run(argv: list[str], state: dict, faults: list[Fault], out: TextIO, err: TextIO) -> int:
    """Behave like ``nvidia-smi argv`` on the GPUs in ``state``; return the exit code."""
    args = parse_args(argv)
    if args is None:
        out.write(INVALID_ARGS + "\n")
        return RC_INVALID_ARGUMENT
    view = build_view(state, faults)
    if not view.driver_loaded:
        out.write(DRIVER_NOT_LOADED + "\n\n")
        err.write(DRIVER_NOT_LOADED + "\n")
        return RC_DRIVER_NOT_LOADED
    if args.mode == "version":
        out.write(version(view))
        return 0
    if args.ids is not None:
        wanted = {i.strip() for i in args.ids}
        view.gpus = [g for g in view.gpus if str(g.index) in wanted or g.uuid in wanted]
    if not view.gpus:
        out.write(NO_DEVICES + "\n")
        return RC_NOT_FOUND
    lost = [g for g in view.gpus if g.lost]
    if lost:
        for gpu in lost:
            out.write(GPU_LOST.format(bus=gpu.bus_id[4:]) + "\n")
        return RC_GPU_LOST
    if args.mode == "list":
        out.write(list_gpus(view))
        return 0
    capture = load_capture()
    if args.mode == "query":
        text, rc = query_gpu(view, args.query, args.fmt, capture)
        out.write(text)
        return rc
    out.write(table(view, capture))
    return 0


def main(argv: list[str] | None = None) -> int:
    path = os.environ.get(STATE_ENV)
    if not path:
        # Without the container's state there is no driver to talk to.
        print(DRIVER_NOT_LOADED + "\n")
        return RC_DRIVER_NOT_LOADED
    state = json.loads(Path(path).read_text())
    faults = load_faults(state["faults_file"])
    return run(sys.argv[1:] if argv is None else argv, state, faults, sys.stdout, sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
