"""Real nodes: the real kubelet, containerd, runc and CNI under the real control plane.

One pair of nodes serves the module; its last test stops them and checks
that the host is exactly as before they started (so the fixture is
module-scoped: nothing may use the nodes after that test).
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import ipaddress
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import NameOID

from gpuspawner_sandbox import hoststate, machineclaim, nodebuild, nodeconfig, nodes, testing
from gpuspawner_sandbox.kubeapi import ApiError
from gpuspawner_sandbox.topology import memory_bytes, parse_topology

NODES = ("real-0", "real-1")
#: The nodes share the session's control plane with other tests (test_controlplane's
#: pods among them); the taint keeps every other test's pods off them.
TAINT_KEY = "gpuspawner.test/real-node"
TOLERATION = [{"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}]
FAILED_CHECK = "GPU 0: fallen off the bus (nvidia-smi exit 15)"
#: real-1's topology entry: less than the machine has, a few pods, a label of ours.
SMALL_NODE = {
    "name": "real-1",
    "cpu": "1",
    "memory": "3Gi",
    "pods": 20,
    "labels": {"example.org/pool": "small"},
}


@dataclass
class Running:
    nodes: nodes.RealNodes
    before: dict[str, Any]
    roots: list[str]


# This module's waits: the shared poller with its own default timeout.
wait_for = functools.partial(testing.wait_for, timeout=120, interval=0.3)


@pytest.fixture(scope="module")
def real_nodes(pytestconfig, control_plane, tmp_path_factory):
    testing.node_binaries(pytestconfig)  # build (with progress) before the snapshot
    state_dir = tmp_path_factory.mktemp("real-nodes")
    roots = [nodeconfig.cgroup_root(n) for n in NODES]
    before = hoststate.snapshot(state_dir / "nodes", roots)
    taints = (f"{TAINT_KEY}=true:NoSchedule",)
    specs = {"real-1": parse_topology({"nodes": [SMALL_NODE]}).node("real-1")}
    with testing.running_real_nodes(
        state_dir, control_plane, list(NODES), pytestconfig, taints=taints, specs=specs
    ) as running:
        yield Running(running, before, roots)


def _pod(name: str, node: str, containers: list[dict], **spec: Any) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": TOLERATION,
            "terminationGracePeriodSeconds": 2,
            "containers": containers,
            **spec,
        },
    }


def _container(name: str, *args: str, **extra: Any) -> dict:
    return {
        "name": name,
        "image": nodeconfig.TOOL_IMAGE,
        "imagePullPolicy": "Never",
        "args": list(args),
        **extra,
    }


def _get_pod(api, namespace: str, name: str) -> dict:
    return api.get(f"/api/v1/namespaces/{namespace}/pods/{name}")


def _get_or_none(api, path: str) -> dict | None:
    try:
        return api.get(path)
    except ApiError as e:
        if e.status == 404:
            return None
        raise


def _ready(pod: dict) -> bool:
    return any(
        c["type"] == "Ready" and c["status"] == "True"
        for c in pod.get("status", {}).get("conditions", [])
    )


def _fetch(url: str) -> str:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=5) as resp:
        return resp.read().decode()


def test_nodes_register_ready_with_node_identities(real_nodes, control_plane):
    api = control_plane.admin_api()
    for index, name in enumerate(NODES):
        node = api.get(f"/api/v1/nodes/{name}")
        info = node["status"]["nodeInfo"]
        assert info["kubeletVersion"] == "v1.37.2"
        assert info["containerRuntimeVersion"].startswith("containerd://")
        assert "2.4.2" in info["containerRuntimeVersion"]
        addresses = {a["type"]: a["address"] for a in node["status"]["addresses"]}
        assert addresses["InternalIP"] == nodeconfig.NodeNetwork(index).node_ip
        assert {"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"} in node["spec"]["taints"]
        assert real_nodes.nodes.node_ready(name)
        # the running kubelet's own configuration, through the API server's node proxy
        running = api.get(f"/api/v1/nodes/{name}/proxy/configz")["kubeletconfig"]
        assert running["nodeStatusUpdateFrequency"] == "1s"
        assert running["nodeStatusReportFrequency"] == "5m0s"

        kubeconfig = yaml.safe_load(real_nodes.nodes.paths(name).kubeconfig.read_text())
        pem = base64.b64decode(kubeconfig["users"][0]["user"]["client-certificate-data"])
        subject = x509.load_pem_x509_certificate(pem).subject
        assert subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == f"system:node:{name}"
        assert [a.value for a in subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)] == [
            "system:nodes"
        ]
        # The Node authorizer ties each kubelet to its own Node: its lease is renewed.
        # Everything a node listens on is loopback or its own bridge address.
        for component in ("kubelet", "containerd"):
            pid = real_nodes.nodes.state["nodes"][name]["pids"][component]
            listening = testing.listening_addresses(pid)
            assert listening, component
            for address, _ in listening:
                ip = ipaddress.ip_address(address)
                assert ip.is_loopback or ip in nodeconfig.POD_RANGE, (component, address)

        lease_path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{name}"
        lease = wait_for(f"{name}'s lease", lambda p=lease_path: _get_or_none(api, p))
        assert lease["spec"]["holderIdentity"] == name


def test_pod_is_a_real_container_in_its_own_namespaces(real_nodes, control_plane, namespace):
    api = control_plane.admin_api()
    limit = 64 * 1024 * 1024
    resources = {"limits": {"memory": "64Mi", "cpu": "100m"}}
    probe = {"httpGet": {"port": 8080, "path": "/"}, "periodSeconds": 1}
    api.post(
        f"/api/v1/namespaces/{namespace}/pods",
        _pod(
            "server",
            NODES[0],
            [_container("tool", "serve", "8080", resources=resources, readinessProbe=probe)],
        ),
    )
    pod = wait_for(
        "the pod to be Ready", lambda: _ready(p := _get_pod(api, namespace, "server")) and p
    )
    pod_ip = pod["status"]["podIP"]
    assert ipaddress.ip_address(pod_ip) in nodeconfig.NodeNetwork(0).subnet
    assert pod["status"]["qosClass"] == "Guaranteed"

    # The host (where the hub runs) reaches the pod on its own IP.
    info = dict(line.split("=", 1) for line in _fetch(f"http://{pod_ip}:8080/").splitlines())
    assert info["hostname"] == "server"
    assert info["pid"] == "1"
    assert info["pid1"] == "/tool serve 8080"
    assert info["memory_limit"] == str(limit)
    # No default route: only the pod's own subnet, and the pod range (where the
    # host's address for pods is) through the node's bridge address.
    net = nodeconfig.NodeNetwork(0)
    assert sorted(info["routes"].split(",")) == sorted(
        [f"{nodeconfig.POD_RANGE} via {net.node_ip}", str(net.subnet)]
    )
    assert all(not r.startswith("0.0.0.0/") for r in info["routes"].split(","))

    container_id = pod["status"]["containerStatuses"][0]["containerID"].split("://", 1)[1]
    cgroup, limit_file = testing.container_memory_cgroup(NODES[0], container_id)
    assert int((cgroup / limit_file).read_text()) == limit
    (host_pid,) = [int(p) for p in (cgroup / "cgroup.procs").read_text().split()]
    assert Path(f"/proc/{host_pid}/cmdline").read_bytes().split(b"\0")[:2] == [b"/tool", b"serve"]
    for ns in ("pid", "mnt", "net", "uts"):
        ours = Path(f"/proc/self/ns/{ns}").readlink()
        assert Path(f"/proc/{host_pid}/ns/{ns}").readlink() != ours, ns


def test_failed_init_container_message_comes_through_the_real_kubelet(
    real_nodes, control_plane, namespace
):
    api = control_plane.admin_api()
    api.post(
        f"/api/v1/namespaces/{namespace}/pods",
        _pod(
            "check",
            NODES[1],
            [_container("main", "sleep", "infinity")],
            initContainers=[_container("gpu-check", "fail", "3", FAILED_CHECK)],
            restartPolicy="Never",
        ),
    )
    pod = wait_for(
        "the pod to fail",
        lambda: (p := _get_pod(api, namespace, "check"))["status"].get("phase") == "Failed" and p,
    )
    (status,) = pod["status"]["initContainerStatuses"]
    terminated = status["state"]["terminated"]
    assert terminated["exitCode"] == 3
    assert terminated["message"] == FAILED_CHECK
    assert terminated["reason"] == "Error"
    # The app container never started.
    (main,) = pod["status"]["containerStatuses"]
    assert "running" not in main["state"]
    # `kubectl logs`: the API server fetches the log from the node's kubelet.
    log = api.request(
        "GET",
        f"/api/v1/namespaces/{namespace}/pods/check/log",
        query={"container": "gpu-check"},
        raw=True,
    ).body
    assert FAILED_CHECK in log
    assert ipaddress.ip_address(pod["status"]["podIP"]) in nodeconfig.NodeNetwork(1).subnet


def test_memory_limit_is_enforced_by_the_runtime(real_nodes, control_plane, namespace):
    api = control_plane.admin_api()
    greedy = _container("greedy", "alloc", "128", resources={"limits": {"memory": "32Mi"}})
    api.post(
        f"/api/v1/namespaces/{namespace}/pods",
        _pod("greedy", NODES[1], [greedy], restartPolicy="Never"),
    )
    pod = wait_for(
        "the pod to fail",
        lambda: (p := _get_pod(api, namespace, "greedy"))["status"].get("phase") == "Failed" and p,
    )
    (status,) = pod["status"]["containerStatuses"]
    assert status["state"]["terminated"]["reason"] == "OOMKilled"
    assert status["state"]["terminated"]["exitCode"] == 137


def test_a_missing_image_fails_at_once_on_loopback(real_nodes, control_plane, namespace):
    api = control_plane.admin_api()
    missing = _container("main", "sleep", "1")
    missing.update(image=f"{nodeconfig.IMAGE_REGISTRY}/missing:v1", imagePullPolicy="IfNotPresent")
    api.post(f"/api/v1/namespaces/{namespace}/pods", _pod("missing", NODES[0], [missing]))

    def pull_failed():
        statuses = _get_pod(api, namespace, "missing")["status"].get("containerStatuses", [])
        waiting = statuses[0]["state"].get("waiting", {}) if statuses else {}
        # (ImagePullBackOff, in between, carries no reason of its own.)
        return waiting if waiting.get("reason") == "ErrImagePull" else None

    waiting = wait_for("the pull to fail", pull_failed)
    # containerd tried the dead loopback registry, nothing else.
    assert nodeconfig.DEAD_REGISTRY.split("//", 1)[1] in waiting["message"], waiting


def test_nothing_was_forwarded_out_of_the_pod_ranges(real_nodes):
    forward = nodes._run(["iptables", "-S", "FORWARD"]).stdout
    assert f"-A FORWARD -j {nodeconfig.FORWARD_CHAIN}" in forward.splitlines()
    assert real_nodes.nodes.forward_drops() == 0


def test_a_second_set_of_real_nodes_is_refused_while_one_runs(
    real_nodes, pytestconfig, control_plane, tmp_path
):
    """The bridges, our chain and the sysctls exist once per machine: one set at a time."""
    held = machineclaim.read_claim()
    assert held is not None and held.state_dir == str(real_nodes.nodes.state_dir)
    roots = [nodeconfig.cgroup_root("second-0")]
    before = hoststate.snapshot(tmp_path / "nodes", roots)
    second = nodes.RealNodes(
        tmp_path, control_plane, testing.node_binaries(pytestconfig), ["second-0"]
    )
    with pytest.raises(nodes.NodeError) as e:
        second.start(timeout=60)
    assert str(e.value) == machineclaim.busy_message(held)
    assert hoststate.differences(before, hoststate.snapshot(tmp_path / "nodes", roots)) == []
    assert nodes.read_state(tmp_path) is None
    # The running set keeps the machine and its nodes.
    assert machineclaim.read_claim() == held
    assert all(all(alive.values()) for alive in nodes.status(real_nodes.nodes.state_dir).values())


def test_a_node_offers_the_topologys_cpu_memory_and_pods_and_carries_its_labels(
    real_nodes, control_plane
):
    status = control_plane.admin_api().get("/api/v1/nodes/real-1")
    allocatable = status["status"]["allocatable"]
    assert allocatable["cpu"] == "1"
    # The topology's 3Gi less the kubelet's 100Mi eviction threshold.
    assert memory_bytes(allocatable["memory"]) == 3 * 2**30 - 100 * 2**20
    assert allocatable["pods"] == "20"
    assert status["metadata"]["labels"]["example.org/pool"] == "small"
    # real-0 has no topology entry: the machine's own figures.
    other = control_plane.admin_api().get("/api/v1/nodes/real-0")["status"]["allocatable"]
    assert other["pods"] == "110" and other["cpu"] != "1"


def test_down_restores_the_host(real_nodes, control_plane):
    """Runs last in this module: it stops the nodes."""
    state_dir = real_nodes.nodes.state_dir
    assert nodes.status(state_dir)
    # The snapshot sees what running nodes change (so its equality below means something).
    during = hoststate.snapshot(state_dir / "nodes", real_nodes.roots)
    changed = {d.split(":", 1)[0] for d in hoststate.differences(real_nodes.before, during)}
    assert {"processes", "cgroups", "links", "routes", "iptables", "sysctls"} <= changed
    real_nodes.nodes.stop()
    after = hoststate.snapshot(state_dir / "nodes", real_nodes.roots)
    assert hoststate.differences(real_nodes.before, after) == []
    assert testing.processes_mentioning(str(state_dir / "nodes")) == []
    assert nodes.read_state(state_dir) is None
    # ... and gives the machine back.
    assert machineclaim.read_claim() is None
    for name in NODES:
        with pytest.raises(ApiError) as e:
            control_plane.admin_api().get(f"/api/v1/nodes/{name}")
        assert e.value.status == 404


def test_a_failed_start_leaves_the_host_as_it_was(pytestconfig, control_plane, tmp_path):
    """After the module's nodes are down: a node whose kubelet dies at once."""
    binaries = testing.node_binaries(pytestconfig)
    broken = dataclasses.replace(binaries, k8s=Path("/bin/false"))
    running = nodes.RealNodes(tmp_path, control_plane, broken, ["broken-0"])
    # Its containerd, mount namespace, cgroups, bridge and our chain had been made.
    testing.failed_start(running, r"kubelet of node broken-0 exited with code 1", timeout=60)


