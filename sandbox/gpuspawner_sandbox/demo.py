"""The local GPU cluster with a JupyterHub in front of it: the project's main command.

    make demo            (or: gpuspawner-sandbox demo)

Builds what is missing (the control plane, the node components, the notebook
image), starts the control plane and the topology's nodes as real nodes
(kubelet, containerd, runc, CNI; GPU nodes with our device plugin, NVIDIA's
runtime and the emulated driver), gives the hub the service account of
config/rbac.yaml (pods of its own namespace only; nodes cluster-wide), and
runs JupyterHub with GPUSpawner and
configurable-http-proxy (the public side on 127.0.0.1). Ctrl-C stops
everything and restores the host. The end-to-end tests start the same stack
through :class:`SandboxStack`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import time
from pathlib import Path

import yaml

from . import build, kubectl, kueue, nodebuild, nodeconfig, notebookimage, validationimage
from .controlplane import ControlPlane, ControlPlaneError
from .hubprocess import REPO, Hub, proxy_command, start_hub
from .kubeapi import ApiError
from .nodes import NodeError, RealNodes
from .prometheus import Prometheus, PrometheusMissing, start_prometheus

HUB_NAMESPACE = "jupyterhub"
HUB_SERVICE_ACCOUNT = "gpuspawner-hub"
RBAC_MANIFEST = REPO / "config" / "rbac.yaml"
#: The opt-in cluster-wide pod read (with c.GPUSpawner.gpu_inventory_all_namespaces = True);
#: only SandboxStack.opt_in_all_namespaces applies it.
ALL_NAMESPACES_RBAC_MANIFEST = REPO / "config" / "rbac-opt-in-all-namespaces.yaml"
#: The hub's and its services' Kueue reads (with kueue=True).
KUEUE_RBAC_MANIFEST = REPO / "config" / "rbac-kueue.yaml"
#: Tells config/sandbox/jupyterhub_config.py the ClusterQueues the culler and the GPU page read.
KUEUE_QUEUES_ENV = "GPUSPAWNER_SANDBOX_KUEUE_CLUSTER_QUEUES"
SANDBOX_HUB_CONFIG = REPO / "config" / "sandbox" / "jupyterhub_config.py"
SANDBOX_CATALOG = REPO / "config" / "sandbox" / "catalog.yaml"
#: Where the notebook image's layers (the private engine's data root) and archive are cached.
IMAGE_CACHE = build.image_cache_dir(REPO)
#: Tells config/sandbox/jupyterhub_config.py the address the hub listens on
#: (nodeconfig.HUB_ADDRESS), which notebooks reach.
HUB_ADDRESS_ENV = "GPUSPAWNER_SANDBOX_HUB_ADDRESS"
#: Tells config/sandbox/jupyterhub_config.py that the admin opted in to counting every
#: namespace's pods (SandboxStack.opt_in_all_namespaces).
ALL_NAMESPACES_ENV = "GPUSPAWNER_SANDBOX_ALL_NAMESPACES"
#: Tells config/sandbox/jupyterhub_config.py where the Prometheus over the DCGM exporters is.
PROMETHEUS_URL_ENV = "GPUSPAWNER_SANDBOX_PROMETHEUS_URL"
#: As often as the culler may look (its own checks are a minute apart), and cheap on 2 cores.
PROMETHEUS_SCRAPE_INTERVAL = "10s"
DEMO_CULLER_CONFIG = REPO / "config" / "sandbox" / "demo_culler_config.py"
DEMO_PASSWORD = "gpu"
#: With --kueue: the hub's GPU servers wait in Kueue's LocalQueue (gpuspawner_sandbox.kueue).
KUEUE_HUB_CONFIG = f"""
c.GPUSpawner.kueue_queue = {kueue.NOTEBOOK_LOCAL_QUEUE!r}
"""

# The story the demo tells (docs/culler.md, "Pressure"): idle servers hold every
# A100; whoever asks for A100s waits in the hub's queue ("1st in line for 2 ×
# NVIDIA A100"); the culler stops the idle holder whose GPUs let the request
# start, and the request starts at once; the holder reads why at their next visit.
STORY_HOLDERS = {"ada": 4, "bob": 4}
STORY_HUB_CONFIG = """
c.GPUSpawner.gpu_queue_enabled = True
c.GPUSpawner.gpu_queue_timeout = 600
# the wait in the queue is part of the start: leave it room
c.KubeSpawner.start_timeout = 660
"""


def start_story(hub: Hub, holders: dict[str, int] = STORY_HOLDERS, timeout: float = 120) -> None:
    """Start the story's idle A100 holders through the hub's API and wait until they run."""
    for user, gpus in holders.items():
        hub.api("POST", f"/users/{user}")
        r = hub.api(
            "POST",
            f"/users/{user}/server",
            {"profile": "pytorch", "gpu_type": "a100", "gpus": str(gpus)},
        )
        if r.status not in (201, 202, 400):  # 400: already running
            raise RuntimeError(f"the demo could not start {user}'s server: {r.body[:300]!r}")
    deadline = time.monotonic() + timeout
    waiting = set(holders)
    while waiting:
        for user in sorted(waiting):
            server = (hub.api("GET", f"/users/{user}").json().get("servers") or {}).get("")
            if server and server.get("ready"):
                waiting.discard(user)
        if waiting and time.monotonic() > deadline:
            raise RuntimeError(f"the demo's servers of {', '.join(sorted(waiting))} did not start")
        time.sleep(0.5)


class SandboxStack:
    """Control plane + real nodes + a hub whose only cluster access is its service account.

    The nodes are the topology's, as real nodes (kubelet, containerd, runc,
    CNI) holding the notebook image built here
    (:mod:`gpuspawner_sandbox.notebookimage`); the hub listens on the host's
    address in the pod range, which notebooks reach. Prometheus scrapes the GPU
    nodes' DCGM exporters every ``scrape_interval`` (the demo's 10 s by default).
    """

    def __init__(
        self,
        state_dir: Path,
        *,
        topology: Path | None = None,
        catalog: Path | None = None,
        extra_hub_config: str = "",
        public_port: int | None = None,
        binary: Path | None = None,
        hub_env: dict[str, str] | None = None,
        machine_wait: float = 0,
        scrape_interval: str = PROMETHEUS_SCRAPE_INTERVAL,
        kueue: bool = False,
        kueue_preemption: bool = False,
        emit=print,
    ):
        self.state_dir = state_dir.resolve()
        self.scrape_interval = scrape_interval
        #: Whether start_cluster() also starts Kueue and its queues (with preemption).
        self.kueue = kueue
        self.kueue_preemption = kueue_preemption
        self.running_kueue: kueue.Kueue | None = None
        self.topology = topology
        self.catalog = catalog
        self.extra_hub_config = extra_hub_config
        self.public_port = public_port
        self.binary = binary
        self.hub_env = dict(hub_env or {})
        #: The admin's opt-in to counting every namespace's pods (opt_in_all_namespaces).
        self.all_namespaces = False
        self.control_plane: ControlPlane | None = None
        self.hub: Hub | None = None
        self.hub_kubeconfig: Path | None = None
        self._token: str | None = None
        #: How long real nodes wait for another set on this machine to stop (tests wait).
        self.machine_wait = machine_wait
        self.emit = emit
        self.nodes: RealNodes | None = None
        self.prometheus: Prometheus | None = None
        self.notebook_images: notebookimage.NotebookImages | None = None
        #: The GPU check's image every node holds (images/validation), for validation_image.
        self.validation_image: str | None = None

    def start_cluster(self) -> None:
        from .topology import TopologyError, load_topology

        try:
            topology = load_topology(self.topology)
        except (OSError, TopologyError) as e:
            raise NodeError(f"Cannot read the topology: {e}") from None
        binaries = nodebuild.build_all(out=sys.stderr)
        # Built (or found cached) before anything starts: the catalog must name what nodes hold.
        images = notebookimage.ensure_notebook_images(IMAGE_CACHE, REPO, self.emit)
        catalog = self.catalog or SANDBOX_CATALOG
        missing = notebookimage.missing_from(
            notebookimage.catalog_images(catalog, REPO), images.refs
        )
        if missing:
            raise NodeError(
                f"The catalog {catalog} names {', '.join(missing)}, which the nodes will not "
                f"have: the notebook image is built as {', '.join(images.refs)}."
            )
        self.notebook_images = images
        try:
            check = validationimage.ensure_validation_image(IMAGE_CACHE, REPO, self.emit)
        except validationimage.ValidationImageError as e:
            raise NodeError(str(e)) from None
        self.validation_image = check.ref
        cp = ControlPlane(
            self.state_dir, self.binary or binaries.k8s, api_address=nodeconfig.API_ADDRESS
        )
        self.control_plane = cp
        names = [n.name for n in topology.nodes]
        self.nodes = RealNodes(
            self.state_dir,
            cp,
            binaries,
            names,
            specs={n.name: n for n in topology.nodes},
            images=[images.archive, check.archive],
            cluster_network=True,
            machine_wait=self.machine_wait,
            emit=self.emit,
        )
        # The host's link first: the API server listens on it.
        self.nodes.prepare()
        cp.start()
        self.emit(f"Starting real nodes: {', '.join(names)}…")
        self.nodes.start()
        self.hub_env.setdefault(HUB_ADDRESS_ENV, nodeconfig.HUB_ADDRESS)
        self._start_prometheus()
        self._hub_account(cp)
        if self.kueue:
            self.emit("Starting Kueue and its queues…")
            self.running_kueue = kueue.deploy_kueue(
                self.nodes, HUB_NAMESPACE, preemption=self.kueue_preemption, emit=self.emit
            )
            cp.apply_manifests(KUEUE_RBAC_MANIFEST)
            self.hub_env.setdefault(KUEUE_QUEUES_ENV, ",".join(self.running_kueue.cluster_queues))

    def _start_prometheus(self) -> None:
        """A real Prometheus over every GPU node's DCGM exporter, for the culler and admin page."""
        assert self.nodes is not None
        targets = [t for n in self.nodes.names if (t := self.nodes.dcgm_exporter(n))]
        if not targets:
            return
        self.emit(f"Starting Prometheus over {len(targets)} DCGM exporters…")
        self.prometheus = start_prometheus(
            self.state_dir / "prometheus", targets, scrape_interval=self.scrape_interval
        )
        self.hub_env.setdefault(PROMETHEUS_URL_ENV, self.prometheus.url)

    def _hub_account(self, cp: ControlPlane) -> None:
        cp.apply_manifests(RBAC_MANIFEST)
        cp.wait_for_service_account(HUB_NAMESPACE, HUB_SERVICE_ACCOUNT)
        self.hub_kubeconfig = cp.service_account_kubeconfig(HUB_NAMESPACE, HUB_SERVICE_ACCOUNT)

    def opt_in_all_namespaces(self, on: bool = True) -> None:
        """Opt in, as an admin does, to figures that count every namespace's pods, or opt out.

        Both halves: the cluster-wide pod read (config/rbac-opt-in-all-namespaces.yaml,
        applied now, or deleted) and ``c.GPUSpawner.gpu_inventory_all_namespaces``, which
        the hub and its gpuspawner service get from the hub's next start.
        """
        cp = self.control_plane
        assert cp is not None, "start_cluster() first"
        self.all_namespaces = on
        if on:
            cp.apply_manifests(ALL_NAMESPACES_RBAC_MANIFEST)
            return
        # The binding first: once it is gone nothing grants the read, whatever the role.
        api = cp.admin_api()
        docs = [d for d in yaml.safe_load_all(ALL_NAMESPACES_RBAC_MANIFEST.read_text()) if d]
        for doc in sorted(docs, key=lambda d: d["kind"] != "ClusterRoleBinding"):
            plural = (
                "clusterrolebindings" if doc["kind"] == "ClusterRoleBinding" else "clusterroles"
            )
            try:
                api.delete(f"/apis/rbac.authorization.k8s.io/v1/{plural}/{doc['metadata']['name']}")
            except ApiError as e:
                if e.status != 404:  # 404: never applied, or already taken back
                    raise

    def _hub_settings(self, extra: str) -> tuple[str, dict[str, str]]:
        assert self.hub_kubeconfig is not None, "start_cluster() first"
        env = {**self.hub_env, "KUBECONFIG": str(self.hub_kubeconfig)}
        if self.catalog is not None:
            env["GPUSPAWNER_CATALOG"] = str(self.catalog)
        if self.all_namespaces:
            # The sandbox config sets c.GPUSpawner.gpu_inventory_all_namespaces from it
            # before it adds the gpuspawner service, which follows the setting (a setting
            # made here, outside that sub-config, would reach the hub but not the service).
            env[ALL_NAMESPACES_ENV] = "1"
        config = (
            f"c.DummyAuthenticator.password = {DEMO_PASSWORD!r}\n"
            f"load_subconfig({str(SANDBOX_HUB_CONFIG)!r})\n{self.extra_hub_config}\n{extra}"
        )
        return config, env

    def start_hub(self, timeout: float = 90) -> Hub:
        """Start (or restart: same database, same token) the hub."""
        config, env = self._hub_settings("")
        hub = start_hub(
            self.state_dir / "hub",
            extra_config=config,
            env=env,
            timeout=timeout,
            public_port=self.public_port,
            token=self._token,
        )
        if hub.process.poll() is not None:
            raise ControlPlaneError(
                f"JupyterHub exited during start; its log:\n{hub.log()[-3000:]}"
            )
        self._token = hub.token
        self.public_port = int(hub.public_url.rsplit(":", 1)[1])
        self.hub = hub
        return hub

    def start_second_hub(self, name: str, extra_config: str, timeout: float = 90) -> Hub:
        """Another hub on the same cluster and service account, with extra settings; the caller stops it."""
        config, env = self._hub_settings(extra_config)
        hub = start_hub(self.state_dir / name, extra_config=config, env=env, timeout=timeout)
        if hub.process.poll() is not None:
            raise ControlPlaneError(
                f"JupyterHub exited during start; its log:\n{hub.log()[-3000:]}"
            )
        return hub

    def stop_hub(self) -> None:
        if self.hub is not None:
            self.hub.stop()
            self.hub = None

    def stop(self) -> None:
        """Stop the hub, Prometheus, the nodes (restoring the host) and the control plane."""
        self.stop_hub()
        if self.prometheus is not None:
            self.prometheus.stop()
            self.prometheus = None
        # Kueue runs on the nodes: it stops with them.
        self.running_kueue = None
        if self.nodes is not None:
            self.nodes.stop()
            self.nodes = None
        if self.control_plane is not None:
            self.control_plane.stop()

    def __enter__(self) -> SandboxStack:
        try:
            self.start_cluster()
            self.start_hub()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()


