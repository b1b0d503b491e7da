"""GPU inventory at scale: hub memory and form render time with 2,000 GPU nodes and 20,000 pods.

    .venv/bin/python benchmarks/inventory.py            (in-process, a few minutes)
    .venv/bin/python benchmarks/inventory.py --api      (also the naive approach against
                                                         the sandbox's real API server)
    .venv/bin/python benchmarks/inventory.py --smoke --api   (every step once, small: tests)

The cluster is made from the Node and Pod objects recorded from the sandbox
(tests/fixtures/nodes/recorded-*.json), copied with new names: 800 nodes with 4
A100, 800 with 8 H100, 400 with MIG slices; 20,000 pods, of which 9,000 hold
GPUs on their node, 1,000 wait for GPUs (unbound) and 10,000 are CPU-only (the
pod watch is cluster-wide, so the hub sees them too and drops them).

Measured:
  * memory: what the inventory keeps (tracemalloc, after feeding every object
    one at a time, as the watches do), beside keeping the raw objects as a
    watch cache of whole objects (KubeSpawner's reflector style) would;
  * form render: GPUSpawner's profile list with live figures + KubeSpawner's
    form template + the figures script, after each of a stream of pod
    changes (so the figures are recomputed every time), and the endpoint's
    JSON alone;
  * naive: per request, parse the node and pod lists (the API server's JSON
    responses, held in memory: a lower bound that leaves out the API server's
    own work and the network) and compute the figures from scratch; with
    --api the same lists are really fetched from the sandbox's API server.
Writes a Markdown report to stdout. ``--smoke`` builds a cluster a hundredth of
the size (20 GPU nodes, 200 pods) and renders 3 times: every step runs once, for
the tests; whatever ends the run, the API server's control plane is stopped
before it exits (benchmarks/benchlib.py).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import gc
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault(
    "KUBECONFIG", str(REPO / "tests" / "fixtures" / "k8s-offline" / "kubeconfig.yaml")
)

from benchlib import Steps, add_arguments, guarded, run, sizes, work_dir  # noqa: E402
from kubernetes_asyncio.config import kube_config  # noqa: E402

kube_config.KUBE_CONFIG_DEFAULT_LOCATION = os.environ["KUBECONFIG"]

from traitlets.config import Config  # noqa: E402

from gpuspawner.core.catalog import load_catalog_file  # noqa: E402
from gpuspawner.hub.spawner import GPUSpawner  # noqa: E402
from gpuspawner.inventory.figures import catalog_availability  # noqa: E402
from gpuspawner.inventory.model import Inventory, inventory_from  # noqa: E402

FIXTURES = REPO / "tests" / "fixtures" / "nodes"
CATALOG = FIXTURES / "catalog.yaml"
NODE_KINDS = [("gpu-a100-0", 800), ("gpu-h100-0", 800), ("gpu-h100-mig-0", 400)]
GPU_PODS, PENDING_PODS, CPU_PODS = 9_000, 1_000, 10_000
#: --smoke divides the cluster's size by this.
SMOKE_SCALE = 100
#: --fail-after's steps, in order ("api-loaded": with --api, the objects are in the API server).
STEPS = ("inventory", "forms", "naive", "api-loaded", "api")


def _items(name: str) -> dict[str, dict]:
    body = json.loads((FIXTURES / name).read_text())
    return {o["metadata"]["name"]: o for o in body["items"]}


def make_nodes(scale: int = 1) -> list[dict]:
    templates = _items("recorded-nodes.json")
    nodes = []
    for template, count in NODE_KINDS:
        for i in range(count // scale):
            node = copy.deepcopy(templates[template])
            name = f"{template.rsplit('-', 1)[0]}-{i}"
            node["metadata"]["name"] = name
            node["metadata"]["uid"] = f"{i:08d}-{template}"
            node["metadata"]["labels"]["kubernetes.io/hostname"] = name
            nodes.append(node)
    return nodes


def make_pods(nodes: list[dict], seed: int = 6, scale: int = 1) -> list[dict]:
    rng = random.Random(seed)
    templates = _items("recorded-pods.json")
    bound, pending = templates["bound-2xa100"], templates["pending-8xa100"]
    room = {}
    for node in nodes:
        for resource, value in node["status"]["allocatable"].items():
            if resource.startswith("nvidia.com/"):
                room[(node["metadata"]["name"], resource)] = int(value)
    slots = sorted(room)
    pods = []

    def named(template: dict, i: int, namespace: str) -> dict:
        pod = copy.deepcopy(template)
        pod["metadata"].update(
            name=f"{template['metadata']['name']}-{i}",
            namespace=namespace,
            uid=f"{i:08d}-{namespace}",
            creationTimestamp=f"2026-11-29T{(i // 3600) % 24:02d}:{(i // 60) % 60:02d}:{i % 60:02d}Z",
        )
        return pod

    def set_gpus(pod: dict, resource: str, count: int) -> None:
        spec = pod["spec"]
        for c in spec["containers"] + spec.get("initContainers", []):
            c["resources"] = {"limits": {resource: str(count)}, "requests": {resource: str(count)}}

    i = 0
    while len(pods) < GPU_PODS // scale and slots:
        index = rng.randrange(len(slots))
        node, resource = slots[index]
        count = min(rng.choice([1, 1, 1, 1, 1, 2]), room[(node, resource)])
        room[(node, resource)] -= count
        if room[(node, resource)] == 0:
            slots[index] = slots[-1]
            slots.pop()
        pod = named(bound, i, f"team-{i % 40}")
        pod["spec"]["nodeName"] = node
        set_gpus(pod, resource, count)
        pods.append(pod)
        i += 1
    for _ in range(PENDING_PODS // scale):
        pod = named(pending, i, f"team-{i % 40}")
        set_gpus(pod, "nvidia.com/gpu", rng.choice([4, 8]))
        pods.append(pod)
        i += 1
    for _ in range(CPU_PODS // scale):
        pod = named(bound, i, f"web-{i % 40}")
        pod["spec"]["nodeName"] = f"cpu-{i % 100}"
        pod["spec"].pop("initContainers", None)
        pod["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "500m"}}
        pods.append(pod)
        i += 1
    rng.shuffle(pods)
    return pods


def measure(fn, runs: int) -> tuple[float, float]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    times.sort()
    return statistics.median(times), times[int(len(times) * 0.95) - 1]


def traced(build) -> tuple[object, float]:
    """What build() returns, and the memory it still holds (MB) once it returns."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    result = build()
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return result, (after - before) / 1e6


