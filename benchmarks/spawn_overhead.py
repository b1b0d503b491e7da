"""Per-spawn overhead GPUSpawner adds over KubeSpawner, and the options form render time.

    make bench            (or: .venv/bin/python benchmarks/spawn_overhead.py [--smoke])

Measures, for a catalog of 20 images x 6 GPU types and 200 existing GPU pods:
  * form:     building the profile list and rendering KubeSpawner's form template
  * validate: resolving user_options and checking limits against the pods
  * manifest: load_user_options + get_pod_manifest, GPUSpawner vs KubeSpawner
              configured with the equivalent hand-written profile
  * budget:   the same spawn for a user with a GPU-hours budget (limits.gpu_hours),
              whose usage is read from a real SQLite usage store holding 5,000 users
              x 250 servers over a year (1.25M intervals; --smoke: 50 x 20), through
              the accounting recorder's worker thread as in the hub
The Kubernetes API is not called: the pod list (filtered by label selector as
the API server does; user7 holds 4 of the 200 pods) is served from memory, so the
figures are GPUSpawner's own CPU cost (the one list call per GPU spawn is a
network round trip, measured end to end on the local cluster). The usage store is
built once and kept in .cache/bench/ (about a minute for the full size).
Writes a Markdown table to stdout. ``--smoke`` (2 warm-ups, 5 runs per step)
runs every step for the tests; it starts no process, so it has nothing to stop.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import time
from pathlib import Path

from traitlets.config import Config

REPO = Path(__file__).resolve().parent.parent
os.environ.setdefault(
    "KUBECONFIG", str(REPO / "tests" / "fixtures" / "k8s-offline" / "kubeconfig.yaml")
)

from benchlib import add_arguments, run, sizes  # noqa: E402
from kubernetes_asyncio.config import kube_config  # noqa: E402

kube_config.KUBE_CONFIG_DEFAULT_LOCATION = os.environ["KUBECONFIG"]

from kubespawner import KubeSpawner  # noqa: E402

from gpuspawner.accounting.store import UsageStore  # noqa: E402
from gpuspawner.core.catalog import parse_catalog  # noqa: E402
from gpuspawner.core.limits import check_request, holdings_from_pods  # noqa: E402
from gpuspawner.core.options import resolve_selection  # noqa: E402
from gpuspawner.core.usage import Interval  # noqa: E402
from gpuspawner.hub import state as hubstate  # noqa: E402
from gpuspawner.hub.accounting import AccountingRecorder  # noqa: E402
from gpuspawner.hub.spawner import GPUSpawner  # noqa: E402

TYPES = ["a100", "h100", "l40s", "t4", "a10", "mig"]


def big_catalog() -> dict:
    gpu_types = {
        key: {
            "display_name": f"NVIDIA {key.upper()}",
            "memory": "80 GB",
            "node_selector": {"nvidia.com/gpu.product": f"NVIDIA-{key.upper()}"},
            **(
                {"resource": "nvidia.com/mig-1g.10gb", "weight": 0.142857, "counts": [1, 2]}
                if key == "mig"
                else {}
            ),
        }
        for key in TYPES
    }
    images = {
        f"image-{i:02d}": {
            "display_name": f"Framework {i}",
            "description": "A CUDA framework image",
            "image": f"registry.example.org/framework-{i}:1.0",
            "cuda": "12.8",
        }
        for i in range(20)
    }
    return {
        "images": images,
        "gpu_types": gpu_types,
        "limits": {
            "default": 8,
            "groups": {"research": {"gpus": 16, "per_type": {"h100": 4}}},
            "group_pools": {"research": 500},
        },
    }


def budget_catalog() -> dict:
    """The big catalog with a weekly GPU-hours budget for everyone (large enough to admit)."""
    raw = big_catalog()
    raw["limits"]["gpu_hours"] = {"period": "week", "default": 100_000}
    return raw


YEAR = 365 * 86400


def usage_store(users: int, per_user: int) -> UsageStore:
    """A SQLite usage store with ``users`` x ``per_user`` closed 2-hour intervals over a year.

    Built once per size into .cache/bench/ (the intervals end relative to when it
    was built; the budget read's cost does not depend on where the week falls).
    """
    folder = REPO / ".cache" / "bench"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"usage-{users}x{per_user}.sqlite"
    ready = path.with_suffix(".ready")
    if not ready.exists():
        for stale in folder.glob(f"{path.name}*"):
            stale.unlink()
        store = UsageStore(f"sqlite:///{path}")
        store.migrate()
        now = time.time()
        for u in range(users):
            store.open_many(
                Interval(
                    uid=f"bench-{u}-{k}",
                    user=f"user{u}",
                    server="",
                    charge_group="",
                    gpu_type=TYPES[k % 5],
                    image=f"image-{k % 20:02d}",
                    gpus=1 + k % 2,
                    units=float(1 + k % 2),
                    start=now - YEAR + k * YEAR / per_user + u % 97 * 60,
                    end=now - YEAR + k * YEAR / per_user + u % 97 * 60 + 7200,
                    end_source="pod",
                )
                for k in range(per_user)
            )
        store.close()
        ready.write_text(f"{users * per_user} intervals\n")
    store = UsageStore(f"sqlite:///{path}")
    store.migrate()
    return store


def pods(n: int) -> list[dict]:
    out = []
    for i in range(n):
        out.append(
            {
                "metadata": {
                    "name": f"jupyter-user{i}",
                    "labels": {
                        "gpuspawner.io/managed": "true",
                        "hub.jupyter.org/username": f"user{i % 50}",
                        "gpuspawner.io/gpu-type": TYPES[i % 5],
                        "gpuspawner.io/gpus": "1",
                    },
                    "annotations": {"hub.jupyter.org/username": f"user{i % 50}"},
                },
                "status": {"phase": "Running"},
            }
        )
    return out


class User:
    name = "user7"
    id = 7
    url = "/user/user7/"
    groups: list = []


class Group:
    name = "research"


class PoolUser(User):
    groups = [Group()]


class OrmSpawner:
    name = ""
    display_name = ""
    server = None
    state: dict = {}
    user_options: dict = {}


class ListResponse:
    status = 200

    def __init__(self, body: bytes):
        self.body = body

    async def read(self):
        return self.body


def make(cls, config, user=None):
    spawner = cls(_mock=True, config=config, user=user or User(), orm_spawner=OrmSpawner())
    everyone = pods(200)
    # the API server filters by label selector; so does this stand-in
    bodies = {
        "gpuspawner.io/managed=true": json.dumps({"items": everyone}).encode(),
        "gpuspawner.io/managed=true,hub.jupyter.org/username=user7": json.dumps(
            {
                "items": [
                    p
                    for p in everyone
                    if p["metadata"]["labels"]["hub.jupyter.org/username"] == "user7"
                ]
            }
        ).encode(),
    }

    async def list_pods(namespace, **kwargs):
        return ListResponse(bodies[kwargs["label_selector"]])

    spawner.api.list_namespaced_pod = list_pods
    return spawner


def timed(fn, repeat: int) -> list[float]:
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1000)
    return samples


async def atimed(fn, repeat: int) -> list[float]:
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        await fn()
        samples.append((time.perf_counter() - t0) * 1000)
    return samples


def row(name: str, samples: list[float]) -> str:
    samples = sorted(samples)
    p95 = samples[int(len(samples) * 0.95) - 1]
    return f"| {name} | {statistics.median(samples):.3f} | {p95:.3f} | {len(samples)} |"


async def measure(
    warm_ups: int, repeat: int, form_repeat: int, store_users: int, store_servers: int
) -> None:
    raw = big_catalog()
    catalog = parse_catalog(raw)
    options = {"profile": "image-07", "gpu_type": "a100", "gpus": "2"}
    holdings = holdings_from_pods(pods(200), catalog)

    gpu_config = Config()
    gpu_config.GPUSpawner.catalog = raw
    gpu_config.GPUSpawner.validation_command = ["true"]
    gpu = make(GPUSpawner, gpu_config)
    pooled = make(GPUSpawner, gpu_config, user=PoolUser())
    budget_config = Config()
    budget_config.GPUSpawner.catalog = budget_catalog()
    budget_config.GPUSpawner.validation_command = ["true"]
    budgeted = make(GPUSpawner, budget_config)
    store = usage_store(store_users, store_servers)
    # the hub's recorder (its worker thread and call()); nothing here starts its watch
    recorder = AccountingRecorder(lambda: store, None, "jupyterhub", api=None)
    budgeted.gpu_accounting = lambda: recorder

    kube_config_ = Config()
    kube_config_.KubeSpawner.profile_list = [
        {
            "display_name": "Framework 7 with 2 A100",
            "slug": "image-07",
            "kubespawner_override": {
                "image": "registry.example.org/framework-7:1.0",
                "extra_resource_limits": {"nvidia.com/gpu": "2"},
                "extra_resource_guarantees": {"nvidia.com/gpu": "2"},
                "node_selector": {"nvidia.com/gpu.product": "NVIDIA-A100"},
                "tolerations": [
                    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
                ],
            },
        }
    ]
    kube = make(KubeSpawner, kube_config_)

    async def spawn(spawner, opts):
        hubstate.current().release(spawner.user.name, spawner.name)
        spawner.user_options = dict(opts)
        await spawner.load_user_options()
        await spawner.get_pod_manifest()

    async def form():
        profiles = await gpu.profile_list(gpu)
        gpu.render_catalog_form(profiles)

    for _ in range(warm_ups):  # warm up imports, templates, caches
        await spawn(gpu, options)
        await spawn(kube, {"profile": "image-07"})
        await spawn(pooled, options)
        await spawn(budgeted, options)
        await form()

    form_ms = await atimed(form, form_repeat)
    validate_ms = timed(
        lambda: check_request(
            catalog=catalog,
            user="user7",
            groups=[],
            server="",
            selection=resolve_selection(options, catalog),
            holdings=holdings,
        ),
        repeat,
    )
    gpu_ms = await atimed(lambda: spawn(gpu, options), repeat)
    kube_ms = await atimed(lambda: spawn(kube, {"profile": "image-07"}), repeat)
    pooled_ms = await atimed(lambda: spawn(pooled, options), repeat)
    budget_ms = await atimed(lambda: spawn(budgeted, options), repeat)
    week = time.time() - 7 * 86400
    read_ms = timed(
        lambda: store.used_unit_seconds(["user7"], week, week + 7 * 86400, time.time()), repeat
    )
    added = statistics.median(gpu_ms) - statistics.median(kube_ms)
    budget_added = statistics.median(budget_ms) - statistics.median(gpu_ms)
    intervals = store_users * store_servers

    print(
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, {platform.platform()}"
    )
    print(
        "Catalog: 20 images x 6 GPU types; 200 GPU pods in the namespace; times in milliseconds.\n"
    )
    print("| step | median | p95 | runs |")
    print("|---|---|---|---|")
    print(row("form: profile list + KubeSpawner form render", form_ms))
    print(row("validate: resolve options + check limits", validate_ms))
    print(row("spawn prep, GPUSpawner (options, limits, pod manifest)", gpu_ms))
    print(row("spawn prep, KubeSpawner (equivalent profile, pod manifest)", kube_ms))
    print(row("spawn prep, GPUSpawner, user in a group pool (reads all 200 pods)", pooled_ms))
    print(
        row(
            f"spawn prep, GPUSpawner, user with a GPU-hours budget ({intervals:,} intervals in SQLite)",
            budget_ms,
        )
    )
    print(row("budget: the usage store's read alone (one user, this week)", read_ms))
    print(f"\nAdded per spawn (median GPUSpawner - median KubeSpawner): {added:.3f} ms")
    print(
        "Added by the budget per spawn (median with a budget - median without): "
        f"{budget_added:.3f} ms"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, help="runs per step (300; --smoke: 5)")
    parser.add_argument(
        "--store-users", type=int, help="users in the usage store (5000; --smoke: 50)"
    )
    parser.add_argument(
        "--store-servers", type=int, help="servers per user in a year (250; --smoke: 20)"
    )
    add_arguments(parser)
    args = parser.parse_args()
    sizes(
        args,
        full={"runs": 300, "store_users": 5000, "store_servers": 250},
        smoke={"runs": 5, "store_users": 50, "store_servers": 20},
    )
    warm_ups, form_runs = (2, 3) if args.smoke else (20, 100)
    asyncio.run(measure(warm_ups, args.runs, form_runs, args.store_users, args.store_servers))
    return 0


if __name__ == "__main__":
    run(main)
