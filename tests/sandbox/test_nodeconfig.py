"""What real nodes are configured with: containerd, CNI, kubelet (rendered from data)."""

from __future__ import annotations

import ipaddress
import shlex
import sys
from pathlib import Path

import pytest

from gpuspawner_sandbox import nodeconfig
from gpuspawner_sandbox.nodeconfig import NodeNetwork, NodePaths

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

PATHS = NodePaths(Path("/state/nodes/cpu-0"))
NET = NodeNetwork(3)
FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def test_network_per_node_index():
    assert NET.bridge == "gsbr3"
    assert str(NET.subnet) == "10.244.3.0/24"
    assert NET.node_ip == "10.244.3.1"
    assert NET.bridge_cidr == "10.244.3.1/24"
    assert NET.subnet.subnet_of(nodeconfig.POD_RANGE)
    assert len(NodeNetwork(254).bridge) <= 15  # Linux interface names


def test_network_index_out_of_range_is_one_sentence():
    with pytest.raises(nodeconfig.NodeConfigError, match="at most 255 nodes"):
        NodeNetwork(255)


def test_the_hubs_address_is_in_the_pod_range_and_no_nodes():
    hub = ipaddress.ip_address(nodeconfig.HUB_ADDRESS)
    assert hub in nodeconfig.POD_RANGE
    assert not any(hub in NodeNetwork(i).subnet for i in range(nodeconfig.MAX_NODES))
    assert len(nodeconfig.HUB_LINK) <= 15
    # the forward-drop rules match bridges, never the hub's own interface
    assert not nodeconfig.HUB_LINK.startswith(nodeconfig.BRIDGE_PREFIX)


def test_containerd_config_keeps_everything_private():
    config = tomllib.loads(
        nodeconfig.containerd_config(PATHS, Path("/usr/sbin/runc"), Path("/cache/cni"))
    )
    assert config["version"] == 3
    assert config["imports"] == []
    assert config["root"] == "/state/nodes/cpu-0/containerd/root"
    assert config["state"] == "/state/nodes/cpu-0/containerd/state"
    assert config["grpc"]["address"] == str(PATHS.containerd_socket)
    # A short path in the node's own /run/containerd (unix socket paths are limited).
    assert str(PATHS.containerd_socket).startswith("/run/containerd/")
    assert "/run/containerd" in nodeconfig.PRIVATE_HOST_DIRS
    plugins = config["plugins"]
    runtime = plugins["io.containerd.cri.v1.runtime"]
    # Pitfall 1: root lacks CAP_SYS_RESOURCE here.
    assert runtime["restrict_oom_score_adj"] is True
    assert runtime["netns_mounts_under_state_dir"] is True
    runc = runtime["containerd"]["runtimes"]["runc"]
    assert runc["runtime_type"] == "io.containerd.runc.v2"
    assert runc["options"] == {
        "BinaryName": "/usr/sbin/runc",
        "Root": str(PATHS.runc_root),
        "SystemdCgroup": False,
    }
    assert runtime["cni"]["bin_dirs"] == ["/cache/cni"]
    assert runtime["cni"]["conf_dir"] == str(PATHS.cni_conf_dir)
    images = plugins["io.containerd.cri.v1.images"]
    assert images["pinned_images"]["sandbox"] == nodeconfig.PAUSE_IMAGE
    assert images["registry"]["config_path"] == str(PATHS.registry_hosts)
    assert plugins["io.containerd.transfer.v1.local"]["config_path"] == str(PATHS.registry_hosts)
    assert config["disabled_plugins"] == ["io.containerd.nri.v1.nri"]
    assert plugins["io.containerd.grpc.v1.cri"]["stream_server_address"] == "127.0.0.1"
    # A CPU node runs plain runc; containerd's CDI reads only the node's (empty) spec dir.
    assert runtime["containerd"]["default_runtime_name"] == "runc"
    assert set(runtime["containerd"]["runtimes"]) == {"runc"}
    assert runtime["cdi_spec_dirs"] == [str(PATHS.cdi_dir)]


def test_registry_is_a_dead_loopback_port():
    hosts = tomllib.loads(nodeconfig.registry_hosts_toml())
    server = hosts["server"]
    assert ipaddress.ip_address(server.split("//")[1].split(":")[0]).is_loopback
    assert list(hosts["host"]) == [server]


