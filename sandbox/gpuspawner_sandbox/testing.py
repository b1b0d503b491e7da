"""Helpers for test suites that run against the sandbox control plane.

``tests/sandbox/conftest.py`` and the end-to-end tests use these to build the
binary once, start one control plane per test session and check the
loopback-only rule. When the control plane genuinely cannot be built (no Go
toolchain), tests are skipped with a loud reason, except in CI (``CI=true``),
where that is a failure: CI must build it.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from . import build
from .controlplane import ControlPlane
from .kubeapi import ApiError, KubeApi

#: How long tests' real nodes wait for another run's real nodes on this machine to stop
#: (gpuspawner_sandbox.machineclaim) before the start fails with the refusal.
MACHINE_WAIT = 30 * 60


def wait_for(
    what: str,
    check,
    timeout: float = 60,
    interval: float = 0.25,
    error: type[Exception] | None = None,
):
    """Poll ``check()`` until it returns something truthy, and return that.

    After ``timeout`` s it fails the test, or, for the harness's own code that runs
    outside a test too, raises ``error`` with one sentence.
    """
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            if error is not None:
                raise error(f"Timed out after {timeout:.0f}s waiting for {what}.")
            import pytest

            pytest.fail(f"timed out waiting for {what}")
        time.sleep(interval)


def in_ci() -> bool:
    """Whether this runs in CI, where an unbuildable sandbox is a failure."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def sandbox_unavailable(reason: str) -> None:
    """Skip (locally) or fail (in CI) because the control plane cannot be built."""
    import pytest

    message = (
        f"THE LOCAL KUBERNETES CONTROL PLANE CANNOT BE BUILT, so sandbox and end-to-end "
        f"tests do not run: {reason}"
    )
    if in_ci():
        pytest.fail(f"{message} (CI must build it)", pytrace=False)
    pytest.skip(message)


def third_party_missing(message: str) -> None:
    """Skip (locally) or fail (in CI) because material of ``../shared/third-party`` is missing."""
    import pytest

    if in_ci():
        pytest.fail(f"{message} (CI must have it)", pytrace=False)
    pytest.skip(message)


def capture_disabled(pytestconfig):
    """Let build progress reach the terminal even though pytest captures output."""
    capman = pytestconfig.pluginmanager.getplugin("capturemanager") if pytestconfig else None
    return capman.global_and_fixture_disabled() if capman else contextlib.nullcontext()


def control_plane_binary(pytestconfig=None) -> Path:
    """Build the control plane if needed (showing progress) and return its path.

    Skips or fails through :func:`sandbox_unavailable` when Go is missing; any
    other build failure is an error, reported as one.
    """
    with capture_disabled(pytestconfig):
        try:
            return build.build(out=sys.stderr)
        except build.GoMissing as e:
            sandbox_unavailable(str(e))
            raise  # unreachable: sandbox_unavailable raises


def node_binaries(pytestconfig=None):
    """Build (or find cached) the kubelet, containerd, CNI plugins and image programs.

    Skips or fails (in CI) through :func:`sandbox_unavailable` when real nodes
    cannot run here: no Go, no runc, or not root.
    """
    from . import nodebuild

    if os.geteuid() != 0:
        sandbox_unavailable("real nodes need root (mount namespaces, cgroups, bridges)")
    with capture_disabled(pytestconfig):
        try:
            nodebuild.find_runc()
            return nodebuild.build_all(out=sys.stderr)
        except build.GoMissing as e:
            sandbox_unavailable(str(e))
        except build.BuildError as e:
            if str(e) != nodebuild.RUNC_MISSING:
                raise
            sandbox_unavailable(str(e))
    raise AssertionError("unreachable: sandbox_unavailable raises")


def running_pod(api, namespace: str, name: str) -> dict | None:
    """The pod if every one of its containers runs (started, not just scheduled), else None."""
    pod = api.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    running = bool(statuses) and all("running" in (c.get("state") or {}) for c in statuses)
    return pod if running else None


@contextlib.contextmanager
def running_control_plane(
    state_dir: Path, pytestconfig=None, binary: Path | None = None
) -> Iterator[ControlPlane]:
    """Build if needed (unless given the binary), start a control plane, stop it afterwards."""
    cp = ControlPlane(state_dir, binary or control_plane_binary(pytestconfig))
    cp.start()
    try:
        yield cp
    finally:
        cp.stop()


