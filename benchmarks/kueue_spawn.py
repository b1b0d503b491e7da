"""Kueue as the GPU queue against the hub's own queue: admission latency and 50 users at once.

    sudo .venv/bin/python benchmarks/kueue_spawn.py [--rounds 8] [--users 50] [--hold 15]
                                                    [--machine-wait SECONDS] [--smoke]

One sandbox (the real control plane and the default topology as real nodes,
benchmarks/sandbox_spawn.py's) with Kueue v0.17.0 and its queues
(gpuspawner_sandbox.kueue: ClusterQueues ``notebooks`` and ``batch`` in cohort
``gpus``, LocalQueue ``gpu-notebooks`` in the hub's namespace) and the hub's
Kueue rights (config/rbac-kueue.yaml). Two hubs on it, same catalog (1 x A100 or
H100, a limit of 1 GPU each) and service account, each started the same way:

* hub A queues in the hub (``c.GPUSpawner.gpu_queue_enabled = True``);
* hub B queues in Kueue (``c.GPUSpawner.kueue_queue = "gpu-notebooks"``).

Kueue's webhook sees every pod of the namespace, hub A's too (it leaves pods
without its queue label alone), so both figures include that call.

First, a request that fits at once: 1 x A100 spawns alternate between the hubs
with nothing else running, request -> ready (sandbox_spawn.py's ``spawn``); the
difference of the medians is what Kueue's admission adds to a spawn. For hub B a
watch on the namespace's pods also measures Kueue's own part: from the pod's
creation (its first watch event, gated) to the watch event in which Kueue's
admission gate is gone.

Then ``--users`` users at once on each hub in turn (A, then B, the cluster empty
between): each asks for 1 GPU, A100 and H100 alternately (the topology has 8 of
each, so most wait), follows its progress stream as the spawn page does, holds a
ready server ``--hold`` seconds and stops it, so that waiting users get GPUs.
Every request is accounted for: ready, refused (the hub's sentence), or failed
(the progress stream's sentence). CPU seconds over each burst are split as
sandbox_spawn.py's ``cpu_breakdown`` splits them, with Kueue's manager pod taken
out of the pods' share.

``--smoke`` runs every step once for the tests: one warm-up spawn and one round per
hub, 4 users per hub holding 2 s. Whatever ends the run, both hubs, Prometheus,
the nodes (with Kueue on them; the host restored) and the control plane are
stopped before it exits (benchmarks/benchlib.py). Prints Markdown for
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from benchlib import Steps, add_arguments, add_machine_wait, guarded, run, sizes, work_dir
from sandbox_spawn import CATALOG, cpu_breakdown, cpu_snapshot, notebook_image, pct, spawn, stop

from gpuspawner.core import kueue
from gpuspawner_sandbox import hoststate, nodeconfig
from gpuspawner_sandbox.demo import HUB_NAMESPACE, REPO, SandboxStack
from gpuspawner_sandbox.kueue import NOTEBOOK_LOCAL_QUEUE
from gpuspawner_sandbox.testing import wait_for

#: --fail-after's steps, in order ("burst-sent": hub B's burst is in flight).
STEPS = ("cluster", "hubs", "warm-up", "rounds", "burst-hub-queue", "burst-sent", "burst-kueue")

KUEUE_RBAC = REPO / "config" / "rbac-kueue.yaml"

#: Both hubs: nobody's wait ends by a timeout (the longest wait of 50 users for 16
#: GPUs held 15 s each, starting four at a time on 2 cores, is a few minutes).
COMMON_HUB_CONFIG = """
c.GPUSpawner.gpu_queue_timeout = 900
c.KubeSpawner.start_timeout = 1200
c.KubeSpawner.http_timeout = 300
"""
HUB_QUEUE_CONFIG = "c.GPUSpawner.gpu_queue_enabled = True\n"
KUEUE_HUB_CONFIG = f"c.GPUSpawner.kueue_queue = {NOTEBOOK_LOCAL_QUEUE!r}\n"

#: How the rows name the hubs.
HUB_QUEUE = "hub's own queue (gpu_queue_enabled)"
KUEUE = f"Kueue (kueue_queue = {NOTEBOOK_LOCAL_QUEUE})"

A100 = {"profile": "pytorch", "gpu_type": "a100", "gpus": "1"}
H100 = {"profile": "pytorch", "gpu_type": "h100", "gpus": "1"}

#: The label every GPUSpawner pod carries (the burst waits for none to be left).
MANAGED = "gpuspawner.io/managed=true"
#: The annotation naming a pod's user (KubeSpawner's).
USERNAME = "hub.jupyter.org/username"

KUEUE_POD_PART = "Kueue's manager pod"
PODS_PART = "notebook pods (Jupyter, GPU checks, pause)"


class GateWatch:
    """Watch the namespace's Kueue-queued pods: when each user's was first seen (gated) and ungated.

    Both times are this client's clock at the watch event's arrival, so their
    difference is Kueue's admission as the cluster sees it: the Workload made,
    quota reserved, the pod's admission gate removed.
    """

    def __init__(self, api, namespace: str):
        self.api = api
        self.namespace = namespace
        self.created: dict[str, float] = {}
        self.ungated: dict[str, float] = {}
        self.error = ""
        self._thread = threading.Thread(target=self._run, name="gate-watch", daemon=True)

    def start(self) -> GateWatch:
        self._thread.start()
        return self

    def _run(self) -> None:
        query = urllib.parse.urlencode(
            {"watch": "true", "labelSelector": kueue.QUEUE_LABEL, "timeoutSeconds": "3600"}
        )
        request = urllib.request.Request(
            f"{self.api.server}/api/v1/namespaces/{self.namespace}/pods?{query}"
        )
        if self.api.token:
            request.add_header("Authorization", f"Bearer {self.api.token}")
        opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=self.api.context)
        )
        try:
            # The stream ends when the control plane stops (the daemon thread with it).
            with opener.open(request, timeout=3700) as stream:
                for line in stream:
                    now = time.perf_counter()
                    pod = json.loads(line).get("object") or {}
                    annotations = (pod.get("metadata") or {}).get("annotations") or {}
                    name = annotations.get(USERNAME)
                    if not name:
                        continue
                    gated = kueue.is_gated(pod)
                    if name not in self.created:
                        # A pod first seen without its gate was not seen gated: not timed.
                        self.created[name] = now if gated else float("nan")
                    if not gated and name not in self.ungated:
                        self.ungated[name] = now
        except (OSError, ValueError) as e:
            self.error = str(e)

    def admission_s(self, user: str, timeout: float = 10) -> float | None:
        """Seconds from the user's pod's creation to its admission gate's removal (None: not seen)."""
        deadline = time.monotonic() + timeout
        while user not in self.ungated and time.monotonic() < deadline:
            time.sleep(0.05)
        seconds = self.ungated.get(user, float("nan")) - self.created.get(user, float("nan"))
        return None if seconds != seconds else seconds  # nan: not seen gated