def test_cni_gives_no_default_route_no_gateway_no_nat_only_the_pod_range():
    conf = nodeconfig.cni_conflist(NET, Path("/state/ipam"))
    bridge, loopback = conf["plugins"]
    assert loopback == {"type": "loopback"}
    assert bridge["type"] == "bridge" and bridge["bridge"] == "gsbr3"
    assert bridge["isGateway"] is False
    assert bridge["isDefaultGateway"] is False
    assert bridge["ipMasq"] is False
    # a pod reaches itself through its own Service (tests/z2jh: the chart's hub)
    assert bridge["hairpinMode"] is True
    ipam = bridge["ipam"]
    assert ipam["type"] == "host-local"
    # the pod range through the node's bridge address (the hub's address is in
    # it), never a default route
    assert ipam["routes"] == [{"dst": "10.244.0.0/16", "gw": "10.244.3.1"}]
    assert ipam["dataDir"] == "/state/ipam"
    (rng,) = ipam["ranges"][0]
    assert rng["subnet"] == "10.244.3.0/24"
    start = ipaddress.ip_address(rng["rangeStart"])
    assert start in NET.subnet and str(start) != NET.node_ip


def test_kubelet_configuration_from_the_trial():
    config = nodeconfig.kubelet_configuration(
        PATHS, NET, node="cpu-0", client_ca=Path("/pki/ca.crt"), healthz_port=12345
    )
    assert config["kind"] == "KubeletConfiguration"
    assert config["failCgroupV1"] is False
    assert config["cgroupDriver"] == "cgroupfs"
    assert config["cgroupRoot"] == nodeconfig.cgroup_root("cpu-0") == "/gpuspawner-cpu-0"
    assert config["containerRuntimeEndpoint"] == f"unix://{PATHS.containerd_socket}"
    assert config["address"] == "10.244.3.1"
    assert config["readOnlyPort"] == 0
    assert config["healthzBindAddress"] == "127.0.0.1" and config["healthzPort"] == 12345
    assert config["authentication"]["x509"]["clientCAFile"] == "/pki/ca.crt"
    assert config["authentication"]["anonymous"]["enabled"] is False
    assert config["authorization"]["mode"] == "Webhook"
    assert config["resolvConf"] == str(PATHS.resolv_conf)
    assert config["imageGCHighThresholdPercent"] == 100
    assert config["failSwapOn"] is False


def test_kubelet_args_name_the_node_and_its_ip():
    args = nodeconfig.kubelet_args(PATHS, NET, node="cpu-0", labels={"b": "2", "a": "1"})
    assert "--hostname-override=cpu-0" in args
    assert "--node-ip=10.244.3.1" in args
    assert "--root-dir=/var/lib/kubelet" in args
    assert f"--kubeconfig={PATHS.kubeconfig}" in args
    assert "--node-labels=a=1,b=2" in args
    tainted = nodeconfig.kubelet_args(PATHS, NET, node="cpu-0", taints=["a=b:NoSchedule"])
    assert "--register-with-taints=a=b:NoSchedule" in tainted
    assert not any(
        a.startswith("--node-labels") for a in nodeconfig.kubelet_args(PATHS, NET, node="x")
    )


def test_mount_script_binds_every_private_dir_then_signals_ready():
    paths = NodePaths(Path("/state/it's here"))
    script = nodeconfig.mount_script(paths)
    lines = script.splitlines()
    mounts = [shlex.split(line) for line in lines if line.startswith("mount ")]
    assert [m[-1] for m in mounts] == list(nodeconfig.PRIVATE_HOST_DIRS)
    assert all(m[:2] == ["mount", "--bind"] for m in mounts)
    assert mounts[0][2] == str(paths.private_dir("/var/lib/kubelet"))
    ready = next(i for i, line in enumerate(lines) if str(paths.ready_file.name) in line)
    assert ready > max(i for i, line in enumerate(lines) if line.startswith("mount "))
    assert lines[0] == "set -eu"


def test_forward_rules_drop_what_leaves_the_pod_range_or_our_links():
    rules = nodeconfig.forward_rules("CHAIN")
    assert all(r[:2] == ["-A", "CHAIN"] and r[-2:] == ["-j", "DROP"] for r in rules)
    leaving_range, from_bridges, to_strangers = rules
    assert leaving_range[2:-2] == ["-s", "10.244.0.0/16", "!", "-d", "10.244.0.0/16"]
    assert from_bridges[2:-2] == ["-i", "gsbr+", "!", "-d", "10.244.0.0/16"]
    # Forwarded from a bridge to any interface not ours: an unheld pod-range
    # address would otherwise take the host's default route.
    assert to_strangers[2:-2] == ["-i", "gsbr+", "!", "-o", "gs+"]
    assert nodeconfig.HUB_LINK.startswith(nodeconfig.LINK_PREFIX)
    assert NET.bridge.startswith(nodeconfig.LINK_PREFIX)