@contextlib.contextmanager
def running_real_nodes(
    state_dir: Path,
    cp: ControlPlane,
    names: list[str],
    pytestconfig=None,
    *,
    taints: tuple[str, ...] = (),
    specs=None,
    device_list_strategy="envvar",
):
    """Real nodes (kubelet, containerd, runc, CNI) on a running control plane; stopped after.

    ``specs`` (name -> topology NodeSpec) makes the nodes with GPUs GPU nodes
    (driver state, device plugin, taint, labels); ``device_list_strategy``
    (one, or per node name) is their plugins' --device-list-strategy. Builds what is missing
    first; skips (fails in CI) where real nodes cannot run.
    """
    from .nodes import RealNodes

    nodes = RealNodes(
        state_dir,
        cp,
        node_binaries(pytestconfig),
        names,
        taints=taints,
        specs=specs,
        device_list_strategy=device_list_strategy,
        machine_wait=MACHINE_WAIT,
        emit=lambda line: sys.__stderr__.write(line + "\n"),
    )
    nodes.start()
    try:
        yield nodes
    finally:
        nodes.stop()


@contextlib.contextmanager
def running_networked_cluster(pytestconfig, topology, prefix: str) -> Iterator:
    """A control plane on the pods' side and ``topology``'s nodes as real nodes with the
    cluster network (kube-proxy, CoreDNS); stopped afterwards, and the host checked to be
    as it was before. Yields the :class:`~gpuspawner_sandbox.nodes.RealNodes`.

    The state lives outside pytest's basetemp: other pytest runs on this machine rotate
    old basetemps away, and with them a running cluster's record that teardown needs.
    """
    import shutil
    import tempfile

    from . import hoststate, nodeconfig
    from .nodes import RealNodes

    binaries = node_binaries(pytestconfig)
    state_dir = Path(tempfile.mkdtemp(prefix=prefix))
    names = [n.name for n in topology.nodes]
    roots = [nodeconfig.cgroup_root(n) for n in names]
    before = hoststate.snapshot(state_dir / "nodes", roots)
    control = ControlPlane(state_dir, binaries.k8s, api_address=nodeconfig.API_ADDRESS)
    running = RealNodes(
        state_dir,
        control,
        binaries,
        names,
        specs={n.name: n for n in topology.nodes},
        cluster_network=True,
        machine_wait=MACHINE_WAIT,
        emit=lambda line: sys.__stderr__.write(line + "\n"),
    )
    try:
        with capture_disabled(pytestconfig):
            running.prepare()
            control.start()
            running.start()
        yield running
    finally:
        running.stop()
        control.stop()
    assert hoststate.differences(before, hoststate.snapshot(state_dir / "nodes", roots)) == []
    shutil.rmtree(state_dir, ignore_errors=True)


@contextlib.contextmanager
def running_kueue(nodes, hub_namespace: str, pytestconfig=None, *, preemption: bool = False):
    """Kueue and its queues (:mod:`gpuspawner_sandbox.kueue`) on running real nodes with
    the cluster network, removed afterwards: yields a :class:`~gpuspawner_sandbox.kueue.Kueue`.

    Builds Kueue first if needed (progress shown); skips (fails in CI) without Go.
    ``preemption``: the ClusterQueues preempt lower priorities and reclaim their cohort's
    quota (off by default).
    """
    from . import kueue

    with capture_disabled(pytestconfig):
        try:
            kueue.build_kueue(out=sys.stderr)
        except build.GoMissing as e:
            sandbox_unavailable(str(e))
        running = kueue.deploy_kueue(
            nodes,
            hub_namespace,
            preemption=preemption,
            emit=lambda line: sys.__stderr__.write(line + "\n"),
            out=sys.stderr,
        )
    try:
        yield running
    finally:
        kueue.remove_kueue(running)


def failed_start(running, match: str | None = None, timeout: float = 120) -> Exception:
    """Start real nodes that must fail; check the host is then as before; return the error.

    ``running`` is a :class:`~gpuspawner_sandbox.nodes.RealNodes` with a broken part; its
    start must raise :class:`~gpuspawner_sandbox.nodes.NodeError` (matching ``match``), and
    undo everything it did: the host snapshot afterwards equals the one before, and no
    record is left.
    """
    import pytest

    from . import hoststate, nodeconfig
    from .nodes import NodeError, read_state

    roots = [nodeconfig.cgroup_root(name) for name in running.names]
    before = hoststate.snapshot(running.root, roots)
    with pytest.raises(NodeError, match=match) as e:
        running.start(timeout=timeout)
    assert hoststate.differences(before, hoststate.snapshot(running.root, roots)) == []
    assert read_state(running.state_dir) is None
    return e.value


