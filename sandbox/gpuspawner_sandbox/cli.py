"""``gpuspawner-sandbox up|down|status``: the local GPU cluster from a shell.

``up`` builds the control plane if needed, starts it in the background,
records what it started in ``<state-dir>/controlplane.json`` and prints how to
reach it; ``down`` stops everything recorded there; ``status`` says what runs.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from . import build, nodebuild, nodeconfig, nodes
from .controlplane import (
    STOP_GRACE,
    ControlPlane,
    ControlPlaneError,
    log_tail,
    pid_is_ours,
    read_state,
    recorded_status,
    stop_recorded,
)

DEFAULT_STATE_DIR = build.REPO_ROOT / ".cache" / "sandbox" / "state"
KUBELET_MODULE = "gpuspawner_sandbox.kubelet"
KUBELET_STATE = "kubelet.json"
#: The file the kubelet writes into its state dir once its nodes are registered
#: (gpuspawner_sandbox.kubelet.READY_FILE; not imported, to keep `status` light).
KUBELET_READY_FILE = "kubelet.ready"


# -- the local kubelet, started and stopped alongside the control plane ---------
#
# The kubelet (gpuspawner_sandbox.kubelet) owns the emulated GPU nodes. It is a
# separate process so that `up` can return; its pid is recorded in
# <state-dir>/kubelet.json and `down` stops it before the control plane.


def kubelet_available() -> bool:
    return importlib.util.find_spec(KUBELET_MODULE) is not None


def start_kubelet(
    state_dir: Path, kubeconfig: Path, topology: Path | None, timeout: float = 60
) -> int:
    """Start the local kubelet in the background, wait until its nodes are up; returns its pid."""
    log_path = state_dir / "logs" / "kubelet.log"
    log = log_path.open("ab")
    kubelet_dir = state_dir / "kubelet"
    kubelet_dir.mkdir(parents=True, exist_ok=True)
    (kubelet_dir / KUBELET_READY_FILE).unlink(missing_ok=True)
    cmd = [sys.executable, "-m", KUBELET_MODULE, "--kubeconfig", str(kubeconfig)]
    if topology is not None:
        cmd += ["--topology", str(topology)]
    cmd += ["--state-dir", str(kubelet_dir)]
    try:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    finally:
        log.close()
    (state_dir / KUBELET_STATE).write_text(json.dumps({"pid": proc.pid}) + "\n")
    deadline = time.monotonic() + timeout
    while not (kubelet_dir / KUBELET_READY_FILE).exists():
        if proc.poll() is not None:
            raise ControlPlaneError(
                f"The local kubelet exited with code {proc.returncode}; "
                f"last lines of {log_path}:\n{log_tail(log_path)}"
            )
        if time.monotonic() > deadline:
            raise ControlPlaneError(
                f"The local kubelet did not register its nodes within {timeout:.0f}s; "
                f"see {log_path}."
            )
        time.sleep(0.2)
    return proc.pid


def kubelet_pid(state_dir: Path) -> int | None:
    """The recorded kubelet's pid if it still runs."""
    try:
        pid = json.loads((state_dir / KUBELET_STATE).read_text())["pid"]
    except (OSError, ValueError, KeyError):
        return None
    return pid if pid_is_ours(pid, state_dir) else None


def stop_kubelet(state_dir: Path, grace: float = STOP_GRACE) -> bool:
    """Stop the recorded kubelet (SIGTERM, then SIGKILL); True if one ran."""
    pid = kubelet_pid(state_dir)
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while pid_is_ours(pid, state_dir) and time.monotonic() < deadline:
            time.sleep(0.1)
        if pid_is_ours(pid, state_dir):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
    (state_dir / KUBELET_STATE).unlink(missing_ok=True)
    return pid is not None


# -- commands ------------------------------------------------------------------


def cmd_up(args: argparse.Namespace) -> int:
    state_dir = args.state_dir.resolve()
    if any(recorded_status(state_dir).values()):
        print(f"The sandbox in {state_dir} is already running (see `gpuspawner-sandbox status`).")
        return 1
    if args.real_nodes and os.geteuid() != 0:
        print(
            "error: --real-nodes needs root (mount namespaces, cgroups, bridges); "
            "run it with sudo, or leave it out for the emulated nodes.",
            file=sys.stderr,
        )
        return 1
    binaries = nodebuild.build_all() if args.real_nodes else None
    binary = binaries.k8s if binaries else build.build()
    cp = ControlPlane(state_dir, binary)
    cp.die_with_parent = args.foreground
    print("Starting etcd, kube-apiserver, kube-scheduler and kube-controller-manager…", flush=True)
    started = time.monotonic()
    cp.start(timeout=args.timeout)
    print(f"Control plane ready in {time.monotonic() - started:.1f}s at {cp.api_url}")

    kubelet = None
    real = None
    if args.no_kubelet:
        pass
    elif binaries is not None:
        real = start_real_nodes(state_dir, cp, binaries, args)
    elif kubelet_available():
        try:
            kubelet = start_kubelet(state_dir, cp.admin_kubeconfig, args.topology)
        except ControlPlaneError:
            stop_kubelet(state_dir)
            cp.stop()
            raise
        where = args.topology or "the default topology"
        print(f"Local kubelet started (pid {kubelet}); its nodes from {where} are registered.")
    else:
        print("The local kubelet (gpuspawner_sandbox.kubelet) is not available: no nodes.")

    print(f"Logs: {cp.log_dir}")
    print(f"export KUBECONFIG={cp.admin_kubeconfig}")
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
        if kubelet is not None:
            stop_kubelet(state_dir)
        if real is not None:
            real.stop()
        cp.stop()


