"""The in-image GPU smoke test, without a GPU.

The GPU-count comparison runs against recorded `nvidia-smi -L` outputs; the matrix
checks run on numpy's CPU implementation, behind a framework adapter that pretends
to have GPUs (and can be told to compute wrongly on one of them).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from gpuspawner.images import smoke

from .conftest import REPO, recorded

SMOKE = REPO / "gpuspawner" / "images" / "smoke.py"


class FakeGPUs(smoke.NumpyFramework):
    """numpy pretending to have `count` GPUs; `broken` GPUs return a wrong product."""

    name = "fake"

    def __init__(self, count: int, broken: frozenset[int] = frozenset(), move_to=None, names=None):
        super().__init__()
        self.count = count
        self.broken = broken
        self.move_to = move_to
        self.names = names
        self.calls: list[int | None] = []

    def gpu_count(self) -> int:
        return self.count

    def gpu_name(self, index: int) -> str:
        return self.names[index] if self.names else super().gpu_name(index)

    def matmul(self, a, b, gpu):
        self.calls.append(gpu)
        out = np.asarray(a, dtype="float32") @ np.asarray(b, dtype="float32")
        if gpu is not None and gpu in self.broken:
            out[3, 5] += 0.5  # one wrong element is enough to fail
        return out.tolist()

    @property
    def can_move_between(self) -> bool:
        return True

    def move_between(self, values, src, dst):
        return list(values), dst if self.move_to is None else self.move_to


def names_of(devices):
    return [d.name for d in devices if not d.mig]


# --- nvidia-smi -L ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fixture", "gpus", "migs"),
    [
        ("list-L__h100-80gb-hbm3_590.48.01.txt", 1, 0),
        ("list-L__2xA10-2xT4__570.133.20__nct-1227.txt", 4, 0),
        ("list-L__8x-quadro-rtx-8000__insights-core.txt", 8, 0),
        ("list-L__h100-80gb-hbm3-MIG_590.48.01.txt", 1, 4),
        ("list-L__a100-sxm4-40gb-MIG-legacyUUID_450.80.02.txt", 1, 7),
        ("list-L__h100-MIG-single__cloud-native-docs.txt", 1, 7),
    ],
)
def test_parse_recorded_listings(fixture, gpus, migs):
    text = recorded(fixture)
    devices = smoke.parse_nvidia_smi_list(text)
    assert sum(not d.mig for d in devices) == gpus == text.count("\nGPU ") + text.startswith("GPU ")
    assert sum(d.mig for d in devices) == migs
    for d in devices:
        assert d.uuid.startswith("MIG-" if d.mig else "GPU-")
        assert d.uuid in text


def test_parse_keeps_names_and_order():
    devices = smoke.parse_nvidia_smi_list(recorded("list-L__2xA10-2xT4__570.133.20__nct-1227.txt"))
    assert [(d.index, d.name) for d in devices] == [
        (0, "NVIDIA A10"),
        (1, "NVIDIA A10"),
        (2, "Tesla T4"),
        (3, "Tesla T4"),
    ]


def test_parse_failure_message_gives_no_devices():
    text = recorded("error-driver-not-loaded__rc9__nvidia_gpu_exporter-65.txt")
    assert smoke.parse_nvidia_smi_list(text) == []


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, []),
        ("", []),
        ("void", []),
        ("none", []),
        ("all", None),
        ("0,1", ["0", "1"]),
        ("GPU-a, GPU-b", ["GPU-a", "GPU-b"]),
    ],
)
def test_requested_devices(value, expected):
    assert smoke.requested_devices(value) == expected


def test_cuda_count_counts_one_mig_device_per_process():
    mig = smoke.parse_nvidia_smi_list(recorded("list-L__h100-MIG-mixed__cloud-native-docs.txt"))
    assert smoke.cuda_device_count(mig) == 1
    full = smoke.parse_nvidia_smi_list(recorded("list-L__8x-quadro-rtx-8000__insights-core.txt"))
    assert smoke.cuda_device_count(full) == 8


def test_expected_count_agrees_with_listed_request():
    devices = smoke.parse_nvidia_smi_list(recorded("list-L__2x-a100-pcie-40gb__insights-core.txt"))
    uuids = ",".join(d.uuid for d in devices)
    assert smoke.expected_gpu_count(devices, uuids) == (2, [])
    assert smoke.expected_gpu_count(devices, "all") == (2, [])


def test_expected_count_flags_request_that_runtime_did_not_honour():
    devices = smoke.parse_nvidia_smi_list(recorded("list-L__2x-a100-pcie-40gb__insights-core.txt"))
    count, problems = smoke.expected_gpu_count(devices, devices[0].uuid)
    assert count == 2
    assert problems == ["NVIDIA_VISIBLE_DEVICES lists 1 device(s) but nvidia-smi shows 2"]
    _, problems = smoke.expected_gpu_count(devices, "void")
    assert "asks for no GPU" in problems[0]


def test_expected_count_for_a_mig_request():
    devices = smoke.parse_nvidia_smi_list(recorded("list-L__h100-80gb-hbm3-MIG_590.48.01.txt"))
    one_mig = [devices[0], devices[1]]
    assert smoke.expected_gpu_count(one_mig, devices[1].uuid) == (1, [])


def test_cuda_visible_devices_narrows_the_expectation():
    devices = smoke.parse_nvidia_smi_list(recorded("list-L__8x-quadro-rtx-8000__insights-core.txt"))
    assert smoke.expected_gpu_count(devices, "all", "0,1")[0] == 2
    assert smoke.expected_gpu_count(devices, "all", "")[0] == 0
    # CUDA stops enumerating at an invalid entry.
    assert smoke.expected_gpu_count(devices, "all", "3,-1,4")[0] == 1


# --- GPU-mode checks -------------------------------------------------------------


def _checks_by_name(checks):
    return {c.name: c for c in checks}


def test_gpu_mode_passes_when_framework_sees_every_listed_gpu():
    devices = smoke.parse_nvidia_smi_list(recorded("list-L__2x-a100-pcie-40gb__insights-core.txt"))
    fw = FakeGPUs(2, names=names_of(devices))
    checks = smoke.run_gpu_checks(fw, devices, None, ",".join(d.uuid for d in devices))
    assert all(c.ok for c in checks), checks
    names = [c.name for c in checks]
    assert "matmul on GPU 0 matches CPU" in names
    assert "matmul on GPU 1 matches CPU" in names
    assert "tensor moves GPU 0 -> GPU 1" in names
    # Every GPU product was compared with a CPU product.
    assert fw.calls.count(None) == 2 and sorted(c for c in fw.calls if c is not None) == [0, 1]


def test_gpu_mode_compares_gpu_models_in_any_order():
    devices = smoke.parse_nvidia_smi_list(recorded("list-L__2xA10-2xT4__570.133.20__nct-1227.txt"))
    # CUDA orders the fastest first; nvidia-smi by PCI bus.
    fw = FakeGPUs(4, names=["NVIDIA A10", "NVIDIA A10", "Tesla T4", "Tesla T4"][::-1])
    assert smoke.run_gpu_checks(fw, devices, None, "all")[0].ok


def test_gpu_mode_fails_when_the_framework_sees_other_models():
    devices = smoke.parse_nvidia_smi_list(recorded("list-L__2xA10-2xT4__570.133.20__nct-1227.txt"))
    fw = FakeGPUs(4, names=["NVIDIA A10", "NVIDIA A10", "NVIDIA A10", "Tesla T4"])
    visibility = smoke.run_gpu_checks(fw, devices, None, "all")[0]
    assert not visibility.ok
    assert visibility.detail.endswith(
        "fake sees 3x NVIDIA A10, 1x Tesla T4; nvidia-smi lists 2x NVIDIA A10, 2x Tesla T4"
    )


def test_mig_listings_are_not_compared_by_name():
    devices = smoke.parse_nvidia_smi_list(recorded("list-L__h100-80gb-hbm3-MIG_590.48.01.txt"))
    one_mig = [devices[0], devices[1]]
    fw = FakeGPUs(1, names=["NVIDIA H100 80GB HBM3 MIG 3g.40gb"])
    assert smoke.run_gpu_checks(fw, one_mig, None, devices[1].uuid)[0].ok


def test_gpu_mode_fails_when_framework_sees_fewer_gpus():
    devices = smoke.parse_nvidia_smi_list(recorded("list-L__2xA10-2xT4__570.133.20__nct-1227.txt"))
    checks = smoke.run_gpu_checks(FakeGPUs(3), devices, None, "all")
    visibility = checks[0]
    assert not visibility.ok
    assert "sees 3 GPU(s)" in visibility.detail and "expect 4" in visibility.detail


def test_gpu_mode_fails_on_a_wrong_product():
    devices = smoke.parse_nvidia_smi_list(recorded("list-L__2x-a100-pcie-40gb__insights-core.txt"))
    checks = _checks_by_name(
        smoke.run_gpu_checks(
            FakeGPUs(2, frozenset({1}), names=names_of(devices)), devices, None, "all"
        )
    )
    assert checks["matmul on GPU 0 matches CPU"].ok
    bad = checks["matmul on GPU 1 matches CPU"]
    assert not bad.ok
    assert "max relative error" in bad.detail


def test_gpu_mode_fails_when_a_tensor_lands_on_the_wrong_gpu():
    devices = smoke.parse_nvidia_smi_list(recorded("list-L__2x-a100-pcie-40gb__insights-core.txt"))
    checks = _checks_by_name(
        smoke.run_gpu_checks(FakeGPUs(2, move_to=0, names=names_of(devices)), devices, None, "all")
    )
    assert not checks["tensor moves GPU 0 -> GPU 1"].ok


def test_gpu_mode_without_a_gpu_fails_and_points_at_cpu_mode():
    checks = smoke.run_gpu_checks(FakeGPUs(0), [], None, None)
    assert not checks[0].ok
    assert "--cpu" in checks[0].detail


def test_gpu_mode_reports_a_broken_nvidia_smi():
    checks = smoke.run_gpu_checks(
        FakeGPUs(1), [], "nvidia-smi -L exited with 9: NVIDIA-SMI has failed", "0"
    )
    assert not checks[0].ok and "exited with 9" in checks[0].detail


def test_expect_option_must_match():
    devices = smoke.parse_nvidia_smi_list(recorded("list-L__h200_590.48.01.txt"))
    fw = FakeGPUs(1, names=names_of(devices))
    assert all(c.ok for c in smoke.run_gpu_checks(fw, devices, None, "all", expect=1))
    checks = smoke.run_gpu_checks(fw, devices, None, "all", expect=2)
    assert not checks[0].ok and "--expect 2" in checks[0].detail


def test_single_gpu_has_no_move_check():
    devices = smoke.parse_nvidia_smi_list(recorded("list-L__h200_590.48.01.txt"))
    names = [c.name for c in smoke.run_gpu_checks(FakeGPUs(1), devices, None, "all")]
    assert not any("moves" in n for n in names)


# --- CPU mode ---------------------------------------------------------------------------


def test_cpu_mode_passes_with_no_gpu_anywhere():
    checks = smoke.run_cpu_checks(
        smoke.NumpyFramework(), [], "nvidia-smi is not in this container", "void"
    )
    assert all(c.ok for c in checks), checks
    assert any("CPU matmul matches plain Python" in c.name for c in checks)


def test_cpu_mode_fails_when_nvidia_smi_lists_a_gpu():
    devices = smoke.parse_nvidia_smi_list(recorded("list-L__l40s_595.80.txt"))
    checks = _checks_by_name(smoke.run_cpu_checks(smoke.NumpyFramework(), devices, None, None))
    assert not checks["nvidia-smi lists no GPU"].ok


def test_cpu_mode_fails_when_all_gpus_are_requested():
    checks = _checks_by_name(smoke.run_cpu_checks(smoke.NumpyFramework(), [], None, "all"))
    assert not checks["NVIDIA_VISIBLE_DEVICES requests no GPU"].ok


def test_cpu_mode_fails_when_framework_sees_a_gpu():
    checks = _checks_by_name(smoke.run_cpu_checks(FakeGPUs(1), [], None, None))
    assert not checks["framework sees no GPU"].ok


def test_cpu_matmul_check_catches_a_wrong_cpu_result():
    class WrongCPU(smoke.NumpyFramework):
        def matmul(self, a, b, gpu):
            return (np.asarray(a) @ np.asarray(b) * 1.01).tolist()

    assert not smoke.check_cpu_matmul(WrongCPU()).ok


def test_max_relative_error_rejects_nan_and_shape_mismatch():
    want = [[1.0, 2.0], [3.0, 4.0]]
    assert smoke.max_relative_error([[1.0, 2.0], [3.0, float("nan")]], want) == float("inf")
    assert smoke.max_relative_error([[1.0, 2.0]], want) == float("inf")
    assert smoke.max_relative_error(want, want) == 0.0


def test_naive_matmul_agrees_with_numpy():
    a = smoke.random_matrix(5, 7, seed=1)
    b = smoke.random_matrix(7, 3, seed=2)
    np.testing.assert_allclose(smoke.naive_matmul(a, b), np.asarray(a) @ np.asarray(b), rtol=1e-12)


# --- report ---------------------------------------------------------------------------


def test_report_fits_one_screen_and_names_failures():
    devices = smoke.parse_nvidia_smi_list(recorded("list-L__8x-quadro-rtx-8000__insights-core.txt"))
    report = smoke.build_report(
        "gpu",
        FakeGPUs(8, frozenset({5}), names=names_of(devices)),
        devices,
        None,
        {"NVIDIA_VISIBLE_DEVICES": "all"},
    )
    text = smoke.render_report(report)
    lines = text.splitlines()
    assert len(lines) <= 40 and max(len(line) for line in lines) <= 120
    assert "[FAIL] matmul on GPU 5 matches CPU" in text
    assert lines[-1] == f"RESULT: FAIL (1 of {len(report.checks)} checks failed)"
    assert "Quadro RTX 8000" in text


# --- the installed script, end to end -----------------------------------------------


def _fake_nvidia_smi(tmp_path: Path, fixture: str, rc: int) -> Path:
    """A directory holding an `nvidia-smi` that replays a recorded output."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = bindir / "nvidia-smi"
    exe.write_text(
        textwrap.dedent(
            f"""\
            #!{sys.executable}
            import sys
            text = open({str(REPO / "tests" / "fixtures" / "nvidia-smi" / fixture)!r}).read()
            sys.stdout.write(text.split("# ----- verbatim output below this line -----\\n", 1)[1])
            sys.exit({rc})
            """
        )
    )
    exe.chmod(0o755)
    return bindir


