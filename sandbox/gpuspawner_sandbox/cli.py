"""``gpuspawner-sandbox up|down|status``: the local GPU cluster from a shell.

``up`` builds what is missing, starts the control plane and the topology's
nodes as real nodes in the background, records what it started in
``<state-dir>`` and prints how to reach it; ``down`` stops everything recorded
there and restores the host; ``status`` says what runs.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from . import build, kubectl, nodebuild, nodeconfig, nodes
from .controlplane import (
    ControlPlane,
    ControlPlaneError,
    read_state,
    recorded_status,
    stop_recorded,
)
from .kueue import KueueError

DEFAULT_STATE_DIR = build.REPO_ROOT / ".cache" / "sandbox" / "state"
# -- commands ------------------------------------------------------------------


def cmd_up(args: argparse.Namespace) -> int:
    state_dir = args.state_dir.resolve()
    if any(recorded_status(state_dir).values()):
        print(f"The sandbox in {state_dir} is already running (see `gpuspawner-sandbox status`).")
        return 1
    if os.geteuid() != 0 and not args.no_kubelet:
        print(
            "error: real nodes need root (mount namespaces, cgroups, bridges): run it with sudo, "
            "or with --no-kubelet for the control plane alone.",
            file=sys.stderr,
        )
        return 1
    if args.kueue and args.no_kubelet:
        print(
            "error: Kueue runs on the nodes: --kueue needs them (drop --no-kubelet).",
            file=sys.stderr,
        )
        return 1
    binaries = None if args.no_kubelet else nodebuild.build_all()
    binary = binaries.k8s if binaries else build.build()
    # With real nodes, the API server listens on the host's link in the pod range
    # (the cluster network), which the nodes' prepare() makes first.
    cp = ControlPlane(state_dir, binary, api_address=nodeconfig.API_ADDRESS if binaries else None)
    cp.die_with_parent = args.foreground
    real = real_nodes(state_dir, cp, binaries, args) if binaries is not None else None
    if real is not None:
        real.prepare()
    print("Starting etcd, kube-apiserver, kube-scheduler and kube-controller-manager…", flush=True)
    started = time.monotonic()
    try:
        cp.start(timeout=args.timeout)
    except BaseException:
        if real is not None:
            real.stop()
        raise
    print(f"Control plane ready in {time.monotonic() - started:.1f}s at {cp.api_url}")
    if real is not None:
        start_real_nodes(real, cp, args)
        if args.kueue:
            start_kueue(real, cp, args)

    print(f"Logs: {cp.log_dir}")
    print("\n".join(kubectl.usage_lines(cp.admin_kubeconfig)))
    if not args.foreground:
        print("Stop it with: gpuspawner-sandbox down")
        return 0

    print("Running in the foreground; Ctrl-C stops everything.", flush=True)
    try:
        while all(cp.running().values()):
            time.sleep(1)
        dead = [n for n, alive in cp.running().items() if not alive]
        print(f"{', '.join(dead)} exited; see {cp.log_dir}. Stopping the rest.", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nStopping…", flush=True)
        return 0
    finally:
        if real is not None:
            real.stop()
        cp.stop()


def real_nodes(
    state_dir: Path, cp: ControlPlane, binaries: nodebuild.NodeBinaries, args: argparse.Namespace
) -> nodes.RealNodes:
    """The topology's nodes as real nodes (GPU nodes with our device plugin), with the
    cluster network; not started."""
    from .topology import TopologyError, load_topology

    try:
        topology = load_topology(args.topology)
    except (OSError, TopologyError) as e:
        raise nodes.NodeError(f"Cannot read the topology: {e}") from None
    real = nodes.RealNodes(
        state_dir,
        cp,
        binaries,
        [n.name for n in topology.nodes],
        specs={n.name: n for n in topology.nodes},
        device_list_strategy=args.device_list_strategy,
        cluster_network=True,
    )
    real.die_with_parent = args.foreground
    return real


def start_real_nodes(real: nodes.RealNodes, cp: ControlPlane, args: argparse.Namespace) -> None:
    """Start the prepared nodes; stops them and the control plane on failure."""
    print(
        f"Starting real nodes (kubelet, containerd, runc, CNI; device plugin on GPU nodes; "
        f"kube-proxy and CoreDNS): {', '.join(real.names)}…",
        flush=True,
    )
    try:
        real.start(timeout=args.timeout)
    except BaseException:
        real.stop()
        cp.stop()
        raise
    for name in real.names:
        exporter = real.dcgm_exporter(name)
        metrics = f"; DCGM metrics at http://{exporter}/metrics" if exporter else ""
        print(
            f"  {name} Ready in {real.started_in[name]:.1f}s (node IP {real.node_ip(name)}{metrics})"
        )


def start_kueue(real: nodes.RealNodes, cp: ControlPlane, args: argparse.Namespace) -> None:
    """Kueue and its queues on the started nodes (gpuspawner_sandbox.kueue); on failure
    the nodes and the control plane stop. Nothing of it is on the host: `down` stops
    it with the nodes."""
    from . import kueue
    from .demo import HUB_NAMESPACE

    print("Starting Kueue (building it first if needed)…", flush=True)
    try:
        running = kueue.deploy_kueue(real, HUB_NAMESPACE, preemption=args.kueue_preemption)
    except BaseException:
        real.stop()
        cp.stop()
        raise
    print(
        f"  Kueue {kueue.VERSION}: ClusterQueues {' and '.join(running.cluster_queues)} "
        f"(cohort {kueue.COHORT}), LocalQueue {running.local_queue} in {HUB_NAMESPACE}, "
        f"LocalQueue {running.batch_local_queue} in {running.batch_namespace}"
    )


def cmd_down(args: argparse.Namespace) -> int:
    state_dir = args.state_dir.resolve()
    # The control plane first: with real nodes its API server listens on their link.
    stopped = stop_recorded(state_dir)
    real = nodes.teardown(state_dir)
    if not stopped and not real:
        print(f"Nothing was running in {state_dir}.")
        return 0
    if real:
        print(f"Stopped the real nodes {', '.join(real)} and restored the host.")
    if stopped:
        print(f"Stopped {', '.join(stopped)}.")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    state_dir = args.state_dir.resolve()
    state = read_state(state_dir)
    components = recorded_status(state_dir)
    if not components:
        print(f"Not running (no control plane recorded in {state_dir}).")
        return 3
    for name, alive in components.items():
        print(f"{name:<26} {'running' if alive else 'NOT RUNNING'}")
    real = nodes.status(state_dir)
    for node, parts in real.items():
        for part, alive in parts.items():
            print(f"{f'{node}/{part}':<26} {'running' if alive else 'NOT RUNNING'}")
    print(f"API server: {state['api_url']}")
    print("\n".join(kubectl.usage_lines(Path(state["admin_kubeconfig"]))))
    healthy = all(components.values()) and all(a for p in real.values() for a in p.values())
    return 0 if healthy else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="gpuspawner-sandbox",
        description="A local Kubernetes cluster with real nodes over emulated GPUs, on loopback "
        "and bridges of its own.",
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=DEFAULT_STATE_DIR,
        help="where certificates, etcd data, kubeconfigs and logs live "
        f"(default {DEFAULT_STATE_DIR})",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="build if needed and start the sandbox")
    up.add_argument("--timeout", type=float, default=180, help="seconds to wait for health")
    up.add_argument(
        "--topology",
        type=Path,
        default=None,
        help="the nodes and their emulated GPUs (YAML; default: "
        "sandbox/gpuspawner_sandbox/topology.yaml)",
    )
    up.add_argument(
        "--no-kubelet", action="store_true", help="start the control plane only (no nodes)"
    )
    # the nodes are always real now; accepted for old scripts
    up.add_argument("--real-nodes", action="store_true", help=argparse.SUPPRESS)
    up.add_argument(
        "--device-list-strategy",
        choices=nodeconfig.DEVICE_LIST_STRATEGIES,
        default="envvar",
        help="how the GPU nodes' device plugin names devices to the runtime, "
        "as NVIDIA's plugin's flag (NVIDIA_VISIBLE_DEVICES, CDI annotations, or CRI CDI devices)",
    )
    up.add_argument(
        "--foreground", action="store_true", help="stay attached; Ctrl-C stops everything"
    )
    up.add_argument(
        "--kueue",
        action="store_true",
        help="also run Kueue with one ResourceFlavor per GPU type and the ClusterQueues "
        "notebooks and batch (docs/sandbox.md, 'Kueue')",
    )
    up.add_argument(
        "--kueue-preemption",
        action="store_true",
        help="with --kueue: the ClusterQueues preempt lower priorities and reclaim their "
        "cohort's quota (off by default)",
    )
    sub.add_parser("down", help="stop everything `up` started")
    sub.add_parser("status", help="say what runs")
    sub.add_parser(
        "demo",
        add_help=False,
        help="the cluster plus JupyterHub with GPUSpawner in front of it (see `demo --help`)",
    )
    args, rest = parser.parse_known_args(argv)
    if args.command == "demo":
        from .demo import main as demo_main

        return demo_main(rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    handlers = {"up": cmd_up, "down": cmd_down, "status": cmd_status}
    try:
        return handlers[args.command](args)
    except (build.BuildError, ControlPlaneError, nodes.NodeError, KueueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