def test_the_hosts_addresses_and_the_services_share_the_hosts_subnet_apart():
    host = nodeconfig.HOST_SERVICES_SUBNET
    addresses = [nodeconfig.HUB_ADDRESS, nodeconfig.API_ADDRESS, nodeconfig.DNS_ADDRESS]
    assert len(set(addresses)) == 3
    for address in addresses:
        ip = ipaddress.ip_address(address)
        assert ip in host and ip not in nodeconfig.SERVICE_CIDR
    assert nodeconfig.SERVICE_CIDR.subnet_of(host)
    # Pods reach every one of them on the one route they have.
    assert host.subnet_of(nodeconfig.POD_RANGE)


def test_kubelet_gives_pods_the_cluster_dns_only_when_there_is_one():
    def config(**kwargs):
        return nodeconfig.kubelet_configuration(
            PATHS, NET, node="cpu-0", client_ca=Path("/ca.crt"), healthz_port=1, **kwargs
        )

    assert "clusterDNS" not in config()
    with_dns = config(cluster_dns=nodeconfig.DNS_ADDRESS)
    assert with_dns["clusterDNS"] == [nodeconfig.DNS_ADDRESS]
    assert with_dns["clusterDomain"] == "cluster.local"


def test_kubelet_sync_frequency_is_set_only_where_the_topology_gives_one():
    def config(**kwargs):
        return nodeconfig.kubelet_configuration(
            PATHS, NET, node="cpu-0", client_ca=Path("/ca.crt"), healthz_port=1, **kwargs
        )

    assert "syncFrequency" not in config()
    assert config(sync_frequency="10s")["syncFrequency"] == "10s"


def test_a_faster_node_status_keeps_the_kubelets_report_only_changes_period():
    def config(**kwargs):
        return nodeconfig.kubelet_configuration(
            PATHS, NET, node="cpu-0", client_ca=Path("/ca.crt"), healthz_port=1, **kwargs
        )

    assert "nodeStatusUpdateFrequency" not in config()
    assert "nodeStatusReportFrequency" not in config()
    fast = config(node_status_update_frequency="1s")
    assert fast["nodeStatusUpdateFrequency"] == "1s"
    # without it the kubelet would PATCH its Node every second, changed or not
    assert fast["nodeStatusReportFrequency"] == "5m"


def test_the_kubelets_feature_gates_are_read_from_its_help():
    # `k8s kubelet --help`'s --feature-gates list, recorded from the v1.37.2 build
    help_text = (FIXTURES / "nodes" / "kubelet-v1.37.2-feature-gates-help.txt").read_text()
    gates = nodeconfig.kubelet_feature_gates(help_text)
    assert gates["EventedPLEG"] == "ALPHA"
    assert gates["APIResponseCompression"] == "BETA"
    # the last line carries a deprecation note after the stage
    assert gates["WorkloadWithJob"] == "ALPHA"
    # one gate per line after the flag's own
    assert len(gates) == len(help_text.splitlines()) - 1 == 166
    # every gate the default topology names is one this kubelet has
    from gpuspawner_sandbox.topology import load_topology

    named = {g for node in load_topology().nodes for g in node.kubelet_feature_gates}
    assert named and named <= set(gates)
    assert nodeconfig.kubelet_feature_gates("usage: kubelet [flags]") == {}


def test_kubelet_feature_gates_are_written_only_where_the_topology_names_some():
    def config(**kwargs):
        return nodeconfig.kubelet_configuration(
            PATHS, NET, node="cpu-0", client_ca=Path("/ca.crt"), healthz_port=1, **kwargs
        )

    assert "featureGates" not in config()
    assert "featureGates" not in config(feature_gates={})
    gates = {"EventedPLEG": True, "KubeletTracing": False}
    assert config(feature_gates=gates)["featureGates"] == gates


