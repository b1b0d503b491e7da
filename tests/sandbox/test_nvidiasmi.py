"""The emulated nvidia-smi binary (sandbox/go/nvidiasmi) over a driver dir the Python writer made.

A container is imitated under the binary's test-only root override: its ``/dev`` entries are
plain files and the driver's mounts are symlinks to the node's view and usage directories.
What it prints for each fault is then fed to the spawner's GPU check, whose verdict must be
the one a user meets on real hardware.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from gpuspawner.validation import gpucheck
from gpuspawner_sandbox import gpudriver, nodebuild
from gpuspawner_sandbox.topology import parse_topology

TOPOLOGY = parse_topology(
    {
        "nodes": [
            {"name": "a100", "driver": "580.95.05", "gpu": {"model": "A100-SXM4-80GB", "count": 4}},
            {
                "name": "mig",
                "driver": "580.95.05",
                "gpu": {"model": "A100-SXM4-40GB", "count": 1},
                "mig": {"strategy": "mixed", "profiles": {"3g.20gb": 1, "1g.5gb": 2}},
            },
        ]
    }
)


@pytest.fixture(scope="module")
def smi() -> Path:
    return nodebuild.build_local(nodebuild.NVIDIA_SMI)


class Container:
    """One container's view of a node's driver, as NVIDIA's runtime would inject it."""

    def __init__(self, root: Path, paths: gpudriver.DriverPaths, smi: Path):
        self.root, self.paths, self.smi = root, paths, smi
        view = root / gpudriver.CONTAINER_VIEW_ROOT.lstrip("/")
        view.mkdir(parents=True)
        (view / gpudriver.VIEW_DRIVER_DIR).symlink_to(paths.driver_view)
        (view / gpudriver.VIEW_GPUS_DIR).mkdir()
        (view / gpudriver.USAGE_DIR).mkdir()
        (root / "dev" / gpudriver.NVIDIA_CAPS_DIR).mkdir(parents=True)
        self.view = view

    def give(self, gpu: dict, migs: list[dict] | None = None) -> None:
        """Inject a GPU (migs None) or some of its MIG devices, as the CDI spec does."""
        uuid = gpu["uuid"]
        if not (self.view / gpudriver.VIEW_GPUS_DIR / uuid).exists():
            (self.view / gpudriver.VIEW_GPUS_DIR / uuid).symlink_to(self.paths.gpu_view(uuid))
            (self.view / gpudriver.USAGE_DIR / uuid).symlink_to(self.paths.usage_dir(uuid))
        (self.root / "dev" / f"nvidia{gpu['minor']}").touch()
        for mig in migs or []:
            for minor in (mig["gi_cap_minor"], mig["ci_cap_minor"]):
                (self.root / "dev" / gpudriver.NVIDIA_CAPS_DIR / f"nvidia-cap{minor}").touch()

    def env(self) -> dict[str, str]:
        return {gpudriver.EMULATED_ROOT_ENV: str(self.root)}

    def run(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(self.smi), *args], capture_output=True, text=True, env=self.env(), check=False
        )

    def check(self, monkeypatch, expect: int, resource: str = "nvidia.com/gpu", cuda=None):
        """The spawner's GPU check in this container: (exit code, reason)."""
        monkeypatch.setenv(gpudriver.EMULATED_ROOT_ENV, str(self.root))
        argv = ["--expect", str(expect), "--resource", resource, "--nvidia-smi", str(self.smi)]
        result = gpucheck.check(gpucheck.parse_args(argv + (["--cuda", cuda] if cuda else [])))
        return result.exit_code, result.reason


@pytest.fixture
def node(tmp_path):
    def make(name: str) -> tuple[gpudriver.DriverPaths, dict]:
        paths = gpudriver.DriverPaths.of_node(tmp_path / name)
        state = gpudriver.driver_state(TOPOLOGY.node(name))
        gpudriver.write_driver_state(paths.state, state)
        return paths, state

    return make


@pytest.fixture
def container(tmp_path, smi):
    count = iter(range(100))

    def make(paths: gpudriver.DriverPaths) -> Container:
        return Container(tmp_path / f"ctr{next(count)}", paths, smi)

    return make