def kueue_pod_cpu_s(stack) -> float:
    """CPU seconds of Kueue's manager pod so far (its pod cgroup's cpuacct), 0 when none runs."""
    pod = stack.running_kueue.pod() if stack.running_kueue is not None else None
    if pod is None:
        return 0.0
    uid, node = pod["metadata"]["uid"], pod["spec"]["nodeName"]
    for mount in hoststate.cgroup_mounts():
        root = mount / nodeconfig.cgroup_root(node).strip("/")
        if (root / "cpuacct.usage").exists():
            for usage in root.glob(f"**/pod{uid}/cpuacct.usage"):
                return int(usage.read_text()) / 1e9
            return 0.0
    return float("nan")


def snapshot(stack, hub) -> dict:
    return {**cpu_snapshot(stack, hub), "kueue": kueue_pod_cpu_s(stack)}


def breakdown(before: dict, after: dict) -> dict[str, float]:
    """sandbox_spawn.py's parts, with Kueue's manager pod out of the pods' share."""
    parts = cpu_breakdown(before, after)
    kueue_s = after["kueue"] - before["kueue"]
    out: dict[str, float] = {}
    for part, seconds in parts.items():
        if part == PODS_PART:
            out[part] = seconds - kueue_s
            out[KUEUE_POD_PART] = kueue_s
        else:
            out[part] = seconds
    return out


