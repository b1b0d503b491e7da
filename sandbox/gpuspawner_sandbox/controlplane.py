"""Start and stop a real Kubernetes control plane on loopback.

etcd, kube-apiserver, kube-scheduler and kube-controller-manager all come from
the one binary that :mod:`gpuspawner_sandbox.build` compiles from the official
Go modules; each runs as its own child process with its output in
``<state_dir>/logs/<component>.log``. Nothing is emulated here: the API server
validates, admits and authorises (RBAC and the Node authorizer) exactly as in
a cluster, and the scheduler really counts ``nvidia.com/gpu``.

Every component listens on ``127.0.0.1`` (or another 127.0.0.0/8 address)
only, on ports picked free at start.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shutil
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from . import build, nodeconfig, pki, suitecosts
from .kubeapi import ApiError, KubeApi, kubeconfig
from .lifetime import dying_with_us
from .ports import free_port

#: Components in start order; stop runs the stages of STOP_ORDER in turn.
COMPONENTS = ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager")
STOP_ORDER = (("kube-controller-manager", "kube-scheduler"), ("kube-apiserver",), ("etcd",))

#: The Services' addresses (nodeconfig.SERVICE_CIDR): inside the pod range, so
#: pods reach them with the cluster network (kube-proxy), and nothing else does.
SERVICE_CIDR = str(nodeconfig.SERVICE_CIDR)
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"

#: Seconds a component gets to exit after SIGTERM before it is killed.
STOP_GRACE = 15.0

#: Starts tried when a port picked free is taken before a component binds it.
PORT_ATTEMPTS = 3

STATE_FILE = "controlplane.json"


class ControlPlaneError(Exception):
    """The control plane could not be started or reached; the message says why."""


def log_tail(path: Path, lines: int = 20) -> str:
    """The last lines of a log file ("" when it does not exist)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


