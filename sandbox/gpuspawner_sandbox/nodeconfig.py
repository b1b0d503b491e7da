"""What a real node is configured with, rendered from data (no I/O here).

One node = its own containerd, kubelet, cgroup root, bridge and directories
on this machine (see :mod:`gpuspawner_sandbox.nodes`, which writes these files
and starts the processes). The settings are the ones that mattered in the
trial on a machine of our kind (``shared/notes/real-nodes.md``); each
non-obvious one says why next to it.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .gpudriver import USAGE_DIR, DriverPaths
from .topology import NodeSpec, cpu_millicores, memory_bytes, node_labels, node_taints

#: Every pod network lives inside this range; the forward-drop rule drops
#: anything forwarded from it to a destination outside it.
POD_RANGE = ipaddress.ip_network("10.244.0.0/16")

#: Bridges are named <prefix><index>; an interface name has at most 15 bytes.
BRIDGE_PREFIX = "gsbr"

#: The last /24 of the pod range is not a node's: it holds the host's own
#: addresses for pods, on an interface of ours (a bridge without ports). The hub listens there, so
#: notebooks reach its API inside the pod range (the host's loopback is not
#: theirs, and nothing may listen on the external interface).
HOST_SERVICES_SUBNET = ipaddress.ip_network("10.244.255.0/24")
HUB_ADDRESS = str(HOST_SERVICES_SUBNET.network_address + 1)
#: With the cluster network (RealNodes(cluster_network=True)): the API server's
#: address for everyone, pods included (the "kubernetes" Service's endpoint), and
#: the cluster DNS's (each pod's nameserver, the kubelet's clusterDNS).
API_ADDRESS = str(HOST_SERVICES_SUBNET.network_address + 2)
DNS_ADDRESS = str(HOST_SERVICES_SUBNET.network_address + 3)
#: ClusterIPs: the upper half of the host's subnet, so a Service's address is inside
#: the pod range too, and pods reach it on the one route they have. The host routes
#: the range to HUB_LINK, a bridge without ports: an address no Service holds goes
#: nowhere (kube-proxy rewrites those that are held before routing).
SERVICE_CIDR = ipaddress.ip_network("10.244.255.128/25")
HUB_LINK = "gshub0"
#: Every interface of ours starts with this: the nodes' bridges and HUB_LINK.
LINK_PREFIX = "gs"
#: Node N has 10.244.N.0/24, so nodes 0..254 fit beside the host's subnet.
MAX_NODES = 255

#: Our own iptables chain in the filter table, jumped to from FORWARD.
FORWARD_CHAIN = "GPUSPAWNER-PODS"
#: Our chain in the filter table jumped to from OUTPUT, with the cluster network: the
#: host's own packets to the pod range leave by our links only (host_output_rules).
HOST_CHAIN = "GPUSPAWNER-HOST"

#: Images that exist only on this machine: ``.invalid`` can never resolve, and
#: containerd's registry configuration sends every pull to a dead loopback
#: port anyway, so a missing image fails at once instead of reaching out.
IMAGE_REGISTRY = "gpuspawner.invalid"
PAUSE_IMAGE = f"{IMAGE_REGISTRY}/pause:v1"
TOOL_IMAGE = f"{IMAGE_REGISTRY}/tool:v1"
#: The test tool in an image that declares NVIDIA_VISIBLE_DEVICES=all, as
#: NVIDIA's CUDA base images do (the seed's security case).
CUDA_TOOL_IMAGE = f"{IMAGE_REGISTRY}/tool-cuda:v1"
CUDA_IMAGE_ENV = ("NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=compute,utility")
DEAD_REGISTRY = "http://127.0.0.1:9"

#: Host paths the kubelet and containerd use whatever they are told; each
#: node's mount namespace gets its own directory bind-mounted over each.
#: /var/lib/kubelet holds device-plugins/ (two kubelets fought over it),
#: /var/log/containers the kubelet's log symlinks, /var/lib/cni libcni's
#: result cache, /run/containerd the shims' sockets (containerd hard-codes
#: /run/containerd/s).
PRIVATE_HOST_DIRS = ("/var/lib/kubelet", "/var/log/containers", "/var/lib/cni", "/run/containerd")

#: containerd's socket, as seen inside each node's own mount namespace.
NODE_CONTAINERD_SOCKET = Path("/run/containerd/containerd.sock")

#: What the kubelet sets on the host when it starts; recorded before the
#: first node starts and put back after the last one stops.
KUBELET_SYSCTLS = ("vm.overcommit_memory", "kernel.panic", "kernel.panic_on_oops")
#: Networking sysctls nothing of ours should change; recorded and put back too.
#: (Pods on different nodes reach each other because forwarding is turned on for
#: our bridges alone, net.ipv4.conf.<bridge>.forwarding, which goes with them.)
#: The last two are kube-proxy's, which it leaves alone as configured
#: (kube_proxy_configuration); recorded to prove it.
NETWORK_SYSCTLS = (
    "net.ipv4.ip_forward",
    "net.bridge.bridge-nf-call-iptables",
    "net.ipv4.conf.all.route_localnet",
    "net.netfilter.nf_conntrack_max",
)


class NodeConfigError(ValueError):
    """A node cannot be configured as asked; the message says why."""


@dataclass(frozen=True)
class NodeNetwork:
    """A node's pod network: bridge name, pod subnet, and the bridge's address (= node IP)."""

    index: int

    def __post_init__(self) -> None:
        if not 0 <= self.index < MAX_NODES:
            raise NodeConfigError(
                f"Node index {self.index} is out of range: at most {MAX_NODES} nodes fit in "
                f"{POD_RANGE} ({HOST_SERVICES_SUBNET} is the host's own)."
            )

    @property
    def bridge(self) -> str:
        return f"{BRIDGE_PREFIX}{self.index}"

    @property
    def subnet(self) -> ipaddress.IPv4Network:
        return ipaddress.ip_network(f"10.244.{self.index}.0/24")

    @property
    def node_ip(self) -> str:
        # The kubelet refuses a loopback node IP; the bridge's own address is
        # ours, reachable from the host, and never leaves the machine.
        return str(self.subnet.network_address + 1)

    @property
    def bridge_cidr(self) -> str:
        return f"{self.node_ip}/{self.subnet.prefixlen}"


@dataclass(frozen=True)
class NodePaths:
    """Every directory and file of one node, under its own root."""

    root: Path

    @property
    def containerd_root(self) -> Path:
        return self.root / "containerd" / "root"

    @property
    def containerd_state(self) -> Path:
        return self.root / "containerd" / "state"

    @property
    def containerd_socket(self) -> Path:
        # Inside the node's mount namespace, where /run/containerd is the
        # node's own directory: a short, fixed path (a unix socket's path has
        # at most 107 bytes, and state directories can be deep), and the
        # place every kubelet and tool looks first.
        return NODE_CONTAINERD_SOCKET

    @property
    def containerd_config(self) -> Path:
        return self.root / "containerd" / "config.toml"

    @property
    def registry_hosts(self) -> Path:
        return self.root / "containerd" / "certs.d"

    @property
    def runc_root(self) -> Path:
        return self.root / "runc"

    @property
    def cni_conf_dir(self) -> Path:
        return self.root / "cni" / "net.d"

    @property
    def cni_data_dir(self) -> Path:
        return self.root / "cni" / "host-local"

    @property
    def kubelet_config(self) -> Path:
        return self.root / "kubelet-config.yaml"

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubelet.kubeconfig"

    @property
    def cert_dir(self) -> Path:
        return self.root / "pki"

    @property
    def pod_logs(self) -> Path:
        return self.root / "pod-logs"

    @property
    def volume_plugins(self) -> Path:
        return self.root / "volume-plugins"

    @property
    def resolv_conf(self) -> Path:
        return self.root / "resolv.conf"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def ready_file(self) -> Path:
        return self.root / "mounts.ready"

    @property
    def driver(self) -> DriverPaths:
        """The emulated NVIDIA driver's files (GPU nodes only; see gpudriver.py)."""
        return DriverPaths.of_node(self.root)

    @property
    def driver_state(self) -> Path:
        """The emulated NVIDIA driver's aggregate state, what the device plugin reads."""
        return self.driver.state

    @property
    def cdi_dir(self) -> Path:
        """The node's CDI spec directory (NVIDIA's runtime and containerd read only this)."""
        return self.root / "cdi"

    @property
    def nvidia_runtime_config(self) -> Path:
        """NVIDIA's container runtime's config.toml (GPU nodes only)."""
        return self.root / "nvidia-container-runtime" / "config.toml"

    @property
    def nvidia_runtime_log(self) -> Path:
        return self.logs / "nvidia-container-runtime.log"

    @property
    def device_plugins(self) -> Path:
        """The kubelet's device-plugins directory as the host sees it (sockets, checkpoint)."""
        return self.private_dir("/var/lib/kubelet") / "device-plugins"

    def private_dir(self, host_dir: str) -> Path:
        """The node's own directory that is bind-mounted over ``host_dir``."""
        return self.root / "private" / host_dir.strip("/").replace("/", "_")


