"""The emulated driver's state file of a real GPU node."""

from __future__ import annotations

import json
import stat

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
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp")]


def test_an_unknown_device_is_one_sentence(tmp_path):
    state = gpudriver.driver_state(TOPOLOGY.node("nv"))
    with pytest.raises(
        gpudriver.DriverStateError, match=r"^Node nv has no GPU or MIG device GPU-x\.$"
    ):
        gpudriver.with_health(state, "GPU-x", healthy=False)
    # The original is untouched.
    assert gpudriver.with_health(state, state["gpus"][0]["uuid"], False) != state
    assert state["gpus"][0]["health"] == "healthy"


def write(tmp_path, node_name="mig"):
    paths = gpudriver.DriverPaths.of_node(tmp_path)
    gpudriver.write_driver_state(paths.state, gpudriver.driver_state(TOPOLOGY.node(node_name)))
    return paths


def test_driver_paths_follow_the_shared_layout(tmp_path):
    paths = gpudriver.DriverPaths.of_node(tmp_path)
    assert paths.root == tmp_path / gpudriver.DRIVER_DIR_NAME
    assert paths.state.parent == paths.root
    assert paths.nvidia_smi == paths.root / "bin" / "nvidia-smi"
    assert paths.driver_view == paths.root / "view" / gpudriver.VIEW_DRIVER_DIR
    assert paths.gpu_view("GPU-1") == paths.root / "view" / gpudriver.VIEW_GPUS_DIR / "GPU-1"
    assert paths.usage_dir("GPU-1") == paths.root / gpudriver.USAGE_DIR / "GPU-1"


def test_writing_the_state_writes_the_projections_and_usage_dirs(tmp_path):
    paths = write(tmp_path, "nv")
    state = gpudriver.read_driver_state(paths.state)
    driver = json.loads((paths.driver_view / gpudriver.DRIVER_VIEW_FILE).read_text())
    assert driver == {
        "node": "nv",
        "driver_version": "550.127.05",
        "cuda_version": "12.4",
        "loaded": True,
    }
    for gpu in state["gpus"]:
        view = json.loads((paths.gpu_view(gpu["uuid"]) / gpudriver.GPU_VIEW_FILE).read_text())
        assert view["uuid"] == gpu["uuid"] and view["minor"] == gpu["minor"]
        assert "faults" not in view
        assert (view["missing"], view["lost"], view["ecc_errors_uncorrected"]) == (False, False, 0)
        mode = paths.usage_dir(gpu["uuid"]).stat().st_mode
        assert stat.S_IMODE(mode) == 0o1777


def test_each_mig_device_has_its_own_usage_dir(tmp_path):
    paths = write(tmp_path, "mig")
    state = gpudriver.read_driver_state(paths.state)
    migs = [m["uuid"] for g in state["gpus"] for m in g.get("mig", [])]
    assert migs and set(migs) <= set(gpudriver.usage_uuids(state))
    for uuid in gpudriver.usage_uuids(state):
        assert stat.S_IMODE(paths.usage_dir(uuid).stat().st_mode) == 0o1777


def test_mig_devices_record_their_nvidia_caps_minors():
    migs = gpudriver.driver_state(TOPOLOGY.node("mig"))["gpus"][0]["mig"]
    # /proc/driver/nvidia-caps/mig-minors: gpu0/gi<g>/access = 3 + 9 g, its ci<c> = that + 1 + c.
    assert [(m["gi_cap_minor"], m["ci_cap_minor"]) for m in migs] == [
        (3 + 9 * m["gi"], 4 + 9 * m["gi"] + m["ci"]) for m in migs
    ]
    assert gpudriver.mig_cap_minors(1, 0, 0) == (138, 139)


@pytest.mark.parametrize(
    ("kind", "withdrawn"),
    [("lost", True), ("ecc", True), ("missing", False), ("row-remap-pending", False)],
)
def test_a_gpu_fault_withdraws_the_gpu_and_its_mig_devices_only_when_the_plugin_notices(
    tmp_path, kind, withdrawn
):
    paths = write(tmp_path)
    uuid = TOPOLOGY.node("mig").gpus[0].uuid
    gpudriver.inject_fault(paths.state, kind, uuid)
    gpu = gpudriver.read_driver_state(paths.state)["gpus"][0]
    health = gpudriver.UNHEALTHY if withdrawn else gpudriver.HEALTHY
    assert {d["health"] for d in (gpu, *gpu["mig"])} == {health}
    assert [f["kind"] for f in gpu["faults"]] == [kind]
    gpudriver.clear_faults(paths.state)
    gpu = gpudriver.read_driver_state(paths.state)["gpus"][0]
    assert gpu["faults"] == [] and {d["health"] for d in (gpu, *gpu["mig"])} == {"healthy"}