#: What a progress line says while a request waits: for GPUs in the hub's queue
#: (core.admission's "2nd in line for ...") or in Kueue (core.kueue.progress_message),
#: or for a turn to start (GPUSpawner.concurrent_starts).
WAITS = {
    "gpus": (" in line for ", "Waiting in the cluster's GPU queue"),
    "turn": ("Waiting for its turn to start",),
}


@dataclass
class Outcome:
    """One user's request followed to its end."""

    outcome: str  # "ready", "refused" (the hub answered it with an error) or "failed"
    seconds: float | None = None  # request -> ready
    sentence: str = ""  # why not ready, in the hub's words
    waited: set[str] = field(default_factory=set)  # WAITS' keys its progress showed
    answered_at: float = 0.0  # seconds from the burst's start to this outcome


def ask(hub, user: str, body: dict, timeout: float) -> Outcome:
    """Ask for a server and follow its progress stream, as the spawn page does, to its end."""
    path = f"/users/{user}/server"
    t0 = time.perf_counter()
    r = hub.api("POST", path, body)
    if r.status == 201:
        return Outcome("ready", time.perf_counter() - t0)
    if r.status != 202:
        try:
            message = (r.json() or {}).get("message", "")
        except ValueError:
            message = r.body.decode(errors="replace")[:300]
        return Outcome("refused", sentence=f"HTTP {r.status}: {message}")
    request = urllib.request.Request(
        f"{hub.public_url}/hub/api{path}/progress",
        headers={"Authorization": f"token {hub.token}", "Accept": "text/event-stream"},
    )
    last = ""
    waited: set[str] = set()
    try:
        with urllib.request.urlopen(request, timeout=timeout) as stream:
            for line in stream:
                if not line.startswith(b"data:"):
                    continue
                event = json.loads(line[len(b"data:") :])
                last = event.get("message") or last
                waited |= {k for k, marks in WAITS.items() if any(m in last for m in marks)}
                if event.get("ready"):
                    return Outcome("ready", time.perf_counter() - t0, waited=waited)
                if event.get("failed"):
                    return Outcome("failed", sentence=last, waited=waited)
    except urllib.error.HTTPError as e:
        return Outcome("failed", sentence=f"progress stream HTTP {e.code}", waited=waited)
    except TimeoutError:
        sentence = f"no progress event for {timeout:.0f} s (last: {last})"
        return Outcome("failed", sentence=sentence, waited=waited)
    return Outcome("failed", sentence=f"progress stream ended (last: {last})", waited=waited)


def release(hub, user: str) -> None:
    """Stop a user's server; wait (polling once a second, gently for 50 users) until it is gone."""
    hub.api("DELETE", f"/users/{user}/server")
    while hub.api("GET", f"/users/{user}").json()["servers"].get(""):
        time.sleep(1)


def cluster_empty(stack) -> None:
    api = stack.control_plane.admin_api()
    wait_for(
        "the burst's pods to be gone",
        lambda: (
            not api.get(
                f"/api/v1/namespaces/{HUB_NAMESPACE}/pods", query={"labelSelector": MANAGED}
            )["items"]
        ),
        300,
        interval=1,
        error=RuntimeError,
    )