def _run(args, path: str, visible: str | None):
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")
    }
    env["PATH"] = path
    if visible is not None:
        env["NVIDIA_VISIBLE_DEVICES"] = visible
    return subprocess.run(
        [sys.executable, str(SMOKE), *args], capture_output=True, text=True, env=env, timeout=120
    )


def test_script_cpu_mode_passes_without_nvidia_smi(tmp_path):
    proc = _run(["--framework", "numpy", "--cpu"], str(tmp_path), "void")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "RESULT: PASS" in proc.stdout
    assert "nvidia-smi is not in this container" in proc.stdout


def test_script_cpu_mode_fails_when_a_gpu_is_visible(tmp_path):
    bindir = _fake_nvidia_smi(tmp_path, "list-L__h100-80gb-hbm3_590.48.01.txt", 0)
    proc = _run(["--framework", "numpy", "--cpu"], str(bindir), "all")
    assert proc.returncode == 1
    assert "[FAIL] nvidia-smi lists no GPU" in proc.stdout


def test_script_gpu_mode_fails_when_framework_sees_no_gpu(tmp_path):
    bindir = _fake_nvidia_smi(tmp_path, "list-L__2x-a100-pcie-40gb__insights-core.txt", 0)
    proc = _run(["--framework", "numpy"], str(bindir), "all")
    assert proc.returncode == 1
    assert "numpy sees 0 GPU(s), nvidia-smi/NVIDIA_VISIBLE_DEVICES expect 2" in proc.stdout


