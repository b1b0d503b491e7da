"""Real nodes: start-up time and idle memory per node and per pod.

    sudo .venv/bin/python benchmarks/real_nodes.py [--nodes 2] [--pods 5] [--idle-seconds 20] \
        [--node-status-update-frequency 1s] [--machine-wait SECONDS] [--smoke]

Starts the sandbox's real control plane, then ``--nodes`` real nodes (the
kubelet, containerd, runc, CNI; gpuspawner_sandbox.nodes), and measures:

* each node's start-up: from creating its directories, cgroups and bridge to
  the Node being Ready in the API (nodes start one after the other, so the
  figure includes the node's own image import);
* idle memory (RSS from /proc) of each node's containerd and kubelet after
  ``--idle-seconds``;
* memory per running pod: ``--pods`` pods (the test tool's ``sleep``) on the
  first node, the increase of all processes of that node (shims, pause and
  the containers themselves) divided by the number of pods;
* CPU of an idle node (containerd + kubelet), over ``--idle-seconds``, with the kubelets
  computing their node status as often as ``--node-status-update-frequency``
  says (the sandbox's 1 s by default; the kubelet's own default is 10 s).

Writes Markdown to stdout. Needs root; builds what is missing first.
``--smoke`` (one node, one pod, 1 s idle) runs every step once for the tests
(benchmarks/benchlib.py: ``--smoke``, ``--fail-after``, and the teardown on every
exit path).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

from benchlib import Steps, add_arguments, add_machine_wait, guarded, run, sizes, work_dir

from gpuspawner_sandbox import nodebuild, nodeconfig, nodes, topology
from gpuspawner_sandbox.controlplane import ControlPlane
from gpuspawner_sandbox.lifetime import alive

#: --fail-after's steps, in order.
STEPS = ("control-plane", "nodes", "idle", "pods")


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def node_pids(rn: nodes.RealNodes, name: str) -> set[int]:
    """Every process of the node: its mount namespace (containerd, kubelet, shims) and its pods."""
    rec = rn.state["nodes"][name]
    found = nodes._namespace_pids(rec["mntns"]) | nodes._cgroup_pids(rec["cgroups"])
    return {p for p in found if alive(p)}


def total_rss(pids: set[int]) -> int:
    total = 0
    for pid in pids:
        try:
            total += rss_kib(pid)
        except OSError:
            pass
    return total


def pod(name: str, node: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "sleep",
                    "image": nodeconfig.TOOL_IMAGE,
                    "imagePullPolicy": "Never",
                    "args": ["sleep", "infinity"],
                }
            ],
        },
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, help="real nodes (2; --smoke: 1)")
    parser.add_argument("--pods", type=int, help="pods on the first node (5; --smoke: 1)")
    parser.add_argument(
        "--idle-seconds", type=float, help="each idle measurement's length (20; --smoke: 1)"
    )
    parser.add_argument(
        "--node-status-update-frequency", default=topology.NODE_STATUS_UPDATE_FREQUENCY
    )
    add_machine_wait(parser)
    add_arguments(parser, STEPS)
    args = parser.parse_args()
    sizes(
        args,
        full={"nodes": 2, "pods": 5, "idle_seconds": 20.0},
        smoke={"nodes": 1, "pods": 1, "idle_seconds": 1.0},
    )
    steps = Steps(args)
    binaries = nodebuild.build_all()
    names = [f"bench-{i}" for i in range(args.nodes)]
    specs = topology.parse_topology(
        {
            "nodes": [
                {"name": n, "node_status_update_frequency": args.node_status_update_frequency}
                for n in names
            ]
        }
    )
    hz = os.sysconf("SC_CLK_TCK")
    with guarded() as started:
        tmp = work_dir(
            Path(started.enter_context(tempfile.TemporaryDirectory(prefix="real-nodes-bench-")))
        )
        cp = started.enter_context(ControlPlane(tmp, binaries.k8s))
        cp.wait_for_service_account("default")
        steps.done("control-plane")
        rn = started.enter_context(
            nodes.RealNodes(
                tmp,
                cp,
                binaries,
                names,
                specs={n.name: n for n in specs.nodes},
                machine_wait=args.machine_wait,
            )
        )
        steps.done("nodes")
        time.sleep(args.idle_seconds)
        rows = []
        for name in names:
            pids = rn.state["nodes"][name]["pids"]
            ticks = {c: cpu_ticks(pids[c]) for c in ("containerd", "kubelet")}
            rows.append((name, {c: rss_kib(pids[c]) for c in ticks}, ticks))
        time.sleep(args.idle_seconds)
        cpu = {
            name: sum(cpu_ticks(rn.state["nodes"][name]["pids"][c]) - t for c, t in ticks.items())
            / hz
            / args.idle_seconds
            for name, _, ticks in rows
        }
        steps.done("idle")

        first = names[0]
        before = total_rss(node_pids(rn, first))
        api = cp.admin_api()
        for i in range(args.pods):
            api.post("/api/v1/namespaces/default/pods", pod(f"idle-{i}", first))
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            items = api.get("/api/v1/namespaces/default/pods")["items"]
            if sum(p["status"].get("phase") == "Running" for p in items) == args.pods:
                break
            time.sleep(0.5)
        else:
            print("pods did not all run within 180 s", file=sys.stderr)
            return 1
        time.sleep(min(5.0, args.idle_seconds))  # let the new processes' memory settle
        after = total_rss(node_pids(rn, first))
        per_pod = (after - before) / args.pods
        started_in = dict(rn.started_in)
        steps.done("pods")

    print(f"Machine: {os.cpu_count()} CPUs, {platform.machine()}, Linux {platform.release()}")
    print(f"Kubelets compute their node status every {args.node_status_update_frequency}\n")
    print("| node | start → Ready | containerd RSS | kubelet RSS | idle CPU (both) |")
    print("|---|---|---|---|---|")
    for name, rss, _ in rows:
        print(
            f"| {name} | {started_in[name]:.1f} s | {rss['containerd'] / 1024:.0f} MiB "
            f"| {rss['kubelet'] / 1024:.0f} MiB | {cpu[name] * 100:.1f} % of a core |"
        )
    print(
        f"\nPer running pod ({args.pods} `sleep` pods on {first}; shim + pause + container): "
        f"{per_pod / 1024:.1f} MiB"
    )
    return 0


if __name__ == "__main__":
    run(main)