class ControlPlane:
    """etcd + kube-apiserver + kube-scheduler + kube-controller-manager on loopback.

    Usable as a context manager (``with ControlPlane(dir) as cp: ...``).
    """

    #: When true (the default), the components are killed if the process that
    #: started them dies. The CLI turns it off so ``up`` can return.
    die_with_parent: bool = True

    def __init__(
        self,
        state_dir: Path,
        binary: Path | None = None,
        host: str = "127.0.0.1",
        api_address: str | None = None,
    ):
        if not ipaddress.ip_address(host).is_loopback:
            raise ValueError(
                f"{host} is not a loopback address; the sandbox listens on loopback only"
            )
        api_address = api_address or host
        if not (
            ipaddress.ip_address(api_address).is_loopback
            or ipaddress.ip_address(api_address) in nodeconfig.HOST_SERVICES_SUBNET
        ):
            raise ValueError(
                f"{api_address} is neither a loopback address nor one of the host's in the pod "
                f"range ({nodeconfig.HOST_SERVICES_SUBNET}); the sandbox listens nowhere else"
            )
        self.state_dir = Path(state_dir).resolve()
        self.binary = Path(binary) if binary is not None else build.binary_path()
        #: Where etcd, the scheduler and the controller manager listen.
        self.host = host
        #: Where the API server listens, and what it advertises: loopback, or with
        #: the cluster network an address of ours that pods reach too
        #: (nodeconfig.API_ADDRESS, on a link the real nodes create first).
        self.api_address = api_address
        self.ports: dict[str, int] = {}
        self.processes: dict[str, subprocess.Popen] = {}
        self.pki: pki.Pki | None = None
        self._admin_api: KubeApi | None = None

    # -- paths -------------------------------------------------------------

    @property
    def api_url(self) -> str:
        if "kube-apiserver" not in self.ports:
            raise ControlPlaneError("The control plane has not been started.")
        return f"https://{self.api_address}:{self.ports['kube-apiserver']}"

    @property
    def service_ip(self) -> str:
        """The "kubernetes" Service's ClusterIP: the first address of the service CIDR."""
        return str(next(ipaddress.ip_network(SERVICE_CIDR).hosts()))

    @property
    def admin_kubeconfig(self) -> Path:
        return self.state_dir / "admin.kubeconfig"

    @property
    def ca_file(self) -> Path:
        return self.state_dir / "pki" / "ca.crt"

    @property
    def log_dir(self) -> Path:
        return self.state_dir / "logs"

    def log_file(self, component: str) -> Path:
        return self.log_dir / f"{component}.log"

    # -- lifecycle ---------------------------------------------------------

    def __enter__(self) -> ControlPlane:
        self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    @suitecosts.recorded(suitecosts.CONTROL_PLANE)
    def start(self, timeout: float = 180) -> None:
        """Start every component and return once all of them are healthy.

        On any failure everything started so far is stopped and one
        ControlPlaneError says which component failed and shows its log.
        """
        if self.processes:
            raise ControlPlaneError("This control plane is already running.")
        if not self.binary.exists():
            raise ControlPlaneError(
                f"The control plane binary {self.binary} does not exist; "
                "build it with `python -m gpuspawner_sandbox.build`."
            )
        recorded = read_state(self.state_dir)
        if recorded and any(pid_is_ours(p, self.state_dir) for p in recorded["pids"].values()):
            raise ControlPlaneError(
                f"A control plane recorded in {self.state_dir} is still running; "
                "stop it first (gpuspawner-sandbox down)."
            )
        deadline = time.monotonic() + timeout
        for attempt in range(PORT_ATTEMPTS):
            try:
                self._start(deadline)
                return
            except ControlPlaneError as e:
                # A port picked free can be taken by someone else before the
                # component binds it; pick new ports and try again.
                if "address already in use" not in str(e) or attempt == PORT_ATTEMPTS - 1:
                    raise

    def _start(self, deadline: float) -> None:
        try:
            self._prepare()
            self._spawn("etcd", self._etcd_args())
            self._wait(deadline, "etcd", self._etcd_healthy)
            self._spawn("kube-apiserver", self._apiserver_args())
            self._wait(deadline, "kube-apiserver", self._apiserver_ready)
            self._spawn("kube-scheduler", self._scheduler_args())
            self._spawn("kube-controller-manager", self._controller_manager_args())
            for name in ("kube-scheduler", "kube-controller-manager"):
                self._wait(deadline, name, lambda n=name: self._component_healthy(n))
            # The controller manager's service-account controller creating the
            # default namespace's ServiceAccount shows it really works, and
            # pods in "default" can be admitted from now on.
            self._wait(
                deadline,
                "kube-controller-manager",
                lambda: self._exists("/api/v1/namespaces/default/serviceaccounts/default"),
            )
            self.write_state()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop every component: SIGTERM, then SIGKILL after a grace period."""
        for stage in STOP_ORDER:
            procs = [(n, self.processes[n]) for n in stage if n in self.processes]
            for _, proc in procs:
                _signal_group(proc.pid, signal.SIGTERM)
            for _, proc in procs:
                try:
                    proc.wait(STOP_GRACE)
                except subprocess.TimeoutExpired:
                    _signal_group(proc.pid, signal.SIGKILL)
                    proc.wait()
        self.processes.clear()
        self._admin_api = None
        with contextlib.suppress(FileNotFoundError):
            (self.state_dir / STATE_FILE).unlink()

    def running(self) -> dict[str, bool]:
        """Which of this object's components are alive."""
        return {name: proc.poll() is None for name, proc in self.processes.items()}

    # -- using it ----------------------------------------------------------

    def admin_api(self) -> KubeApi:
        """A REST client with cluster-admin (system:masters) credentials."""
        if self._admin_api is None:
            admin = self.pki.clients["admin"] if self.pki else None
            if admin is None:
                raise ControlPlaneError("The control plane has not been started.")
            self._admin_api = KubeApi(
                self.api_url, self.ca_file, cert_file=admin.cert, key_file=admin.key
            )
        return self._admin_api

    def apply_manifests(self, path: Path) -> None:
        """Apply every object in a (multi-document) YAML file as the admin.

        Server-side apply, so applying the same file twice is harmless.
        Namespaces go first so namespaced objects in the same file find theirs.
        """
        docs = [d for d in yaml.safe_load_all(Path(path).read_text()) if d]
        apply_objects(self.admin_api(), docs)

    def client_kubeconfig(
        self, user: str, groups: Iterable[str] = (), name: str | None = None
    ) -> Path:
        """A kubeconfig authenticating with a new client certificate for user/groups.

        For example ``client_kubeconfig("system:node:gpu-a100-0", ["system:nodes"])``
        gives the credentials a real kubelet on that node has.
        """
        if self.pki is None:
            raise ControlPlaneError("The control plane has not been started.")
        ca_key = pki.load_private_key(self.pki.ca.key)
        ca_cert = pki.load_certificate(self.pki.ca.cert)
        key, cert = pki.issue(ca_key, ca_cert, user, tuple(groups))
        stem = name or user.replace(":", "-")
        path = self.state_dir / f"{stem}.kubeconfig"
        self._write_kubeconfig(
            path,
            kubeconfig(
                stem,
                self.api_url,
                self.pki.ca.cert.read_bytes(),
                cert_pem=pki.cert_pem(cert),
                key_pem=pki.key_pem(key),
            ),
        )
        return path

    def service_account_kubeconfig(
        self, namespace: str, name: str, expiration_seconds: int = 7 * 24 * 3600
    ) -> Path:
        """A kubeconfig for a ServiceAccount, holding a TokenRequest token.

        The ServiceAccount must exist (apply its manifest first). The token
        authenticates as ``system:serviceaccount:<namespace>:<name>``, so the
        kubeconfig can do exactly what that account's RBAC bindings allow.
        """
        api = self.admin_api()
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": expiration_seconds},
        }
        try:
            result = api.post(f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token", body)
        except ApiError as e:
            raise ControlPlaneError(
                f"Cannot get a token for service account {namespace}/{name}: {e}"
            ) from None
        path = self.state_dir / f"sa-{namespace}-{name}.kubeconfig"
        self._write_kubeconfig(
            path,
            kubeconfig(
                f"system:serviceaccount:{namespace}:{name}",
                self.api_url,
                self.ca_file.read_bytes(),
                token=result["status"]["token"],
                namespace=namespace,
            ),
        )
        return path

    def wait_for_service_account(
        self, namespace: str, name: str = "default", timeout: float = 60
    ) -> None:
        """Wait until a ServiceAccount exists (the controller manager creates "default").

        Pods that name no account use "default", and admission rejects them
        until it exists: wait for it after creating a namespace.
        """
        path = f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}"
        deadline = time.monotonic() + timeout
        while not self._exists(path):
            if time.monotonic() > deadline:
                raise ControlPlaneError(
                    f"Service account {namespace}/{name} did not appear within {timeout:.0f}s."
                )
            time.sleep(0.2)

    # -- state file ---------------------------------------------------------

    def write_state(self) -> None:
        """Record pids, ports and paths so another process (``down``) can stop them."""
        state = {
            "binary": str(self.binary),
            "host": self.host,
            "api_url": self.api_url,
            "admin_kubeconfig": str(self.admin_kubeconfig),
            "ports": self.ports,
            "pids": {name: proc.pid for name, proc in self.processes.items()},
        }
        (self.state_dir / STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")

    # -- internals -----------------------------------------------------------

    def _prepare(self) -> None:
        # A fresh cluster every time: old etcd data signed with old keys is
        # of no use to anyone, and a sandbox should start from a known state.
        self.state_dir.mkdir(parents=True, exist_ok=True)
        for sub in ("pki", "etcd"):
            shutil.rmtree(self.state_dir / sub, ignore_errors=True)
        for old in self.state_dir.glob("*.kubeconfig"):
            old.unlink()  # credentials for a CA that no longer exists
        self.log_dir.mkdir(exist_ok=True)
        for component in COMPONENTS:
            self.log_file(component).unlink(missing_ok=True)
        taken: set[int] = set()
        for key in ("etcd", "etcd-peer", *COMPONENTS[1:]):
            host = self.api_address if key == "kube-apiserver" else self.host
            port = free_port(host)
            while port in taken:
                port = free_port(host)
            taken.add(port)
            self.ports[key] = port
        self.pki = pki.generate(
            self.state_dir / "pki", host=self.api_address, service_ip=self.service_ip
        )
        ca_pem = self.pki.ca.cert.read_bytes()
        for stem in ("admin", "kube-scheduler", "kube-controller-manager"):
            pair = self.pki.clients[stem]
            self._write_kubeconfig(
                self._kubeconfig_path(stem),
                kubeconfig(
                    stem,
                    self.api_url,
                    ca_pem,
                    cert_pem=pair.cert.read_bytes(),
                    key_pem=pair.key.read_bytes(),
                ),
            )

    def _kubeconfig_path(self, stem: str) -> Path:
        return self.admin_kubeconfig if stem == "admin" else self.state_dir / f"{stem}.kubeconfig"

    @staticmethod
    def _write_kubeconfig(path: Path, config: dict[str, Any]) -> None:
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        path.chmod(0o600)

    def _etcd_args(self) -> list[str]:
        return [
            f"--data-dir={self.state_dir / 'etcd'}",
            f"--host={self.host}",
            f"--client-port={self.ports['etcd']}",
            f"--peer-port={self.ports['etcd-peer']}",
            # A throwaway cluster: losing it on a power cut costs nothing,
            # and fsync dominates etcd's latency on slow disks.
            "--unsafe-no-fsync",
        ]

    def _apiserver_args(self) -> list[str]:
        p = self.pki
        assert p is not None
        return [
            f"--etcd-servers=http://{self.host}:{self.ports['etcd']}",
            f"--bind-address={self.api_address}",
            f"--secure-port={self.ports['kube-apiserver']}",
            f"--advertise-address={self.api_address}",
            # The reconciler publishes the advertised address as the "kubernetes"
            # Service's endpoint, which pods reach through kube-proxy; a loopback
            # address is invalid there and only accepted without it.
            "--endpoint-reconciler-type="
            + ("none" if ipaddress.ip_address(self.api_address).is_loopback else "lease"),
            f"--cert-dir={self.state_dir / 'pki' / 'apiserver'}",
            f"--tls-cert-file={p.apiserver.cert}",
            f"--tls-private-key-file={p.apiserver.key}",
            f"--client-ca-file={p.ca.cert}",
            f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
            f"--service-account-key-file={p.sa_public_key}",
            f"--service-account-signing-key-file={p.sa_private_key}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            # The aggregation layer's front proxy, configured as kubeadm does;
            # without it the scheduler and controller manager complain that
            # extension-apiserver-authentication lacks a request-header CA.
            f"--requestheader-client-ca-file={p.front_proxy_ca.cert}",
            f"--requestheader-allowed-names={pki.FRONT_PROXY_CLIENT}",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={p.front_proxy_client.cert}",
            f"--proxy-client-key-file={p.front_proxy_client.key}",
            # `kubectl logs`/`exec` reach real nodes' kubelets on their node IP
            # (a bridge address of ours), as the API server's own client.
            f"--kubelet-client-certificate={p.clients['apiserver-kubelet-client'].cert}",
            f"--kubelet-client-key={p.clients['apiserver-kubelet-client'].key}",
            "--kubelet-preferred-address-types=InternalIP",
            "--authorization-mode=Node,RBAC",
            # On top of the default admission plugins (ServiceAccount,
            # NamespaceLifecycle, LimitRanger, PodSecurity, ResourceQuota, ...).
            "--enable-admission-plugins=NodeRestriction",
            "--allow-privileged=true",
            "--profiling=false",
            # On SIGTERM, answer new requests 429 until those in flight are done,
            # then close the connections within 2 s. Without it the HTTP server
            # waits up to the 60 s request timeout for clients that keep their
            # connections (kubelets, watches), and `down` waited for its grace.
            "--shutdown-send-retry-after=true",
        ]

    def _common_component_args(self, component: str) -> list[str]:
        kubeconfig_path = self._kubeconfig_path(component)
        return [
            f"--kubeconfig={kubeconfig_path}",
            f"--authentication-kubeconfig={kubeconfig_path}",
            f"--authorization-kubeconfig={kubeconfig_path}",
            f"--bind-address={self.host}",
            f"--secure-port={self.ports[component]}",
            f"--cert-dir={self.state_dir / 'pki' / component}",
            # Health endpoints answer without credentials, as on a real cluster.
            "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics",
            # One instance: leader election would only add lease traffic and
            # a delay before the component starts working.
            "--leader-elect=false",
            "--profiling=false",
        ]

    def _scheduler_args(self) -> list[str]:
        return self._common_component_args("kube-scheduler")

    def _controller_manager_args(self) -> list[str]:
        p = self.pki
        assert p is not None
        return [
            *self._common_component_args("kube-controller-manager"),
            f"--root-ca-file={p.ca.cert}",
            f"--service-account-private-key-file={p.sa_private_key}",
            # Every controller acts with its own ServiceAccount, so RBAC
            # applies to them as in a real cluster.
            "--use-service-account-credentials=true",
            f"--cluster-signing-cert-file={p.ca.cert}",
            f"--cluster-signing-key-file={p.ca.key}",
            # Each controller's client is rate-limited (20 requests/s, bursts of
            # 30, by default); at start-up every controller fetches a token of its
            # own, so they started seconds apart: the default ServiceAccount came
            # about 5 s after the controller manager was healthy. One cluster on
            # one machine has the room.
            "--kube-api-qps=200",
            "--kube-api-burst=400",
        ]

    def _spawn(self, component: str, args: list[str]) -> None:
        log = self.log_file(component).open("ab")
        preexec = dying_with_us(self.die_with_parent)
        try:
            self.processes[component] = subprocess.Popen(
                [str(self.binary), component, *args],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.state_dir,
                # Own process group: a Ctrl-C in the terminal reaches us, and
                # we stop the components in order rather than all at once.
                start_new_session=True,
                preexec_fn=preexec,
                env=_component_env(),
            )
        finally:
            log.close()

    def _wait(self, deadline: float, component: str, check) -> None:
        """Poll ``check`` until true; fail fast if any component has exited."""
        while True:
            for name, proc in self.processes.items():
                rc = proc.poll()
                if rc is not None:
                    raise ControlPlaneError(
                        f"{name} exited with code {rc} while the control plane was starting; "
                        f"last lines of {self.log_file(name)}:\n{log_tail(self.log_file(name))}"
                    )
            try:
                if check():
                    return
            except (OSError, ApiError, ssl.SSLError):
                pass
            if time.monotonic() > deadline:
                raise ControlPlaneError(
                    f"{component} did not become healthy in time; "
                    f"last lines of {self.log_file(component)}:\n"
                    f"{log_tail(self.log_file(component))}"
                )
            time.sleep(0.25)

    def _etcd_healthy(self) -> bool:
        url = f"http://{self.host}:{self.ports['etcd']}/health"
        with urllib.request.urlopen(url, timeout=2) as resp:
            return json.loads(resp.read()).get("health") == "true"

    def _apiserver_ready(self) -> bool:
        return self.admin_api().request("GET", "/readyz", raw=True).body.strip() == "ok"

    def _component_healthy(self, component: str) -> bool:
        # The scheduler and controller manager serve a self-signed
        # certificate they generate themselves; only health is asked here.
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        url = f"https://{self.host}:{self.ports[component]}/healthz"
        try:
            with urllib.request.urlopen(url, context=ctx, timeout=2) as resp:
                return resp.read().decode().strip() == "ok"
        except urllib.error.HTTPError:
            return False

    def _exists(self, path: str) -> bool:
        try:
            self.admin_api().get(path)
        except ApiError as e:
            if e.status == 404:
                return False
            raise
        return True


def _component_env() -> dict[str, str]:
    env = dict(os.environ)
    # Proxies would send loopback traffic elsewhere; the components have
    # no business with any proxy.
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        env.pop(var, None)
    env["NO_PROXY"] = env["no_proxy"] = f"127.0.0.0/8,localhost,{nodeconfig.POD_RANGE}"
    return env


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


# -- applying manifests --------------------------------------------------------


def _api_prefix(api_version: str) -> str:
    return f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"


def _resource_for(api: KubeApi, api_version: str, kind: str, cache: dict) -> tuple[str, bool]:
    """(plural resource name, namespaced) for a kind, from the server's discovery."""
    if api_version not in cache:
        cache[api_version] = api.get(_api_prefix(api_version))["resources"]
    for res in cache[api_version]:
        if res["kind"] == kind and "/" not in res["name"]:
            return res["name"], res["namespaced"]
    raise ControlPlaneError(f"The API server does not know kind {kind} in {api_version}.")


def apply_objects(
    api: KubeApi, objects: list[dict[str, Any]], field_manager: str = "gpuspawner-sandbox"
) -> None:
    """Server-side apply each object (Namespaces first), as the given client."""
    cache: dict[str, list] = {}
    ordered = sorted(objects, key=lambda o: o.get("kind") != "Namespace")
    for obj in ordered:
        api_version, kind = obj["apiVersion"], obj["kind"]
        meta = obj.get("metadata", {})
        resource, namespaced = _resource_for(api, api_version, kind, cache)
        path = _api_prefix(api_version)
        if namespaced:
            path += f"/namespaces/{meta.get('namespace', 'default')}"
        path += f"/{resource}/{meta['name']}"
        try:
            api.request(
                "PATCH",
                path,
                json.dumps(obj),
                content_type="application/apply-patch+yaml",
                query={"fieldManager": field_manager, "force": "true"},
            )
        except ApiError as e:
            raise ControlPlaneError(f"Cannot apply {kind} {meta.get('name')}: {e}") from None


# -- a control plane started by another process ----------------------------------


def read_state(state_dir: Path) -> dict[str, Any] | None:
    """The state file a started control plane wrote, or None."""
    try:
        return json.loads((Path(state_dir) / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None


def pid_is_ours(pid: int, state_dir: Path) -> bool:
    """Whether pid is alive and still one of this state dir's components.

    Pids are reused; the command line tells ours apart from a stranger's.
    """
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return any(str(state_dir).encode() in arg for arg in cmdline)


def recorded_status(state_dir: Path) -> dict[str, bool]:
    """Component name -> alive, for the control plane recorded in state_dir."""
    state_dir = Path(state_dir).resolve()
    state = read_state(state_dir)
    if not state:
        return {}
    return {name: pid_is_ours(pid, state_dir) for name, pid in state["pids"].items()}


def stop_recorded(state_dir: Path, grace: float = STOP_GRACE) -> list[str]:
    """Stop the control plane recorded in state_dir; returns the components stopped."""
    state_dir = Path(state_dir).resolve()
    state = read_state(state_dir)
    if not state:
        return []
    stopped = []
    for stage in STOP_ORDER:
        pids = {n: state["pids"][n] for n in stage if n in state["pids"]}
        live = {n: pid for n, pid in pids.items() if pid_is_ours(pid, state_dir)}
        for pid in live.values():
            _signal_group(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while any(pid_is_ours(pid, state_dir) for pid in live.values()):
            if time.monotonic() > deadline:
                for pid in live.values():
                    if pid_is_ours(pid, state_dir):
                        _signal_group(pid, signal.SIGKILL)
                break
            time.sleep(0.1)
        stopped += list(live)
    (state_dir / STATE_FILE).unlink(missing_ok=True)
    return stopped