def test_script_reports_nvidia_smi_failure(tmp_path):
    bindir = _fake_nvidia_smi(
        tmp_path, "error-driver-not-loaded__rc9__nvidia_gpu_exporter-65.txt", 9
    )
    proc = _run(["--framework", "numpy", "--json"], str(bindir), "0")
    assert proc.returncode == 1
    data = json.loads(proc.stdout)
    assert data["ok"] is False
    assert any("exited with 9" in c["detail"] for c in data["checks"])


def test_missing_framework_is_one_sentence(monkeypatch):
    class Missing(smoke.Framework):
        def __init__(self):
            raise ImportError("No module named 'torch'")

    monkeypatch.setitem(smoke.FRAMEWORKS, "torch", Missing)
    with pytest.raises(smoke.SmokeTestError, match="none of torch can be imported"):
        smoke.load_framework("torch")


def test_script_unusable_arguments_exit_2_without_traceback(tmp_path):
    proc = _run(["--framework", "mxnet"], str(tmp_path), None)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip() == (
        "gpu-smoke-test: unknown framework 'mxnet'; choose from torch, tensorflow, numpy."
    )


def test_script_is_standalone():
    """The images copy smoke.py alone: it must not import gpuspawner."""
    source = SMOKE.read_text()
    assert "gpuspawner" not in "".join(
        line for line in source.splitlines() if line.startswith(("import ", "from "))
    )
    assert SMOKE.stat().st_mode & 0o111, "the script must be executable (COPY keeps the mode)"
    assert source.startswith("#!/usr/bin/env python3\n")
