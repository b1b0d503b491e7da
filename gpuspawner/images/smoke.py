#!/usr/bin/env python3
"""gpu-smoke-test: prove that the GPUs a notebook was given actually work.

Installed in every gpuspawner notebook image as /usr/local/bin/gpu-smoke-test and
run by `gpuspawner-images test`. It fails (exit 1) unless

* the framework (PyTorch or TensorFlow) sees exactly the GPUs that `nvidia-smi -L`
  lists and that NVIDIA_VISIBLE_DEVICES asked for,
* a matrix product on each GPU matches the same product on the CPU, and
* with PyTorch and two or more GPUs, a tensor moves from one GPU to another intact.

`--cpu` is the mode for CPU-only containers: it fails if any GPU *is* visible,
which is what a CPU profile must guarantee.

This file runs inside the images with nothing but the standard library and the
framework, so it imports nothing from gpuspawner; the package ships it so that
its logic is tested without a GPU (tests/images/test_smoke.py).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_UNUSABLE = 2

# Sizes are small on purpose: the test must take seconds, not exercise the GPU.
MATMUL_SIZE = 256
CPU_MATMUL_SIZE = 24
# Products are compared with TF32 switched off, so float32 rounding is all that
# differs between devices; 1e-3 relative to the largest entry is far above it
# and far below any real corruption.
MATMUL_TOLERANCE = 1e-3

_GPU_LINE = re.compile(r"^GPU (?P<index>\d+): (?P<name>.*?) \(UUID: (?P<uuid>[^)]+)\)\s*$")
_MIG_LINE = re.compile(
    r"^\s+MIG (?P<profile>\S+)\s+Device\s+(?P<index>\d+): \(UUID: (?P<uuid>[^)]+)\)\s*$"
)


@dataclass
class Device:
    """One line of `nvidia-smi -L`: a GPU, or a MIG device of the GPU before it."""

    index: int
    name: str
    uuid: str
    mig: bool = False
    parent: int | None = None


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


@dataclass
class Report:
    mode: str
    framework: str
    framework_version: str
    framework_cuda: str
    visible_devices: str | None
    devices: list[Device] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)


class SmokeTestError(Exception):
    """The test could not run at all (no framework, unusable arguments)."""


# --- nvidia-smi and NVIDIA_VISIBLE_DEVICES -----------------------------------------


def parse_nvidia_smi_list(text: str) -> list[Device]:
    """Parse `nvidia-smi -L` output into devices; unknown lines are ignored.

    MIG lines ("  MIG 1g.10gb  Device  0: (UUID: MIG-...)") belong to the GPU line
    above them.
    """
    devices: list[Device] = []
    parent: int | None = None
    for line in text.splitlines():
        gpu = _GPU_LINE.match(line)
        if gpu:
            parent = int(gpu["index"])
            devices.append(Device(parent, gpu["name"], gpu["uuid"]))
            continue
        mig = _MIG_LINE.match(line)
        if mig and parent is not None:
            devices.append(
                Device(int(mig["index"]), f"MIG {mig['profile']}", mig["uuid"], True, parent)
            )
    return devices


def requested_devices(value: str | None) -> list[str] | None:
    """What NVIDIA_VISIBLE_DEVICES asks the container runtime for.

    Returns None for "all" (whatever the runtime gives), [] for "no GPU"
    (unset, empty, "void", "none"), else the listed indices or UUIDs.
    """
    if value is None:
        return []
    value = value.strip()
    if value.lower() in ("", "void", "none"):
        return []
    if value.lower() == "all":
        return None
    return [part.strip() for part in value.split(",") if part.strip()]


def cuda_device_count(devices: list[Device]) -> int:
    """How many devices CUDA enumerates for an `nvidia-smi -L` listing.

    Every GPU without MIG devices counts once. A process sees at most one MIG
    device (CUDA enumerates a single MIG compute instance), and a GPU split into
    MIG devices is not itself a CUDA device.
    """
    mig_parents = {d.parent for d in devices if d.mig}
    full = [d for d in devices if not d.mig and d.index not in mig_parents]
    return len(full) + (1 if mig_parents else 0)


def expected_gpu_count(
    devices: list[Device], visible: str | None, cuda_visible: str | None = None
) -> tuple[int, list[str]]:
    """The number of GPUs the framework must see, and any disagreement found.

    `devices` is what nvidia-smi lists inside the container; the runtime should
    have mounted exactly what NVIDIA_VISIBLE_DEVICES requested, so a listed
    request of a different length is itself a problem worth reporting.
    """
    problems: list[str] = []
    requested = requested_devices(visible)
    gpus = [d for d in devices if not d.mig]
    migs = [d for d in devices if d.mig]
    if requested is not None:
        if not requested and devices:
            problems.append(
                f"NVIDIA_VISIBLE_DEVICES={visible!r} asks for no GPU, "
                f"but nvidia-smi lists {len(gpus)} GPU(s)"
            )
        elif requested:
            # Requests name whole GPUs or MIG devices (MIG-<uuid> or <gpu>:<mig>);
            # compare like with like.
            wants_mig = any(r.startswith("MIG-") or ":" in r for r in requested)
            got = len(migs) if wants_mig else len(gpus)
            if got != len(requested):
                problems.append(
                    f"NVIDIA_VISIBLE_DEVICES lists {len(requested)} device(s) "
                    f"but nvidia-smi shows {got}"
                )
    count = cuda_device_count(devices)
    if cuda_visible is not None and cuda_visible.strip() not in ("", "all"):
        # CUDA stops at the first entry it cannot resolve; count the usable prefix.
        entries = [e.strip() for e in cuda_visible.split(",")]
        usable = 0
        for entry in entries:
            if entry.lstrip("-").isdigit() and int(entry) < 0:
                break
            usable += 1
        count = min(count, usable)
    elif cuda_visible is not None and cuda_visible.strip() == "":
        count = 0
    return count, problems


def run_nvidia_smi_list() -> tuple[list[Device], str | None]:
    """Run `nvidia-smi -L`; returns the devices and, if it failed, why."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return [], "nvidia-smi is not in this container (no driver was mounted)"
    try:
        proc = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=60, check=False)
    except subprocess.TimeoutExpired:
        return [], "nvidia-smi -L did not answer within 60 seconds"
    if proc.returncode != 0:
        message = (proc.stdout + proc.stderr).strip().splitlines()
        first = message[0] if message else "no output"
        return [], f"nvidia-smi -L exited with {proc.returncode}: {first}"
    return parse_nvidia_smi_list(proc.stdout), None


