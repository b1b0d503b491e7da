"""The local kubelet: owns the sandbox's emulated GPU nodes and runs their pods as local processes.

``python -m gpuspawner_sandbox.kubelet --kubeconfig K --topology T --state-dir S``

What it does, as a kubelet does, through the real API server:

* registers one Node per topology entry (labels as GPU feature discovery sets
  them, the GPU taint, capacity/allocatable with the extended resources through
  the status subresource), renews their Leases in ``kube-node-lease`` and keeps
  their conditions fresh;
* watches the pods the real scheduler binds to those nodes, admits them against
  the node's device pool (the device plugin's ``Allocate``: concrete GPU UUIDs
  in ``NVIDIA_VISIBLE_DEVICES``), gives each pod its own loopback address
  127.0.0.N as pod IP, runs the init containers in order and then the
  containers as local processes, honours ``restartPolicy`` with crash-loop
  back-off, termination messages, exit codes and readiness probes, and posts
  pod status and Events;
* on deletion sends SIGTERM, then SIGKILL after the grace period, frees the
  GPUs and the address, and removes the pod object.

What is emulated rather than real is listed in docs/sandbox-kubelet.md.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import dataclasses
import hashlib
import ipaddress
import json
import logging
import os
import signal
import sys
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from kubernetes_asyncio import client, config, watch
from kubernetes_asyncio.client.exceptions import ApiException

from . import containers as ct
from .devices import (
    DevicePool,
    effective_driver,
    faults_path,
    load_faults,
)
from .pods import DEFAULT_POD_RANGE, AddressPool, PodRunner, now, now_micro, pod_key
from .topology import (
    NodeSpec,
    Topology,
    TopologyError,
    extended_resources,
    load_topology,
    node_labels,
    node_taints,
)

log = logging.getLogger("gpuspawner_sandbox.kubelet")

LEASE_NAMESPACE = "kube-node-lease"
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
#: Written into the state directory once the nodes are registered and schedulable (holds the pid).
READY_FILE = "kubelet.ready"
LEASE_DURATION = 40
LEASE_RENEW_INTERVAL = 10.0
NODE_STATUS_INTERVAL = 60.0
FAULT_POLL_INTERVAL = 1.0
MERGE_PATCH = "application/merge-patch+json"


# --- the kubelet --------------------------------------------------------------------------


class Kubelet:
    """All emulated nodes of one topology, served by one process."""

    def __init__(
        self,
        api: client.ApiClient,
        topology: Topology,
        state_dir: Path,
        *,
        backoff_initial: float = 10.0,
        pod_ip_range: str = DEFAULT_POD_RANGE,
    ):
        self.api = api
        self.core = client.CoreV1Api(api)
        self.coordination = client.CoordinationV1Api(api)
        self.topology = topology
        self.state_dir = Path(state_dir)
        self.nodes = {n.name: n for n in topology.nodes}
        self.pools = {n.name: DevicePool(n) for n in topology.nodes}
        self.drivers = {n.name: n.driver for n in topology.nodes}
        self._relabel: set[str] = set()
        self.addresses = AddressPool(pod_ip_range)
        self.backoff_initial = backoff_initial
        self.runners: dict[str, PodRunner] = {}
        self.referenced: dict[str, tuple[dict, dict]] = {}
        self._tasks: list[asyncio.Task] = []
        self._background: set[asyncio.Task] = set()
        self._faults_mtime: float | None = None
        self._version = "v0.0.0"
        self._boot_id = str(uuid.uuid4())
        self._node_uids: dict[str, str] = {}
        self._heartbeat = now()
        self._last_event_ns = 0
        self._events: asyncio.Queue = asyncio.Queue()
        self._event_counts: dict[tuple, tuple[str, int]] = {}

    # -- start/stop --

    async def start(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(Exception):
            info = await client.VersionApi(self.api).get_code()
            self._version = info.git_version
        self._check_faults()
        for node in self.topology.nodes:
            await self.register_node(node)
        self._tasks = [
            asyncio.create_task(self._lease_loop()),
            asyncio.create_task(self._node_status_loop()),
            asyncio.create_task(self._fault_loop()),
            asyncio.create_task(self._pod_loop()),
            asyncio.create_task(self._event_loop()),
        ]

    async def wait_schedulable(self, timeout: float = 60.0) -> bool:
        """Wait until the node lifecycle controller has lifted the ``not-ready`` taint
        the API server puts on every new node; False if it has not within ``timeout``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pending = []
            for name in self.nodes:
                node = await self.core.read_node(name)
                if any(t.key == NOT_READY_TAINT for t in node.spec.taints or []):
                    pending.append(name)
            if not pending:
                return True
            await asyncio.sleep(0.5)
        log.warning("nodes still tainted %s after %.0fs", NOT_READY_TAINT, timeout)
        return False

    async def stop(self, grace: float = 5.0) -> None:
        for task in self._tasks[:-1]:  # every loop but the events'
            task.cancel()
        await asyncio.gather(*self._tasks[:-1], return_exceptions=True)
        await asyncio.gather(
            *(r.terminate(grace) for r in list(self.runners.values())), return_exceptions=True
        )
        # Let the Killing events out before the event loop goes.
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._drain_events(), timeout=5)
        self._tasks[-1].cancel()
        for r in list(self.runners.values()):
            if r.task:
                r.task.cancel()
        for task in list(self._background):
            task.cancel()

    # -- nodes --

    def node_status(self, node: NodeSpec) -> dict[str, Any]:
        pool = self.pools[node.name]
        base = {
            "cpu": node.cpu,
            "memory": node.memory,
            "pods": str(node.pods),
            "ephemeral-storage": "100Gi",
        }
        capacity = {**base, **{k: str(v) for k, v in pool.capacity().items()}}
        allocatable = {**base, **{k: str(v) for k, v in pool.allocatable().items()}}
        heartbeat = now()
        conditions = [
            (
                "MemoryPressure",
                "False",
                "KubeletHasSufficientMemory",
                "kubelet has sufficient memory available",
            ),
            ("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
            (
                "PIDPressure",
                "False",
                "KubeletHasSufficientPID",
                "kubelet has sufficient PID available",
            ),
            ("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
        ]
        return {
            "capacity": capacity,
            "allocatable": allocatable,
            "conditions": [
                {
                    "type": kind,
                    "status": status,
                    "reason": reason,
                    "message": message,
                    "lastHeartbeatTime": heartbeat,
                    "lastTransitionTime": self._heartbeat,
                }
                for kind, status, reason, message in conditions
            ],
            "addresses": [
                {"type": "InternalIP", "address": "127.0.0.1"},
                {"type": "Hostname", "address": node.name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
            "nodeInfo": {
                "machineID": hashlib.md5(node.name.encode()).hexdigest(),
                "systemUUID": str(uuid.uuid5(uuid.NAMESPACE_DNS, node.name)),
                "bootID": self._boot_id,
                "kernelVersion": os.uname().release,
                "osImage": "gpuspawner sandbox",
                "containerRuntimeVersion": "sandbox://0.1.0",
                "kubeletVersion": self._version,
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        }

    async def register_node(self, node: NodeSpec) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": node.name,
                "labels": self.labels(node),
                "annotations": {"gpuspawner.io/sandbox-node": "true"},
            },
            "spec": {"taints": node_taints(node)},
            "status": self.node_status(node),
        }
        try:
            created = await self.core.create_node(body)
            self._node_uids[node.name] = created.metadata.uid
        except ApiException as e:
            if e.status != 409:
                raise
            patched = await self.core.patch_node(
                node.name,
                {"metadata": {"labels": body["metadata"]["labels"]}, "spec": body["spec"]},
                _content_type=MERGE_PATCH,
            )
            self._node_uids[node.name] = patched.metadata.uid
        # A kubelet reports capacity through the status subresource.
        await self.patch_node_status(node)
        await self.renew_lease(node)
        log.info("node %s registered: %s", node.name, extended_resources(node) or "no GPUs")

    async def patch_node_status(self, node: NodeSpec) -> None:
        await self.core.patch_node_status(
            node.name, {"status": self.node_status(node)}, _content_type=MERGE_PATCH
        )

    async def renew_lease(self, node: NodeSpec) -> None:
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": node.name,
                "namespace": LEASE_NAMESPACE,
                "ownerReferences": [
                    {
                        "apiVersion": "v1",
                        "kind": "Node",
                        "name": node.name,
                        "uid": self._node_uids.get(node.name, ""),
                    }
                ],
            },
            "spec": {
                "holderIdentity": node.name,
                "leaseDurationSeconds": LEASE_DURATION,
                "renewTime": now_micro(),
            },
        }
        try:
            await self.coordination.patch_namespaced_lease(
                node.name, LEASE_NAMESPACE, {"spec": body["spec"]}, _content_type=MERGE_PATCH
            )
        except ApiException as e:
            if e.status != 404:
                raise
            await self.coordination.create_namespaced_lease(LEASE_NAMESPACE, body)

    async def _lease_loop(self) -> None:
        while True:
            await asyncio.sleep(LEASE_RENEW_INTERVAL)
            for node in self.topology.nodes:
                try:
                    await self.renew_lease(node)
                except Exception as e:
                    log.warning("lease renewal for %s failed: %s", node.name, e)

    async def _node_status_loop(self) -> None:
        while True:
            await asyncio.sleep(NODE_STATUS_INTERVAL)
            await self._post_all_node_status()

    async def _post_all_node_status(self) -> None:
        for node in self.topology.nodes:
            try:
                await self.patch_node_status(node)
            except Exception as e:
                log.warning("status update for node %s failed: %s", node.name, e)

    # -- faults --

    def _check_faults(self) -> bool:
        path = faults_path(self.state_dir)
        try:
            mtime = path.stat().st_mtime
        except FileNotFoundError:
            mtime = None
        if mtime == self._faults_mtime:
            return False
        self._faults_mtime = mtime
        try:
            faults = load_faults(path)
        except (ValueError, TypeError) as e:
            log.warning("ignoring unreadable faults file %s: %s", path, e)
            return False
        changed = False
        for pool in self.pools.values():
            changed |= pool.set_faults(faults)
        for name, node in self.nodes.items():
            driver = effective_driver(name, node.driver, faults)
            if driver != self.drivers[name]:
                self.drivers[name] = driver
                self._relabel.add(name)
        return changed

    def labels(self, node: NodeSpec) -> dict[str, str]:
        """The node's labels as GFD would set them for the driver it really runs."""
        return node_labels(dataclasses.replace(node, driver=self.drivers[node.name]))

    async def _fault_loop(self) -> None:
        while True:
            await asyncio.sleep(FAULT_POLL_INTERVAL)
            if self._check_faults():
                log.info("device health changed; updating node allocatable")
                await self._post_all_node_status()
            while self._relabel:
                # GPU feature discovery relabels a node whose driver changed.
                name = self._relabel.pop()
                labels = {k: v for k, v in self.labels(self.nodes[name]).items() if "cuda" in k}
                try:
                    await self.core.patch_node(
                        name, {"metadata": {"labels": labels}}, _content_type=MERGE_PATCH
                    )
                except ApiException as e:
                    log.warning("relabelling node %s failed: %s", name, e.reason)

    # -- pods --

    async def _pod_loop(self) -> None:
        while True:
            try:
                await self._list_and_watch()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("pod watch ended (%s); listing again", e)
                await asyncio.sleep(1)

    async def _list_and_watch(self) -> None:
        resp = await self.core.list_pod_for_all_namespaces(
            field_selector="spec.nodeName!=", _preload_content=False
        )
        listing = json.loads(await resp.read())
        seen = set()
        for pod in listing["items"]:
            if pod["spec"].get("nodeName") in self.nodes:
                seen.add(pod["metadata"]["uid"])
                await self.handle("ADDED", pod)
        for uid in list(self.runners):
            if uid not in seen:
                self._forget(uid)
        rv = listing["metadata"]["resourceVersion"]
        w = watch.Watch()
        async with w.stream(
            self.core.list_pod_for_all_namespaces,
            field_selector="spec.nodeName!=",
            resource_version=rv,
            allow_watch_bookmarks=True,
            timeout_seconds=300,
        ) as stream:
            async for event in stream:
                kind = event["type"]
                if kind == "ERROR":
                    raise RuntimeError(event["raw_object"].get("message", "watch error"))
                if kind == "BOOKMARK":
                    continue
                pod = event["raw_object"]
                if pod["spec"].get("nodeName") in self.nodes:
                    await self.handle(kind, pod)

    async def handle(self, kind: str, pod: dict[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        runner = self.runners.get(uid)
        if kind == "DELETED":
            self._forget(uid)
            return
        if runner is not None:
            runner.pod["status"] = pod.get("status") or {}
            runner.pod["metadata"] = pod["metadata"]
        if pod["metadata"].get("deletionTimestamp"):
            grace = pod["metadata"].get("deletionGracePeriodSeconds")
            if grace is None:
                grace = pod["spec"].get("terminationGracePeriodSeconds", 30)
            if runner is None or not runner.terminating:
                self._spawn(self._delete_pod(pod, runner, float(grace)))
            return
        phase = (pod.get("status") or {}).get("phase")
        if runner is None and phase not in ("Succeeded", "Failed"):
            runner = PodRunner(self, pod)
            self.runners[uid] = runner
            await self.fetch_references(runner)
            runner.task = asyncio.create_task(runner.run())

    async def fetch_references(self, runner: PodRunner) -> None:
        """Read the ConfigMaps and Secrets the pod's env refers to (missing ones stay missing)."""
        ns = runner.pod["metadata"]["namespace"]
        cmaps: dict[str, dict] = {}
        secrets: dict[str, dict] = {}
        for run in runner.inits + runner.apps:
            want_c, want_s = ct.referenced_objects(run.spec)
            for name in want_c - set(cmaps):
                with contextlib.suppress(ApiException):
                    cmaps[name] = (await self.core.read_namespaced_config_map(name, ns)).data or {}
            for name in want_s - set(secrets):
                with contextlib.suppress(ApiException):
                    obj = await self.core.read_namespaced_secret(name, ns)
                    secrets[name] = {
                        k: base64.b64decode(v).decode() for k, v in (obj.data or {}).items()
                    }
        self.referenced[runner.uid] = (cmaps, secrets)

    def _spawn(self, coro) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _delete_pod(self, pod: dict, runner: PodRunner | None, grace: float) -> None:
        meta = pod["metadata"]
        if runner is not None:
            await runner.terminate(grace)
            with contextlib.suppress(Exception):
                await runner.post_status()
        with contextlib.suppress(ApiException):
            await self.core.delete_namespaced_pod(
                meta["name"],
                meta["namespace"],
                body={"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}},
                grace_period_seconds=0,
            )
        self.runners.pop(meta["uid"], None)
        self.referenced.pop(meta["uid"], None)
        self.forget_events(meta["uid"])

    def _forget(self, uid: str) -> None:
        runner = self.runners.pop(uid, None)
        self.referenced.pop(uid, None)
        self.forget_events(uid)
        if runner is not None:
            # The runner's task sees `terminating` and ends by itself; cancelling it
            # mid-spawn could lose a process handle.
            runner.kill_now()

    # -- API writes --

    def _event_stamp(self) -> int:
        stamp = max(time.time_ns(), self._last_event_ns + 1)
        self._last_event_ns = stamp
        return stamp

    async def patch_pod_status(self, pod: dict, status: dict) -> None:
        meta = pod["metadata"]
        try:
            await self.core.patch_namespaced_pod_status(
                meta["name"], meta["namespace"], {"status": status}, _content_type=MERGE_PATCH
            )
        except ApiException as e:
            if e.status != 404:
                log.warning("status of pod %s not posted: %s", pod_key(pod), e.reason)

    def event(
        self,
        pod: dict,
        kind: str,
        reason: str,
        message: str,
        field_path: str | None = None,
    ) -> None:
        """Record an Event about ``pod`` as the kubelet of its node.

        Events are posted in order by one task. A repeat of an event (same
        container, type, reason and message) raises the first one's ``count``, as
        the client-go event correlator does, instead of creating another object.
        """
        meta = pod["metadata"]
        stamp = now()
        key = (meta["uid"], field_path, kind, reason, message)
        if key in self._event_counts:
            name, count = self._event_counts[key]
            self._event_counts[key] = (name, count + 1)
            patch = {"count": count + 1, "lastTimestamp": stamp}
            self._events.put_nowait(("patch", meta["namespace"], name, patch))
            return
        # As the kubelet names them: pod name + hex nanoseconds, so that a listing
        # (sorted by name) gives a pod's events in order.
        name = f"{meta['name']}.{self._event_stamp():x}"
        self._event_counts[key] = (name, 1)
        involved = {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta["uid"],
        }
        if field_path:
            involved["fieldPath"] = field_path
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": meta["namespace"]},
            "involvedObject": involved,
            "reason": reason,
            "message": message,
            "type": kind,
            "source": {"component": "kubelet", "host": pod["spec"].get("nodeName", "")},
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
            "reportingComponent": "kubelet",
            "reportingInstance": pod["spec"].get("nodeName", ""),
        }
        self._events.put_nowait(("create", meta["namespace"], name, body))

    async def _event_loop(self) -> None:
        while True:
            op, namespace, name, body = await self._events.get()
            try:
                if op == "create":
                    await self.core.create_namespaced_event(namespace, body)
                else:
                    await self.core.patch_namespaced_event(
                        name, namespace, body, _content_type=MERGE_PATCH
                    )
            except ApiException as e:
                log.debug("event %s in %s not posted: %s", name, namespace, e.reason)

    async def _drain_events(self) -> None:
        while not self._events.empty():
            await asyncio.sleep(0.05)

    def forget_events(self, uid: str) -> None:
        for key in [k for k in self._event_counts if k[0] == uid]:
            del self._event_counts[key]


# --- command line -------------------------------------------------------------------------


def is_loopback_url(url: str) -> bool:
    """Whether ``url`` names a loopback address (no name lookup beyond "localhost")."""
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


async def serve(
    kubeconfig: Path,
    topology: Topology,
    state_dir: Path,
    *,
    backoff: float = 10.0,
    pod_ip_range: str = DEFAULT_POD_RANGE,
) -> None:
    """Run the kubelet until SIGTERM/SIGINT, then stop every pod process."""
    cfg = client.Configuration()
    await config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
    if not is_loopback_url(cfg.host):
        raise SystemExit(f"The API server {cfg.host} is not on loopback; refusing to start.")
    async with client.ApiClient(cfg) as api:
        kubelet = Kubelet(
            api, topology, state_dir, backoff_initial=backoff, pod_ip_range=pod_ip_range
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await kubelet.start()
        await kubelet.wait_schedulable()
        (state_dir / READY_FILE).write_text(str(os.getpid()))
        log.info("kubelet ready: %d node(s)", len(topology.nodes))
        await stop.wait()
        log.info("stopping: killing pod processes")
        await kubelet.stop()
        with contextlib.suppress(FileNotFoundError):
            (state_dir / READY_FILE).unlink()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gpuspawner_sandbox.kubelet",
        description="Run the sandbox's emulated GPU nodes and their pods as local processes.",
    )
    parser.add_argument("--kubeconfig", required=True, type=Path, help="admin kubeconfig")
    parser.add_argument(
        "--topology", type=Path, default=None, help="topology YAML (default: built in)"
    )
    parser.add_argument("--state-dir", required=True, type=Path, help="where pods and faults live")
    parser.add_argument(
        "--backoff-initial",
        type=float,
        default=10.0,
        help="first crash-loop back-off in seconds (the kubelet's is 10)",
    )
    parser.add_argument(
        "--pod-ip-range",
        default=DEFAULT_POD_RANGE,
        help="loopback CIDR pod IPs are taken from (default %(default)s: 127.0.0.2 first)",
    )
    parser.add_argument("--log-level", default="INFO", help="logging level")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s kubelet %(levelname)s %(message)s"
    )
    try:
        topology = load_topology(args.topology)
    except TopologyError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    args.state_dir.mkdir(parents=True, exist_ok=True)
    try:
        AddressPool(args.pod_ip_range)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    asyncio.run(
        serve(
            args.kubeconfig,
            topology,
            args.state_dir,
            backoff=args.backoff_initial,
            pod_ip_range=args.pod_ip_range,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
