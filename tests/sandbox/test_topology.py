"""The sandbox topology: validation, deterministic device identities, node labels."""

import re

import pytest

from gpuspawner_sandbox.topology import (
    GPU_RESOURCE,
    TopologyError,
    cpu_millicores,
    extended_resources,
    gpu_uuid,
    kubelet_may_set,
    load_topology,
    memory_bytes,
    node_labels,
    node_taints,
    parse_topology,
)

UUID = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
MIG_UUID = re.compile(r"^MIG-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")

MIG_NODE = {
    "name": "gpu-mig-0",
    "gpu": {"model": "A100-SXM4-40GB", "count": 2},
    "mig": {"strategy": "mixed", "profiles": {"3g.20gb": 1, "1g.5gb": 4}},
}


def test_default_topology_is_the_documented_cluster():
    topo = load_topology()
    by_name = {n.name: n for n in topo.nodes}
    gpu_nodes = {n: extended_resources(s) for n, s in by_name.items() if s.gpus}
    assert sorted(gpu_nodes.values(), key=str) == sorted(
        [
            {GPU_RESOURCE: 4},
            {GPU_RESOURCE: 4},
            {GPU_RESOURCE: 8},
            # the MIG node, NVIDIA's mixed strategy: MIG resources only
            {"nvidia.com/mig-3g.20gb": 2, "nvidia.com/mig-1g.5gb": 8},
        ],
        key=str,
    )
    products = sorted(node_labels(by_name[n])["nvidia.com/gpu.product"] for n in gpu_nodes)
    assert products == ["NVIDIA-A100-SXM4-40GB"] + ["NVIDIA-A100-SXM4-80GB"] * 2 + [
        "NVIDIA-H100-80GB-HBM3"
    ]
    cpu_only = [s for s in topo.nodes if not s.gpus]
    assert len(cpu_only) == 1
    assert node_taints(cpu_only[0]) == []
    assert "nvidia.com/gpu.present" not in node_labels(cpu_only[0])


def test_uuids_are_deterministic_unique_and_in_nvidia_format():
    a, b = load_topology(), load_topology()
    uuids = [g.uuid for n in a.nodes for g in n.gpus]
    assert uuids == [g.uuid for n in b.nodes for g in n.gpus]
    assert len(set(uuids)) == len(uuids) == 4 + 4 + 8 + 2
    assert all(UUID.match(u) for u in uuids)
    assert gpu_uuid("x", 0) != gpu_uuid("x", 1) != gpu_uuid("y", 0)


