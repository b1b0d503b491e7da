"""A GPU node's CDI spec, generated from its emulated driver's state (pure)."""

from __future__ import annotations

from pathlib import Path

from gpuspawner_sandbox import cdi, gpudriver
from gpuspawner_sandbox.gpudriver import (
    CONTAINER_VIEW_ROOT,
    USAGE_DIR,
    VIEW_DRIVER_DIR,
    VIEW_GPUS_DIR,
    DriverPaths,
)
from gpuspawner_sandbox.topology import parse_topology

TOPOLOGY = parse_topology(
    {
        "nodes": [
            {"name": "plain", "gpu": {"model": "A100-SXM4-80GB", "count": 2}},
            {
                "name": "mig",
                "gpu": {"model": "A100-SXM4-80GB", "count": 2},
                "mig": {"strategy": "mixed", "profiles": {"3g.40gb": 1, "1g.10gb": 2}},
            },
        ]
    }
)
DRIVER = DriverPaths(Path("/state/nodes/n/nvidia-driver"))


def _spec(node: str) -> tuple[dict, dict]:
    state = gpudriver.driver_state(TOPOLOGY.node(node))
    return state, cdi.cdi_spec(state, DRIVER)


def _device(spec: dict, name: str) -> dict:
    (device,) = [d for d in spec["devices"] if d["name"] == name]
    return device["containerEdits"]


def _paths(edits: dict) -> set[str]:
    return {n["path"] for n in edits["deviceNodes"]}


def _mounted(edits: dict) -> set[str]:
    return {m["containerPath"] for m in edits.get("mounts", [])}


def test_each_gpu_is_named_by_index_and_uuid_with_its_device_and_views():
    state, spec = _spec("plain")
    assert spec["kind"] == "nvidia.com/gpu"
    gpu = state["gpus"][1]
    by_index, by_uuid = _device(spec, "1"), _device(spec, gpu["uuid"])
    assert by_index == by_uuid
    (node,) = by_index["deviceNodes"]
    assert node == {
        "path": "/dev/nvidia1",
        "hostPath": str(DRIVER.dev_dir / "nvidia1"),
        "type": "c",
        "major": gpudriver.NVIDIA_MAJOR,
        "minor": gpu["minor"],
        "fileMode": 0o666,
    }
    mounts = {m["containerPath"]: m for m in by_index["mounts"]}
    view = mounts[f"{CONTAINER_VIEW_ROOT}/{VIEW_GPUS_DIR}/{gpu['uuid']}"]
    assert view["hostPath"] == str(DRIVER.gpu_view(gpu["uuid"])) and "ro" in view["options"]
    usage = mounts[f"{CONTAINER_VIEW_ROOT}/{USAGE_DIR}/{gpu['uuid']}"]
    assert usage["hostPath"] == str(DRIVER.usage_dir(gpu["uuid"])) and "rw" in usage["options"]
    # Only that GPU's: nothing of GPU 0.
    assert not any(state["gpus"][0]["uuid"] in p for p in _mounted(by_index))


def test_all_is_every_gpu_and_the_shared_edits_are_nvidias():
    state, spec = _spec("plain")
    every = _device(spec, "all")
    assert _paths(every) == {"/dev/nvidia0", "/dev/nvidia1"}
    assert {
        f"{CONTAINER_VIEW_ROOT}/{VIEW_GPUS_DIR}/{g['uuid']}" for g in state["gpus"]
    } <= _mounted(every)
    shared = spec["containerEdits"]
    # As NVIDIA's generated specs: nothing downstream injects devices a second time.
    assert shared["env"] == ["NVIDIA_VISIBLE_DEVICES=void"]
    assert _paths(shared) == {"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}
    majors = {n["path"]: (n["major"], n["minor"]) for n in shared["deviceNodes"]}
    assert majors["/dev/nvidiactl"] == (gpudriver.NVIDIA_MAJOR, gpudriver.NVIDIACTL_MINOR)
    assert majors["/dev/nvidia-uvm"][0] == gpudriver.NVIDIA_UVM_MAJOR
    mounts = {m["containerPath"]: m["hostPath"] for m in shared["mounts"]}
    assert mounts == {
        gpudriver.SMI_CONTAINER_PATH: str(DRIVER.nvidia_smi),
        f"{CONTAINER_VIEW_ROOT}/{VIEW_DRIVER_DIR}": str(DRIVER.driver_view),
    }
    assert cdi.device_names(state) == [
        "0",
        state["gpus"][0]["uuid"],
        "1",
        state["gpus"][1]["uuid"],
        "all",
    ]
    assert [d["name"] for d in spec["devices"]] == cdi.device_names(state)


def test_mig_devices_are_named_as_nvidia_names_them_with_their_caps():
    state, spec = _spec("mig")
    gpu = state["gpus"][1]
    mig = gpu["mig"][2]
    edits = _device(spec, f"1:{mig['index']}")
    assert edits == _device(spec, mig["uuid"])
    caps = f"/dev/{gpudriver.NVIDIA_CAPS_DIR}/nvidia-cap"
    assert _paths(edits) == {
        "/dev/nvidia1",
        f"{caps}{mig['gi_cap_minor']}",
        f"{caps}{mig['ci_cap_minor']}",
    }
    cap_majors = {n["major"] for n in edits["deviceNodes"] if "nvidia-caps" in n["path"]}
    assert cap_majors == {gpudriver.NVIDIA_CAPS_MAJOR}
    # The parent GPU's view (nvidia-smi shows a MIG device under its GPU), and the MIG
    # device's own usage directory: its neighbours on that GPU never share its figures.
    assert _mounted(edits) == {
        f"{CONTAINER_VIEW_ROOT}/{VIEW_GPUS_DIR}/{gpu['uuid']}",
        f"{CONTAINER_VIEW_ROOT}/{USAGE_DIR}/{mig['uuid']}",
    }
    usage = {m["containerPath"]: m for m in edits["mounts"]}[
        f"{CONTAINER_VIEW_ROOT}/{USAGE_DIR}/{mig['uuid']}"
    ]
    assert usage["hostPath"] == str(DRIVER.usage_dir(mig["uuid"])) and "rw" in usage["options"]
    names = cdi.device_names(state)
    assert len(names) == 2 * (2 + 2 * 3) + 1
    every = _paths(_device(spec, "all"))
    assert {"/dev/nvidia0", "/dev/nvidia1"} <= every
    assert len([p for p in every if p.startswith(caps)]) == 2 * 3 * 2
    # `all` writes to every usage directory: each whole GPU's and each MIG device's.
    assert {
        m
        for m in _mounted(_device(spec, "all"))
        if m.startswith(f"{CONTAINER_VIEW_ROOT}/{USAGE_DIR}/")
    } == {f"{CONTAINER_VIEW_ROOT}/{USAGE_DIR}/{uuid}" for uuid in gpudriver.usage_uuids(state)}


def test_device_nodes_are_each_file_once():
    state, spec = _spec("mig")
    nodes = cdi.device_nodes(state)
    assert len(nodes) == len(set(nodes)) == len({n.name for n in nodes})
    # Every device node the spec names exists among them, with the same numbers.
    named = {
        (n["path"], n["major"], n["minor"], n["hostPath"])
        for d in [*spec["devices"], {"containerEdits": spec["containerEdits"]}]
        for n in d["containerEdits"]["deviceNodes"]
    }
    made = {(n.container_path, n.major, n.minor, str(DRIVER.dev_dir / n.name)) for n in nodes}
    assert named == made