class Reflector:
    """The reflector's interface the spawner reads, over an Inventory the benchmark feeds."""

    def __init__(self, inventory: Inventory):
        self.inventory = inventory
        self.ready = True
        self.missing_permissions: list[str] = []

    async def wait_ready(self, timeout: float) -> bool:
        return True


class NoPods:
    """The user's (empty) GPU pod list, as kubernetes_asyncio returns it unparsed."""

    status = 200

    async def read(self) -> bytes:
        return b'{"kind": "PodList", "items": []}'


async def form_benchmark(inventory: Inventory, pods: list[dict], runs: int) -> dict[str, tuple]:
    from tests.hub.test_spawner import OrmSpawner, User  # the minimal objects JupyterHub passes

    c = Config()
    c.GPUSpawner.catalog_file = str(CATALOG)
    spawner = GPUSpawner(_mock=True, config=c, user=User("bench"), orm_spawner=OrmSpawner(""))

    async def no_pods(namespace, **kwargs):
        return NoPods()

    spawner.api.list_namespaced_pod = no_pods
    reflector = Reflector(inventory)
    spawner.gpu_inventory = lambda: reflector
    loop = asyncio.get_running_loop()
    gpu_pods = [p for p in pods if p["spec"].get("nodeName", "").startswith("gpu-")]
    changes = iter(range(10**9))

    def render() -> None:
        profiles = loop.run_until_complete(spawner._catalog_profile_list(spawner))
        html = spawner.render_catalog_form(profiles)
        assert "free of" in html

    def change_then_render() -> None:
        # One pod ends (or returns) before each render, so no cached figure helps.
        pod = gpu_pods[next(changes) % len(gpu_pods)]
        meta = pod["metadata"]
        if f"{meta['namespace']}/{meta['name']}" in inventory.pods:
            inventory.remove_pod(meta["namespace"], meta["name"])
        else:
            inventory.set_pod(pod)
        render()

    def payload() -> None:
        inventory.generation += 1
        json.dumps(spawner.gpu_availability_payload())

    # run_until_complete cannot nest: render from a worker thread's own loop.
    results = {}

    def work() -> None:
        nonlocal loop
        loop = asyncio.new_event_loop()
        results["form"] = measure(change_then_render, runs)
        results["cached"] = measure(render, runs)
        results["payload"] = measure(payload, runs)
        loop.close()

    await asyncio.to_thread(work)
    return results


def naive(node_body: bytes, pod_body: bytes, catalog) -> None:
    nodes = json.loads(node_body)["items"]
    pods = json.loads(pod_body)["items"]
    catalog_availability(inventory_from(nodes, pods), catalog)