# --- frameworks ------------------------------------------------------------------------


class Framework:
    """What the checks need from a framework; one subclass per framework.

    Matrices cross this interface as lists of lists of floats, so the checks
    themselves need neither numpy nor the framework.
    """

    name = "none"
    version = ""
    cuda = ""

    def gpu_count(self) -> int:
        raise NotImplementedError

    def gpu_name(self, index: int) -> str:
        return f"GPU {index}"

    def matmul(self, a: list[list[float]], b: list[list[float]], gpu: int | None) -> Any:
        """a @ b on GPU `gpu`, or on the CPU when gpu is None; returns nested lists."""
        raise NotImplementedError

    def move_between(self, values: list[float], src: int, dst: int) -> tuple[list[float], int]:
        """Put `values` on GPU src, move it to GPU dst; return its values and device."""
        raise NotImplementedError

    @property
    def can_move_between(self) -> bool:
        return False


class TorchFramework(Framework):
    name = "torch"

    def __init__(self) -> None:
        import torch

        self.torch = torch
        self.version = torch.__version__
        self.cuda = torch.version.cuda or ""
        # Exact float32 products on every device: TF32 would differ from the CPU.
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False

    def gpu_count(self) -> int:
        return self.torch.cuda.device_count() if self.torch.cuda.is_available() else 0

    def gpu_name(self, index: int) -> str:
        return self.torch.cuda.get_device_name(index)

    def matmul(self, a, b, gpu):
        device = "cpu" if gpu is None else f"cuda:{gpu}"
        ta = self.torch.tensor(a, dtype=self.torch.float32, device=device)
        tb = self.torch.tensor(b, dtype=self.torch.float32, device=device)
        out = ta @ tb
        if gpu is not None:
            if out.device.index != gpu:
                raise SmokeTestError(f"the product ran on {out.device}, not GPU {gpu}")
            self.torch.cuda.synchronize(gpu)
        return out.cpu().tolist()

    @property
    def can_move_between(self) -> bool:
        return True

    def move_between(self, values, src, dst):
        t = self.torch.tensor(values, dtype=self.torch.float32, device=f"cuda:{src}")
        moved = t.to(f"cuda:{dst}")
        self.torch.cuda.synchronize(dst)
        return moved.cpu().tolist(), moved.device.index


