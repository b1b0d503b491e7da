"""One pod on an emulated node, run as local processes: what the local kubelet does per pod.

:class:`PodRunner` takes a pod the scheduler bound to one of the kubelet's
nodes from admission (device allocation, a loopback pod IP) through its init
containers and containers (restart policy, crash-loop back-off, termination
messages, readiness probes) to termination (SIGTERM, SIGKILL after the grace
period). Every state change is posted as pod status; Events go through the
kubelet. The pure rules it follows live in :mod:`.containers`.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import hashlib
import ipaddress
import json
import logging
import os
import shlex
import signal
import sys
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import containers as ct
from .devices import (
    DeviceError,
    DevicePool,
    container_device_state,
    faults_path,
    resolve_visible,
    visible_devices_env,
)
from .topology import NodeSpec

if TYPE_CHECKING:
    from .kubelet import Kubelet

log = logging.getLogger("gpuspawner_sandbox.kubelet")

#: Kubernetes keeps at most this much of a termination message.
MAX_MESSAGE = 4096
#: FallbackToLogsOnError uses at most this many lines / bytes of the log.
FALLBACK_LINES = 80
FALLBACK_BYTES = 2048
PACKAGE_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TERMINATION_PATH = "/dev/termination-log"
#: Where pod IPs come from unless the kubelet is told otherwise: 127.0.0.2, 127.0.0.3, ...
DEFAULT_POD_RANGE = "127.0.0.0/16"


def now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_micro() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# --- pod addresses ------------------------------------------------------------------------


class AddressPool:
    """Pod IPs from a loopback range (127.0.0.1, the host's own, is never handed out).

    Freed addresses are reused last, so a new pod rarely gets the address a
    just-deleted pod's clients may still be talking to.
    """

    def __init__(self, cidr: str = DEFAULT_POD_RANGE):
        network = ipaddress.ip_network(cidr)
        if network.version != 4 or not network.subnet_of(ipaddress.ip_network("127.0.0.0/8")):
            raise ValueError(f"The pod IP range {cidr} is not inside 127.0.0.0/8.")
        self._first = int(network.network_address) + 1
        self._size = max(1, network.num_addresses - 2)
        self._next = 0
        self._used: set[int] = set()
        self._host = int(ipaddress.IPv4Address("127.0.0.1"))

    def allocate(self) -> str:
        for _ in range(self._size):
            candidate = self._first + self._next
            self._next = (self._next + 1) % self._size
            if (
                candidate not in self._used
                and candidate != self._host
                and (candidate & 0xFF) not in (0, 255)
            ):
                self._used.add(candidate)
                return str(ipaddress.IPv4Address(candidate))
        raise RuntimeError("no free loopback address for a pod")

    def release(self, address: str) -> None:
        self._used.discard(int(ipaddress.IPv4Address(address)))


# --- one container ------------------------------------------------------------------------


@dataclass
class ContainerRun:
    """One container of a pod: its spec, its process, and its status as the API shows it."""

    spec: dict[str, Any]
    init: bool
    devices: list = field(default_factory=list)
    process: asyncio.subprocess.Process | None = None
    restart_count: int = 0
    ready: bool = False
    started_at: float = 0.0
    state: dict[str, Any] = field(default_factory=dict)
    last_state: dict[str, Any] = field(default_factory=dict)
    container_id: str = ""
    #: Steps into the crash-loop back-off (reset after 10 minutes of running well).
    backoff_step: int = 0

    @property
    def name(self) -> str:
        return self.spec["name"]

    @property
    def field_path(self) -> str:
        kind = "initContainers" if self.init else "containers"
        return f"spec.{kind}{{{self.name}}}"

    def status(self, waiting_reason: str = "ContainerCreating") -> dict[str, Any]:
        image = self.spec.get("image", "")
        status = {
            "name": self.name,
            "image": image,
            "imageID": image_id(image),
            "ready": self.ready,
            "restartCount": self.restart_count,
            "state": self.state or {"waiting": {"reason": waiting_reason}},
            "lastState": self.last_state,
            "started": "running" in self.state,
        }
        if self.container_id:
            status["containerID"] = self.container_id
        return status


def image_id(image: str) -> str:
    """A plausible ``imageID``: the normalised repository plus a digest of the reference."""
    name = image.split("@", 1)[0]
    repo = name.rsplit(":", 1)[0] if ":" in name.rsplit("/", 1)[-1] else name
    if "/" not in repo:
        repo = f"library/{repo}"
    if "." not in repo.split("/", 1)[0] and ":" not in repo.split("/", 1)[0]:
        repo = f"docker.io/{repo}"
    return f"{repo}@sha256:{hashlib.sha256(image.encode()).hexdigest()}"


def pod_key(pod: dict[str, Any]) -> str:
    meta = pod["metadata"]
    return f"{meta['namespace']}/{meta['name']}"


def extended_limits(spec: dict[str, Any], resources: set[str]) -> dict[str, int]:
    limits = (spec.get("resources") or {}).get("limits") or {}
    requests = (spec.get("resources") or {}).get("requests") or {}
    out = {}
    for name in resources:
        value = limits.get(name, requests.get(name))
        if value is not None and int(value) > 0:
            out[name] = int(value)
    return out


def extended_resource_names(pod: dict[str, Any]) -> set[str]:
    """Extended resources (``vendor.example/thing``) any container of the pod asks for."""
    names = set()
    for c in (pod["spec"].get("initContainers") or []) + (pod["spec"].get("containers") or []):
        resources = c.get("resources") or {}
        for kind in ("limits", "requests"):
            for name, value in (resources.get(kind) or {}).items():
                if "/" in name and not name.startswith("kubernetes.io/") and int(value) > 0:
                    names.add(name)
    return names


def pod_device_requests(pod: dict[str, Any], resources: set[str]) -> dict[str, int]:
    """The pod's effective extended-resource request: max(any init container, sum of containers)."""
    spec = pod["spec"]
    total: dict[str, int] = {}
    for c in spec.get("containers") or []:
        for name, n in extended_limits(c, resources).items():
            total[name] = total.get(name, 0) + n
    for c in spec.get("initContainers") or []:
        for name, n in extended_limits(c, resources).items():
            total[name] = max(total.get(name, 0), n)
    return total


# --- one pod ------------------------------------------------------------------------------


class PodRunner:
    """Runs one pod bound to one of our nodes, from admission to removal."""

    def __init__(self, kubelet: Kubelet, pod: dict[str, Any]):
        self.kubelet = kubelet
        self.pod = pod
        self.uid = pod["metadata"]["uid"]
        self.node: NodeSpec = kubelet.nodes[pod["spec"]["nodeName"]]
        self.pool: DevicePool = kubelet.pools[self.node.name]
        self.restart_policy = pod["spec"].get("restartPolicy", "Always")
        self.inits = [ContainerRun(c, True) for c in pod["spec"].get("initContainers") or []]
        self.apps = [ContainerRun(c, False) for c in pod["spec"].get("containers") or []]
        meta = pod["metadata"]
        self.dir = kubelet.state_dir / "pods" / f"{meta['namespace']}_{meta['name']}_{self.uid[:8]}"
        self.pod_ip = ""
        self.start_time = ""
        self.phase = "Pending"
        self.reason: str | None = None
        self.message: str | None = None
        self.init_done = not self.inits
        self.init_failed = False
        self.terminating = False
        self.finished = False
        self.task: asyncio.Task | None = None
        self._tasks: list[asyncio.Task] = []
        self._status_lock = asyncio.Lock()
        self._transitions: dict[str, tuple[str, str]] = {}
        self._wake = asyncio.Event()

    # -- lifecycle --

    async def run(self) -> None:
        try:
            await self._run()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("pod %s: unexpected error", pod_key(self.pod))

    async def _run(self) -> None:
        self.start_time = now()
        self.pod_ip = self.kubelet.addresses.allocate()
        (self.dir / "home").mkdir(parents=True, exist_ok=True)
        if not self._admit():
            self.phase = "Failed"
            await self.post_status()
            self._release()
            return
        await self.post_status()
        for run in self.inits:
            ok = await self._run_init(run)
            if self.terminating:
                return
            if not ok:
                self.init_failed = True
                await self.post_status()
                self._release()
                return
        self.init_done = True
        await self.post_status()
        self._tasks = [asyncio.create_task(self._supervise(run)) for run in self.apps]
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if not self.terminating:
            await self.post_status()
            self._release()

    def _admit(self) -> bool:
        """Device admission: the device manager allocates for the whole pod up front."""
        unknown = extended_resource_names(self.pod) - self.pool.resources
        if unknown:
            # The kubelet's own admission check (the scheduler would not have bound it).
            name = sorted(unknown)[0]
            count = pod_device_requests(self.pod, {name})[name]
            self.reason = f"OutOf{name}"
            self.message = (
                f"Pod was rejected: Node didn't have enough resource: {name}, "
                f"requested: {count}, used: 0, capacity: 0"
            )
            self.kubelet.event(self.pod, "Warning", self.reason, self.message)
            return False
        requests = pod_device_requests(self.pod, self.pool.resources)
        pod_devices: dict[str, list] = {}
        for resource, count in requests.items():
            try:
                pod_devices[resource] = self.pool.allocate(self.uid, resource, count)
            except DeviceError:
                self.pool.release(self.uid)
                available = self.pool.free_count(resource)
                self.reason = "UnexpectedAdmissionError"
                self.message = (
                    f"Allocate failed due to requested number of devices unavailable for "
                    f"{resource}. Requested: {count}, Available: {available}, which "
                    "is unexpected"
                )
                self.kubelet.event(self.pod, "Warning", self.reason, self.message)
                return False
        # Init containers reuse the pod's devices; app containers get disjoint slices.
        for run in self.inits:
            for resource, n in extended_limits(run.spec, self.pool.resources).items():
                run.devices += pod_devices.get(resource, [])[:n]
        offsets: dict[str, int] = {}
        for run in self.apps:
            for resource, n in extended_limits(run.spec, self.pool.resources).items():
                start = offsets.get(resource, 0)
                run.devices += pod_devices.get(resource, [])[start : start + n]
                offsets[resource] = start + n
        return True

    async def _run_init(self, run: ContainerRun) -> bool:
        """Run one init container to success; False when the pod fails instead."""
        while not self.terminating:
            exit_code = await self._start_and_wait(run)
            if self.terminating:
                return False
            if exit_code == 0:
                return True
            if self.restart_policy == "Never":
                return False
            await self._back_off(run)
        return False

    async def _supervise(self, run: ContainerRun) -> None:
        while not self.terminating:
            exit_code = await self._start_and_wait(run)
            if self.terminating or not ct.should_restart(self.restart_policy, exit_code):
                return
            await self._back_off(run)

    async def _back_off(self, run: ContainerRun) -> None:
        # The back-off resets when the container ran for 10 minutes without crashing.
        if run.started_at and time.monotonic() - run.started_at > 600:
            run.backoff_step = 0
        delay = ct.backoff_seconds(run.backoff_step, self.kubelet.backoff_initial)
        run.backoff_step += 1
        run.last_state = {"terminated": run.state.get("terminated", {})} if run.state else {}
        run.restart_count += 1
        meta = self.pod["metadata"]
        pod_ref = f"{meta['name']}_{meta['namespace']}({self.uid})"
        message = f"back-off {int(delay)}s restarting failed container={run.name} pod={pod_ref}"
        run.state = {"waiting": {"reason": "CrashLoopBackOff", "message": message}}
        self.kubelet.event(
            self.pod,
            "Warning",
            "BackOff",
            f"Back-off restarting failed container {run.name} in pod {pod_ref}",
            run.field_path,
        )
        await self.post_status()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout=delay)

    # -- processes --

    def _container_dir(self, run: ContainerRun) -> Path:
        path = self.dir / "containers" / run.name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def _prepare(self, run: ContainerRun) -> tuple[list[str], dict[str, str], str, Path]:
        """argv, env, working directory and log file of the container's next start."""
        spec = run.spec
        host_ip = "127.0.0.1"
        cmaps, secrets = self.kubelet.referenced.get(self.uid, ({}, {}))
        spec_env = ct.build_env(self.pod, spec, self.pod_ip, host_ip, cmaps, secrets)
        image_env: dict[str, str] = {}
        for pattern, env in self.kubelet.topology.image_env.items():
            if fnmatch.fnmatch(spec.get("image", ""), pattern):
                image_env.update(env)
        plugin_env = visible_devices_env(run.devices) if run.devices else {}
        env = ct.merge_runtime_env(image_env, plugin_env, spec_env)
        cdir = self._container_dir(run)

        # What the NVIDIA runtime would inject for the final NVIDIA_VISIBLE_DEVICES.
        injected, visible = resolve_visible(self.node, env.get("NVIDIA_VISIBLE_DEVICES"))
        path_dirs = []
        if injected:
            bindir = cdir / "bin"
            bindir.mkdir(exist_ok=True)
            state_file = cdir / "devices.json"
            state_file.write_text(
                json.dumps(
                    container_device_state(self.node, visible, faults_path(self.kubelet.state_dir)),
                    indent=1,
                )
            )
            write_smi_wrapper(bindir / "nvidia-smi", state_file)
            path_dirs.append(str(bindir))
        base_path = env.get("PATH") or os.pathsep.join(
            [str(Path(sys.executable).parent), os.environ.get("PATH", "/usr/bin:/bin")]
        )
        home = self.dir / "home"
        final_env = {
            "HOSTNAME": self.pod["metadata"]["name"],
            "HOME": str(home),
            "LANG": "C.UTF-8",
            **env,
        }
        if "HOME" in env and not Path(env["HOME"]).is_dir():
            final_env["HOME"] = str(home)
        final_env["PATH"] = os.pathsep.join([*path_dirs, base_path])
        if final_env["HOME"] == str(home):
            write_login_profile(home, final_env["PATH"])

        argv = ct.container_argv(spec, final_env)
        argv, final_env = ct.confine_to_pod_ip(argv, final_env, self.pod_ip)
        term_path = spec.get("terminationMessagePath") or DEFAULT_TERMINATION_PATH
        term_file = cdir / "termination-log"
        term_file.write_text("")
        argv, final_env = ct.replace_path(argv, final_env, term_path, str(term_file))

        workdir = spec.get("workingDir")
        cwd = workdir if workdir and Path(workdir).is_dir() else str(home)
        log_file = cdir / f"{run.restart_count}.log"
        return argv, final_env, cwd, log_file

    async def _start_and_wait(self, run: ContainerRun) -> int:
        """Start the container's process, wait for it, record how it ended; the exit code."""
        pod = self.pod
        self.kubelet.event(
            pod,
            "Normal",
            "Pulled",
            f'Container image "{run.spec.get("image", "")}" already present on machine',
            run.field_path,
        )
        run.container_id = f"containerd://{uuid.uuid4().hex}{uuid.uuid4().hex}"
        while True:
            try:
                argv, env, cwd, log_file = self._prepare(run)
                program = ct.resolve_executable(argv[0], env["PATH"])
                if program is None:
                    raise ct.ContainerStartError(ct.not_found_message(argv[0]))
                break
            except ct.ContainerConfigError as e:
                message = str(e)
                run.state = {
                    "waiting": {"reason": "CreateContainerConfigError", "message": message}
                }
                self.kubelet.event(pod, "Warning", "Failed", f"Error: {message}", run.field_path)
                await self.post_status()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self.kubelet.backoff_initial)
                if self.terminating:
                    return 1
                # Try again (a missing ConfigMap may appear), without counting a restart.
                await self.kubelet.fetch_references(self)
            except ct.ContainerStartError as e:
                self.kubelet.event(
                    pod, "Normal", "Created", f"Created container: {run.name}", run.field_path
                )
                message = str(e)
                run.state = {
                    "terminated": {
                        "exitCode": 128,
                        "reason": "StartError",
                        "message": message,
                        "startedAt": "1970-01-01T00:00:00Z",
                        "finishedAt": now(),
                        "containerID": run.container_id,
                    }
                }
                self.kubelet.event(pod, "Warning", "Failed", f"Error: {message}", run.field_path)
                await self.post_status()
                return 128

        self.kubelet.event(
            pod, "Normal", "Created", f"Created container: {run.name}", run.field_path
        )
        with open(log_file, "ab") as out:
            run.process = await asyncio.create_subprocess_exec(
                program,
                *argv[1:],
                env=env,
                cwd=cwd,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_kubelet,
            )
        if self.terminating:
            # Deleted while the process was being started: it must not outlive the pod.
            signal_group(run.process, signal.SIGKILL)
        run.started_at = time.monotonic()
        started = now()
        run.state = {"running": {"startedAt": started}}
        self.kubelet.event(
            pod, "Normal", "Started", f"Started container {run.name}", run.field_path
        )
        probe = None
        if not run.init:
            if run.spec.get("readinessProbe"):
                probe = asyncio.create_task(self._probe_loop(run))
            else:
                run.ready = True
        await self.post_status()
        exit_code = await run.process.wait()
        if probe:
            probe.cancel()
        run.ready = False
        run.process = None
        # A process killed by a signal shows as 128 + the signal, as with runc.
        if exit_code < 0:
            exit_code = 128 - exit_code
        terminated = {
            "exitCode": exit_code,
            "reason": "Completed" if exit_code == 0 else "Error",
            "startedAt": started,
            "finishedAt": now(),
            "containerID": run.container_id,
        }
        message = termination_message(run.spec, self._container_dir(run), log_file, exit_code)
        if message:
            terminated["message"] = message
        run.state = {"terminated": terminated}
        if not self.terminating:
            await self.post_status()
        return exit_code

    async def _probe_loop(self, run: ContainerRun) -> None:
        probe = run.spec["readinessProbe"]
        await asyncio.sleep(probe.get("initialDelaySeconds", 0))
        period = probe.get("periodSeconds", 10)
        success_needed = probe.get("successThreshold", 1)
        failure_needed = probe.get("failureThreshold", 3)
        successes = failures = 0
        while run.process is not None:
            ok = await run_probe(probe, run.spec, self.pod_ip, probe.get("timeoutSeconds", 1))
            if ok:
                successes, failures = successes + 1, 0
                if not run.ready and successes >= success_needed:
                    run.ready = True
                    await self.post_status()
            else:
                successes, failures = 0, failures + 1
                if run.ready and failures >= failure_needed:
                    run.ready = False
                    await self.post_status()
            await asyncio.sleep(period)

    async def terminate(self, grace: float) -> None:
        """Stop every process (SIGTERM, SIGKILL after ``grace``), then free what the pod held."""
        if self.terminating:
            return
        self.terminating = True
        self._wake.set()
        running = [r for r in self.inits + self.apps if r.process is not None]
        for run in running:
            self.kubelet.event(
                self.pod, "Normal", "Killing", f"Stopping container {run.name}", run.field_path
            )
            signal_group(run.process, signal.SIGTERM)
        deadline = time.monotonic() + max(0.0, grace)
        for run in running:
            proc = run.process
            if proc is None:
                continue
            try:
                await asyncio.wait_for(proc.wait(), timeout=max(0.0, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                signal_group(proc, signal.SIGKILL)
                await proc.wait()
        if self.task is not None:
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(self.task), timeout=5)
        for run in self.inits + self.apps:
            if "terminated" not in run.state:
                run.state = {
                    "terminated": {
                        "exitCode": 137 if run.started_at else 0,
                        "reason": "ContainerStatusUnknown" if not run.started_at else "Error",
                        "finishedAt": now(),
                    }
                }
            run.ready = False
        self._release()

    def kill_now(self) -> None:
        """The pod object is gone (force delete): stop everything without waiting."""
        self.terminating = True
        self._wake.set()
        for run in self.inits + self.apps:
            if run.process is not None:
                signal_group(run.process, signal.SIGKILL)
        self._release()

    def _release(self) -> None:
        if self.finished:
            return
        self.finished = True
        self.pool.release(self.uid)
        if self.pod_ip:
            self.kubelet.addresses.release(self.pod_ip)

    # -- status --

    def _condition(self, kind: str, ok: bool, reason: str = "", message: str = "") -> dict:
        status = "True" if ok else "False"
        previous = self._transitions.get(kind)
        if previous is None or previous[0] != status:
            self._transitions[kind] = (status, now())
        cond = {"type": kind, "status": status, "lastProbeTime": None}
        cond["lastTransitionTime"] = self._transitions[kind][1]
        if not ok and reason:
            cond["reason"] = reason
            cond["message"] = message
        return cond

    def status(self) -> dict[str, Any]:
        app_waiting = "ContainerCreating" if self.init_done else "PodInitializing"
        app_statuses = [r.status(app_waiting) for r in self.apps]
        init_statuses = [r.status("PodInitializing") for r in self.inits]
        if self.reason is not None:  # rejected at admission
            phase = "Failed"
        else:
            phase = ct.pod_phase(
                self.restart_policy, self.init_done, self.init_failed, app_statuses
            )
            if self.terminating:
                codes = [s["state"].get("terminated", {}).get("exitCode", 0) for s in app_statuses]
                phase = "Succeeded" if all(c == 0 for c in codes) and self.init_done else "Failed"
        self.phase = phase
        not_init = [
            r.name
            for r in self.inits
            if "terminated" not in r.state or r.state["terminated"]["exitCode"] != 0
        ]
        unready = [r.name for r in self.apps if not r.ready]
        conditions = [
            self._condition("PodReadyToStartContainers", bool(self.pod_ip) and not self.finished),
            self._condition(
                "Initialized",
                self.init_done,
                "ContainersNotInitialized",
                f"containers with incomplete status: [{' '.join(not_init)}]",
            ),
            self._condition(
                "Ready",
                not unready,
                "ContainersNotReady",
                f"containers with unready status: [{' '.join(unready)}]",
            ),
            self._condition(
                "ContainersReady",
                not unready,
                "ContainersNotReady",
                f"containers with unready status: [{' '.join(unready)}]",
            ),
        ]
        ours = {c["type"] for c in conditions}
        for cond in (self.pod.get("status") or {}).get("conditions") or []:
            if cond["type"] not in ours:
                conditions.append(cond)
        status: dict[str, Any] = {
            "phase": phase,
            "conditions": conditions,
            "hostIP": "127.0.0.1",
            "hostIPs": [{"ip": "127.0.0.1"}],
            "podIP": self.pod_ip,
            "podIPs": [{"ip": self.pod_ip}] if self.pod_ip else [],
            "startTime": self.start_time,
            "qosClass": (self.pod.get("status") or {}).get("qosClass", "BestEffort"),
            "containerStatuses": app_statuses,
            "reason": self.reason,
            "message": self.message,
        }
        if init_statuses:
            status["initContainerStatuses"] = init_statuses
        if not self.pod_ip:
            del status["podIP"]
        return status

    async def post_status(self) -> None:
        async with self._status_lock:
            await self.kubelet.patch_pod_status(self.pod, self.status())


def _die_with_kubelet() -> None:
    """In the child: get SIGKILL if the kubelet dies, so no pod process outlives it."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def signal_group(process: asyncio.subprocess.Process, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)


def termination_message(spec: dict, cdir: Path, log_file: Path, exit_code: int) -> str:
    """The termination message: the file, or with FallbackToLogsOnError the log's tail."""
    try:
        message = (cdir / "termination-log").read_bytes()[:MAX_MESSAGE].decode(errors="replace")
    except OSError:
        message = ""
    if (
        not message
        and exit_code != 0
        and spec.get("terminationMessagePolicy") == "FallbackToLogsOnError"
    ):
        try:
            lines = log_file.read_bytes().splitlines()[-FALLBACK_LINES:]
        except OSError:
            lines = []
        message = b"\n".join(lines)[-FALLBACK_BYTES:].decode(errors="replace")
        if message:
            message += "\n"
    return message


async def run_probe(probe: dict, container: dict, pod_ip: str, timeout: float) -> bool:
    """One readiness probe attempt (httpGet or tcpSocket; exec is run as a local process)."""

    def port_of(spec_port: Any) -> int:
        if isinstance(spec_port, int) or str(spec_port).isdigit():
            return int(spec_port)
        for p in container.get("ports") or []:
            if p.get("name") == spec_port:
                return int(p["containerPort"])
        return -1

    try:
        if "httpGet" in probe:
            get = probe["httpGet"]
            host = get.get("host") or pod_ip
            if not ipaddress.ip_address(host).is_loopback:
                return False  # never send a packet off the machine
            port = port_of(get.get("port"))
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(host, port), timeout=timeout
            )
            headers = "".join(
                f"{h['name']}: {h['value']}\r\n" for h in get.get("httpHeaders") or []
            )
            request = (
                f"GET {get.get('path', '/')} HTTP/1.1\r\nHost: {host}:{port}\r\n"
                f"User-Agent: kube-probe/1.37\r\nConnection: close\r\n{headers}\r\n"
            )
            writer.write(request.encode())
            await writer.drain()
            line = await asyncio.wait_for(reader.readline(), timeout=timeout)
            writer.close()
            parts = line.split()
            return len(parts) >= 2 and 200 <= int(parts[1]) < 400
        if "tcpSocket" in probe:
            host = probe["tcpSocket"].get("host") or pod_ip
            if not ipaddress.ip_address(host).is_loopback:
                return False
            _, writer = await asyncio.wait_for(
                asyncio.open_connection(host, port_of(probe["tcpSocket"]["port"])),
                timeout=timeout,
            )
            writer.close()
            return True
        if "exec" in probe:
            proc = await asyncio.create_subprocess_exec(
                *probe["exec"]["command"],
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
            )
            return await asyncio.wait_for(proc.wait(), timeout=timeout) == 0
    except (OSError, asyncio.TimeoutError, ValueError):
        return False
    return True