def api_naive(
    nodes: list[dict], pods: list[dict], catalog, runs: int, steps: Steps
) -> tuple[tuple, float]:
    """Load the objects into the sandbox's API server, then list them per request."""
    from concurrent.futures import ThreadPoolExecutor

    from gpuspawner_sandbox import testing

    with (
        tempfile.TemporaryDirectory(prefix="inventory-bench-") as tmp,
        testing.running_control_plane(work_dir(Path(tmp))) as cp,
    ):
        api = cp.admin_api()
        start = time.perf_counter()
        namespaces = sorted({p["metadata"]["namespace"] for p in pods})
        for ns in namespaces:
            api.post("/api/v1/namespaces", {"metadata": {"name": ns}})

        def create(obj: dict) -> None:
            body = copy.deepcopy(obj)
            for key in ("uid", "resourceVersion", "creationTimestamp", "managedFields"):
                body["metadata"].pop(key, None)
            body.pop("status", None)
            if body.get("kind") == "Node" or "nodeInfo" in obj.get("status", {}):
                api.post("/api/v1/nodes", body)
            else:
                body["spec"]["serviceAccountName"] = "default"
                body["spec"].pop("serviceAccount", None)
                body["spec"]["automountServiceAccountToken"] = False
                body["spec"].pop("volumes", None)
                for c in body["spec"]["containers"] + body["spec"].get("initContainers", []):
                    c.pop("volumeMounts", None)
                api.post(f"/api/v1/namespaces/{body['metadata']['namespace']}/pods", body)

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(create, nodes))
            list(pool.map(create, pods))
        load_s = time.perf_counter() - start
        steps.done("api-loaded")

        def per_request() -> None:
            node_body = api.request("GET", "/api/v1/nodes", raw=True).body
            pod_body = api.request("GET", "/api/v1/pods", raw=True).body
            naive(node_body, pod_body, catalog)

        return measure(per_request, runs), load_s


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--api", action="store_true", help="also list from the sandbox API server")
    parser.add_argument("--runs", type=int, help="renders per measure (50; --smoke: 3)")
    add_arguments(parser, STEPS)
    args = parser.parse_args()
    sizes(args, full={"runs": 50}, smoke={"runs": 3})
    steps = Steps(args)
    scale = SMOKE_SCALE if args.smoke else 1
    naive_runs = 1 if args.smoke else max(5, args.runs // 5)
    catalog = load_catalog_file(CATALOG)

    nodes = make_nodes(scale)
    pods = make_pods(nodes, scale=scale)
    node_body = json.dumps({"items": nodes}).encode()
    pod_body = json.dumps({"items": pods}).encode()

    def feed() -> Inventory:
        # Objects arrive one by one from the watch and are dropped after use;
        # copying from the JSON text stands in for the watch stream.
        inventory = Inventory()
        for raw in json.loads(node_body)["items"]:
            inventory.set_node(raw)
        for raw in json.loads(pod_body)["items"]:
            inventory.set_pod(raw)
        return inventory

    # Only --api starts anything (a control plane, stopped by its own context
    # manager); the guard still makes SIGTERM unwind it.
    with guarded():
        inventory, inventory_mb = traced(feed)
        kept_nodes, kept_pods = len(inventory.nodes), len(inventory.pods)
        raw_cache, raw_mb = traced(
            lambda: {
                "nodes": json.loads(node_body)["items"],
                "pods": json.loads(pod_body)["items"],
            }
        )
        del raw_cache
        gc.collect()
        steps.done("inventory")
        forms = asyncio.run(form_benchmark(inventory, pods, args.runs))
        steps.done("forms")
        naive_times = measure(lambda: naive(node_body, pod_body, catalog), naive_runs)
        steps.done("naive")
        api_times = None
        if args.api:
            api_times = api_naive(nodes, pods, catalog, naive_runs, steps)
            steps.done("api")

    print(
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    )
    holding = sum(1 for p in pods if p["spec"].get("nodeName", "").startswith("gpu-"))
    waiting = sum(1 for p in pods if not p["spec"].get("nodeName"))
    print(
        f"Cluster: {len(nodes)} GPU nodes, {len(pods)} pods ({holding} holding GPUs, "
        f"{waiting} waiting for GPUs, {len(pods) - holding - waiting} CPU-only); "
        f"kept by the inventory: {kept_nodes} nodes, {kept_pods} pods. "
        f"API responses: nodes {len(node_body) / 1e6:.1f} MB, pods {len(pod_body) / 1e6:.1f} MB."
    )
    print()
    print("| measure | median | p95 |")
    print("|---|---|---|")
    print(f"| inventory memory (MB, tracemalloc) | {inventory_mb:.1f} | |")
    print(f"| whole objects, as a raw watch cache would keep them (MB) | {raw_mb:.1f} | |")
    print(
        f"| form render after a pod change (ms) | {forms['form'][0]:.2f} | {forms['form'][1]:.2f} |"
    )
    print(
        f"| form render, figures unchanged (ms) | {forms['cached'][0]:.2f} | {forms['cached'][1]:.2f} |"
    )
    print(
        f"| availability endpoint JSON, recomputed (ms) | {forms['payload'][0]:.2f} | "
        f"{forms['payload'][1]:.2f} |"
    )
    print(
        f"| naive per request: parse node+pod lists, compute (ms, in memory) | "
        f"{naive_times[0]:.1f} | {naive_times[1]:.1f} |"
    )
    if api_times is not None:
        (median, p95), load_s = api_times
        print(
            f"| naive per request: list nodes+pods from the API server, compute (ms) | "
            f"{median:.1f} | {p95:.1f} |"
        )
        print(f"\n(loading the objects into the sandbox API server took {load_s:.0f} s)")
    return 0


if __name__ == "__main__":
    run(main)