class TensorFlowFramework(Framework):
    name = "tensorflow"

    def __init__(self) -> None:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        import tensorflow as tf

        self.tf = tf
        self.version = tf.__version__
        self.cuda = tf.sysconfig.get_build_info().get("cuda_version", "")
        tf.config.experimental.enable_tensor_float_32_execution(False)
        # Never let TensorFlow quietly run a "GPU" product on the CPU.
        tf.config.set_soft_device_placement(False)

    def gpu_count(self) -> int:
        return len(self.tf.config.list_physical_devices("GPU"))

    def gpu_name(self, index: int) -> str:
        gpu = self.tf.config.list_physical_devices("GPU")[index]
        details = self.tf.config.experimental.get_device_details(gpu)
        return details.get("device_name", gpu.name)

    def matmul(self, a, b, gpu):
        device = "/CPU:0" if gpu is None else f"/GPU:{gpu}"
        with self.tf.device(device):
            out = self.tf.linalg.matmul(
                self.tf.constant(a, dtype=self.tf.float32),
                self.tf.constant(b, dtype=self.tf.float32),
            )
        if gpu is not None and not out.device.endswith(f"GPU:{gpu}"):
            raise SmokeTestError(f"the product ran on {out.device}, not GPU {gpu}")
        return out.numpy().tolist()


class NumpyFramework(Framework):
    """The CPU-only reference: no GPU, ever. Used by `--framework numpy` and tests."""

    name = "numpy"

    def __init__(self) -> None:
        import numpy

        self.np = numpy
        self.version = numpy.__version__

    def gpu_count(self) -> int:
        return 0

    def matmul(self, a, b, gpu):
        if gpu is not None:
            raise SmokeTestError("numpy has no GPU")
        return (self.np.asarray(a, dtype="float32") @ self.np.asarray(b, dtype="float32")).tolist()


FRAMEWORKS: dict[str, type[Framework]] = {
    "torch": TorchFramework,
    "tensorflow": TensorFlowFramework,
    "numpy": NumpyFramework,
}


def load_framework(choice: str) -> Framework:
    """The named framework, or for "auto" the first of torch, tensorflow, numpy installed."""
    names = list(FRAMEWORKS) if choice == "auto" else [choice]
    if choice != "auto" and choice not in FRAMEWORKS:
        raise SmokeTestError(f"unknown framework {choice!r}; choose from {', '.join(FRAMEWORKS)}")
    for name in names:
        try:
            return FRAMEWORKS[name]()
        except ImportError:
            continue
    raise SmokeTestError(f"none of {', '.join(names)} can be imported in this environment")


# --- checks ------------------------------------------------------------------------------


def random_matrix(rows: int, cols: int, seed: int) -> list[list[float]]:
    rng = random.Random(seed)
    return [[rng.uniform(-1.0, 1.0) for _ in range(cols)] for _ in range(rows)]


def naive_matmul(a: list[list[float]], b: list[list[float]]) -> list[list[float]]:
    """Plain-Python product: the reference the CPU-mode check trusts."""
    columns = list(zip(*b, strict=True))
    return [[sum(x * y for x, y in zip(row, col, strict=True)) for col in columns] for row in a]


def max_relative_error(got: Any, want: list[list[float]]) -> float:
    """Largest |got - want| over the largest |want|: one number per product."""
    got_rows = [list(r) for r in got]
    if len(got_rows) != len(want) or any(
        len(g) != len(w) for g, w in zip(got_rows, want, strict=True)
    ):
        return float("inf")
    scale = max((abs(v) for row in want for v in row), default=0.0) or 1.0
    worst = 0.0
    for g_row, w_row in zip(got_rows, want, strict=True):
        for g, w in zip(g_row, w_row, strict=True):
            diff = abs(float(g) - w)
            if diff != diff:  # NaN from a broken device
                return float("inf")
            worst = max(worst, diff)
    return worst / scale


