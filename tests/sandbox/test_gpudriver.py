"""The emulated driver's state file of a real GPU node."""

from __future__ import annotations

import json

import pytest

from gpuspawner_sandbox import gpudriver
from gpuspawner_sandbox.topology import parse_topology

TOPOLOGY = parse_topology(
    {
        "driver": "550.127.05",
        "nodes": [
            {"name": "nv", "gpu": {"model": "H100-80GB-HBM3", "count": 4, "nvlink_domains": 2}},
            {
                "name": "mig",
                "gpu": {"model": "A100-SXM4-40GB", "count": 1},
                "mig": {"strategy": "mixed", "profiles": {"3g.20gb": 1, "1g.5gb": 2}},
            },
        ],
    }
)


def test_driver_state_describes_every_gpu_from_the_topology():
    node = TOPOLOGY.node("nv")
    state = gpudriver.driver_state(node)
    assert state["node"] == "nv"
    assert state["driver_version"] == "550.127.05"
    assert state["cuda_version"] == node.cuda_version == "12.4"
    assert [g["uuid"] for g in state["gpus"]] == [g.uuid for g in node.gpus]
    assert [g["nvlink_domain"] for g in state["gpus"]] == [0, 0, 1, 1]
    assert [g["minor"] for g in state["gpus"]] == [0, 1, 2, 3]
    first = state["gpus"][0]
    assert first["name"] == "NVIDIA H100 80GB HBM3"
    assert first["memory_mib"] == 81559
    assert first["bus_id"] == node.gpus[0].bus_id
    assert first["health"] == "healthy" and first["mig"] == []


def test_driver_state_lists_mig_devices():
    node = TOPOLOGY.node("mig")
    migs = gpudriver.driver_state(node)["gpus"][0]["mig"]
    assert [m["profile"] for m in migs] == ["3g.20gb", "1g.5gb", "1g.5gb"]
    assert [m["uuid"] for m in migs] == [m.uuid for m in node.gpus[0].mig]
    assert migs[1]["memory_mib"] == 4864
    assert {m["health"] for m in migs} == {"healthy"}


def test_set_health_marks_one_device_and_writes_atomically(tmp_path):
    node = TOPOLOGY.node("mig")
    path = tmp_path / gpudriver.DRIVER_STATE_FILE
    gpudriver.write_driver_state(path, gpudriver.driver_state(node))
    mig_uuid = node.gpus[0].mig[2].uuid
    gpudriver.set_health(path, mig_uuid, healthy=False)
    state = json.loads(path.read_text())
    assert state["gpus"][0]["health"] == "healthy"
    assert [m["health"] for m in state["gpus"][0]["mig"]] == ["healthy", "healthy", "unhealthy"]
    gpudriver.set_health(path, node.gpus[0].uuid, healthy=False)
    assert gpudriver.read_driver_state(path)["gpus"][0]["health"] == "unhealthy"
    assert [p.name for p in tmp_path.iterdir()] == [gpudriver.DRIVER_STATE_FILE]


def test_an_unknown_device_is_one_sentence(tmp_path):
    state = gpudriver.driver_state(TOPOLOGY.node("nv"))
    with pytest.raises(
        gpudriver.DriverStateError, match=r"^Node nv has no GPU or MIG device GPU-x\.$"
    ):
        gpudriver.with_health(state, "GPU-x", healthy=False)
    # The original is untouched.
    assert gpudriver.with_health(state, state["gpus"][0]["uuid"], False) != state
    assert state["gpus"][0]["health"] == "healthy"