@contextlib.contextmanager
def temporary_namespace(cp: ControlPlane, prefix: str = "test") -> Iterator[str]:
    """A fresh namespace whose default ServiceAccount exists; deleted afterwards.

    Pods left in it are deleted with no grace period first: without a kubelet
    confirming, a bound pod would otherwise keep the namespace terminating.
    """
    api = cp.admin_api()
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    api.post("/api/v1/namespaces", {"metadata": {"name": name}})
    cp.wait_for_service_account(name)
    try:
        yield name
    finally:
        force_delete_pods(api, name)
        with contextlib.suppress(ApiError):
            api.delete(f"/api/v1/namespaces/{name}")


def force_delete_pods(api: KubeApi, namespace: str) -> None:
    """Delete every pod in a namespace at once (grace period 0)."""
    pods = api.get(f"/api/v1/namespaces/{namespace}/pods")["items"]
    for pod in pods:
        with contextlib.suppress(ApiError):
            api.delete(
                f"/api/v1/namespaces/{namespace}/pods/{pod['metadata']['name']}",
                query={"gracePeriodSeconds": "0"},
            )


def _socket_inodes(pid: int) -> set[int]:
    inodes = set()
    fd_dir = Path(f"/proc/{pid}/fd")
    for fd in fd_dir.iterdir():
        with contextlib.suppress(OSError):
            match = re.fullmatch(r"socket:\[(\d+)\]", os.readlink(fd))
            if match:
                inodes.add(int(match.group(1)))
    return inodes


def _hex_to_ip(hex_addr: str) -> str:
    """An address from /proc/net/tcp{,6} (little-endian hex words) as text."""
    import ipaddress

    raw = bytes.fromhex(hex_addr)
    # The kernel prints each 32-bit word in host (little-endian) order.
    words = [raw[i : i + 4][::-1] for i in range(0, len(raw), 4)]
    return str(ipaddress.ip_address(b"".join(words)))


def _split(hex_endpoint: str) -> tuple[str, int]:
    addr, port = hex_endpoint.rsplit(":", 1)
    return _hex_to_ip(addr), int(port, 16)


