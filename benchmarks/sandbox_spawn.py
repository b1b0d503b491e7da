"""Spawn latency on the local GPU cluster: GPUSpawner vs KubeSpawner, 50 users at once, start-up.

    sudo .venv/bin/python benchmarks/sandbox_spawn.py [--rounds 8] [--ratio-only]
                                                      [--without-evented-pleg] [--smoke]

One sandbox (the real control plane and the default topology as real nodes:
kubelet, containerd, NVIDIA's runtime, the notebook image built here; needs
root), two hubs on it with the same service account: one with GPUSpawner (catalog, limits, the nvidia-smi
init container), one with plain KubeSpawner configured by hand for the same
pod (nvidia.com/gpu limit, node selector, toleration, same command). Spawns
alternate between them; latency is request -> server ready (the REST call
returns when the server answers, or the hub is polled when it takes longer).
Then 50 users spawn on the GPUSpawner hub at once, 16 of them asking for a GPU
and also, at the same moment, for a second GPU server beyond their limit of 1;
each follows its server's progress event stream, as a browser's spawn page does.
It also measures the memory each running notebook costs: the
RSS of every process of the CPU node (containerd, kubelet, shims, pause and
the notebooks) with the servers running, less the same with none, divided by
the number of notebooks there.
`--ratio-only` stops after the alternating spawns. The default topology turns
on the kubelet's EventedPLEG gate (alpha; docs/sandbox.md, "Topology"), so that
the kubelet sees the GPU check's init container exit at once rather than at its
next one-second relist; `--without-evented-pleg` runs the same topology without
it, as kubelets run by default.
`--smoke` runs every step once for the tests: one warm-up spawn per hub, one
round, and a burst of 3 users (1 x A100, 1 x H100, 1 CPU-only; 5 requests).
Whatever ends the run, both hubs, Prometheus, the nodes (the host restored) and
the control plane are stopped before it exits (benchmarks/benchlib.py).
Prints Markdown for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml
from benchlib import Steps, add_arguments, add_machine_wait, guarded, run, sizes, work_dir
from real_nodes import cpu_ticks, node_pids, total_rss

from gpuspawner_sandbox.demo import SANDBOX_CATALOG, SandboxStack
from gpuspawner_sandbox.hubprocess import descendants
from gpuspawner_sandbox.topology import DEFAULT_TOPOLOGY

#: The CPU-only node of the default topology, where the burst's CPU-only servers run.
CPU_NODE = "cpu-0"

#: --fail-after's steps, in order ("burst-sent": the burst's requests are in flight).
STEPS = ("cluster", "hubs", "warm-up", "rounds", "burst-sent", "burst")

#: The burst's users: (asking for 1 x A100, for 1 x H100, CPU-only), real run and --smoke.
BURST_USERS = (8, 8, 34)
SMOKE_BURST_USERS = (1, 1, 1)

CATALOG = """
images:
  pytorch: {{display_name: PyTorch, image: "{image}", cuda: "{cuda}"}}
gpu_types:
  a100: {{display_name: NVIDIA A100, node_selector: {{nvidia.com/gpu.product: NVIDIA-A100-SXM4-80GB}}}}
  h100: {{display_name: NVIDIA H100, node_selector: {{nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3}}}}
