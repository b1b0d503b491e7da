"""Stand-ins for the slices of the torch and tensorflow APIs that gpu-smoke-test uses.

They compute with numpy and keep track of devices, so the smoke test's framework
adapters run here without the frameworks (gigabytes with their CUDA libraries)
and without a GPU. They show that the adapters call the APIs as written and
react to a wrong device; only a run on a real GPU (docs/gpu-checks.md) shows
that the real frameworks behave the same.
"""

from __future__ import annotations

import contextlib
import types
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class TorchDevice:
    type: str
    index: int | None

    def __str__(self) -> str:
        return self.type if self.index is None else f"{self.type}:{self.index}"


def _torch_device(spec: str) -> TorchDevice:
    kind, _, index = spec.partition(":")
    return TorchDevice(kind, int(index) if index else (0 if kind == "cuda" else None))


class TorchTensor:
    def __init__(self, array, device: TorchDevice, torch):
        self.array = np.asarray(array, dtype="float32")
        self.device = device
        self._torch = torch

    def __matmul__(self, other):
        out = self.array @ other.array
        if self.device.index in self._torch.broken_gpus:
            out = out + 1.0
        # A misbehaving runtime may leave results elsewhere; the adapter must notice.
        device = self._torch.result_device or self.device
        return TorchTensor(out, device, self._torch)

    def to(self, spec):
        return TorchTensor(self.array, _torch_device(spec), self._torch)

    def cpu(self):
        return TorchTensor(self.array, TorchDevice("cpu", None), self._torch)

    def tolist(self):
        return self.array.tolist()


def fake_torch(gpus: list[str], broken_gpus=(), result_device=None) -> types.ModuleType:
    torch = types.ModuleType("torch")
    torch.__version__ = "2.15.0"
    torch.version = types.SimpleNamespace(cuda="13.2")
    torch.float32 = "float32"
    torch.broken_gpus = set(broken_gpus)
    torch.result_device = result_device
    torch.backends = types.SimpleNamespace(
        cuda=types.SimpleNamespace(matmul=types.SimpleNamespace(allow_tf32=True)),
        cudnn=types.SimpleNamespace(allow_tf32=True),
    )
    torch.synchronized = []
    torch.cuda = types.SimpleNamespace(
        is_available=lambda: bool(gpus),
        device_count=lambda: len(gpus),
        get_device_name=lambda i: gpus[i],
        synchronize=lambda i: torch.synchronized.append(i),
    )

    def tensor(data, dtype=None, device="cpu"):
        assert dtype == "float32"
        dev = _torch_device(device)
        if dev.type == "cuda" and dev.index >= len(gpus):
            raise RuntimeError("CUDA error: invalid device ordinal")
        return TorchTensor(data, dev, torch)

    torch.tensor = tensor
    return torch


class TFTensor:
    def __init__(self, array, device: str):
        self.array = np.asarray(array, dtype="float32")
        self.device = device

    def numpy(self):
        return self.array


def fake_tensorflow(gpus: list[str], place_on_cpu: bool = False) -> types.ModuleType:
    """`place_on_cpu`: what soft device placement does when a GPU kernel is unavailable."""
    tf = types.ModuleType("tensorflow")
    tf.__version__ = "2.21.0"
    tf.float32 = "float32"
    tf.settings = {}
    current = ["/job:localhost/replica:0/task:0/device:CPU:0"]
    physical = [types.SimpleNamespace(name=f"/physical_device:GPU:{i}") for i in range(len(gpus))]

    @contextlib.contextmanager
    def device(spec):
        kind, index = spec.strip("/").split(":")
        before = current[0]
        current[0] = f"/job:localhost/replica:0/task:0/device:{kind}:{index}"
        try:
            yield
        finally:
            current[0] = before

    def matmul(a, b):
        where = current[0]
        if place_on_cpu and tf.settings.get("soft_placement", True):
            where = "/job:localhost/replica:0/task:0/device:CPU:0"
        return TFTensor(a.array @ b.array, where)

    tf.device = device
    tf.constant = lambda value, dtype=None: TFTensor(value, current[0])
    tf.linalg = types.SimpleNamespace(matmul=matmul)
    tf.sysconfig = types.SimpleNamespace(get_build_info=lambda: {"cuda_version": "12.9"})
    tf.config = types.SimpleNamespace(
        list_physical_devices=lambda kind: physical if kind == "GPU" else [],
        set_soft_device_placement=lambda on: tf.settings.__setitem__("soft_placement", on),
        experimental=types.SimpleNamespace(
            enable_tensor_float_32_execution=lambda on: tf.settings.__setitem__("tf32", on),
            get_device_details=lambda dev: {"device_name": gpus[physical.index(dev)]},
        ),
    )
    return tf