def test_a_container_sees_only_the_gpus_injected_into_it(node, container):
    paths, state = node("a100")
    ctr = container(paths)
    ctr.give(state["gpus"][1])
    ctr.give(state["gpus"][3])
    # Mounted view without its device node, and a device node without its view: not visible.
    (ctr.view / "gpus" / state["gpus"][2]["uuid"]).symlink_to(
        paths.gpu_view(state["gpus"][2]["uuid"])
    )
    (ctr.root / "dev" / f"nvidia{state['gpus'][0]['minor']}").touch()
    out = ctr.run("-L")
    assert out.returncode == 0
    assert out.stdout.splitlines() == [
        f"GPU {i}: NVIDIA A100-SXM4-80GB (UUID: {g['uuid']})"
        for i, g in enumerate([state["gpus"][1], state["gpus"][3]])
    ]
    query = ctr.run("--query-gpu=index,pci.bus_id,serial", "--format=csv,noheader")
    assert query.stdout.splitlines() == [
        f"{i}, {g['bus_id']}, {g['serial']}"
        for i, g in enumerate([state["gpus"][1], state["gpus"][3]])
    ]


def test_a_container_without_gpus_finds_none_and_one_without_the_driver_finds_no_driver(
    node, container
):
    paths, _ = node("a100")
    out = container(paths).run("-L")
    assert (out.returncode, out.stdout) == (6, "No devices were found\n")
    bare = container(paths)
    (bare.view / "driver").unlink()
    assert bare.run().returncode == 9


def test_a_mig_device_is_seen_with_its_gpu_and_without_its_siblings(node, container):
    paths, state = node("mig")
    gpu = state["gpus"][0]
    ctr = container(paths)
    ctr.give(gpu, [gpu["mig"][2]])
    out = ctr.run("-L")
    assert out.stdout.splitlines() == [
        f"GPU 0: NVIDIA A100-SXM4-40GB (UUID: {gpu['uuid']})",
        f"  MIG 1g.5gb      Device  0: (UUID: {gpu['mig'][2]['uuid']})",
    ]
    table = ctr.run().stdout
    assert "MIG devices:" in table and table.count("4864MiB") == 1


def test_usage_reported_by_a_workload_shows_until_it_expires(node, container):
    paths, state = node("a100")
    gpu = state["gpus"][0]
    ctr = container(paths)
    ctr.give(gpu)
    usage = ctr.view / "usage" / gpu["uuid"] / gpudriver.USAGE_FILE
    args = ("--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader,nounits")
    usage.write_text(
        json.dumps({"gpu_util_percent": 87, "fb_used_mib": 2048, "until": time.time() + 600})
    )
    assert ctr.run(*args).stdout == "87, 2048\n"
    assert (paths.usage_dir(gpu["uuid"]) / gpudriver.USAGE_FILE).exists()
    assert re.search(r"2048MiB /  81920MiB \|\s+87%", ctr.run().stdout)
    usage.write_text(
        json.dumps({"gpu_util_percent": 87, "fb_used_mib": 2048, "until": time.time() - 1})
    )
    assert ctr.run(*args).stdout == "0, 0\n"


def inject(paths, kind, gpu=None, value=None):
    gpudriver.inject_fault(paths.state, kind, gpu, value=value)


def test_missing_gpu(node, container, monkeypatch):
    paths, state = node("a100")
    ctr = container(paths)
    ctr.give(state["gpus"][0])
    ctr.give(state["gpus"][1])
    inject(paths, "missing", state["gpus"][0]["uuid"])
    out = ctr.run("-L")
    assert out.stdout.splitlines() == [
        f"GPU 0: NVIDIA A100-SXM4-80GB (UUID: {state['gpus'][1]['uuid']})"
    ]
    assert ctr.check(monkeypatch, 2) == (
        gpucheck.EXIT_GPU_COUNT,
        "Only 1 of the 2 requested GPUs is visible: the node's device plugin gave this "
        "container fewer GPUs than it asked for; ask an admin to check the node.",
    )


def test_every_gpu_missing_is_no_devices(node, container, monkeypatch):
    paths, state = node("a100")
    ctr = container(paths)
    ctr.give(state["gpus"][0])
    inject(paths, "missing")
    assert ctr.run().returncode == 6
    code, reason = ctr.check(monkeypatch, 1)
    assert code == gpucheck.EXIT_GPU_COUNT
    assert "No devices were found" in reason