def test_kube_proxy_leaves_the_host_settings_and_the_external_interface_alone():
    config = nodeconfig.kube_proxy_configuration(
        Path("/kp.kubeconfig"), node="cpu-0", healthz_port=1, metrics_port=2
    )
    assert config["kind"] == "KubeProxyConfiguration"
    assert config["mode"] == "iptables"
    assert config["clientConnection"]["kubeconfig"] == "/kp.kubeconfig"
    assert config["hostnameOverride"] == "cpu-0"
    # Pods' traffic keeps its source (no masquerade for the pod range).
    assert config["detectLocalMode"] == "ClusterCIDR" and config["clusterCIDR"] == "10.244.0.0/16"
    assert config["iptables"]["masqueradeAll"] is False
    # NodePorts on our bridges only; none on 127.0.0.1 (that needs route_localnet).
    assert config["nodePortAddresses"] == ["10.244.0.0/16"]
    assert config["iptables"]["localhostNodePorts"] is False
    assert config["healthzBindAddress"] == "127.0.0.1:1"
    assert config["metricsBindAddress"] == "127.0.0.1:2"
    # Zero: the conntrack sysctls are left as they are.
    conntrack = config["conntrack"]
    assert conntrack["maxPerCore"] == 0 and conntrack["min"] == 0
    assert conntrack["tcpEstablishedTimeout"] == conntrack["tcpCloseWaitTimeout"] == "0s"


def test_device_plugin_args_taint_and_labels_of_a_gpu_node(tmp_path):
    from gpuspawner_sandbox.topology import parse_topology

    node = parse_topology(
        {
            "nodes": [
                {
                    "name": "g",
                    "gpu": {"model": "A100-SXM4-80GB", "count": 2},
                    "mig": {"strategy": "single", "profiles": {"1g.10gb": 7}},
                }
            ]
        }
    ).node("g")
    paths = NodePaths(tmp_path / "g")
    args = nodeconfig.device_plugin_args(paths, node, "cdi-cri")
    assert f"--driver-state={paths.driver_state}" in args
    assert "--mig-strategy=single" in args and "--device-list-strategy=cdi-cri" in args
    assert "--plugin-dir=/var/lib/kubelet/device-plugins" in args
    with pytest.raises(nodeconfig.NodeConfigError, match="Unknown device list strategy 'volume'"):
        nodeconfig.device_plugin_args(paths, node, "volume")
    assert nodeconfig.gpu_taints(node) == ["nvidia.com/gpu=present:NoSchedule"]
    labels = nodeconfig.gpu_feature_labels(node)
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb"
    assert labels["nvidia.com/gpu.count"] == "14"
    assert all(k.startswith("nvidia.com/") for k in labels)
    assert paths.device_plugins == paths.private_dir("/var/lib/kubelet") / "device-plugins"


def test_dcgm_exporter_args_read_the_nodes_driver_and_the_kubelets_pod_resources(tmp_path):
    from gpuspawner_sandbox import gpudriver

    paths = NodePaths(tmp_path / "g")
    args = nodeconfig.dcgm_exporter_args(paths, "10.244.3.1:9400")
    assert args == [
        f"--driver-state={paths.driver_state}",
        f"--usage-dir={tmp_path / 'g' / gpudriver.DRIVER_DIR_NAME / gpudriver.USAGE_DIR}",
        "--pod-resources-socket=/var/lib/kubelet/pod-resources/kubelet.sock",
        "--listen=10.244.3.1:9400",
    ]
    # The socket is the node's own: its /var/lib/kubelet is private to its mount namespace.
    assert nodeconfig.POD_RESOURCES_SOCKET.startswith("/var/lib/kubelet/")
    assert "/var/lib/kubelet" in nodeconfig.PRIVATE_HOST_DIRS


def test_a_gpu_nodes_default_runtime_is_nvidias_in_cdi_mode():
    runtime_bin = Path("/cache/nvidia/nvidia-container-runtime")
    config = tomllib.loads(
        nodeconfig.containerd_config(
            PATHS, Path("/usr/sbin/runc"), Path("/cache/cni"), nvidia_runtime=runtime_bin
        )
    )
    runtime = config["plugins"]["io.containerd.cri.v1.runtime"]
    assert runtime["containerd"]["default_runtime_name"] == nodeconfig.NVIDIA_RUNTIME_NAME
    nvidia = runtime["containerd"]["runtimes"][nodeconfig.NVIDIA_RUNTIME_NAME]
    assert nvidia["runtime_type"] == "io.containerd.runc.v2"
    assert nvidia["container_annotations"] == ["cdi.k8s.io/*"]
    assert nvidia["options"] == {
        "BinaryName": str(runtime_bin),
        # The same runc state as the plain runtime: NVIDIA's runtime passes --root on.
        "Root": str(PATHS.runc_root),
        "SystemdCgroup": False,
    }
    # containerd's own CDI (cdi-cri) and NVIDIA's runtime read the same directory.
    assert runtime["enable_cdi"] is True
    assert runtime["cdi_spec_dirs"] == [str(PATHS.cdi_dir)]