def start_real_nodes(
    state_dir: Path, cp: ControlPlane, binaries: nodebuild.NodeBinaries, args: argparse.Namespace
) -> nodes.RealNodes:
    """Start the topology's nodes as real nodes (GPU nodes with our device plugin);
    stops the control plane on failure."""
    from .topology import TopologyError, load_topology

    try:
        topology = load_topology(args.topology)
    except (OSError, TopologyError) as e:
        cp.stop()
        raise nodes.NodeError(f"Cannot read the topology: {e}") from None
    names = [n.name for n in topology.nodes]
    specs = {n.name: n for n in topology.nodes}
    real = nodes.RealNodes(
        state_dir,
        cp,
        binaries,
        names,
        specs=specs,
        device_list_strategy=args.device_list_strategy,
    )
    real.die_with_parent = args.foreground
    print(
        f"Starting real nodes (kubelet, containerd, runc, CNI; device plugin on GPU nodes): "
        f"{', '.join(names)}…",
        flush=True,
    )
    try:
        real.start(timeout=args.timeout)
    except BaseException:
        cp.stop()
        raise
    for name in names:
        exporter = real.dcgm_exporter(name)
        metrics = f"; DCGM metrics at http://{exporter}/metrics" if exporter else ""
        print(
            f"  {name} Ready in {real.started_in[name]:.1f}s (node IP {real.node_ip(name)}{metrics})"
        )
    return real


def cmd_down(args: argparse.Namespace) -> int:
    state_dir = args.state_dir.resolve()
    real = nodes.teardown(state_dir)
    had_kubelet = stop_kubelet(state_dir)
    stopped = stop_recorded(state_dir)
    if not stopped and not had_kubelet and not real:
        print(f"Nothing was running in {state_dir}.")
        return 0
    if real:
        print(f"Stopped the real nodes {', '.join(real)} and restored the host.")
    names = (["kubelet"] if had_kubelet else []) + stopped
    print(f"Stopped {', '.join(names)}.")
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
    kubelet = kubelet_pid(state_dir)
    if (state_dir / KUBELET_STATE).exists() or kubelet:
        print(f"{'kubelet':<26} {'running' if kubelet else 'NOT RUNNING'}")
    real = nodes.status(state_dir)
    for node, parts in real.items():
        for part, alive in parts.items():
            print(f"{f'{node}/{part}':<26} {'running' if alive else 'NOT RUNNING'}")
    print(f"API server: {state['api_url']}")
    print(f"export KUBECONFIG={state['admin_kubeconfig']}")
    healthy = all(components.values()) and all(a for p in real.values() for a in p.values())
    return 0 if healthy else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="gpuspawner-sandbox",
        description="A local Kubernetes control plane with emulated GPU nodes, on loopback.",
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
        help="the emulated nodes (YAML; default: sandbox/gpuspawner_sandbox/topology.yaml)",
    )
    up.add_argument("--no-kubelet", action="store_true", help="start the control plane only")
    up.add_argument(
        "--real-nodes",
        action="store_true",
        help="run the topology's nodes as real nodes (the kubelet, containerd, runc and CNI, "
        "and our device plugin over emulated GPUs on GPU nodes; needs root) instead of the "
        "emulated kubelet",
    )
    up.add_argument(
        "--device-list-strategy",
        choices=nodeconfig.DEVICE_LIST_STRATEGIES,
        default="envvar",
        help="with --real-nodes: how the GPU nodes' device plugin names devices to the runtime, "
        "as NVIDIA's plugin's flag (NVIDIA_VISIBLE_DEVICES, CDI annotations, or CRI CDI devices)",
    )
    up.add_argument(
        "--foreground", action="store_true", help="stay attached; Ctrl-C stops everything"
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
    except (build.BuildError, ControlPlaneError, nodes.NodeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