def test_gpu_fallen_off_the_bus(node, container, monkeypatch):
    paths, state = node("a100")
    ctr = container(paths)
    ctr.give(state["gpus"][2])
    inject(paths, "lost", state["gpus"][2]["uuid"])
    out = ctr.run("-L")
    bus = state["gpus"][2]["bus_id"][4:]
    assert (out.returncode, out.stdout) == (
        15,
        f"Unable to determine the device handle for GPU{bus}: GPU is lost.  Reboot the system "
        "to recover this GPU\n",
    )
    assert ctr.check(monkeypatch, 1) == (
        gpucheck.EXIT_NVIDIA_SMI_FAILED,
        "nvidia-smi failed with exit code 15 (a GPU has fallen off the bus or has otherwise "
        "become inaccessible), so the GPUs cannot be used; ask an admin to drain and reboot "
        f"the node. nvidia-smi said: Unable to determine the device handle for GPU{bus}: GPU is "
        "lost.  Reboot the system to recover this GPU",
    )


def test_driver_not_loaded(node, container, monkeypatch):
    paths, state = node("a100")
    ctr = container(paths)
    ctr.give(state["gpus"][0])
    inject(paths, "driver-not-loaded")
    out = ctr.run()
    assert out.returncode == 9
    assert "couldn't communicate with the NVIDIA driver" in out.stdout
    code, reason = ctr.check(monkeypatch, 1)
    assert code == gpucheck.EXIT_NVIDIA_SMI_FAILED
    assert reason.startswith(
        "nvidia-smi failed with exit code 9 (the NVIDIA driver is not loaded on the node), so "
        "the GPUs cannot be used; ask an admin to check the node's driver."
    )


def test_old_driver(node, container, monkeypatch):
    paths, state = node("a100")
    ctr = container(paths)
    ctr.give(state["gpus"][0])
    inject(paths, "driver-too-old", value="535.161.08")
    assert "DRIVER version      : 535.161.08" in ctr.run("--version").stdout
    assert ctr.check(monkeypatch, 1, cuda="13.0") == (
        gpucheck.EXIT_DRIVER_TOO_OLD,
        "The node's NVIDIA driver 535.161.08 is too old for this image's CUDA 13.0, which "
        "needs driver 580.65.06 or newer: pick an image built for an older CUDA, or ask an admin "
        "to upgrade the node's driver.",
    )
    gpudriver.clear_faults(paths.state, "driver-too-old")
    inject(paths, "driver-too-old")
    assert ctr.run().stdout.splitlines()[2].startswith("| NVIDIA-SMI 470.82.01    ")


def test_uncorrectable_ecc(node, container, monkeypatch):
    paths, state = node("a100")
    ctr = container(paths)
    ctr.give(state["gpus"][0])
    ctr.give(state["gpus"][1])
    inject(paths, "ecc", state["gpus"][1]["uuid"], value="3")
    out = ctr.run(
        "--query-gpu=index,ecc.errors.uncorrected.volatile.total,remapped_rows.pending",
        "--format=csv,noheader",
    )
    assert out.stdout.splitlines() == ["0, 0, No", "1, 3, Yes"]
    code, reason = ctr.check(monkeypatch, 2)
    assert code == gpucheck.EXIT_GPU_UNHEALTHY
    assert "has 3 uncorrectable ECC errors since the driver loaded" in reason


def test_pending_row_remap(node, container, monkeypatch):
    paths, state = node("a100")
    ctr = container(paths)
    ctr.give(state["gpus"][0])
    inject(paths, "row-remap-pending", state["gpus"][0]["uuid"])
    out = ctr.run(
        "--query-gpu=remapped_rows.pending,remapped_rows.uncorrectable", "--format=csv,noheader"
    )
    assert out.stdout == "Yes, 1\n"
    code, reason = ctr.check(monkeypatch, 1)
    assert code == gpucheck.EXIT_GPU_UNHEALTHY
    assert "has a memory row remapping pending that only takes effect after a GPU reset" in reason


def test_a_healthy_container_passes_the_check_and_cleared_faults_are_gone(
    node, container, monkeypatch
):
    paths, state = node("mig")
    gpu = state["gpus"][0]
    ctr = container(paths)
    ctr.give(gpu, gpu["mig"][1:])
    inject(paths, "lost")
    assert ctr.run().returncode == 15
    gpudriver.clear_faults(paths.state)
    assert ctr.check(monkeypatch, 2, "nvidia.com/mig-1g.5gb", cuda="12.4") == (
        gpucheck.EXIT_OK,
        None,
    )
