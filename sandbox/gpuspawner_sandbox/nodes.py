"""Real Kubernetes nodes on this machine: the kubelet, containerd, runc and CNI.

Each node is a set of host processes sharing one private mount namespace
(``unshare --mount --propagation slave``): its own containerd (private root,
state, socket), the kubelet (``k8s kubelet`` from the control plane's
binary) with a ``system:node:<name>`` client certificate, a cgroup root
``/gpuspawner-<node>`` in every hierarchy, and a bridge ``gsbr<N>`` whose
address 10.244.N.1 is the node IP. Pods get their own network namespace on
that bridge with no default route; an iptables chain of ours drops anything
forwarded from the pod range to elsewhere, and its counter is readable.

Everything started and changed is recorded in ``<state_dir>/nodes.json``
before it happens, so :func:`teardown` (from this process or from
``gpuspawner-sandbox down``) stops it all and puts the host back as it was,
even after a failed start.

A GPU node (one whose topology entry has GPUs) also gets its emulated driver's
directory (:mod:`gpuspawner_sandbox.gpudriver`: state, projections, nvidia-smi),
our device plugin beside its
kubelet in its mount namespace (``k8s device-plugin``: the kubelet's own
device manager allocates, checkpoints and withdraws unhealthy GPUs), the
``nvidia.com/gpu`` taint at registration, and the labels GPU feature discovery
sets, written with the node's own credentials. Its containerd's default
runtime is NVIDIA's ``nvidia-container-runtime`` in CDI mode, wrapping runc,
with a CDI spec generated from the driver state (:mod:`gpuspawner_sandbox.cdi`)
and the driver's device files (``mknod``; nothing can open them). Everything
of a GPU node lives under its root, so teardown has nothing more to restore.
Beside the kubelet runs the emulated DCGM exporter
(``sandbox/go/cmd/dcgm-exporter``) on the node IP, its address recorded as
``dcgm_exporter``.

With ``cluster_network=True`` pods get what a real cluster gives them (docs/sandbox.md,
"The cluster network"): the host's link ``gshub0`` holds the hub's, the API server's
and the cluster DNS's addresses and routes the Services' range; each bridge forwards
(that bridge alone); one kube-proxy and one CoreDNS serve the machine, recorded under
``_cluster``.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from . import (
    cdi,
    clusterdns,
    gpudriver,
    imageseed,
    machineclaim,
    nodeconfig,
    ociimage,
    suitecosts,
)
from .controlplane import ControlPlane, log_tail, stop_recorded
from .controlplane import read_state as read_control_plane
from .hoststate import cgroup_mounts, read_sysctl, sysctl_path
from .kubeapi import ApiError, KubeApi
from .lifetime import alive, dying_with_us
from .nodebuild import NodeBinaries, go_arch
from .nodeconfig import NodeNetwork, NodePaths
from .ports import free_port
from .topology import NODE_STATUS_UPDATE_FREQUENCY, NodeSpec, extended_resources

STATE_FILE = "nodes.json"

#: Seconds each process gets to exit after SIGTERM before it is killed.
STOP_GRACE = 10.0

#: iptables chains the kubelet and kube-proxy create (and we remove again when we
#: created them).
KUBELET_CHAIN_PREFIX = "KUBE-"

#: The record's key (and the directory under the nodes' root) of the machine-wide
#: components of the cluster network, kube-proxy and CoreDNS; not a valid node name.
CLUSTER = "_cluster"


class NodeError(Exception):
    """Real nodes could not be started; the message says why and what to do."""


def _run(
    cmd: Sequence[str], check: bool = True, timeout: float = 60
) -> subprocess.CompletedProcess:
    result = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise NodeError(f"`{shlex.join(cmd)}` failed: {result.stderr.strip() or result.stdout}")
    return result


def _mntns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return None


def pause_spec(ref: str, programs: Path, arch: str) -> ociimage.ImageSpec:
    """The pause image, named ``ref``: the pod sandboxes' on the real nodes, and the one
    zero-to-jupyterhub's placeholder and puller pods run (:mod:`.chartimages`).

    ``programs`` holds the built pause program (:func:`.nodebuild.build_image_programs`).
    """
    return ociimage.ImageSpec(
        ref=ref,
        files={"pause": ((programs / "pause").read_bytes(), 0o755)},
        entrypoint=["/pause"],
        architecture=arch,
    )


# -- the record --------------------------------------------------------------------


def read_state(state_dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads((Path(state_dir) / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None


def _write_state(state_dir: Path, state: dict[str, Any]) -> None:
    path = Path(state_dir) / STATE_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2) + "\n")
    tmp.replace(path)


# -- starting ----------------------------------------------------------------------


class RealNodes:
    """Real nodes registered to a running control plane. A context manager."""

    #: Tests and `up --foreground` want the processes to die with us; `up` does not.
    die_with_parent: bool = True

    def __init__(
        self,
        state_dir: Path,
        control_plane: ControlPlane,
        binaries: NodeBinaries,
        names: Iterable[str],
        *,
        taints: Sequence[str] = (),
        specs: Mapping[str, NodeSpec] | None = None,
        device_list_strategy: str | Mapping[str, str] = "envvar",
        images: Sequence[Path] = (),
        cluster_network: bool = False,
        machine_wait: float = 0,
        emit: Callable[[str], None] | None = None,
    ):
        self.state_dir = Path(state_dir).resolve()
        self.root = self.state_dir / "nodes"
        self.cp = control_plane
        self.binaries = binaries
        self.names = list(names)
        self.taints = tuple(taints)
        #: Topology entries by name; a node whose entry has GPUs is a GPU node.
        self.specs = dict(specs or {})
        #: How each GPU node's plugin names devices to the runtime (NVIDIA's
        #: --device-list-strategy): one for all nodes, or per node name.
        self.device_list_strategy = device_list_strategy
        #: More image archives (docker save / OCI tars) every node holds: the notebook image.
        self.images = tuple(images)
        #: Whether pods get the cluster network of a real cluster: the host's link
        #: (nodeconfig.HUB_LINK) with the hub's, the API server's and the cluster
        #: DNS's addresses and the Services' route; forwarding between our bridges;
        #: a real kube-proxy and CoreDNS as the pods' nameserver. The control plane
        #: is then started after prepare(), with api_address=nodeconfig.API_ADDRESS.
        self.cluster_network = cluster_network
        #: How long a start waits for another set of real nodes on this machine to stop
        #: (machineclaim) before it refuses: 0 for `up` and the demo, longer for tests.
        self.machine_wait = machine_wait
        self.emit = emit
        for name in self.names:
            if (
                self.gpu_spec(name)
                and self._strategy(name) not in nodeconfig.DEVICE_LIST_STRATEGIES
            ):
                # Refused before anything starts.
                raise NodeError(
                    f"Node {name}: unknown device list strategy {self._strategy(name)!r}; "
                    f"expected one of {', '.join(nodeconfig.DEVICE_LIST_STRATEGIES)}."
                )
        self._check_feature_gates()
        self.kubelet_cmds: dict[str, list[str]] = {}
        self.state: dict[str, Any] = {}
        self.processes: dict[str, subprocess.Popen] = {}
        self.started_in: dict[str, float] = {}

    def _check_feature_gates(self) -> None:
        """Refuse, before anything starts, a feature gate the kubelet does not offer."""
        wanted = {
            name: spec.kubelet_feature_gates
            for name, spec in self.specs.items()
            if name in self.names and spec.kubelet_feature_gates
        }
        if not wanted:
            return
        try:
            result = subprocess.run(
                [str(self.binaries.k8s), "kubelet", "--help"],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            raise NodeError(
                f"Cannot ask the kubelet {self.binaries.k8s} for its feature gates: {e}."
            ) from None
        known = nodeconfig.kubelet_feature_gates(result.stdout + result.stderr)
        for name, gates in wanted.items():
            unknown = sorted(set(gates) - set(known))
            if known and unknown:
                raise NodeError(
                    f"Node {name}: the kubelet has no feature gate "
                    f"{', '.join(map(repr, unknown))}; `k8s kubelet --help` lists the "
                    f"{len(known)} it has."
                )

    def __enter__(self) -> RealNodes:
        self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def paths(self, name: str) -> NodePaths:
        return NodePaths(self.root / name)

    def _strategy(self, name: str) -> str:
        strategy = self.device_list_strategy
        return strategy if isinstance(strategy, str) else strategy.get(name, "envvar")

    def gpu_spec(self, name: str) -> NodeSpec | None:
        """The topology entry of a GPU node; None for a CPU-only node."""
        spec = self.specs.get(name)
        return spec if spec is not None and spec.gpus else None

    def api(self) -> KubeApi:
        return self.cp.admin_api()

    def prepare(self) -> None:
        """Claim the machine and make the host-wide part (our link, our chain), recorded.

        Done by :meth:`start` when not done before; with the cluster network it comes
        before the control plane starts, whose API server listens on our link.
        On failure, or when the control plane fails after it, :meth:`stop` undoes it.
        """
        if os.geteuid() != 0:
            raise NodeError("Real nodes need root (mount namespaces, cgroups, bridges).")
        if read_state(self.state_dir):
            raise NodeError(
                f"Real nodes recorded in {self.state_dir} may still run; "
                "stop them first (gpuspawner-sandbox down)."
            )
        try:
            machineclaim.claim(
                self.state_dir,
                lambda state_dir: read_state(state_dir) is not None,
                wait=self.machine_wait,
                emit=self.emit,
            )
        except machineclaim.MachineBusy as e:
            raise NodeError(str(e)) from None
        try:
            self._begin()
        except BaseException:
            self.stop()
            raise

    @suitecosts.recorded(suitecosts.REAL_NODES, lambda self, *a, **k: ", ".join(self.names))
    def start(self, timeout: float = 180) -> None:
        """Start every node and wait until all are Ready; on failure undo everything."""
        if not self.state:
            self.prepare()
        deadline = time.monotonic() + timeout
        try:
            seed = self._image_seed()
            began = {}
            for index, name in enumerate(self.names):
                began[name] = time.monotonic()
                self._start_node(name, index, seed, deadline)
            # Nodes register in parallel; each one's time is its own start to
            # its Ready (a GPU node's: to its labels and GPUs in allocatable).
            labelled: set[str] = set()
            while len(self.started_in) < len(self.names):
                for name in self.names:
                    if name in self.started_in:
                        continue
                    self._check(name, deadline, "the node to be Ready with its GPUs")
                    if not self.node_ready(name):
                        continue
                    if self.gpu_spec(name) and name not in labelled:
                        self._label(name)
                        labelled.add(name)
                    if self.gpus_advertised(name):
                        self.started_in[name] = time.monotonic() - began[name]
                time.sleep(0.2)
            if self.cluster_network:
                self._start_cluster_services(deadline)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop every node, delete its Node object, restore the host (see :func:`teardown`).

        When the control plane's API server listens on our link (the cluster
        network's API address) it stops first: once the link is gone a client still
        asking that address would send its packets out of the host's default route.
        (A loopback control plane outlives the nodes, and their Node objects go.)
        """
        if self.cluster_network and _on_our_link(self.cp.api_address):
            self.cp.stop()
        teardown(self.state_dir)
        if not _on_our_link(self.cp.api_address):
            # The control plane outlives the nodes (tests, `down` of nodes
            # only): a stopped node's object would only hold pods bound to it.
            for name in self.names:
                with contextlib.suppress(Exception):
                    self.api().delete(f"/api/v1/nodes/{name}")
        for proc in self.processes.values():
            with contextlib.suppress(Exception):
                proc.wait(timeout=1)
        self.processes.clear()

    # -- the record, host-wide part --------------------------------------------

    def _save(self) -> None:
        _write_state(self.state_dir, self.state)

    def _begin(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.state = {
            "root": str(self.root),
            # Recorded before anything of ours runs, put back by teardown.
            "sysctls": {
                n: read_sysctl(n)
                for n in (*nodeconfig.KUBELET_SYSCTLS, *nodeconfig.NETWORK_SYSCTLS)
            },
            "iptables": {tool: _chains(tool) for tool in ("iptables", "ip6tables")},
            "created_dirs": [],
            "chain": False,
            "host_chain": False,
            "hub_link": None,
            "nodes": {},
            CLUSTER: {"root": str(self.paths(CLUSTER).root), "pids": {}},
        }
        self._save()
        if self.cluster_network:
            self._add_host_chain()
            self._add_hub_link()
        for host_dir in nodeconfig.PRIVATE_HOST_DIRS:
            if not os.path.lexists(host_dir):
                # Mount points must exist; remember to remove them again.
                created = _makedirs(Path(host_dir))
                self.state["created_dirs"] += [str(p) for p in created]
                self._save()
        self._add_forward_chain()

    def _add_hub_link(self) -> None:
        link = nodeconfig.HUB_LINK
        if _run(["ip", "link", "show", link], check=False).returncode == 0:
            raise NodeError(
                f"The interface {link} exists already: real nodes of another sandbox run, "
                "or were not stopped (gpuspawner-sandbox down)."
            )
        self.state["hub_link"] = link
        self._save()
        # A bridge without ports: the kernel here has no dummy interfaces.
        _run(["ip", "link", "add", link, "type", "bridge"])
        for address in (nodeconfig.HUB_ADDRESS, nodeconfig.API_ADDRESS, nodeconfig.DNS_ADDRESS):
            _run(["ip", "addr", "add", f"{address}/32", "dev", link])
        _run(["ip", "link", "set", link, "up"])
        # kube-proxy rewrites a Service's address before routing; the route lets
        # the host's own connections get that far (the link has no ports, so an
        # address no Service holds goes nowhere).
        _run(["ip", "route", "add", str(nodeconfig.SERVICE_CIDR), "dev", link])

    def _preexec(self) -> Callable[[], None] | None:
        """What a process we start runs first: dying with us, where that is wanted."""
        return dying_with_us(self.die_with_parent)

    def _say(self, line: str) -> None:
        (self.emit or (lambda text: print(text, file=sys.stderr, flush=True)))(line)

    def _image_seed(self) -> Path:
        """The containerd root every node starts from: our images and the extra archives."""
        try:
            return imageseed.ensure_seed(
                [*self._write_images(), *self.images],
                self.binaries.containerd_dir,
                preexec=self._preexec(),
                emit=self._say,
            )
        except (imageseed.SeedError, OSError) as e:
            raise NodeError(f"The nodes' images could not be prepared: {e}") from None

    def _add_host_chain(self) -> None:
        self._add_chain("host_chain", nodeconfig.HOST_CHAIN, "OUTPUT", nodeconfig.host_output_rules)

    def _add_forward_chain(self) -> None:
        self._add_chain("chain", nodeconfig.FORWARD_CHAIN, "FORWARD", nodeconfig.forward_rules)

    def _add_chain(
        self, key: str, chain: str, hook: str, rules: Callable[[str], list[list[str]]]
    ) -> None:
        """A chain of ours in the filter table, jumped to first from ``hook``; recorded first."""
        if _run(["iptables", "-n", "-L", chain], check=False).returncode == 0:
            raise NodeError(
                f"The iptables chain {chain} exists already: real nodes of another sandbox "
                "run, or were not stopped (gpuspawner-sandbox down)."
            )
        self.state[key] = True
        self._save()
        _run(["iptables", "-N", chain])
        for rule in rules(chain):
            _run(["iptables", *rule])
        _run(["iptables", "-I", hook, "1", "-j", chain])

    def _write_images(self) -> list[Path]:
        images = self.root / "images"
        images.mkdir(parents=True, exist_ok=True)
        arch = go_arch()
        programs = self.binaries.images_dir
        specs = [
            pause_spec(nodeconfig.PAUSE_IMAGE, programs, arch),
            ociimage.ImageSpec(
                ref=nodeconfig.TOOL_IMAGE,
                files={"tool": ((programs / "tool").read_bytes(), 0o755)},
                entrypoint=["/tool"],
                cmd=["sleep", "infinity"],
                architecture=arch,
            ),
            ociimage.ImageSpec(
                ref=nodeconfig.CUDA_TOOL_IMAGE,
                files={"tool": ((programs / "tool").read_bytes(), 0o755)},
                entrypoint=["/tool"],
                cmd=["sleep", "infinity"],
                env=("PATH=/", *nodeconfig.CUDA_IMAGE_ENV),
                architecture=arch,
            ),
        ]
        paths = []
        for spec in specs:
            path = images / (spec.ref.rsplit("/", 1)[-1].replace(":", "-") + ".tar")
            path.write_bytes(ociimage.image_archive(spec))
            paths.append(path)
        return paths

    # -- one node ----------------------------------------------------------------

    def _start_node(self, name: str, index: int, seed: Path, deadline: float) -> None:
        paths, net = self.paths(name), NodeNetwork(index)
        rec: dict[str, Any] = {
            "index": index,
            "root": str(paths.root),
            "bridge": None,
            "cgroups": [],
            "pids": {},
            "mntns": None,
            # The shim's path tells our shims from strangers' if the holder is gone.
            "shim": str(self.binaries.containerd_dir / "containerd-shim-runc-v2"),
        }
        self.state["nodes"][name] = rec
        self._save()
        self._write_files(name, paths, net)
        began = time.monotonic()
        try:
            imageseed.populate(seed, paths.containerd_root)
        except (imageseed.SeedError, OSError) as e:
            raise NodeError(f"Node {name} could not get its images from {seed}: {e}") from None
        self._say(
            f"  {name}: images in place in {time.monotonic() - began:.1f}s (from {seed.parent.name})"
        )

        for mount in cgroup_mounts():
            top = mount / nodeconfig.cgroup_root(name).strip("/")
            if top.exists():
                raise NodeError(
                    f"The cgroup {top} exists already: a node named {name} runs or was not "
                    "stopped (gpuspawner-sandbox down)."
                )
            rec["cgroups"].append(str(top))
            self._save()
            top.mkdir()
            # A new cpuset cgroup has no CPUs or memory nodes until given its parent's.
            for knob in ("cpuset.cpus", "cpuset.mems"):
                if (mount / knob).exists():
                    (top / knob).write_text((mount / knob).read_text())

        if _run(["ip", "link", "show", net.bridge], check=False).returncode == 0:
            raise NodeError(
                f"The bridge {net.bridge} exists already: real nodes of another sandbox run, "
                "or were not stopped (gpuspawner-sandbox down)."
            )
        rec["bridge"] = net.bridge
        self._save()
        _run(["ip", "link", "add", net.bridge, "type", "bridge"])
        _run(["ip", "addr", "add", net.bridge_cidr, "dev", net.bridge])
        if self.cluster_network:
            # Pods' packets arriving here may be forwarded (to another node's bridge,
            # or to a Service's pod): this bridge alone, the host's ip_forward stays
            # as it is, and the setting goes with the bridge. Our chain drops
            # anything bound elsewhere.
            sysctl_path(f"net.ipv4.conf.{net.bridge}.forwarding").write_text("1\n")
        _run(["ip", "link", "set", net.bridge, "up"])

        holder = self._spawn(
            name,
            "holder",
            [
                "unshare",
                "--mount",
                "--propagation",
                "slave",
                "sh",
                "-c",
                nodeconfig.mount_script(paths),
            ],
        )
        self._wait(name, deadline, "its mount namespace", paths.ready_file.exists)
        rec["mntns"] = _mntns(holder.pid)
        self._save()

        enter = ["nsenter", f"--mount=/proc/{holder.pid}/ns/mnt", "--"]
        self._spawn(
            name,
            "containerd",
            [*enter, str(self.binaries.containerd), "--config", str(paths.containerd_config)],
            # Its shims, and through them NVIDIA's runtime, inherit it.
            env={nodeconfig.NVIDIA_CONFIG_ENV: str(paths.nvidia_runtime_config)}
            if self.gpu_spec(name)
            else None,
        )
        ctr = [*enter, str(self.binaries.ctr), "--address", str(paths.containerd_socket)]
        self._wait(
            name,
            deadline,
            "containerd",
            lambda: _run([*ctr, "version"], check=False).returncode == 0,
        )

        spec = self.gpu_spec(name)
        taints = [*self.taints, *(nodeconfig.gpu_taints(spec) if spec else [])]
        self.kubelet_cmds[name] = [
            *enter,
            str(self.binaries.k8s),
            "kubelet",
            *nodeconfig.kubelet_args(
                paths,
                net,
                node=name,
                taints=taints,
                labels=self.specs[name].labels if name in self.specs else None,
            ),
        ]
        self._spawn(name, "kubelet", self.kubelet_cmds[name])
        if spec:
            # Beside the kubelet, in its mount namespace: the kubelet's
            # device-plugins directory there is the node's own.
            plugin_args = nodeconfig.device_plugin_args(paths, spec, self._strategy(name))
            self._spawn(
                name,
                "device-plugin",
                [*enter, str(self.binaries.k8s), "device-plugin", *plugin_args],
            )
            # On the node IP (our bridge's address) only, as a node's exporter
            # serves on the node; Prometheus scrapes the recorded address.
            rec["dcgm_exporter"] = f"{net.node_ip}:{free_port(net.node_ip)}"
            self._save()
            self._spawn(
                name,
                "dcgm-exporter",
                [
                    *enter,
                    str(self.binaries.dcgm_exporter),
                    *nodeconfig.dcgm_exporter_args(paths, rec["dcgm_exporter"]),
                ],
            )

    def _write_files(self, name: str, paths: NodePaths, net: NodeNetwork) -> None:
        for d in (
            paths.containerd_root,
            paths.containerd_state,
            paths.runc_root,
            paths.cni_conf_dir,
            paths.cni_data_dir,
            paths.cert_dir,
            paths.pod_logs,
            paths.volume_plugins,
            paths.logs,
            paths.registry_hosts / "_default",
            *(paths.private_dir(h) for h in nodeconfig.PRIVATE_HOST_DIRS),
        ):
            d.mkdir(parents=True, exist_ok=True)
        spec = self.gpu_spec(name)
        paths.containerd_config.write_text(
            nodeconfig.containerd_config(
                paths,
                self.binaries.runc,
                self.binaries.cni_dir,
                nvidia_runtime=self.binaries.nvidia_runtime if spec else None,
            )
        )
        (paths.registry_hosts / "_default" / "hosts.toml").write_text(
            nodeconfig.registry_hosts_toml()
        )
        (paths.cni_conf_dir / "10-gpuspawner.conflist").write_text(
            json.dumps(nodeconfig.cni_conflist(net, paths.cni_data_dir), indent=2) + "\n"
        )
        paths.resolv_conf.write_text(nodeconfig.resolv_conf())
        paths.cdi_dir.mkdir(parents=True, exist_ok=True)
        if spec:
            paths.driver.bin_dir.mkdir(parents=True, exist_ok=True)
            shutil.copy2(self.binaries.nvidia_smi, paths.driver.nvidia_smi)
            state = gpudriver.driver_state(spec)
            gpudriver.write_driver_state(paths.driver_state, state)
            self._write_runtime_files(paths, spec, state)
        topology = self.specs.get(name)
        reserved: dict[str, str] = {}
        if topology is not None:
            reserved, short = nodeconfig.capacity_reservation(topology, *_machine_capacity())
            for line in short:
                self._say(f"  {line}")
        config = nodeconfig.kubelet_configuration(
            paths,
            net,
            node=name,
            client_ca=self.cp.ca_file,
            healthz_port=free_port(),
            cluster_dns=nodeconfig.DNS_ADDRESS if self.cluster_network else None,
            max_pods=topology.pods if topology is not None else 110,
            system_reserved=reserved,
            sync_frequency=topology.sync_frequency if topology is not None else None,
            node_status_update_frequency=(
                topology.node_status_update_frequency
                if topology is not None
                else NODE_STATUS_UPDATE_FREQUENCY
            ),
            feature_gates=topology.kubelet_feature_gates if topology is not None else None,
        )
        paths.kubelet_config.write_text(yaml.safe_dump(config, sort_keys=False))
        kubeconfig = self.cp.client_kubeconfig(
            f"system:node:{name}", ["system:nodes"], name=f"node-{name}"
        )
        paths.kubeconfig.write_bytes(kubeconfig.read_bytes())
        paths.kubeconfig.chmod(0o600)

    def _write_runtime_files(self, paths: NodePaths, spec: NodeSpec, state: dict[str, Any]) -> None:
        """A GPU node's driver device files, CDI spec and NVIDIA runtime config."""
        driver = paths.driver
        for node in cdi.device_nodes(state):
            path = driver.dev_dir / node.name
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.mknod(
                    path, stat.S_IFCHR | cdi.DEVICE_FILE_MODE, os.makedev(node.major, node.minor)
                )
            except OSError as e:
                raise NodeError(
                    f"Cannot make the emulated driver's device file {path} ({e.strerror}): "
                    "GPU nodes need root with CAP_MKNOD on a file system that allows device "
                    "files."
                ) from None
            # mknod honours the umask; the files are crw-rw-rw- as on real nodes.
            path.chmod(cdi.DEVICE_FILE_MODE)
        (paths.cdi_dir / cdi.CDI_SPEC_FILE).write_text(
            json.dumps(cdi.cdi_spec(state, driver), indent=2) + "\n"
        )
        paths.nvidia_runtime_config.parent.mkdir(parents=True, exist_ok=True)
        paths.nvidia_runtime_config.write_text(
            nodeconfig.nvidia_runtime_config(
                paths,
                self.binaries.runc,
                self.binaries.nvidia_ctk,
                cdi.CDI_KIND,
                accept_envvar_unprivileged=spec.accept_envvar_unprivileged,
            )
        )

    def _spawn(
        self,
        name: str,
        component: str,
        cmd: list[str],
        env: Mapping[str, str] | None = None,
    ) -> subprocess.Popen:
        log_path = self.paths(name).logs / f"{component}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        env = nodeconfig.component_env({**os.environ, **(env or {})}, self.binaries.containerd_dir)
        with log_path.open("ab") as log:
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=self._preexec(),
                env=env,
            )
        self.processes[f"{name}/{component}"] = proc
        record = self.state[CLUSTER] if name == CLUSTER else self.state["nodes"][name]
        record["pids"][component] = proc.pid
        self._save()
        return proc

    # -- the cluster network's machine-wide part --------------------------------

    def _start_cluster_services(self, deadline: float) -> None:
        """kube-proxy and CoreDNS, once for the machine, and our forward chain first again."""
        paths = self.paths(CLUSTER)
        paths.root.mkdir(parents=True, exist_ok=True)
        self._say("  cluster network: starting kube-proxy and CoreDNS…")
        began = time.monotonic()
        proxy_config = paths.root / "kube-proxy.yaml"
        # The identity kube-proxy has everywhere: the default ClusterRoleBinding
        # system:node-proxier grants the user system:kube-proxy what it reads.
        kubeconfig = self.cp.client_kubeconfig("system:kube-proxy", [], name="kube-proxy")
        metrics = free_port()
        proxy_config.write_text(
            yaml.safe_dump(
                nodeconfig.kube_proxy_configuration(
                    kubeconfig, node=self.names[0], healthz_port=free_port(), metrics_port=metrics
                ),
                sort_keys=False,
            )
        )
        self._spawn(
            CLUSTER,
            "kube-proxy",
            [str(self.binaries.k8s), "kube-proxy", f"--config={proxy_config}"],
        )

        self.cp.apply_manifests(clusterdns.RBAC_MANIFEST)
        self.cp.wait_for_service_account(clusterdns.NAMESPACE, clusterdns.SERVICE_ACCOUNT)
        dns_kubeconfig = self.cp.service_account_kubeconfig(
            clusterdns.NAMESPACE, clusterdns.SERVICE_ACCOUNT
        )
        ip = nodeconfig.DNS_ADDRESS
        address = clusterdns.DNSAddress(ip, 53, free_port(ip), free_port(ip))
        corefile = paths.root / "Corefile"
        corefile.write_text(clusterdns.corefile(address, dns_kubeconfig))
        self._spawn(CLUSTER, "coredns", [str(self.binaries.coredns), "-conf", str(corefile)])

        def proxy_synced() -> bool:
            try:
                with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(
                    f"http://127.0.0.1:{metrics}/metrics", timeout=2
                ) as response:
                    return nodeconfig.kube_proxy_synced(response.read().decode())
            except OSError:
                return False

        # Its health says ok before its first sync, which puts its jumps in FORWARD.
        self._wait(CLUSTER, deadline, "kube-proxy's first sync", proxy_synced)
        self._wait(CLUSTER, deadline, "CoreDNS", lambda: clusterdns.ready(address))
        # kube-proxy puts its KUBE-FORWARD (which accepts established flows) before
        # everything in FORWARD; ours drops what would leave the pod range, first.
        chain = nodeconfig.FORWARD_CHAIN
        _run(["iptables", "-D", "FORWARD", "-j", chain])
        _run(["iptables", "-I", "FORWARD", "1", "-j", chain])
        self._say(f"  cluster network: ready in {time.monotonic() - began:.1f}s")

    def _wait(self, name: str, deadline: float, what: str, check) -> None:
        while not check():
            self._check(name, deadline, what)
            time.sleep(0.2)

    def _check(self, name: str, deadline: float, what: str) -> None:
        """Fail at once if a process of the node exited, or when time is up."""
        for key, proc in self.processes.items():
            if key.startswith(f"{name}/") and proc.poll() is not None:
                component = key.split("/", 1)[1]
                log_path = self.paths(name).logs / f"{component}.log"
                whose = "the cluster network" if name == CLUSTER else f"node {name}"
                raise NodeError(
                    f"{component} of {whose} exited with code {proc.returncode} "
                    f"while waiting for {what}; last lines of {log_path}:\n{log_tail(log_path)}"
                )
        if time.monotonic() > deadline:
            component = "kube-proxy" if name == CLUSTER else "kubelet"
            log_path = self.paths(name).logs / f"{component}.log"
            whose = "The cluster network" if name == CLUSTER else f"Node {name}"
            raise NodeError(
                f"{whose}: {what} not ready in time; last lines of {log_path}:\n"
                f"{log_tail(log_path)}"
            )

    def node_ready(self, name: str) -> bool:
        try:
            node = self.api().get(f"/api/v1/nodes/{name}")
        except (ApiError, OSError):
            return False
        return any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in node.get("status", {}).get("conditions", [])
        )

    def _label(self, name: str) -> None:
        """Label a GPU node as GPU feature discovery does, with the node's own credentials."""
        spec = self.gpu_spec(name)
        assert spec is not None
        api = KubeApi.from_kubeconfig(self.paths(name).kubeconfig)
        try:
            api.request(
                "PATCH",
                f"/api/v1/nodes/{name}",
                {"metadata": {"labels": nodeconfig.gpu_feature_labels(spec)}},
                content_type="application/merge-patch+json",
            )
        except ApiError as e:
            raise NodeError(
                f"Node {name} could not label itself with its GPUs' features: {e}"
            ) from None

    def gpus_advertised(self, name: str) -> bool:
        """Whether the node's allocatable shows every GPU resource its topology entry has."""
        spec = self.gpu_spec(name)
        if spec is None:
            return True
        try:
            allocatable = self.api().get(f"/api/v1/nodes/{name}")["status"].get("allocatable", {})
        except (ApiError, OSError, KeyError):
            return False
        return all(allocatable.get(res) == str(n) for res, n in extended_resources(spec).items())

    def restart_kubelet(self, name: str) -> None:
        """Stop the node's kubelet and start it again with the same flags (pods keep running)."""
        rec = self.state["nodes"][name]
        _stop_pid(rec["pids"]["kubelet"], rec["root"])
        old = self.processes.pop(f"{name}/kubelet", None)
        if old is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                old.wait(timeout=5)
        self._spawn(name, "kubelet", self.kubelet_cmds[name])

    def dcgm_exporter(self, name: str) -> str | None:
        """``IP:PORT`` of a GPU node's emulated DCGM exporter (its /metrics); None otherwise."""
        return self.state["nodes"][name].get("dcgm_exporter")

    def in_node(
        self, name: str, argv: Sequence[str], timeout: float = 30
    ) -> subprocess.CompletedProcess:
        """Run a program in the node's mount namespace (its containerd and kubelet sockets)."""
        holder = self.state["nodes"][name]["pids"]["holder"]
        return subprocess.run(
            ["nsenter", f"--mount=/proc/{holder}/ns/mnt", "--", *argv],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def pod_resources(self, name: str) -> list[dict[str, Any]]:
        """What the node's kubelet says each container holds, from its PodResources API.

        Asked as the DCGM exporter asks (``dcgm-exporter --list-pod-resources``, in the
        node's mount namespace): one entry per container and resource, with its device IDs.
        """
        result = self.in_node(
            name,
            [
                str(self.binaries.dcgm_exporter),
                "--list-pod-resources",
                f"--pod-resources-socket={nodeconfig.POD_RESOURCES_SOCKET}",
            ],
        )
        if result.returncode != 0:
            raise NodeError(
                f"The kubelet of node {name} did not answer its PodResources API: "
                f"{result.stderr.strip()[-500:]}"
            )
        return json.loads(result.stdout)

    def node_ip(self, name: str) -> str:
        return NodeNetwork(self.names.index(name)).node_ip

    def forward_drops(self) -> int:
        """Packets our forward rule dropped (pods reaching outside the pod ranges)."""
        return forward_drops()

    def host_drops(self) -> int:
        """The host's own packets to the pod range our OUTPUT rule dropped (cluster network)."""
        return forward_drops(nodeconfig.HOST_CHAIN, target="DROP")


def forward_drops(chain: str = nodeconfig.FORWARD_CHAIN, target: str | None = None) -> int:
    """The sum of the packet counters of a chain of ours (of its ``target`` rules only)."""
    out = _run(["iptables", "-n", "-v", "-x", "-L", chain]).stdout
    total = 0
    for line in out.splitlines()[2:]:
        fields = line.split()
        if fields and fields[0].isdigit() and (target is None or fields[2] == target):
            total += int(fields[0])
    return total


def _machine_capacity() -> tuple[int, int]:
    """This machine's CPUs (millicores) and memory (bytes), as the kubelet counts them."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            memory = int(line.split()[1]) * 1024
            break
    else:
        raise NodeError("Cannot read this machine's memory from /proc/meminfo.")
    return (os.cpu_count() or 1) * 1000, memory


def _makedirs(path: Path) -> list[Path]:
    """mkdir -p, returning the directories it created (outermost first)."""
    created = []
    for parent in reversed([path, *path.parents]):
        if not parent.exists():
            parent.mkdir()
            created.append(parent)
    return created


def _chains(tool: str) -> dict[str, list[str]]:
    """Table -> chain names, from ``<tool>-save``."""
    out = subprocess.run([f"{tool}-save"], capture_output=True, text=True, timeout=30).stdout
    tables: dict[str, list[str]] = {}
    table = None
    for line in out.splitlines():
        if line.startswith("*"):
            table = line[1:]
            tables[table] = []
        elif line.startswith(":") and table is not None:
            tables[table].append(line[1:].split()[0])
    return tables


# -- stopping and restoring ------------------------------------------------------------


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def _stop_pid(pid: int, marker: str, grace: float = STOP_GRACE) -> None:
    """SIGTERM a recorded process if it is still ours, SIGKILL after the grace period."""
    if not _is_ours(pid, marker):
        return
    _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if alive(pid):
        _signal(pid, signal.SIGKILL)
        _wait_gone([pid])


def _is_ours(pid: int, marker: str) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return marker.encode() in cmdline and alive(pid)


def _wait_gone(pids: Iterable[int], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)


def _cgroup_pids(tops: Iterable[str]) -> set[int]:
    pids = set()
    for top in tops:
        for directory, _, _ in os.walk(top):
            with contextlib.suppress(OSError):
                pids.update(int(p) for p in Path(directory, "cgroup.procs").read_text().split())
    return pids


def _namespace_pids(mntns: str, only: tuple[str, ...] | None = None) -> set[int]:
    """Processes in a mount namespace; with ``only``, just those running one of those files."""
    pids = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and _mntns(int(entry.name)) == mntns:
            if only is not None:
                try:
                    if os.readlink(entry / "exe") not in only:
                        continue
                except OSError:
                    continue
            pids.add(int(entry.name))
    return pids


def _kill_until_empty(find, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while (pids := {p for p in find() if alive(p)}) and time.monotonic() < deadline:
        for pid in pids:
            _signal(pid, signal.SIGKILL)
        time.sleep(0.1)


def _remove_cgroup(top: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while True:
        for directory, _, _ in sorted(os.walk(top), key=lambda w: -len(w[0])):
            with contextlib.suppress(OSError):
                os.rmdir(directory)
        if not os.path.isdir(top):
            return
        if time.monotonic() > deadline:
            raise NodeError(f"Cannot remove the cgroup {top}: processes still in it.")
        time.sleep(0.1)


def _teardown_node(name: str, rec: dict[str, Any]) -> None:
    marker = rec["root"]
    pids = rec.get("pids", {})
    # The kubelet first, so it restarts nothing; then the pods' processes
    # (in the node's cgroups), then containerd, then whatever is left in the
    # node's mount namespace (shims, the namespace holder). With the last of
    # them the namespace goes, and with it every mount and pod network
    # namespace inside it.
    for component in ("dcgm-exporter", "device-plugin"):
        if component in pids:
            _stop_pid(pids[component], marker)
    if "kubelet" in pids:
        _stop_pid(pids["kubelet"], marker)
    _kill_until_empty(lambda: _cgroup_pids(rec.get("cgroups", [])))
    if "containerd" in pids:
        _stop_pid(pids["containerd"], marker)
    if rec.get("mntns"):
        # While the holder lives the namespace is certainly the node's; once
        # it is gone the kernel may reuse the number for someone else's, so
        # then only our own shims are killed there.
        holder = pids.get("holder")
        only = None if holder and _is_ours(holder, marker) else (rec.get("shim", ""),)
        _kill_until_empty(lambda: _namespace_pids(rec["mntns"], only))
    if "holder" in pids:
        _stop_pid(pids["holder"], marker, grace=1)
    for top in rec.get("cgroups", []):
        _remove_cgroup(top)
    bridge = rec.get("bridge")
    if bridge and _run(["ip", "link", "show", bridge], check=False).returncode == 0:
        # Pod veths go with their network namespaces; any left behind go now.
        listed = _run(["ip", "-o", "link", "show", "master", bridge], check=False).stdout
        for line in listed.splitlines():
            veth = line.split(":", 2)[1].strip().split("@", 1)[0]
            _run(["ip", "link", "del", veth], check=False)
        _run(["ip", "link", "del", bridge])


def _on_our_link(address: str) -> bool:
    """Whether an address is one of the host's on our link (it goes with the nodes)."""
    return ipaddress.ip_address(address) in nodeconfig.HOST_SERVICES_SUBNET


def _remove_chain(chain: str, hook: str) -> None:
    """Remove a chain of ours and every jump to it from ``hook``."""
    while _run(["iptables", "-D", hook, "-j", chain], check=False).returncode == 0:
        pass
    _run(["iptables", "-F", chain], check=False)
    _run(["iptables", "-X", chain], check=False)


def _restore_iptables(before: dict[str, dict[str, list[str]]]) -> None:
    """Remove the kubelet's chains (and the rules jumping to them) that were not there before."""
    for tool, tables in before.items():
        now = _chains(tool)
        for table, chains in now.items():
            new = [
                c
                for c in chains
                if c.startswith(KUBELET_CHAIN_PREFIX) and c not in tables.get(table, [])
            ]
            if not new:
                continue
            saved = subprocess.run(
                [f"{tool}-save", "-t", table], capture_output=True, text=True, timeout=30
            ).stdout
            for line in saved.splitlines():
                if not line.startswith("-A "):
                    continue
                args = shlex.split(line)
                target = args[args.index("-j") + 1] if "-j" in args else None
                if args[1] not in new and target in new:
                    _run([tool, "-t", table, "-D", *args[1:]], check=False)
            for chain in new:
                _run([tool, "-t", table, "-F", chain], check=False)
            for chain in new:
                _run([tool, "-t", table, "-X", chain], check=False)


def teardown(state_dir: Path) -> list[str]:
    """Stop the real nodes recorded in state_dir and restore the host; returns their names.

    Safe to call more than once and after a partial start: it undoes what the
    record says was done, in reverse.
    """
    state_dir = Path(state_dir).resolve()
    state = read_state(state_dir)
    if not state:
        # Nothing ran (a start refused or failed before its record): give the machine back.
        machineclaim.release(state_dir)
        return []
    names = list(state.get("nodes", {}))
    problems = []
    cluster = state.get(CLUSTER, {})
    for pid in cluster.get("pids", {}).values():
        _stop_pid(pid, cluster["root"])
    for name in reversed(names):
        try:
            _teardown_node(name, state["nodes"][name])
        except NodeError as e:
            # Undo everything else anyway; the record stays for another try.
            problems.append(f"node {name}: {e}")
    if state.get("chain"):
        _remove_chain(nodeconfig.FORWARD_CHAIN, "FORWARD")
    _restore_iptables(state.get("iptables", {}))
    link = state.get("hub_link")
    recorded = read_control_plane(state_dir)
    if link and recorded and _on_our_link(urllib.parse.urlsplit(recorded["api_url"]).hostname):
        # The control plane of this state directory listens on the link: stopped
        # before it goes, so that nothing asks its address once it has no route.
        stop_recorded(state_dir)
    if link and _run(["ip", "link", "show", link], check=False).returncode == 0:
        _run(["ip", "link", "del", link], check=False)
    if state.get("host_chain"):
        # Last of the network: it guards the host's packets until the link is gone.
        _remove_chain(nodeconfig.HOST_CHAIN, "OUTPUT")
    for name, value in state.get("sysctls", {}).items():
        # Only what the kubelet changes: the networking ones are recorded to
        # prove we leave them alone, and others on the machine may change them.
        if name not in nodeconfig.KUBELET_SYSCTLS:
            continue
        if value is not None and read_sysctl(name) != value:
            sysctl_path(name).write_text(value + "\n")
    for created in reversed(state.get("created_dirs", [])):
        with contextlib.suppress(OSError):
            os.rmdir(created)
    if problems:
        raise NodeError(
            "Real nodes were stopped, but the host is not fully restored ("
            + "; ".join(problems)
            + "); run `gpuspawner-sandbox down` again once that is resolved."
        )
    root = Path(state["root"])
    if root.is_dir() and not _has_mounts(root):
        shutil.rmtree(root, ignore_errors=True)
    (state_dir / STATE_FILE).unlink(missing_ok=True)
    # Last: while anything of these nodes is left, the machine stays theirs.
    machineclaim.release(state_dir)
    return names


def _has_mounts(path: Path) -> bool:
    prefix = str(path).rstrip("/") + "/"
    return any(
        line.split(" ")[4].startswith(prefix)
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
    )


def status(state_dir: Path) -> dict[str, dict[str, bool]]:
    """Node -> component -> alive, for the nodes recorded in state_dir."""
    state = read_state(Path(state_dir).resolve())
    if not state:
        return {}
    return {
        name: {c: _is_ours(pid, rec["root"]) for c, pid in rec.get("pids", {}).items()}
        for name, rec in state.get("nodes", {}).items()
    }