def _toml_str(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string


#: The variable that points NVIDIA's container toolkit at its config file
#: (instead of /etc/nvidia-container-runtime/config.toml); set in a GPU node's
#: containerd's environment, which its shims and so the runtime inherit.
NVIDIA_CONFIG_ENV = "NVIDIA_CTK_CONFIG_FILE_PATH"
#: containerd's name for the runtime handler of NVIDIA's runtime.
NVIDIA_RUNTIME_NAME = "nvidia"
#: Annotations that name CDI devices (the cdi-annotations strategy): containerd
#: passes them to the OCI spec, where NVIDIA's runtime reads them.
CDI_ANNOTATION_PREFIX = "cdi.k8s.io/"
#: NVIDIA's default for accept-nvidia-visible-devices-envvar-when-unprivileged.
ACCEPT_ENVVAR_UNPRIVILEGED_DEFAULT = True


def containerd_config(
    paths: NodePaths, runc: Path, cni_bin_dir: Path, nvidia_runtime: Path | None = None
) -> str:
    """containerd's config.toml (version 3) for one node.

    With ``nvidia_runtime`` (a GPU node) NVIDIA's container runtime, wrapping
    runc, is the default runtime.
    """
    runtime = 'plugins."io.containerd.cri.v1.runtime"'
    images = 'plugins."io.containerd.cri.v1.images"'
    default = NVIDIA_RUNTIME_NAME if nvidia_runtime else "runc"
    nvidia = ""
    if nvidia_runtime:
        nvidia = f"""
# NVIDIA's runtime in CDI mode (its config: {NVIDIA_CONFIG_ENV} in containerd's
# environment): it edits the OCI spec on `create`, then runs runc.
[{runtime}.containerd.runtimes.{NVIDIA_RUNTIME_NAME}]
  runtime_type = "io.containerd.runc.v2"
  # CRI annotations reach the OCI spec only when listed here.
  container_annotations = [{_toml_str(CDI_ANNOTATION_PREFIX + "*")}]

[{runtime}.containerd.runtimes.{NVIDIA_RUNTIME_NAME}.options]
  BinaryName = {_toml_str(str(nvidia_runtime))}
  Root = {_toml_str(str(paths.runc_root))}
  SystemdCgroup = false
"""
    return f"""\
# Written by gpuspawner_sandbox.nodes for one sandbox node; private paths only.
version = 3
root = {_toml_str(str(paths.containerd_root))}
state = {_toml_str(str(paths.containerd_state))}
# Never pick up the host's containerd drop-ins.
imports = []
disabled_plugins = ["io.containerd.nri.v1.nri"]

[grpc]
  address = {_toml_str(str(paths.containerd_socket))}

[ttrpc]
  address = {_toml_str(str(paths.containerd_socket) + ".ttrpc")}

[plugins."io.containerd.grpc.v1.cri"]
  # The streaming server (exec/attach/port-forward) on loopback, any free port.
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

[{images}]
  snapshotter = "overlayfs"

[{images}.pinned_images]
  sandbox = {_toml_str(PAUSE_IMAGE)}

[{images}.registry]
  config_path = {_toml_str(str(paths.registry_hosts))}

[{runtime}]
  # Root here lacks CAP_SYS_RESOURCE: without this runc fails every pod
  # when the kubelet asks for oom_score_adj -998/-997.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  enable_selinux = false
  # containerd's own CDI (the cdi-cri strategy) reads only the node's specs.
  enable_cdi = true
  cdi_spec_dirs = [{_toml_str(str(paths.cdi_dir))}]

[{runtime}.cni]
  bin_dirs = [{_toml_str(str(cni_bin_dir))}]
  conf_dir = {_toml_str(str(paths.cni_conf_dir))}
  max_conf_num = 1

[{runtime}.containerd]
  default_runtime_name = {_toml_str(default)}

[{runtime}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[{runtime}.containerd.runtimes.runc.options]
  BinaryName = {_toml_str(str(runc))}
  Root = {_toml_str(str(paths.runc_root))}
  SystemdCgroup = false
{nvidia}
[plugins."io.containerd.transfer.v1.local"]
  config_path = {_toml_str(str(paths.registry_hosts))}
"""


def component_env(base: Mapping[str, str], containerd_dir: Path) -> dict[str, str]:
    """The environment a node component (or the image store's containerd) runs with.

    containerd finds its shim next to itself, on PATH; proxies have no business here
    (pulls fail fast on loopback, and nothing else leaves the machine).
    """
    env = {k: v for k, v in base.items() if k.lower() not in ("http_proxy", "https_proxy")}
    env["PATH"] = f"{containerd_dir}:{env.get('PATH', '/usr/sbin:/usr/bin')}"
    return env


def nvidia_runtime_config(
    paths: NodePaths,
    runc: Path,
    nvidia_ctk: Path,
    cdi_kind: str,
    *,
    accept_envvar_unprivileged: bool = ACCEPT_ENVVAR_UNPRIVILEGED_DEFAULT,
) -> str:
    """NVIDIA's container runtime's config.toml for a GPU node: CDI mode, the node's specs.

    ``mode = "cdi"`` is set explicitly: the shipped ``auto`` turns requests
    into just-in-time CDI specs, which needs NVML (a real driver). In CDI mode
    the runtime resolves ``NVIDIA_VISIBLE_DEVICES`` (unless refused, below) and
    ``cdi.k8s.io/`` annotations against the node's spec.
    """
    return f"""\
# Written by gpuspawner_sandbox.nodes for one GPU node.
# false: unprivileged containers get no GPU through NVIDIA_VISIBLE_DEVICES
# (closes an image's NVIDIA_VISIBLE_DEVICES=all at node level).
accept-nvidia-visible-devices-envvar-when-unprivileged = {_toml_bool(accept_envvar_unprivileged)}
accept-nvidia-visible-devices-as-volume-mounts = false

[nvidia-ctk]
  path = {_toml_str(str(nvidia_ctk))}

[nvidia-container-runtime]
  debug = {_toml_str(str(paths.nvidia_runtime_log))}
  log-level = "info"
  mode = "cdi"
  runtimes = [{_toml_str(str(runc))}]

[nvidia-container-runtime.modes.cdi]
  default-kind = {_toml_str(cdi_kind)}
  annotation-prefixes = [{_toml_str(CDI_ANNOTATION_PREFIX)}]
  spec-dirs = [{_toml_str(str(paths.cdi_dir))}]
"""


def _toml_bool(value: bool) -> str:
    return "true" if value else "false"


def registry_hosts_toml() -> str:
    """certs.d/_default/hosts.toml: every registry is a dead loopback port."""
    return f"""\
# No registry is reachable from the sandbox: pulls fail at once, on loopback.
server = {_toml_str(DEAD_REGISTRY)}

[host.{_toml_str(DEAD_REGISTRY)}]
  capabilities = ["pull", "resolve"]
"""


def cni_conflist(net: NodeNetwork, data_dir: Path) -> dict[str, Any]:
    """The node's CNI network: bridge + host-local + loopback, no default route, no NAT."""
    return {
        "cniVersion": "1.0.0",
        "name": "gpuspawner-pods",
        "plugins": [
            {
                "type": "bridge",
                "bridge": net.bridge,
                # The bridge and its address are ours (created before the
                # node starts): the plugin neither addresses the bridge nor
                # turns on IP forwarding, and gives pods no gateway.
                "isGateway": False,
                "isDefaultGateway": False,
                "ipMasq": False,
                # A pod reaches itself through a Service (kube-proxy DNATs to its own
                # address; with br_netfilter the frame goes back out the port it came
                # in on), as on any real cluster: the chart's hub checks its managed
                # services at http://hub:<port>, its own Service.
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "dataDir": str(data_dir),
                    # Besides the subnet's own (connected) route, only the
                    # pod range, through the node's bridge address: pods
                    # reach the host's address for them (the hub, on
                    # HUB_ADDRESS) and nothing outside the pod range. No
                    # default route; the host forwards nothing (ip_forward
                    # stays as it is) and our FORWARD chain drops whatever
                    # would leave the range.
                    "ranges": [
                        [
                            {
                                "subnet": str(net.subnet),
                                "rangeStart": str(net.subnet.network_address + 10),
                                "rangeEnd": str(net.subnet.broadcast_address - 1),
                            }
                        ]
                    ],
                    "routes": [{"dst": str(POD_RANGE), "gw": net.node_ip}],
                },
            },
            {"type": "loopback"},
        ],
    }


