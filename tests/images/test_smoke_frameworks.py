"""gpu-smoke-test's PyTorch and TensorFlow adapters, against API stand-ins (no GPU)."""

from __future__ import annotations

import sys

import pytest

from gpuspawner.images import smoke

from .conftest import recorded
from .fakeframeworks import TorchDevice, fake_tensorflow, fake_torch

A100S = ["NVIDIA A100-PCIE-40GB", "NVIDIA A100-PCIE-40GB"]
LISTING = "list-L__2x-a100-pcie-40gb__insights-core.txt"


def with_module(monkeypatch, name, module):
    monkeypatch.setitem(sys.modules, name, module)
    return smoke.load_framework(name)


def test_torch_adapter_passes_on_working_gpus(monkeypatch):
    torch = fake_torch(A100S)
    fw = with_module(monkeypatch, "torch", torch)
    assert (fw.name, fw.version, fw.cuda) == ("torch", "2.15.0", "13.2")
    # TF32 would make GPU products differ from the CPU's.
    assert torch.backends.cuda.matmul.allow_tf32 is False
    assert torch.backends.cudnn.allow_tf32 is False
    devices = smoke.parse_nvidia_smi_list(recorded(LISTING))
    checks = smoke.run_gpu_checks(fw, devices, None, ",".join(d.uuid for d in devices))
    assert all(c.ok for c in checks), checks
    assert [c.name for c in checks if "moves" in c.name] == [
        "tensor moves GPU 0 -> GPU 1",
        "tensor moves GPU 1 -> GPU 0",
    ]
    assert set(torch.synchronized) == {0, 1}


def test_torch_adapter_catches_a_wrong_gpu(monkeypatch):
    fw = with_module(monkeypatch, "torch", fake_torch(A100S, broken_gpus={1}))
    devices = smoke.parse_nvidia_smi_list(recorded(LISTING))
    checks = {c.name: c for c in smoke.run_gpu_checks(fw, devices, None, "all")}
    assert checks["matmul on GPU 0 matches CPU"].ok
    assert not checks["matmul on GPU 1 matches CPU"].ok


def test_torch_adapter_catches_a_result_on_another_device(monkeypatch):
    fw = with_module(
        monkeypatch, "torch", fake_torch(A100S, result_device=TorchDevice("cpu", None))
    )
    check = smoke.check_matmul(fw, 0, size=8)
    assert not check.ok
    assert check.detail == "SmokeTestError: the product ran on cpu, not GPU 0"


def test_torch_adapter_on_a_cpu_only_machine(monkeypatch):
    fw = with_module(monkeypatch, "torch", fake_torch([]))
    checks = smoke.run_cpu_checks(fw, [], "nvidia-smi is not in this container", "void")
    assert all(c.ok for c in checks), checks


def test_tensorflow_adapter_passes_on_working_gpus(monkeypatch):
    tf = fake_tensorflow(A100S)
    fw = with_module(monkeypatch, "tensorflow", tf)
    assert (fw.name, fw.version, fw.cuda) == ("tensorflow", "2.21.0", "12.9")
    assert tf.settings == {"tf32": False, "soft_placement": False}
    devices = smoke.parse_nvidia_smi_list(recorded(LISTING))
    checks = smoke.run_gpu_checks(fw, devices, None, "all")
    assert all(c.ok for c in checks), checks
    # No PyTorch-only move check for TensorFlow.
    assert not any("moves" in c.name for c in checks)


def test_tensorflow_adapter_refuses_a_silent_cpu_fallback(monkeypatch):
    tf = fake_tensorflow(A100S, place_on_cpu=True)
    fw = with_module(monkeypatch, "tensorflow", tf)
    # The adapter switched soft placement off; a runtime that still falls back is caught.
    tf.settings["soft_placement"] = True
    check = smoke.check_matmul(fw, 1, size=8)
    assert not check.ok
    assert "ran on /job:localhost/replica:0/task:0/device:CPU:0, not GPU 1" in check.detail


@pytest.mark.parametrize("name", ["torch", "tensorflow"])
def test_auto_prefers_an_installed_framework(monkeypatch, name):
    monkeypatch.setitem(sys.modules, "torch", fake_torch(A100S) if name == "torch" else None)
    monkeypatch.setitem(sys.modules, "tensorflow", fake_tensorflow(A100S))
    assert smoke.load_framework("auto").name == name