@pytest.mark.parametrize("accept", [True, False])
def test_nvidia_runtime_config_is_cdi_mode_on_the_nodes_specs(accept):
    config = tomllib.loads(
        nodeconfig.nvidia_runtime_config(
            PATHS,
            Path("/usr/sbin/runc"),
            Path("/cache/nvidia/nvidia-ctk"),
            "nvidia.com/gpu",
            accept_envvar_unprivileged=accept,
        )
    )
    assert config["accept-nvidia-visible-devices-envvar-when-unprivileged"] is accept
    assert config["accept-nvidia-visible-devices-as-volume-mounts"] is False
    runtime = config["nvidia-container-runtime"]
    # Explicit: the shipped "auto" needs NVML for just-in-time specs.
    assert runtime["mode"] == "cdi"
    assert runtime["runtimes"] == ["/usr/sbin/runc"]
    assert runtime["debug"] == str(PATHS.nvidia_runtime_log)
    assert runtime["modes"]["cdi"] == {
        "default-kind": "nvidia.com/gpu",
        "annotation-prefixes": ["cdi.k8s.io/"],
        "spec-dirs": [str(PATHS.cdi_dir)],
    }
    assert config["nvidia-ctk"]["path"] == "/cache/nvidia/nvidia-ctk"
    assert str(PATHS.nvidia_runtime_config).startswith(str(PATHS.root) + "/")


def test_nvidia_runtime_default_accepts_the_variable_as_nvidia_does():
    assert nodeconfig.ACCEPT_ENVVAR_UNPRIVILEGED_DEFAULT is True
    text = nodeconfig.nvidia_runtime_config(
        PATHS, Path("/usr/sbin/runc"), Path("/x/nvidia-ctk"), "nvidia.com/gpu"
    )
    assert tomllib.loads(text)["accept-nvidia-visible-devices-envvar-when-unprivileged"] is True


def test_kube_proxy_is_synced_once_its_ipv4_rules_were_written():
    name = "kubeproxy_sync_proxy_rules_last_timestamp_seconds"
    assert not nodeconfig.kube_proxy_synced("")
    assert not nodeconfig.kube_proxy_synced(f'{name}{{ip_family="IPv4"}} 0\n')
    assert not nodeconfig.kube_proxy_synced(f'{name}{{ip_family="IPv6"}} 1.7e+09\n')
    assert nodeconfig.kube_proxy_synced(
        f'# HELP {name} The last time\n{name}{{ip_family="IPv4"}} 1.7648e+09\n'
    )


def test_a_node_offers_at_most_the_topologys_cpu_and_memory():
    from gpuspawner_sandbox.topology import parse_topology

    small = parse_topology({"nodes": [{"name": "s", "cpu": "1500m", "memory": "4Gi"}]}).node("s")
    reserved, short = nodeconfig.capacity_reservation(small, 2000, 24 * 2**30)
    assert reserved == {"cpu": "500m", "memory": str(20 * 2**30)}
    assert short == []
    big = parse_topology({"nodes": [{"name": "b", "cpu": "16", "memory": "64Gi"}]}).node("b")
    reserved, short = nodeconfig.capacity_reservation(big, 2000, 24 * 2**30)
    assert reserved == {}
    assert [line.split(":")[0] for line in short] == ["b", "b"]
    assert "cpu 16 is more than this machine has (2)" in short[0]
    assert "memory 64Gi is more than this machine has (24.0Gi)" in short[1]
    config = nodeconfig.kubelet_configuration(
        PATHS,
        NET,
        node="s",
        client_ca=Path("/ca.crt"),
        healthz_port=1,
        max_pods=12,
        system_reserved={"cpu": "500m"},
    )
    assert config["maxPods"] == 12 and config["systemReserved"] == {"cpu": "500m"}
    machine = parse_topology({"nodes": [{"name": "m"}]}).node("m")
    assert nodeconfig.capacity_reservation(machine, 2000, 24 * 2**30) == ({}, [])
    assert "systemReserved" not in nodeconfig.kubelet_configuration(
        PATHS, NET, node="s", client_ca=Path("/ca.crt"), healthz_port=1
    )


def test_the_hosts_packets_to_the_pod_range_leave_by_our_links_only():
    local, guard = nodeconfig.host_output_rules("CHAIN")
    assert local == ["-A", "CHAIN", "-o", "lo", "-j", "RETURN"]
    assert guard == ["-A", "CHAIN", "-d", "10.244.0.0/16", "!", "-o", "gs+", "-j", "DROP"]