def test_gfd_labels_and_taint_of_a_gpu_node():
    node = parse_topology(
        {
            "driver": "570.133.20",
            "nodes": [{"name": "g", "gpu": {"model": "H100-80GB-HBM3", "count": 8}}],
        }
    ).nodes[0]
    labels = node_labels(node)
    assert labels["nvidia.com/gpu.count"] == "8"
    assert labels["nvidia.com/gpu.memory"] == "81559"
    assert labels["nvidia.com/gpu.family"] == "hopper"
    assert (labels["nvidia.com/cuda.driver.major"], labels["nvidia.com/cuda.driver.minor"]) == (
        "570",
        "133",
    )
    assert labels["nvidia.com/cuda.driver.rev"] == "20"
    assert (labels["nvidia.com/cuda.runtime.major"], labels["nvidia.com/cuda.runtime.minor"]) == (
        "12",
        "8",
    )
    assert labels["nvidia.com/mig.strategy"] == "none"
    assert labels["nvidia.com/gpu.present"] == "true"
    assert node_taints(node) == [
        {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    ]


def test_mixed_mig_node_advertises_mig_resources_and_labels():
    node = parse_topology({"nodes": [MIG_NODE]}).nodes[0]
    assert extended_resources(node) == {"nvidia.com/mig-3g.20gb": 2, "nvidia.com/mig-1g.5gb": 8}
    labels = node_labels(node)
    assert labels["nvidia.com/mig.strategy"] == "mixed"
    assert labels["nvidia.com/mig-1g.5gb.count"] == "8"
    assert labels["nvidia.com/mig-1g.5gb.memory"] == "4864"
    assert labels["nvidia.com/mig-3g.20gb.slices.gi"] == "3"
    migs = [m.uuid for g in node.gpus for m in g.mig]
    assert len(set(migs)) == 10 and all(MIG_UUID.match(m) for m in migs)


def test_single_mig_strategy_overloads_the_gpu_resource():
    raw = dict(MIG_NODE, mig={"strategy": "single", "profiles": {"1g.5gb": 7}})
    node = parse_topology({"nodes": [raw]}).nodes[0]
    assert extended_resources(node) == {GPU_RESOURCE: 14}
    labels = node_labels(node)
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"
    assert labels["nvidia.com/gpu.count"] == "14"
    assert labels["nvidia.com/gpu.memory"] == "4864"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({}, "non-empty 'nodes'"),
        ({"nodes": [{"name": "Bad_Name"}]}, "lowercase DNS label"),
        ({"nodes": [{"name": "a"}, {"name": "a"}]}, "more than once"),
        (
            {"nodes": [{"name": "a", "gpu": {"model": "V99", "count": 1}}]},
            "unknown GPU model 'V99'",
        ),
        ({"nodes": [{"name": "a", "gpu": {"model": "T4", "count": 9}}]}, "from 1 to 8"),
        ({"nodes": [{"name": "a", "driver": "latest"}]}, "driver 'latest'"),
        ({"nodes": [{"name": "a", "colour": "red"}]}, "unknown field(s): colour"),
        (
            {"nodes": [dict(MIG_NODE, mig={"profiles": {"3g.20gb": 3}})]},
            "uses 9 compute slices",
        ),
        (
            {"nodes": [dict(MIG_NODE, mig={"profiles": {"2g.20gb": 1}})]},
            "no MIG profile '2g.20gb'",
        ),
        (
            {
                "nodes": [
                    dict(
                        MIG_NODE,
                        mig={"strategy": "single", "profiles": {"3g.20gb": 1, "1g.5gb": 1}},
                    )
                ]
            },
            "needs one profile",
        ),
        (
            {
                "nodes": [
                    {"name": "a", "gpu": {"model": "T4", "count": 1}, "mig": {"profiles": {"x": 1}}}
                ]
            },
            "does not support MIG",
        ),
        (
            {"nodes": [{"name": "a", "nvidia-container-runtime": {}}]},
            "'nvidia-container-runtime' section but no 'gpu'",
        ),
        (
            {
                "nodes": [
                    dict(
                        MIG_NODE,
                        **{"nvidia-container-runtime": {"mode": "legacy"}},
                    )
                ]
            },
            "must be a mapping with only 'accept-nvidia-visible-devices-envvar-when-unprivileged'",
        ),
        (
            {
                "nodes": [
                    dict(
                        MIG_NODE,
                        **{
                            "nvidia-container-runtime": {
                                "accept-nvidia-visible-devices-envvar-when-unprivileged": "no"
                            }
                        },
                    )
                ]
            },
            "must be true or false, not 'no'",
        ),
        ({"nodes": [{"name": "a", "cpu": "lots"}]}, "'cpu' must be a positive CPU quantity"),
        ({"nodes": [{"name": "a", "cpu": "0"}]}, "not '0'"),
        ({"nodes": [{"name": "a", "memory": "64GB"}]}, "'memory' must be a positive memory"),
        (
            {"nodes": [{"name": "a", "labels": {"node-role.kubernetes.io/gpu": ""}}]},
            "a kubelet may not give its node the label 'node-role.kubernetes.io/gpu'",
        ),
        (
            {"nodes": [{"name": "a", "sync_frequency": 10}]},
            "'sync_frequency' must be a duration from 1s to 59m like '10s' or '1m', not 10.",
        ),
        ({"nodes": [{"name": "a", "sync_frequency": "0s"}]}, "not '0s'"),
        ({"nodes": [{"name": "a", "sync_frequency": "1h"}]}, "not '1h'"),
        (
            {"nodes": [{"name": "a", "node_status_update_frequency": "500ms"}]},
            "Node 'a': 'node_status_update_frequency' must be a duration from 1s to 59m "
            "like '10s' or '1m', not '500ms'.",
        ),
        (
            {"kubelet_feature_gates": ["EventedPLEG"], "nodes": [{"name": "a"}]},
            "The topology: 'kubelet_feature_gates' must be a mapping of gate names to true or "
            "false, like {EventedPLEG: true}, not ['EventedPLEG'].",
        ),
        (
            {"nodes": [{"name": "a", "kubelet_feature_gates": {"evented-pleg": True}}]},
            "Node 'a': 'evented-pleg' is not a feature gate's name",
        ),
        (
            {"nodes": [{"name": "a", "kubelet_feature_gates": {"EventedPLEG": "yes"}}]},
            "Node 'a': feature gate 'EventedPLEG' must be true or false, not 'yes'.",
        ),
    ],
)
def test_invalid_topologies_get_one_readable_sentence(raw, message):
    with pytest.raises(TopologyError) as e:
        parse_topology(raw)
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_unreadable_file_is_a_topology_error(tmp_path):
    with pytest.raises(TopologyError, match="Cannot read"):
        load_topology(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("nodes: [")
    with pytest.raises(TopologyError, match="not valid YAML"):
        load_topology(bad)


def test_nvlink_domains_split_the_gpus_into_equal_groups():
    node = parse_topology(
        {
            "nodes": [
                {"name": "n", "gpu": {"model": "H100-80GB-HBM3", "count": 8, "nvlink_domains": 2}}
            ]
        }
    ).node("n")
    assert [g.nvlink_domain for g in node.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    one = parse_topology({"nodes": [{"name": "n", "gpu": {"model": "L4", "count": 3}}]}).node("n")
    assert {g.nvlink_domain for g in one.gpus} == {0}
    for bad in (3, 0, "two"):
        with pytest.raises(TopologyError, match="'nvlink_domains' must be a positive integer"):
            parse_topology(
                {
                    "nodes": [
                        {"name": "n", "gpu": {"model": "L4", "count": 8, "nvlink_domains": bad}}
                    ]
                }
            )


def test_a_gpu_node_may_refuse_the_variable_to_unprivileged_containers():
    key = "accept-nvidia-visible-devices-envvar-when-unprivileged"
    topo = parse_topology(
        {
            "nodes": [
                {"name": "open", "gpu": {"model": "T4", "count": 1}},
                {
                    "name": "closed",
                    "gpu": {"model": "T4", "count": 1},
                    "nvidia-container-runtime": {key: False},
                },
                {"name": "cpu"},
            ]
        }
    )
    # NVIDIA's default is to accept it.
    assert topo.node("open").accept_envvar_unprivileged is True
    assert topo.node("closed").accept_envvar_unprivileged is False
    assert topo.node("cpu").accept_envvar_unprivileged is True


@pytest.mark.parametrize(
    ("key", "allowed"),
    [
        ("pool", True),
        ("example.org/pool", True),
        ("topology.kubernetes.io/zone", True),
        ("node.kubernetes.io/pool", True),
        ("team.node.kubernetes.io/x", True),
        ("kubernetes.io/role", False),
        ("node-role.kubernetes.io/gpu", False),
        ("x.k8s.io/pool", False),
    ],
)
def test_a_kubelet_sets_only_its_own_labels_in_the_kubernetes_namespaces(key, allowed):
    assert kubelet_may_set(key) is allowed


def test_cpu_and_memory_quantities_read_as_kubernetes_reads_them():
    assert cpu_millicores("16") == 16000
    assert cpu_millicores("1.5") == 1500
    assert cpu_millicores("500m") == 500
    assert memory_bytes("64Gi") == 64 * 2**30
    assert memory_bytes("8G") == 8 * 10**9
    assert memory_bytes("1000") == 1000
    for bad in ("", "-1", "1 Gi", "2x"):
        with pytest.raises(ValueError):
            memory_bytes(bad)


def test_kubelet_feature_gates_apply_to_every_node_and_a_node_may_override_one():
    topo = parse_topology(
        {
            "kubelet_feature_gates": {"EventedPLEG": True, "KubeletTracing": False},
            "nodes": [
                {"name": "a"},
                {"name": "b", "kubelet_feature_gates": {"EventedPLEG": False}},
            ],
        }
    )
    assert topo.node("a").kubelet_feature_gates == {"EventedPLEG": True, "KubeletTracing": False}
    assert topo.node("b").kubelet_feature_gates == {"EventedPLEG": False, "KubeletTracing": False}
    assert parse_topology({"nodes": [{"name": "c"}]}).node("c").kubelet_feature_gates == {}


def test_the_default_topology_turns_on_the_kubelets_evented_pleg():
    # docs/sandbox.md, "Topology": the kubelet learns of an exited (init) container from
    # containerd's event at once instead of at its next one-second relist
    assert all(
        node.kubelet_feature_gates == {"EventedPLEG": True} for node in load_topology().nodes
    )


def test_a_node_may_sync_its_pods_more_often_than_the_kubelets_minute():
    topo = parse_topology({"nodes": [{"name": "a", "sync_frequency": "10s"}, {"name": "b"}]})
    assert topo.node("a").sync_frequency == "10s"
    assert topo.node("b").sync_frequency is None  # the kubelet's own default


def test_nodes_compute_their_status_every_second_unless_told_otherwise():
    topo = parse_topology(
        {"nodes": [{"name": "a"}, {"name": "b", "node_status_update_frequency": "10s"}]}
    )
    assert topo.node("a").node_status_update_frequency == "1s"
    assert topo.node("b").node_status_update_frequency == "10s"