def kubelet_configuration(
    paths: NodePaths,
    net: NodeNetwork,
    *,
    node: str,
    client_ca: Path,
    healthz_port: int,
    kubelet_port: int = 10250,
    cluster_dns: str | None = None,
    max_pods: int = 110,
    system_reserved: Mapping[str, str] | None = None,
    sync_frequency: str | None = None,
    node_status_update_frequency: str | None = None,
    feature_gates: Mapping[str, bool] | None = None,
) -> dict[str, Any]:
    """The KubeletConfiguration for one node; ``cluster_dns`` is the pods' nameserver, if any.

    ``max_pods`` and ``system_reserved`` (:func:`capacity_reservation`) give it the
    topology's pods, CPU and memory; ``sync_frequency`` its sync period (None: the
    kubelet's default, 1m); ``node_status_update_frequency`` how often it computes
    its node's status (None: the kubelet's 10 s); ``feature_gates`` its featureGates
    (None or empty: the kubelet's defaults).
    """
    dns = {"clusterDNS": [cluster_dns]} if cluster_dns else {}
    reserved = {"systemReserved": dict(system_reserved)} if system_reserved else {}
    sync = {"syncFrequency": sync_frequency} if sync_frequency else {}
    status = (
        {
            "nodeStatusUpdateFrequency": node_status_update_frequency,
            # Set explicitly, the update frequency would also become the report
            # frequency: a PATCH of every node, watched by the scheduler and the
            # hub, each time. The kubelet's own default sends only what changed.
            "nodeStatusReportFrequency": "5m",
        }
        if node_status_update_frequency
        else {}
    )
    gates = {"featureGates": dict(feature_gates)} if feature_gates else {}
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        # Our machines have the cgroup v1 hybrid hierarchy; the kubelet
        # refuses v1 unless told otherwise.
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        # Each node's pods in their own cgroup subtree (pre-created by nodes.py).
        "cgroupRoot": cgroup_root(node),
        "cgroupsPerQOS": True,
        "containerRuntimeEndpoint": f"unix://{paths.containerd_socket}",
        "podLogsDir": str(paths.pod_logs),
        "volumePluginDir": str(paths.volume_plugins),
        "address": net.node_ip,
        "port": kubelet_port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(client_ca)},
        },
        "authorization": {"mode": "Webhook"},
        # Pods resolve nothing outside: the only nameserver is a dead loopback.
        "resolvConf": str(paths.resolv_conf),
        # Images exist only locally: never garbage-collect them.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        # A shared development machine: evict only when really short.
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "nodefs.inodesFree": "1%",
            "imagefs.available": "1%",
        },
        "failSwapOn": False,
        "serializeImagePulls": False,
        "registerNode": True,
        "staticPodPath": "",
        # Lets `down` restore the host: the kubelet sets the kernel's panic
        # sysctls itself (recorded and put back by nodes.py).
        "protectKernelDefaults": False,
        "clusterDomain": "cluster.local",
        # Pods with dnsPolicy ClusterFirst (the default) ask the cluster DNS,
        # which answers for the cluster's zone only and forwards nothing.
        **dns,
        "maxPods": max_pods,
        # Set aside so that allocatable is the topology's CPU and memory, where the
        # machine has more (enforced on the node's pods' cgroup, "pods" only).
        **reserved,
        **sync,
        **status,
        **gates,
    }


