"""Emulated device plugin: allocation, release, health and the runtime's view of NVIDIA_VISIBLE_DEVICES."""

import pytest

from gpuspawner_sandbox.devices import (
    DeviceError,
    DevicePool,
    Fault,
    clear_faults,
    effective_driver,
    faults_path,
    inject_fault,
    load_faults,
    resolve_visible,
    visible_devices_env,
)
from gpuspawner_sandbox.devices import _main as devices_cli
from gpuspawner_sandbox.topology import GPU_RESOURCE, parse_topology


def node(count=4, **extra):
    raw = {"name": "n1", "gpu": {"model": "A100-SXM4-80GB", "count": count}, **extra}
    return parse_topology({"nodes": [raw]}).nodes[0]


def test_allocation_gives_distinct_free_gpus_and_release_returns_them():
    pool = DevicePool(node())
    a = pool.allocate("pod-a/c", GPU_RESOURCE, 2)
    b = pool.allocate("pod-b/c", GPU_RESOURCE, 2)
    assert len({d.id for d in a + b}) == 4
    with pytest.raises(DeviceError, match="only 0 healthy and free"):
        pool.allocate("pod-c/c", GPU_RESOURCE, 1)
    assert pool.release("pod-a/c") == a
    assert pool.allocate("pod-c/c", GPU_RESOURCE, 2) == a


def test_same_owner_keeps_its_devices():
    pool = DevicePool(node())
    first = pool.allocate("pod/c", GPU_RESOURCE, 2)
    assert pool.allocate("pod/c", GPU_RESOURCE, 2) == first


def test_plugin_env_lists_the_uuids():
    pool = DevicePool(node())
    devs = pool.allocate("pod/c", GPU_RESOURCE, 2)
    assert visible_devices_env(devs) == {"NVIDIA_VISIBLE_DEVICES": f"{devs[0].id},{devs[1].id}"}


def test_unhealthy_gpu_leaves_allocatable_but_its_holder_keeps_it():
    spec = node()
    pool = DevicePool(spec)
    held = pool.allocate("pod/c", GPU_RESOURCE, 1)[0]
    assert pool.set_faults([Fault("n1", "ecc", gpu=held.id)]) is True
    assert pool.allocatable() == {GPU_RESOURCE: 3}
    assert pool.capacity() == {GPU_RESOURCE: 4}
    assert pool.allocated_to("pod/c") == [held]
    # The other three are still allocatable; the faulty one is never handed out again.
    pool.release("pod/c")
    others = pool.allocate("pod2/c", GPU_RESOURCE, 3)
    assert held not in others


def test_fault_the_plugin_does_not_notice_keeps_the_gpu_allocatable():
    pool = DevicePool(node())
    assert pool.set_faults([Fault("n1", "ecc", gpu="0", withdraw=False)]) is False
    assert pool.allocatable() == {GPU_RESOURCE: 4}
    assert pool.set_faults([Fault("n1", "driver-too-old")]) is False


def test_node_wide_fault_withdraws_every_gpu():
    pool = DevicePool(node())
    pool.set_faults([Fault("n1", "lost"), Fault("other", "missing")])
    assert pool.allocatable() == {GPU_RESOURCE: 0}


def test_mig_devices_are_allocated_per_profile():
    spec = node(2, mig={"strategy": "mixed", "profiles": {"3g.40gb": 1, "1g.10gb": 4}})
    pool = DevicePool(spec)
    assert pool.capacity() == {"nvidia.com/mig-3g.40gb": 2, "nvidia.com/mig-1g.10gb": 8}
    devs = pool.allocate("p/c", "nvidia.com/mig-3g.40gb", 2)
    assert all(d.id.startswith("MIG-") for d in devs)
    assert {d.gpu_index for d in devs} == {0, 1}


@pytest.mark.parametrize(
    ("value", "injected", "count"),
    [
        (None, False, 0),
        ("", False, 0),
        ("void", False, 0),
        ("none", True, 0),
        ("all", True, 4),
    ],
)
def test_runtime_reading_of_visible_devices(value, injected, count):
    assert resolve_visible(node(), value)[0] is injected
    assert len(resolve_visible(node(), value)[1]) == count


def test_runtime_accepts_uuids_and_indices():
    spec = node()
    _, devs = resolve_visible(spec, f"{spec.gpus[2].uuid},0")
    assert [d.gpu_index for d in devs] == [2, 0]


def test_cpu_node_never_injects_a_driver():
    cpu = parse_topology({"nodes": [{"name": "c"}]}).nodes[0]
    assert resolve_visible(cpu, "all") == (False, [])


def test_fault_file_round_trip_and_clear(tmp_path):
    inject_fault(tmp_path, Fault("n1", "ecc", gpu="1", value="2"))
    inject_fault(tmp_path, Fault("n2", "driver-not-loaded"))
    assert load_faults(faults_path(tmp_path)) == [
        Fault("n1", "ecc", gpu="1", value="2"),
        Fault("n2", "driver-not-loaded"),
    ]
    clear_faults(tmp_path, node="n1")
    assert load_faults(faults_path(tmp_path)) == [Fault("n2", "driver-not-loaded")]
    clear_faults(tmp_path)
    assert load_faults(faults_path(tmp_path)) == []


def test_fault_validation(tmp_path):
    with pytest.raises(ValueError, match="Unknown fault kind"):
        inject_fault(tmp_path, Fault("n1", "melted"))
    with pytest.raises(ValueError, match="whole node"):
        inject_fault(tmp_path, Fault("n1", "driver-too-old", gpu="0"))


def test_cli(tmp_path, capsys):
    assert (
        devices_cli(
            [
                "inject",
                "--state-dir",
                str(tmp_path),
                "--node",
                "n1",
                "--gpu",
                "0",
                "--kind",
                "ecc",
                "--withdraw",
                "no",
            ]
        )
        == 0
    )
    assert load_faults(faults_path(tmp_path)) == [Fault("n1", "ecc", gpu="0", withdraw=False)]
    assert devices_cli(["list", "--state-dir", str(tmp_path)]) == 0
    assert '"kind": "ecc"' in capsys.readouterr().out
    assert (
        devices_cli(
            [
                "inject",
                "--state-dir",
                str(tmp_path),
                "--node",
                "n1",
                "--gpu",
                "0",
                "--kind",
                "driver-too-old",
            ]
        )
        == 2
    )
    assert devices_cli(["clear", "--state-dir", str(tmp_path)]) == 0
    assert load_faults(faults_path(tmp_path)) == []


def test_effective_driver():
    faults = [Fault("n1", "driver-too-old", value="535.104.12"), Fault("n2", "driver-too-old")]
    assert effective_driver("n1", "580.95.05", faults) == "535.104.12"
    assert effective_driver("n2", "580.95.05", faults) == "470.82.01"
    assert effective_driver("n3", "580.95.05", faults) == "580.95.05"