def test_an_unknown_device_list_strategy_is_refused_before_anything_starts(tmp_path):
    from gpuspawner_sandbox.topology import parse_topology

    spec = parse_topology({"nodes": [{"name": "g", "gpu": {"model": "L4", "count": 1}}]}).node("g")
    binaries = nodebuild.NodeBinaries(
        *(tmp_path,) * len(dataclasses.fields(nodebuild.NodeBinaries))
    )
    with pytest.raises(nodes.NodeError, match=r"^Node g: unknown device list strategy 'volume'; "):
        nodes.RealNodes(
            tmp_path, None, binaries, ["g"], specs={"g": spec}, device_list_strategy="volume"
        )
    assert list(tmp_path.iterdir()) == []


def test_a_feature_gate_the_kubelet_lacks_is_refused_before_anything_starts(pytestconfig, tmp_path):
    from gpuspawner_sandbox.topology import parse_topology

    binaries = testing.node_binaries(pytestconfig)
    topology = parse_topology(
        {
            "nodes": [
                {"name": "c", "kubelet_feature_gates": {"EventedPLEG": True, "NoSuchGate": True}}
            ]
        }
    )
    with pytest.raises(
        nodes.NodeError,
        match=r"^Node c: the kubelet has no feature gate 'NoSuchGate'; `k8s kubelet --help` lists",
    ):
        nodes.RealNodes(tmp_path, None, binaries, ["c"], specs={"c": topology.node("c")})
    assert list(tmp_path.iterdir()) == []


def test_a_failed_cluster_network_leaves_the_host_as_it_was(pytestconfig, control_plane, tmp_path):
    """A cluster DNS that dies at once, after our link with its addresses and route, the
    bridge's forwarding, the node and kube-proxy (whose chains may be written) were made."""
    binaries = testing.node_binaries(pytestconfig)
    broken = dataclasses.replace(binaries, coredns=Path("/bin/false"))
    running = nodes.RealNodes(tmp_path, control_plane, broken, ["net-0"], cluster_network=True)
    testing.failed_start(
        running, r"^coredns of the cluster network exited with code 1 while waiting for ", 90
    )