def name_mismatch(framework: Framework, devices: list[Device]) -> str | None:
    """Whether the framework's GPUs are the models nvidia-smi lists, compared as multisets.

    CUDA orders devices fastest first and nvidia-smi by PCI bus, so only the
    names as a whole can be compared. MIG devices carry their parent's name in
    the framework, so listings with MIG are not compared.
    """
    if any(d.mig for d in devices):
        return None
    try:
        seen = sorted(framework.gpu_name(i).strip() for i in range(framework.gpu_count()))
    except Exception as e:  # a framework that cannot name its devices is itself a finding
        return f"{framework.name} cannot name its GPUs ({type(e).__name__}: {e})"
    listed = sorted(d.name.strip() for d in devices)
    if seen != listed:
        return f"{framework.name} sees {_tally(seen)}; nvidia-smi lists {_tally(listed)}"
    return None


def _tally(names: list[str]) -> str:
    """'2x NVIDIA A10, 1x Tesla T4': short enough for one report line."""
    return ", ".join(f"{n}x {name}" for name, n in sorted(Counter(names).items()))


def check_visibility(
    framework: Framework, expected: int, problems: list[str], devices: list[Device] | None = None
) -> Check:
    seen = framework.gpu_count()
    detail = (
        f"{framework.name} sees {seen} GPU(s), nvidia-smi/NVIDIA_VISIBLE_DEVICES expect {expected}"
    )
    problems = list(problems)
    if devices and seen == expected == len(devices):
        mismatch = name_mismatch(framework, devices)
        if mismatch:
            problems.append(mismatch)
    if problems:
        detail += "; " + "; ".join(problems)
    return Check("framework sees exactly the GPUs given", seen == expected and not problems, detail)


def check_matmul(framework: Framework, gpu: int, size: int = MATMUL_SIZE) -> Check:
    a = random_matrix(size, size, seed=1)
    b = random_matrix(size, size, seed=2)
    name = f"matmul on GPU {gpu} matches CPU"
    try:
        want = framework.matmul(a, b, None)
        got = framework.matmul(a, b, gpu)
    except Exception as e:  # any framework error is a failed check, reported in one line
        return Check(name, False, f"{type(e).__name__}: {e}".splitlines()[0])
    error = max_relative_error(got, want)
    ok = error <= MATMUL_TOLERANCE
    return Check(name, ok, f"{size}x{size} float32, max relative error {error:.2e}")


def check_cpu_matmul(framework: Framework, size: int = CPU_MATMUL_SIZE) -> Check:
    a = random_matrix(size, size, seed=3)
    b = random_matrix(size, size, seed=4)
    name = f"{framework.name} CPU matmul matches plain Python"
    try:
        got = framework.matmul(a, b, None)
    except Exception as e:
        return Check(name, False, f"{type(e).__name__}: {e}".splitlines()[0])
    error = max_relative_error(got, naive_matmul(a, b))
    return Check(name, error <= MATMUL_TOLERANCE, f"{size}x{size}, max relative error {error:.2e}")


def check_move(framework: Framework, src: int, dst: int) -> Check:
    values = [float(i) for i in range(1024)]
    name = f"tensor moves GPU {src} -> GPU {dst}"
    try:
        got, device = framework.move_between(values, src, dst)
    except Exception as e:
        return Check(name, False, f"{type(e).__name__}: {e}".splitlines()[0])
    ok = device == dst and list(got) == values
    where = f"landed on GPU {device}"
    return Check(
        name, ok, f"1024 floats, {where}, {'intact' if list(got) == values else 'CHANGED'}"
    )


def run_gpu_checks(
    framework: Framework,
    devices: list[Device],
    smi_error: str | None,
    visible: str | None,
    cuda_visible: str | None = None,
    expect: int | None = None,
) -> list[Check]:
    """All GPU-mode checks; pure given a framework and the nvidia-smi listing."""
    checks: list[Check] = []
    if smi_error:
        checks.append(Check("nvidia-smi lists the GPUs", False, smi_error))
    expected, problems = expected_gpu_count(devices, visible, cuda_visible)
    if expect is not None and expect != expected:
        problems.append(f"--expect {expect} but the container was given {expected}")
    if expected == 0 and not smi_error:
        problems.append("no GPU was given to this container (use --cpu for a CPU image)")
    checks.append(check_visibility(framework, expected, problems, devices))
    seen = framework.gpu_count()
    for gpu in range(seen):
        checks.append(check_matmul(framework, gpu))
    if seen >= 2:
        if framework.can_move_between:
            checks.append(check_move(framework, 0, 1))
            checks.append(check_move(framework, seen - 1, 0))
    return checks