def sockets(pid: int) -> list[dict]:
    """Every TCP and UDP socket the process holds, from Linux's /proc tables.

    Each is ``{"proto", "local": (ip, port), "remote": (ip, port), "state"}``;
    an unconnected socket's remote is ``("0.0.0.0", 0)`` (or ``("::", 0)``).
    """
    inodes = _socket_inodes(pid)
    found = []
    for table in ("tcp", "tcp6", "udp", "udp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if int(fields[9]) in inodes:
                found.append(
                    {
                        "proto": table,
                        "local": _split(fields[1]),
                        "remote": _split(fields[2]),
                        "state": fields[3],
                    }
                )
    return found


def listening_addresses(pid: int) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket the process listens on (Linux /proc)."""
    return [s["local"] for s in sockets(pid) if s["proto"].startswith("tcp") and s["state"] == "0A"]


def stays_on_loopback(sock: dict) -> bool:
    """Whether a socket from :func:`sockets` is bound and connected within 127.0.0.0/8 (or ::1).

    An unconnected socket's remote (the unspecified address, port 0) is fine.
    """
    import ipaddress

    def loopback(endpoint: tuple[str, int], unconnected_ok: bool) -> bool:
        ip = ipaddress.ip_address(endpoint[0])
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
            ip = ip.ipv4_mapped
        if unconnected_ok and ip.is_unspecified and endpoint[1] == 0:
            return True
        return ip.is_loopback

    return loopback(sock["local"], False) and loopback(sock["remote"], True)


def non_loopback_sockets(pid: int) -> list[dict]:
    """The process's sockets bound or connected anywhere outside loopback."""
    return [s for s in sockets(pid) if not stays_on_loopback(s)]


def processes_mentioning(text: str) -> list[int]:
    """Pids of live processes whose command line contains text (a state dir, say)."""
    pids = []
    needle = text.encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if needle in (entry / "cmdline").read_bytes():
                pids.append(int(entry.name))
    return pids


def container_pids(node: str, container_id: str) -> list[int]:
    """Host pids of a real node's container, from its cgroup under the node's cgroup root."""
    from .hoststate import cgroup_mounts
    from .nodeconfig import cgroup_root

    for mount in cgroup_mounts():
        for found in (mount / cgroup_root(node).strip("/")).rglob(container_id):
            procs = found / "cgroup.procs"
            if procs.is_file() and (pids := procs.read_text().split()):
                return [int(p) for p in pids]
    return []


def namespace_pid(pid: int) -> int:
    """The pid a host process has in its innermost pid namespace (NSpid's last field)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("NSpid:"):
            return int(line.split()[-1])
    raise AssertionError(f"no NSpid for {pid}")


def in_pod_container(pod: dict, argv: list[str], uid: int = 1000, gid: int = 100):
    """Start ``argv`` in a pod's first container, as its user types it in a terminal
    (its mount and pid namespaces, jovyan's uid/gid by default): a ``subprocess.Popen``."""
    import subprocess

    container_id = pod["status"]["containerStatuses"][0]["containerID"].split("://", 1)[1]
    pids = container_pids(pod["spec"]["nodeName"], container_id)
    (init,) = [p for p in pids if namespace_pid(p) == 1]
    enter = [
        "nsenter",
        f"--target={init}",
        "--mount",
        "--pid",
        f"--setuid={uid}",
        f"--setgid={gid}",
    ]
    return subprocess.Popen(
        [*enter, *argv],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def process_environment(pid: int) -> dict[str, str]:
    """A process's environment, from /proc."""
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.decode().split("=", 1) for item in raw.split(b"\0") if b"=" in item)


def container_memory_cgroup(node: str, container_id: str) -> tuple[Path, str]:
    """A real node's container's memory cgroup directory on the host, and its limit file's name.

    cgroup v1 (our machines: the memory hierarchy) or v2 (the unified one).
    """
    from .hoststate import cgroup_mounts
    from .nodeconfig import cgroup_root

    mounts = cgroup_mounts()
    v1 = [m for m in mounts if m.name == "memory"]
    base, limit_file = (v1[0], "memory.limit_in_bytes") if v1 else (mounts[0], "memory.max")
    found = list((base / cgroup_root(node).strip("/")).rglob(container_id))
    if len(found) != 1:
        raise AssertionError(f"expected one memory cgroup of container {container_id}: {found}")
    return found[0], limit_file


# --- DNS ------------------------------------------------------------------------------------

#: DNS response codes (RFC 1035 4.1.1).
DNS_NOERROR, DNS_SERVFAIL, DNS_NXDOMAIN, DNS_REFUSED = 0, 2, 3, 5


def dns_query(
    server: str, port: int, name: str, timeout: float = 2, attempts: int = 3
) -> tuple[int, list[str]]:
    """Ask a DNS server for ``name``'s A records over UDP: (response code, addresses).

    A small RFC 1035 client, so that tests need no resolver library and never
    consult the machine's own resolver. Like a stub resolver, it sends the query
    again when no answer comes within ``timeout`` s (UDP may lose it), up to
    ``attempts`` times, then raises :class:`TimeoutError`.
    """
    import random
    import struct

    query_id = random.randrange(1 << 16)
    question = b"".join(
        bytes([len(label)]) + label.encode("ascii") for label in name.rstrip(".").split(".")
    )
    question += b"\0" + struct.pack("!HH", 1, 1)  # QTYPE A, QCLASS IN
    packet = struct.pack("!HHHHHH", query_id, 0x0100, 1, 0, 0, 0) + question
    reply = None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(timeout)
        for _ in range(attempts):
            sock.sendto(packet, (server, port))
            try:
                while True:
                    reply, _ = sock.recvfrom(4096)
                    if struct.unpack("!H", reply[:2])[0] == query_id:
                        break
                break
            except TimeoutError:
                reply = None
    if reply is None:
        raise TimeoutError(f"no answer from {server}:{port} for {name} ({attempts} attempts)")
    flags, qdcount, ancount = struct.unpack("!HHH", reply[2:8])
    offset = 12
    for _ in range(qdcount):
        offset = _skip_name(reply, offset) + 4
    addresses = []
    for _ in range(ancount):
        offset = _skip_name(reply, offset)
        rtype, _rclass, _ttl, length = struct.unpack("!HHIH", reply[offset : offset + 10])
        offset += 10
        if rtype == 1 and length == 4:
            addresses.append(socket.inet_ntoa(reply[offset : offset + 4]))
        offset += length
    return flags & 0x000F, addresses


def _skip_name(message: bytes, offset: int) -> int:
    while True:
        length = message[offset]
        if length == 0:
            return offset + 1
        if length & 0xC0 == 0xC0:  # a compression pointer ends the name
            return offset + 2
        offset += 1 + length