def burst(stack, hub, prefix: str, users: int, hold: float, on_sent=None) -> dict:
    """``users`` users at once on one hub, each holding a ready server ``hold`` s; the figures."""
    names = [f"{prefix}{i:02d}" for i in range(users)]
    for user in names:
        hub.api("POST", f"/users/{user}")
    held = {"now": 0, "peak": 0}
    lock = threading.Lock()
    t0 = time.perf_counter()

    def one(i: int, user: str) -> Outcome:
        result = ask(hub, user, A100 if i % 2 == 0 else H100, timeout=1200)
        result.answered_at = time.perf_counter() - t0
        if result.outcome == "ready":
            with lock:
                held["now"] += 1
                held["peak"] = max(held["peak"], held["now"])
            time.sleep(hold)
            release(hub, user)
            with lock:
                held["now"] -= 1
        return result

    before = snapshot(stack, hub)
    pool = ThreadPoolExecutor(users)
    try:
        futures = [pool.submit(one, i, user) for i, user in enumerate(names)]
        if on_sent is not None:
            on_sent()
        results = [f.result() for f in futures]
    finally:
        # Cut short, the requests in flight end when the teardown stops the hub.
        pool.shutdown(wait=False, cancel_futures=True)
    cluster_empty(stack)
    wall_s = time.perf_counter() - t0
    cpu = breakdown(before, snapshot(stack, hub))
    return {
        "names": names,
        "ready": [r.seconds for r in results if r.outcome == "ready"],
        "outcomes": Counter(r.outcome for r in results),
        "sentences": Counter(f"{r.outcome}: {r.sentence}" for r in results if r.outcome != "ready"),
        "waited": Counter(k for r in results for k in r.waited),
        "peak": held["peak"],
        "answered_s": max(r.answered_at for r in results),
        "wall_s": wall_s,
        "cpu": cpu,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--rounds", type=int, help="alternating single spawns per hub (8; --smoke: 1)"
    )
    parser.add_argument("--users", type=int, help="users at once per hub (50; --smoke: 4)")
    parser.add_argument(
        "--hold", type=float, help="seconds each ready server is held (15; --smoke: 2)"
    )
    add_machine_wait(parser)
    add_arguments(parser, STEPS)
    args = parser.parse_args()
    sizes(
        args,
        full={"rounds": 8, "users": 50, "hold": 15.0},
        smoke={"rounds": 1, "users": 4, "hold": 2.0},
    )
    warm_ups = 1 if args.smoke else 2
    steps = Steps(args)
    work = work_dir(Path(tempfile.mkdtemp(prefix="gpuspawner-bench-kueue-")))
    image, cuda = notebook_image()
    (work / "catalog.yaml").write_text(CATALOG.format(image=image, cuda=cuda))

    stack = SandboxStack(
        work / "sandbox",
        catalog=work / "catalog.yaml",
        extra_hub_config=COMMON_HUB_CONFIG,
        machine_wait=args.machine_wait,
        kueue=True,
        emit=lambda line: print(line, file=sys.stderr, flush=True),
    )
    bursts: dict[str, dict] = {}
    with guarded() as started:
        # The stack's stop undoes a partial start too; Kueue runs on the nodes and
        # goes with them. If it fails half-way, the control plane is still stopped.
        started.callback(lambda: stack.control_plane and stack.control_plane.stop())
        started.callback(stack.stop)
        t0 = time.perf_counter()
        stack.start_cluster()
        stack.control_plane.apply_manifests(KUEUE_RBAC)
        cluster_s = time.perf_counter() - t0
        kueue_s = stack.running_kueue.started_in
        steps.done("cluster")
        t0 = time.perf_counter()
        hub_a = stack.start_second_hub("hub-queue", HUB_QUEUE_CONFIG)
        started.callback(hub_a.stop)
        hub_b = stack.start_second_hub("kueue-hub", KUEUE_HUB_CONFIG)
        started.callback(hub_b.stop)
        hubs_s = time.perf_counter() - t0
        steps.done("hubs")

        watch = GateWatch(stack.control_plane.admin_api(), HUB_NAMESPACE).start()
        for warm in range(warm_ups):  # warm caches of both hubs, Kueue and the kubelets
            for hub, user in ((hub_a, f"warm-a{warm}"), (hub_b, f"warm-b{warm}")):
                seconds, status = spawn(hub, user, A100)
                assert seconds is not None, (user, status)
                stop(hub, user)
        steps.done("warm-up")

        times: dict[str, list[float]] = {HUB_QUEUE: [], KUEUE: []}
        admission: list[float] = []
        for i in range(args.rounds):
            for hub, row, user in ((hub_a, HUB_QUEUE, f"qa{i}"), (hub_b, KUEUE, f"kb{i}")):
                seconds, status = spawn(hub, user, A100)
                assert seconds is not None, (user, status)
                times[row].append(seconds)
                if hub is hub_b:
                    gate = watch.admission_s(user)
                    assert gate is not None, (
                        f"the watch did not see {user}'s pod gated, then not ({watch.error})"
                    )
                    admission.append(gate)
                stop(hub, user)
        steps.done("rounds")

        cluster_empty(stack)
        bursts[HUB_QUEUE] = burst(stack, hub_a, "qu", args.users, args.hold)
        steps.done("burst-hub-queue")
        bursts[KUEUE] = burst(
            stack, hub_b, "ku", args.users, args.hold, on_sent=lambda: steps.done("burst-sent")
        )
        burst_gates = [
            g for u in bursts[KUEUE]["names"] if (g := watch.admission_s(u, timeout=0)) is not None
        ]
        steps.done("burst-kueue")

    print(
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    )
    print(
        f"\nControl plane + real nodes + Kueue + hub RBAC ready: {cluster_s:.1f} s "
        f"(Kueue deployed and answering in {kueue_s:.1f} s of it); both hubs up: {hubs_s:.1f} s\n"
    )
    print("| spawn of 1 x A100 that fits at once, request -> ready | median s | p95 s | runs |")
    print("|---|---|---|---|")
    for row, values in times.items():
        print(
            f"| {row} | {statistics.median(values):.2f} | {pct(values, 0.95):.2f} | {len(values)} |"
        )
    print(
        f"| Kueue's admission alone: pod created -> admission gate removed | "
        f"{statistics.median(admission):.2f} | {pct(admission, 0.95):.2f} | {len(admission)} |"
    )
    added = statistics.median(times[KUEUE]) - statistics.median(times[HUB_QUEUE])
    print(
        f"\nAdded by Kueue's admission (median Kueue - median hub's queue): {added:.2f} s (target <= 1 s)\n"
    )

    names = list(bursts)
    print(
        f"{args.users} users at once on each hub in turn, 1 GPU each (A100 and H100 alternately; "
        f"8 of each in the cluster), each ready server held {args.hold:.0f} s then stopped:\n"
    )
    print(f"| {args.users} users at once | " + " | ".join(names) + " |")
    print("|---" * (len(names) + 1) + "|")

    def row(label: str, cell) -> None:
        print(f"| {label} | " + " | ".join(cell(bursts[n]) for n in names) + " |")

    row("ready", lambda b: str(b["outcomes"]["ready"]))
    row("refused", lambda b: str(b["outcomes"]["refused"]))
    row("failed", lambda b: str(b["outcomes"]["failed"]))
    row("request -> ready p50 s", lambda b: f"{pct(b['ready'], 0.5):.1f}" if b["ready"] else "-")
    row("request -> ready p95 s", lambda b: f"{pct(b['ready'], 0.95):.1f}" if b["ready"] else "-")
    row("request -> ready max s", lambda b: f"{max(b['ready']):.1f}" if b["ready"] else "-")
    row("progress showed a GPU queue place", lambda b: str(b["waited"]["gpus"]))
    row("progress showed a turn to start (4 at once)", lambda b: str(b["waited"]["turn"]))
    row("most ready servers held at once", lambda b: str(b["peak"]))
    row("last request answered s", lambda b: f"{b['answered_s']:.1f}")
    row("all done (every server stopped, pods gone) s", lambda b: f"{b['wall_s']:.1f}")
    for part in bursts[names[0]]["cpu"]:
        row(
            f"CPU-s per start: {part}",
            lambda b, part=part: f"{b['cpu'][part] / max(b['outcomes']['ready'], 1):.2f}",
        )
    if burst_gates:
        print(
            f"\nKueue's admission in its burst, pod created -> admission gate removed "
            f"({len(burst_gates)} pods): p50 {pct(burst_gates, 0.5):.1f} s, "
            f"p95 {pct(burst_gates, 0.95):.1f} s, max {max(burst_gates):.1f} s; "
            f"gated more than 1 s: {sum(g > 1 for g in burst_gates)}\n"
        )
    for name in names:
        for sentence, count in bursts[name]["sentences"].most_common():
            print(f"- {name}, {count} x {sentence}")
    print(
        "\nCPU seconds are over each whole burst (requests, waits, holds, stops), divided by "
        "the servers started. The hub's part is the hub under test with its proxy and "
        "services (the other hub, idle, is in 'the rest'); Kueue's manager pod is its pod "
        "cgroup; the control plane is etcd, the API server, the scheduler and the "
        "controller manager."
    )
    return 0


if __name__ == "__main__":
    run(main)