def run_cpu_checks(
    framework: Framework, devices: list[Device], smi_error: str | None, visible: str | None
) -> list[Check]:
    """CPU mode: no GPU may be visible, by any route, and the CPU must compute."""
    checks: list[Check] = []
    requested = requested_devices(visible)
    env_ok = requested == []
    checks.append(
        Check(
            "NVIDIA_VISIBLE_DEVICES requests no GPU",
            env_ok,
            f"NVIDIA_VISIBLE_DEVICES={visible!r}" if visible is not None else "unset",
        )
    )
    gpus = [d for d in devices if not d.mig]
    detail = (
        f"nvidia-smi lists {len(devices)} device(s)"
        if devices
        else (smi_error or "nvidia-smi lists no device")
    )
    checks.append(Check("nvidia-smi lists no GPU", not devices, detail))
    seen = framework.gpu_count()
    checks.append(
        Check(
            "framework sees no GPU",
            seen == 0,
            f"{framework.name} sees {seen} GPU(s)" + (f" of {len(gpus)} listed" if gpus else ""),
        )
    )
    checks.append(check_cpu_matmul(framework))
    return checks


# --- report --------------------------------------------------------------------------


def render_report(report: Report) -> str:
    """The one-screen, human-readable report."""
    lines = [
        f"gpu-smoke-test ({report.mode} mode)",
        f"  framework     {report.framework} {report.framework_version}"
        + (f" (built for CUDA {report.framework_cuda})" if report.framework_cuda else ""),
        "  NVIDIA_VISIBLE_DEVICES  "
        + ("(unset)" if report.visible_devices is None else repr(report.visible_devices)),
    ]
    if report.devices:
        lines.append("  nvidia-smi -L")
        for d in report.devices:
            indent = "      " if d.mig else "    "
            label = "MIG dev" if d.mig else "GPU"
            lines.append(f"{indent}{label} {d.index}: {d.name} ({d.uuid})")
    else:
        lines.append("  nvidia-smi -L  (no devices)")
    lines.append("")
    for c in report.checks:
        lines.append(f"  [{'PASS' if c.ok else 'FAIL'}] {c.name}: {c.detail}")
    lines.append("")
    failed = sum(not c.ok for c in report.checks)
    if report.ok:
        lines.append(f"RESULT: PASS ({len(report.checks)} checks)")
    else:
        lines.append(f"RESULT: FAIL ({failed} of {len(report.checks)} checks failed)")
    return "\n".join(lines)


def build_report(
    mode: str,
    framework: Framework,
    devices: list[Device],
    smi_error: str | None,
    env: dict[str, str],
    expect: int | None = None,
) -> Report:
    visible = env.get("NVIDIA_VISIBLE_DEVICES")
    if mode == "cpu":
        checks = run_cpu_checks(framework, devices, smi_error, visible)
    else:
        checks = run_gpu_checks(
            framework, devices, smi_error, visible, env.get("CUDA_VISIBLE_DEVICES"), expect
        )
    return Report(mode, framework.name, framework.version, framework.cuda, visible, devices, checks)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="gpu-smoke-test",
        description="Check that the framework sees exactly the GPUs this container was "
        "given and computes correctly on each (or, with --cpu, that no GPU is visible).",
    )
    parser.add_argument(
        "--framework", default="auto", help="torch, tensorflow, numpy or auto (default)"
    )
    parser.add_argument(
        "--cpu", action="store_true", help="CPU-only mode: fail if any GPU is visible"
    )
    parser.add_argument(
        "--expect", type=int, default=None, help="also require exactly this many GPUs"
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    try:
        framework = load_framework(args.framework)
    except SmokeTestError as e:
        print(f"gpu-smoke-test: {e}.", file=sys.stderr)
        return EXIT_UNUSABLE
    devices, smi_error = run_nvidia_smi_list()
    report = build_report(
        "cpu" if args.cpu else "gpu", framework, devices, smi_error, dict(os.environ), args.expect
    )
    if args.json:
        data = asdict(report)
        data["ok"] = report.ok
        print(json.dumps(data, indent=2))
    else:
        print(render_report(report))
    return EXIT_OK if report.ok else EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