def _prerequisites() -> str | None:
    """What stops the demo before anything starts, in one sentence; None if nothing."""
    if os.geteuid() != 0:
        return (
            "The demo runs real nodes (mount namespaces, cgroups, bridges), which needs root: "
            "run it with sudo."
        )
    try:
        build.find_go()
        nodebuild.find_runc()
        proxy_command()
    except (build.BuildError, RuntimeError) as e:
        return str(e)
    return None


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="gpuspawner-sandbox demo",
        description="Start the local GPU cluster and a JupyterHub with GPUSpawner in front of it.",
    )
    parser.add_argument("--state-dir", type=Path, default=REPO / ".cache" / "sandbox" / "demo")
    parser.add_argument("--port", type=int, default=8000, help="the hub's port on 127.0.0.1")
    parser.add_argument("--topology", type=Path, default=None, help="GPU node topology YAML")
    parser.add_argument(
        "--catalog",
        type=Path,
        default=None,
        help="catalog YAML (default config/sandbox/catalog.yaml)",
    )
    parser.add_argument(
        "--real-nodes",
        action="store_true",
        help=argparse.SUPPRESS,  # the nodes are always real now; accepted for old scripts
    )
    parser.add_argument(
        "--machine-wait",
        type=float,
        default=0,
        metavar="SECONDS",
        help="how long to wait for other real nodes on this machine (a test run, another demo) "
        "to stop; by default the demo refuses at once and says how to stop them",
    )
    parser.add_argument(
        "--no-story",
        action="store_true",
        help="start no idle A100 holders and no queue: just the cluster and the hub",
    )
    parser.add_argument(
        "--pressure-timeout",
        type=int,
        default=120,
        help="seconds an idle server holds GPUs others wait for before the culler stops it",
    )
    parser.add_argument(
        "--kueue",
        action="store_true",
        help="queue GPU servers in Kueue (ClusterQueues notebooks and batch, LocalQueue "
        f"{kueue.NOTEBOOK_LOCAL_QUEUE} in the hub's namespace; docs/sandbox.md, 'Kueue')",
    )
    parser.add_argument(
        "--kueue-preemption",
        action="store_true",
        help="with --kueue: Kueue preempts lower priorities and reclaims its cohort's quota",
    )
    args = parser.parse_args(argv)

    # Ctrl-C, and `kill` from another terminal, stop everything in order
    # (also when started from a script that ignores SIGINT).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _interrupt)
    problem = _prerequisites()
    if problem:
        print(problem, file=sys.stderr)
        return 1
    story = not args.no_story
    stack = SandboxStack(
        args.state_dir,
        topology=args.topology,
        catalog=args.catalog,
        public_port=args.port,
        extra_hub_config=(STORY_HUB_CONFIG if story else "")
        + (KUEUE_HUB_CONFIG if args.kueue else ""),
        hub_env={
            "GPUSPAWNER_CULLER_CONFIG": str(DEMO_CULLER_CONFIG),
            "GPUSPAWNER_DEMO_PRESSURE_TIMEOUT": str(args.pressure_timeout),
        }
        if story
        else {},
        machine_wait=args.machine_wait,
        kueue=args.kueue,
        kueue_preemption=args.kueue_preemption,
        emit=lambda line: print(line, flush=True),
    )
    started = time.monotonic()
    try:
        print(
            "Starting the local GPU cluster (etcd, kube-apiserver, scheduler, controller manager, "
            "then the nodes: kubelet, containerd, runc, CNI)…",
            flush=True,
        )
        stack.start_cluster()
        print(
            f"Cluster ready in {time.monotonic() - started:.0f}s; starting JupyterHub…", flush=True
        )
        hub = stack.start_hub()
    except (
        ControlPlaneError,
        build.BuildError,
        RuntimeError,
        NodeError,
        notebookimage.NotebookImageError,
        PrometheusMissing,
        kueue.KueueError,
    ) as e:
        print(f"The demo could not start: {e}", file=sys.stderr)
        stack.stop()
        return 1
    except KeyboardInterrupt:
        stack.stop()
        return 130
    shell = [
        *kubectl.usage_lines(stack.control_plane.admin_kubeconfig),
        kubectl.typed("-n", HUB_NAMESPACE, "exec", "jupyter-<name>", "--", "nvidia-smi", "-L"),
    ]
    print(
        f"\nJupyterHub with GPUSpawner is running at {hub.public_url}/\n"
        f"Log in as any user name with the password '{DEMO_PASSWORD}' ('admin' has no GPU limit,\n"
        "'student' may use 1 A100), pick 'PyTorch' with 2 × NVIDIA H100, and open a terminal:\n"
        "`nvidia-smi` lists the two GPUs the cluster allocated to you.\n"
        "The cluster from a shell (the last line with a user's name: their server's GPUs):\n"
        + "".join(f"  {line}\n" for line in shell)
        + "Press Ctrl-C to stop everything.",
        flush=True,
    )
    if story:
        try:
            start_story(hub)
        except RuntimeError as e:
            print(f"The demo's story could not start: {e}", file=sys.stderr)
        except KeyboardInterrupt:
            print("\nStopping JupyterHub, the nodes and the control plane…", flush=True)
            with contextlib.suppress(Exception):
                stack.stop()
            return 0
        else:
            holders = " and ".join(STORY_HOLDERS)
            print(
                f"\nThe story: {holders} hold all 8 A100s with idle servers. Ask for 2 × NVIDIA A100:\n"
                "you wait in line (the progress page says where). Within about "
                f"{args.pressure_timeout // 60 + 1} minutes the culler\n"
                "stops the idle holder whose GPUs let your request start, and your server starts.\n"
                f"Log in as {next(iter(STORY_HOLDERS))} or {list(STORY_HOLDERS)[-1]} to read why "
                "their server stopped. (--no-story: none of this.)",
                flush=True,
            )
    try:
        while hub.process.poll() is None:
            time.sleep(1)
        print(
            f"JupyterHub exited; its log is {hub.log_path}. Stopping the cluster.", file=sys.stderr
        )
        return 1
    except KeyboardInterrupt:
        print("\nStopping JupyterHub, the nodes and the control plane…", flush=True)
        return 0
    finally:
        with contextlib.suppress(Exception):
            stack.stop()


if __name__ == "__main__":
    sys.exit(main())