#: One gate in ``kubelet --help``'s --feature-gates list: "  EventedPLEG=true|false (ALPHA - default=false)".
_HELP_GATE = re.compile(
    r"^\s+([A-Za-z0-9]+)=true\|false \(([A-Z]+) - default=(?:true|false)\)", re.M
)


def kubelet_feature_gates(help_text: str) -> dict[str, str]:
    """The feature gates a kubelet's ``--help`` offers, with their stage (ALPHA, BETA, …).

    The kubelet panics on a gate it does not know in its config file; asking its
    help first lets the start refuse such a topology in one sentence.
    """
    return {m.group(1): m.group(2) for m in _HELP_GATE.finditer(help_text)}


def capacity_reservation(
    node: NodeSpec, machine_millicores: int, machine_memory: int
) -> tuple[dict[str, str], list[str]]:
    """What the kubelet reserves so the node offers at most the topology's CPU and memory.

    Returns the ``systemReserved`` mapping (empty where the machine has no more
    than the topology asks) and one sentence per resource the machine cannot give in
    full: every node is on this machine, so none can advertise more than it has.
    """
    reserved: dict[str, str] = {}
    short: list[str] = []
    if node.cpu is not None:
        cpu = cpu_millicores(node.cpu)
        if machine_millicores > cpu:
            reserved["cpu"] = f"{machine_millicores - cpu}m"
        elif machine_millicores < cpu:
            short.append(
                f"{node.name}: the topology's cpu {node.cpu} is more than this machine has "
                f"({machine_millicores / 1000:g}); the node offers the machine's."
            )
    if node.memory is not None:
        memory = memory_bytes(node.memory)
        if machine_memory > memory:
            reserved["memory"] = str(machine_memory - memory)
        elif machine_memory < memory:
            short.append(
                f"{node.name}: the topology's memory {node.memory} is more than this machine "
                f"has ({machine_memory / 2**30:.1f}Gi); the node offers the machine's."
            )
    return reserved, short