def test_withdraw_overrides_the_kinds_default():
    state = gpudriver.driver_state(TOPOLOGY.node("nv"))
    quiet = gpudriver.with_fault(state, "ecc", "1", value="3", withdraw=False)
    assert [g["health"] for g in quiet["gpus"]] == ["healthy"] * 4
    loud = gpudriver.with_fault(state, "missing", "2", withdraw=True)
    assert [g["health"] for g in loud["gpus"]] == ["healthy", "healthy", "unhealthy", "healthy"]


def test_a_fault_on_one_gpu_leaves_the_health_set_on_another():
    state = gpudriver.driver_state(TOPOLOGY.node("nv"))
    uuids = [g["uuid"] for g in state["gpus"]]
    state = gpudriver.with_health(state, uuids[0], healthy=False)
    state = gpudriver.with_fault(state, "row-remap-pending", uuids[1])
    state = gpudriver.without_faults(state, gpu=uuids[1])
    assert [g["health"] for g in state["gpus"]] == ["unhealthy"] + ["healthy"] * 3


def test_a_gpu_fault_without_a_gpu_hits_every_gpu_and_clearing_one_gpu_keeps_the_rest():
    state = gpudriver.driver_state(TOPOLOGY.node("nv"))
    state = gpudriver.with_fault(state, "lost")
    assert {g["health"] for g in state["gpus"]} == {"unhealthy"}
    state = gpudriver.without_faults(state, gpu=state["gpus"][0]["uuid"])
    assert [g["health"] for g in state["gpus"]] == ["healthy"] + ["unhealthy"] * 3


def test_projections_carry_fault_effects():
    state = gpudriver.driver_state(TOPOLOGY.node("nv"))
    uuids = [g["uuid"] for g in state["gpus"]]
    state = gpudriver.with_fault(state, "ecc", uuids[0], value="3")
    state = gpudriver.with_fault(state, "row-remap-pending", uuids[1])
    state = gpudriver.with_fault(state, "lost", uuids[2])
    state = gpudriver.with_fault(state, "missing", uuids[3])
    state = gpudriver.with_fault(state, "driver-too-old", value="535.161.08")
    driver, gpus = gpudriver.projections(state)
    assert (driver["driver_version"], driver["cuda_version"], driver["loaded"]) == (
        "535.161.08",
        "12.2",
        True,
    )
    effects = [
        (
            gpus[u]["ecc_errors_uncorrected"],
            gpus[u]["remapped_rows_uncorrectable"],
            gpus[u]["remapped_rows_pending"],
            gpus[u]["lost"],
            gpus[u]["missing"],
        )
        for u in uuids
    ]
    assert effects == [
        (3, 3, True, False, False),
        (0, 1, True, False, False),
        (0, 0, False, True, False),
        (0, 0, False, False, True),
    ]
    not_loaded = gpudriver.with_fault(state, "driver-not-loaded")
    assert gpudriver.projections(not_loaded)[0]["loaded"] is False


def test_mig_gpus_report_ecc_errors_but_no_row_remapping():
    state = gpudriver.driver_state(TOPOLOGY.node("mig"))
    state = gpudriver.with_fault(state, "ecc", "0", value="2")
    view = gpudriver.projections(state)[1][state["gpus"][0]["uuid"]]
    assert (view["ecc_errors_uncorrected"], view["remapped_rows_pending"]) == (2, False)


@pytest.mark.parametrize(
    ("kind", "gpu", "message"),
    [
        ("overheated", None, r"^Unknown fault kind 'overheated'; known kinds: missing, lost, "),
        ("driver-not-loaded", "0", r"^The 'driver-not-loaded' fault applies to a whole node"),
        ("lost", "GPU-x", r"^Node nv has no GPU GPU-x\.$"),
    ],
)
def test_bad_fault_requests_are_one_sentence(kind, gpu, message):
    state = gpudriver.driver_state(TOPOLOGY.node("nv"))
    with pytest.raises(gpudriver.DriverStateError, match=message):
        gpudriver.with_fault(state, kind, gpu)