limits: {{default: 1}}
"""

KUBESPAWNER_HUB = """
c.JupyterHub.spawner_class = "kubespawner.KubeSpawner"
c.KubeSpawner.image = "{image}"
c.KubeSpawner.extra_resource_limits = {{"nvidia.com/gpu": "1"}}
c.KubeSpawner.extra_resource_guarantees = {{"nvidia.com/gpu": "1"}}
c.KubeSpawner.node_selector = {{"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}}
c.KubeSpawner.tolerations = [{{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}}]
"""


def spawn(hub, user, body, name="", timeout=180, follow=False):
    """Seconds from the request to a ready server (or None if refused), and the HTTP status.

    The hub's REST call returns 201 when the server answers within its
    slow_spawn_timeout, else 202. Then either the hub's user model is polled
    (10 times a second: the single spawns, where it rarely happens), or, with
    ``follow``, the server's progress event stream is read as the spawn page of
    a browser reads it (the 50-user burst: 66 clients polling would load the hub).
    """
    hub.api("POST", f"/users/{user}")
    path = f"/users/{user}/servers/{name}" if name else f"/users/{user}/server"
    t0 = time.perf_counter()
    r = hub.api("POST", path, body)
    if r.status == 201:
        return time.perf_counter() - t0, r.status
    if r.status != 202:
        return None, r.status
    if follow:
        outcome = follow_progress(hub, f"{path}/progress", timeout)
        return (time.perf_counter() - t0 if outcome == 200 else None), outcome
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        server = hub.api("GET", f"/users/{user}").json()["servers"].get(name)
        if server and server["ready"]:
            return time.perf_counter() - t0, r.status
        if server is None:
            return None, 500
        time.sleep(0.1)
    return None, 504


def follow_progress(hub, path: str, timeout: float) -> int:
    """Read a server's progress events until it is ready (200), failed (500) or the stream ends (502)."""
    request = urllib.request.Request(
        f"{hub.public_url}/hub/api{path}",
        headers={"Authorization": f"token {hub.token}", "Accept": "text/event-stream"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as stream:
            for line in stream:
                if not line.startswith(b"data:"):
                    continue
                event = json.loads(line[len(b"data:") :])
                if event.get("ready"):
                    return 200
                if event.get("failed"):
                    return 500
    except urllib.error.HTTPError as e:
        return e.code
    except TimeoutError:
        return 504
    return 502


def stop(hub, user, name=""):
    path = f"/users/{user}/servers/{name}" if name else f"/users/{user}/server"
    hub.api("DELETE", path)
    while hub.api("GET", f"/users/{user}").json()["servers"].get(name):
        time.sleep(0.1)


TICK = os.sysconf("SC_CLK_TCK")


def machine_busy_s() -> float:
    """CPU seconds the whole machine has spent busy (everything but idle and iowait)."""
    fields = [int(f) for f in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / TICK


def pods_cpu_s(names) -> float:
    """CPU seconds of every pod of the nodes (their cgroup roots' cpuacct)."""
    from gpuspawner_sandbox import hoststate, nodeconfig

    total = 0
    for mount in hoststate.cgroup_mounts():
        if (mount / "cpuacct.usage").exists():
            for name in names:
                usage = mount / nodeconfig.cgroup_root(name).strip("/") / "cpuacct.usage"
                total += int(usage.read_text())
            return total / 1e9
    return float("nan")


def tree(pid: int) -> set[int]:
    """A process and its live descendants."""
    return {pid, *descendants(pid)}


def ticks(pids) -> dict[int, int]:
    out = {}
    for pid in pids:
        try:
            out[pid] = cpu_ticks(pid)
        except OSError:
            pass
    return out


def cpu_snapshot(stack, hub) -> dict:
    """What the CPU breakdown of a burst compares: per part, CPU ticks by pid (or seconds)."""
    return {
        "machine": machine_busy_s(),
        "pods": pods_cpu_s(stack.nodes.names),
        "hub": ticks(tree(hub.process.pid)),
        "control plane": ticks(p.pid for p in stack.control_plane.processes.values()),
        "node daemons": ticks(p for name in stack.nodes.names for p in nodes_of(stack, name)),
    }


def nodes_of(stack, name: str) -> set[int]:
    """The node's own processes (containerd, kubelet, shims, plugin, exporter), not its pods."""
    from gpuspawner_sandbox import nodes

    rec = stack.nodes.state["nodes"][name]
    pods = nodes._cgroup_pids(rec["cgroups"])
    return {p for p in nodes._namespace_pids(rec["mntns"]) if p not in pods}


def cpu_breakdown(before: dict, after: dict) -> dict[str, float]:
    """CPU seconds per part between two snapshots; 'the rest' is the machine's remainder."""

    def delta(a: dict[int, int], b: dict[int, int]) -> float:
        return sum(t - a.get(pid, 0) for pid, t in b.items()) / TICK

    parts = {
        "notebook pods (Jupyter, GPU checks, pause)": after["pods"] - before["pods"],
        "JupyterHub, its proxy and services": delta(before["hub"], after["hub"]),
        "control plane (etcd, API server, scheduler, controllers)": delta(
            before["control plane"], after["control plane"]
        ),
        "nodes' containerd, kubelet, shims, plugins": delta(
            before["node daemons"], after["node daemons"]
        ),
    }
    total = after["machine"] - before["machine"]
    parts["the rest (runc, CNI, NVIDIA hook, kube-proxy, Prometheus, this client, kernel)"] = (
        total - sum(parts.values())
    )
    parts["the whole machine"] = total
    return parts


def pct(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


def notebook_image() -> tuple[str, str]:
    """The image both hubs start and its CUDA version: the one the nodes hold."""
    pytorch = yaml.safe_load(SANDBOX_CATALOG.read_text())["images"]["pytorch"]
    return pytorch["image"], str(pytorch["cuda"])


def burst(
    stack, gpu_hub, idle_node_kib: int, steps: Steps, users: tuple[int, int, int] = BURST_USERS
) -> list[str]:
    """Users at once on the GPUSpawner hub (50 in the real run); the report's Markdown lines."""
    # Each GPU user also asks for a second GPU server at the same moment, beyond
    # the limit of 1.
    a100, h100, cpu_only = users
    requests = []
    for i in range(a100 + h100 + cpu_only):
        if i < a100:
            body_i = {"profile": "pytorch", "gpu_type": "a100", "gpus": "1"}
        elif i < a100 + h100:
            body_i = {"profile": "pytorch", "gpu_type": "h100", "gpus": "1"}
        else:
            body_i = {"profile": "pytorch", "gpus": "0"}
        requests.append((f"u{i:02d}", "", body_i))
        if i < a100 + h100:
            requests.append((f"u{i:02d}", "extra", body_i))
    for user, _, _ in requests:
        gpu_hub.api("POST", f"/users/{user}")
    cpu_before = cpu_snapshot(stack, gpu_hub)
    t0 = time.perf_counter()
    pool = ThreadPoolExecutor(len(requests))
    try:
        futures = [
            pool.submit(spawn, gpu_hub, user, body, name, timeout=600, follow=True)
            for user, name, body in requests
        ]
        steps.done("burst-sent")
        results = [f.result() for f in futures]
    finally:
        # Cut short, the requests still in flight end when the teardown stops
        # the hub; waiting for them here could take their whole 600 s.
        pool.shutdown(wait=False, cancel_futures=True)
    burst_s = time.perf_counter() - t0
    cpu = cpu_breakdown(cpu_before, cpu_snapshot(stack, gpu_hub))
    ready = [s for s, _ in results if s is not None]
    refused = [st for s, st in results if s is None and st == 403]
    other = [st for s, st in results if s is None and st != 403]
    api = stack.control_plane.admin_api()
    pods = api.get(
        "/api/v1/namespaces/jupyterhub/pods",
        query={"labelSelector": "gpuspawner.io/managed=true"},
    )["items"]
    per_user: dict[str, int] = {}
    for p in pods:
        user = p["metadata"]["annotations"]["hub.jupyter.org/username"]
        per_user[user] = per_user.get(user, 0) + int(p["metadata"]["labels"]["gpuspawner.io/gpus"])
    on_cpu_node = sum(1 for p in pods if p["spec"].get("nodeName") == CPU_NODE)
    busy_node_kib = total_rss(node_pids(stack.nodes, CPU_NODE))
    per_notebook_kib = (busy_node_kib - idle_node_kib) / max(on_cpu_node, 1)
    gpu_pods = sum(1 for p in pods if p["metadata"]["labels"]["gpuspawner.io/gpus"] != "0")
    lines = [
        f"{a100 + h100 + cpu_only} users at once ({len(requests)} requests, {a100 + h100} of "
        "them a second GPU server beyond the limit):",
        f"- ready: {len(ready)}, refused by limit: {len(refused)}, other outcomes: {len(other)} {other}",
        f"- GPU pods: {gpu_pods}, most GPUs held by one user: {max(per_user.values())}",
        f"- request -> ready: p50 {pct(ready, 0.5):.1f} s, p95 {pct(ready, 0.95):.1f} s, all done in {burst_s:.1f} s",
        f"- CPU seconds during the burst, per started server ({len(ready)}):",
    ]
    for part, seconds in cpu.items():
        lines.append(
            f"  - {part}: {seconds:.0f} s in all, {seconds / max(len(ready), 1):.2f} s per server"
        )
    lines.append(
        f"- memory per running notebook on {CPU_NODE} (its node's processes, RSS): "
        f"{per_notebook_kib / 1024:.0f} MiB"
    )
    steps.done("burst")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, help="alternating spawns per hub (8; --smoke: 1)")
    parser.add_argument(
        "--ratio-only", action="store_true", help="only the alternating single spawns"
    )
    parser.add_argument(
        "--without-evented-pleg",
        action="store_true",
        help="the default topology without its kubelet feature gates (EventedPLEG)",
    )
    add_machine_wait(parser)
    add_arguments(parser, STEPS)
    args = parser.parse_args()
    sizes(args, full={"rounds": 8}, smoke={"rounds": 1})
    warm_ups = 1 if args.smoke else 2
    steps = Steps(args)
    work = work_dir(Path(tempfile.mkdtemp(prefix="gpuspawner-bench-")))
    image, cuda = notebook_image()
    (work / "catalog.yaml").write_text(CATALOG.format(image=image, cuda=cuda))
    topology = None
    if args.without_evented_pleg:
        raw = yaml.safe_load(DEFAULT_TOPOLOGY.read_text())
        raw.pop("kubelet_feature_gates", None)
        topology = work / "topology.yaml"
        topology.write_text(yaml.safe_dump(raw))

    # 50 notebook servers starting at once on 2 cores take minutes to answer:
    # give them longer than the default 60 s before the hub gives up on one.
    stack = SandboxStack(
        work / "sandbox",
        catalog=work / "catalog.yaml",
        topology=topology,
        extra_hub_config="c.KubeSpawner.http_timeout = 300\nc.KubeSpawner.start_timeout = 600",
        machine_wait=args.machine_wait,
    )
    burst_report: list[str] = []
    with guarded() as started:
        # The stack's stop undoes a partial start too. If it fails half-way (the
        # host not fully restored), the control plane is still stopped.
        started.callback(lambda: stack.control_plane and stack.control_plane.stop())
        started.callback(stack.stop)
        t0 = time.perf_counter()
        stack.start_cluster()
        cluster_s = time.perf_counter() - t0
        steps.done("cluster")
        t0 = time.perf_counter()
        gpu_hub = stack.start_hub()
        hub_s = time.perf_counter() - t0
        # the sandbox hub's settings (the address notebooks reach it on) come with the stack
        kube_hub = stack.start_second_hub("kubespawner-hub", KUBESPAWNER_HUB.format(image=image))
        started.callback(kube_hub.stop)
        steps.done("hubs")
        idle_node_kib = total_rss(node_pids(stack.nodes, CPU_NODE))
        body = {"profile": "pytorch", "gpu_type": "a100", "gpus": "1"}
        for warm in range(warm_ups):  # warm caches of both hubs and the kubelet
            spawn(gpu_hub, f"warm-g{warm}", body)
            stop(gpu_hub, f"warm-g{warm}")
            spawn(kube_hub, f"warm-k{warm}", {})
            stop(kube_hub, f"warm-k{warm}")
        steps.done("warm-up")
        gpu_times, kube_times = [], []
        for i in range(args.rounds):
            seconds, status = spawn(gpu_hub, f"g{i}", body)
            assert seconds is not None, status
            gpu_times.append(seconds)
            stop(gpu_hub, f"g{i}")
            seconds, status = spawn(kube_hub, f"k{i}", {})
            assert seconds is not None, status
            kube_times.append(seconds)
            stop(kube_hub, f"k{i}")
        steps.done("rounds")

        if not args.ratio_only:
            burst_report = burst(
                stack,
                gpu_hub,
                idle_node_kib,
                steps,
                SMOKE_BURST_USERS if args.smoke else BURST_USERS,
            )

    ratio = statistics.median(gpu_times) / statistics.median(kube_times)
    print(
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    )
    print(
        "Kubelet feature gates: "
        + ("none (--without-evented-pleg)" if args.without_evented_pleg else "EventedPLEG")
    )
    print(
        f"\nControl plane + real nodes + hub RBAC ready: {cluster_s:.1f} s; hub up: {hub_s:.1f} s\n"
    )
    print("| spawn of 1 x A100, request -> ready | median s | p95 s | runs |")
    print("|---|---|---|---|")
    print(
        f"| GPUSpawner (limits, nvidia-smi check) | {statistics.median(gpu_times):.2f} | {pct(gpu_times, 0.95):.2f} | {len(gpu_times)} |"
    )
    print(
        f"| KubeSpawner (hand-written GPU settings) | {statistics.median(kube_times):.2f} | {pct(kube_times, 0.95):.2f} | {len(kube_times)} |"
    )
    print(f"\nRatio of medians GPUSpawner / KubeSpawner: {ratio:.2f} (target <= 1.15)\n")
    print("\n".join(burst_report))
    return 0


if __name__ == "__main__":
    run(main)