def kube_proxy_configuration(
    kubeconfig: Path, *, node: str, healthz_port: int, metrics_port: int
) -> dict[str, Any]:
    """The KubeProxyConfiguration of the machine's one kube-proxy.

    One is enough: every node's pods are on bridges in the host's network
    namespace, which is where kube-proxy writes its rules. It runs as ``node``
    (the first node) only to learn a node IP.
    """
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": node,
        "mode": "iptables",
        # Traffic from a pod is local and keeps its source address; only the
        # host's own connections to a Service are masqueraded, and those never
        # leave the machine either.
        "detectLocalMode": "ClusterCIDR",
        "clusterCIDR": str(POD_RANGE),
        # NodePorts only on our bridges' addresses, never the external interface.
        "nodePortAddresses": [str(POD_RANGE)],
        "healthzBindAddress": f"127.0.0.1:{healthz_port}",
        "metricsBindAddress": f"127.0.0.1:{metrics_port}",
        # Zero leaves the host's conntrack sysctls as they are (NETWORK_SYSCTLS).
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
        },
        "iptables": {
            "masqueradeAll": False,
            # Else it sets net.ipv4.conf.all.route_localnet for NodePorts on 127.0.0.1.
            "localhostNodePorts": False,
            "syncPeriod": "30s",
            "minSyncPeriod": "1s",
        },
    }