def write_login_profile(home: Path, path: str) -> None:
    """Keep the container's PATH in login shells (Jupyter terminals run ``sh -l``).

    In a container, /etc/profile is the image's and nvidia-smi sits in /usr/bin;
    here /etc/profile is the host's and resets PATH, which would hide the
    injected nvidia-smi. The per-pod HOME's .profile puts the container's PATH back.
    """
    (home / ".profile").write_text(
        "# Written by the gpuspawner sandbox kubelet: restore the container's PATH\n"
        "# (the host's /etc/profile, read by login shells, resets it).\n"
        f"export PATH={shlex.quote(path)}\n"
    )


def write_smi_wrapper(path: Path, state_file: Path) -> None:
    """The container's ``nvidia-smi``: the emulator bound to this container's devices."""
    code = (
        f"import sys; sys.path.insert(0, {str(PACKAGE_ROOT)!r}); "
        "from gpuspawner_sandbox.nvidia_smi import main; sys.exit(main())"
    )
    path.write_text(
        "#!/bin/sh\n"
        "# Emulated nvidia-smi (gpuspawner sandbox): reports this container's GPUs only.\n"
        f"GPUSPAWNER_SANDBOX_SMI_STATE={shlex.quote(str(state_file))} "
        f'exec {shlex.quote(sys.executable)} -I -c {shlex.quote(code)} "$@"\n'
    )
    path.chmod(0o755)