def kubelet_args(
    paths: NodePaths,
    net: NodeNetwork,
    *,
    node: str,
    labels: Mapping[str, str] | None = None,
    taints: Sequence[str] = (),
) -> list[str]:
    """The kubelet's command-line flags (after ``k8s kubelet``).

    ``taints`` are ``key=value:Effect`` strings the node registers with.
    """
    args = [
        f"--config={paths.kubelet_config}",
        f"--kubeconfig={paths.kubeconfig}",
        f"--hostname-override={node}",
        f"--node-ip={net.node_ip}",
        # The node's own directory is mounted here in its mount namespace.
        "--root-dir=/var/lib/kubelet",
        f"--cert-dir={paths.cert_dir}",
    ]
    if labels:
        args.append("--node-labels=" + ",".join(f"{k}={v}" for k, v in sorted(labels.items())))
    if taints:
        args.append("--register-with-taints=" + ",".join(taints))
    return args


#: How the device plugin hands devices to containers, as NVIDIA's plugin's
#: --device-list-strategy: the variable NVIDIA's runtime reads, or CDI names.
DEVICE_LIST_STRATEGIES = ("envvar", "cdi-annotations", "cdi-cri")


def device_plugin_args(paths: NodePaths, node: NodeSpec, device_list_strategy: str) -> list[str]:
    """The device plugin's flags (after ``k8s device-plugin``) for a GPU node."""
    if device_list_strategy not in DEVICE_LIST_STRATEGIES:
        raise NodeConfigError(
            f"Unknown device list strategy {device_list_strategy!r}; expected one of "
            f"{', '.join(DEVICE_LIST_STRATEGIES)}."
        )
    return [
        f"--driver-state={paths.driver_state}",
        # The node's own directory is mounted here in its mount namespace.
        "--plugin-dir=/var/lib/kubelet/device-plugins",
        f"--mig-strategy={node.mig_strategy}",
        f"--device-list-strategy={device_list_strategy}",
    ]


#: The kubelet's PodResources socket, inside the node's mount namespace.
POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"


def dcgm_exporter_args(paths: NodePaths, listen: str) -> list[str]:
    """The emulated DCGM exporter's flags for a GPU node, serving on ``listen`` (IP:PORT)."""
    return [
        f"--driver-state={paths.driver_state}",
        # usage/<GPU-UUID>/usage.json (DriverPaths.usage_dir) under it.
        f"--usage-dir={paths.driver.root / USAGE_DIR}",
        # The node's own /var/lib/kubelet is mounted here in its mount namespace.
        f"--pod-resources-socket={POD_RESOURCES_SOCKET}",
        f"--listen={listen}",
    ]


def gpu_taints(node: NodeSpec) -> list[str]:
    """The GPU taint as the kubelet's ``--register-with-taints`` takes it (a node may
    not change its own taints once registered: NodeRestriction)."""
    return [f"{t['key']}={t['value']}:{t['effect']}" for t in node_taints(node)]


def gpu_feature_labels(node: NodeSpec) -> dict[str, str]:
    """The labels GPU feature discovery puts on a node: the ``nvidia.com/`` ones.

    The kubelet sets its own (hostname, os, arch); NodeRestriction lets a node
    set ``nvidia.com/`` labels on itself.
    """
    return {k: v for k, v in node_labels(node).items() if k.startswith("nvidia.com/")}


def resolv_conf() -> str:
    """The pods' resolv.conf: a loopback nameserver that answers nothing."""
    return "nameserver 127.0.0.1\n"


def mount_script(paths: NodePaths, host_dirs: tuple[str, ...] = PRIVATE_HOST_DIRS) -> str:
    """The shell script the node's mount-namespace holder runs (sh -c).

    It bind-mounts the node's private directories over the shared host paths,
    then marks itself ready and waits until it is killed; the node's
    containerd and kubelet join its mount namespace.
    """
    lines = ["set -eu"]
    for host_dir in host_dirs:
        lines.append(f"mount --bind {_sh(str(paths.private_dir(host_dir)))} {_sh(host_dir)}")
    lines.append(f": > {_sh(str(paths.ready_file))}")
    # The shell stays (its command line names the node, so `down` can tell
    # it is ours); it sleeps until it is killed.
    lines.append("while :; do sleep 3600; done")
    return "\n".join(lines) + "\n"


def _sh(value: str) -> str:
    return "'" + value.replace("'", "'\\''") + "'"


def forward_rules(chain: str = FORWARD_CHAIN) -> list[list[str]]:
    """iptables rules (filter table) of our chain: drop pod traffic leaving the pod ranges.

    Pods have no default route, so nothing should ever match; the rules'
    counters prove it.
    """
    pods = str(POD_RANGE)
    return [
        ["-A", chain, "-s", pods, "!", "-d", pods, "-j", "DROP"],
        ["-A", chain, "-i", f"{BRIDGE_PREFIX}+", "!", "-d", pods, "-j", "DROP"],
        # Our bridges forward (pod to pod across nodes): an address inside the pod
        # range that no bridge of ours holds would take the host's default route.
        ["-A", chain, "-i", f"{BRIDGE_PREFIX}+", "!", "-o", f"{LINK_PREFIX}+", "-j", "DROP"],
    ]


def kube_proxy_synced(metrics: str) -> bool:
    """Whether kube-proxy's Prometheus metrics say it has written the IPv4 rules once."""
    for line in metrics.splitlines():
        if line.startswith('kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"}'):
            return float(line.rsplit(" ", 1)[1]) > 0
    return False


def host_output_rules(chain: str = HOST_CHAIN) -> list[list[str]]:
    """iptables rules (filter table) of our OUTPUT chain: the host's packets to the pod
    range go out of our links (or stay local), never out of another interface.

    An address of the range that no link of ours holds (a node's, or the API
    server's once its link is gone) would otherwise take the default route; the
    counter shows whether anything tried.
    """
    return [
        ["-A", chain, "-o", "lo", "-j", "RETURN"],
        ["-A", chain, "-d", str(POD_RANGE), "!", "-o", f"{LINK_PREFIX}+", "-j", "DROP"],
    ]


def cgroup_root(node: str) -> str:
    """The node's cgroup root (the kubelet's ``cgroupRoot``), in every hierarchy."""
    return f"/gpuspawner-{node}"
