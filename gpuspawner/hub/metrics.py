"""The hub's GPU metrics, served on the hub's own ``/metrics`` (JupyterHub's default registry).

Defined once, at import (the spawner imports this module, so they exist as
soon as the hub loads GPUSpawner). Every label has a bounded set of values —
GPU type (the catalog's keys), user group (the hub's groups), refusal or
check-failure reason (fixed lists below) — and **never the user name**, so
the number of series does not grow with the number of users.

- ``gpuspawner_spawn_refusals_total{reason}``: spawns refused before any pod
  was created (``limit``, ``group-pool``, ``never-schedulable``,
  ``no-capacity``, ``invalid-request``, …) and spawns that failed later
  (``unschedulable``, ``gpu-check``).
- ``gpuspawner_validation_failures_total{reason}``: failed GPU checks by kind
  (``gpu-count``, ``driver-too-old``, ``gpu-unhealthy``, …).
- ``gpuspawner_gpu_spawn_duration_seconds{gpu_type}``: from the start of a GPU
  server's spawn until its pod runs (GPU check passed).
- ``gpuspawner_gpus_requested{gpu_type,group}`` / ``gpuspawner_gpus_allocated{…}``:
  GPUs of the hub's servers (allocated: the pod is bound to a node), read at
  scrape time from the pod reflector the hub keeps anyway: no API request per
  scrape. A user in several groups is counted in each; ``group=""`` holds
  users in no group.
- ``gpuspawner_pool_gpus{gpu_type,figure}``: the cluster's figures per catalog
  type from the hub's inventory (``allocatable``, ``in_use``, ``free``,
  ``waiting_pods``).
- ``gpuspawner_node_gpus{gpu_type,node,figure}``: the same per node
  (``allocatable``, ``free``; GPUs promised to admitted servers whose pods are
  not on a node yet count as taken), so the culler can tell which servers'
  GPUs would make a waiting request fit on one node.
- ``gpuspawner_gpu_demand{gpu_type,gpus,source}``: requests waiting for GPUs,
  by type and size: ``queued`` in the hub's queue, ``refused`` for lack of free
  GPUs within ``gpu_demand_window``, and the hub's ``pending`` pods the
  scheduler cannot place for lack of GPUs. Never by user. The culler's
  pressure mode reads it (with the ``read:metrics`` scope).
- ``gpuspawner_gpu_seconds_total{gpu_type,group}``: GPU-seconds the hub's servers
  have held (GPUs × seconds from scheduling to the pod's end), by GPU type and
  charge group (one group per server, so groups add up), from the usage
  recorder (:mod:`gpuspawner.hub.accounting`): the closed intervals kept in
  the usage store, so it counts on across hub restarts, plus the open ones up
  to the scrape. Never by user.
"""

from __future__ import annotations

import time
from collections import Counter as Tally
from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client import REGISTRY, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ..core import refusals
from ..core.serverpod import ServerPod
from ..validation import podstatus
from . import state as hubstate

#: The refusal reasons the spawner gives (other values are counted as "other"); each is
#: a reason of the table of refusals, :data:`gpuspawner.core.refusals.SENTENCES`.
REFUSAL_REASONS = (
    refusals.REASON_INVALID,
    refusals.REASON_LIMIT,
    refusals.REASON_GROUP_POOL,
    refusals.REASON_NEVER,
    refusals.REASON_NO_CAPACITY,
    refusals.REASON_UNSCHEDULABLE,
    refusals.REASON_USAGE_UNKNOWN,
    refusals.REASON_CATALOG_INVALID,
    refusals.REASON_GPU_CHECK,
)

SPAWN_REFUSALS = Counter(
    "gpuspawner_spawn_refusals",
    "GPU spawns refused or failed, by reason (never by user)",
    ["reason"],
)
VALIDATION_FAILURES = Counter(
    "gpuspawner_validation_failures",
    "Failed GPU checks (the nvidia-smi init container), by reason",
    ["reason"],
)
GPU_SPAWN_DURATION = Histogram(
    "gpuspawner_gpu_spawn_duration_seconds",
    "Seconds from the start of a GPU server's spawn until its pod runs with checked GPUs",
    ["gpu_type"],
    buckets=(5, 10, 20, 30, 60, 120, 300, 600, float("inf")),
)

for _reason in REFUSAL_REASONS:
    SPAWN_REFUSALS.labels(reason=_reason)
for _reason in podstatus.CHECK_FAILURE_KINDS:
    VALIDATION_FAILURES.labels(reason=_reason)


def refusal_reason(reason: str | None) -> str:
    """The label for a refusal reason: one of REFUSAL_REASONS, else "other"."""
    return reason if reason in REFUSAL_REASONS else "other"


def count_refusal(reason: str | None) -> None:
    SPAWN_REFUSALS.labels(reason=refusal_reason(reason)).inc()


def check_failure_reason(pod: Mapping[str, Any]) -> str:
    """The bounded reason label of a failed GPU check, from the check container's exit code."""
    return podstatus.check_failure_kind(dict(pod)) or podstatus.OTHER_KIND


def count_validation_failure(pod: Mapping[str, Any]) -> None:
    VALIDATION_FAILURES.labels(reason=check_failure_reason(pod)).inc()


def observe_spawn_duration(gpu_type: str, seconds: float) -> None:
    GPU_SPAWN_DURATION.labels(gpu_type=gpu_type).observe(seconds)


# ---------------------------------------------------------------------------
# GPUs by type and group, read at scrape time
# ---------------------------------------------------------------------------


def track(spawner: Any) -> None:
    """Remember a spawner (weakly, in the hub's state) so its server's GPUs are counted at scrape time."""
    hubstate.current().spawners.add(spawner)


def gpus_by_group(
    servers: Iterable[tuple[Iterable[str], Mapping[str, Any]]],
) -> tuple[dict[tuple[str, str], int], dict[tuple[str, str], int]]:
    """(requested, allocated) GPUs per (gpu_type, group) from (user's groups, server pod) pairs.

    A pod being deleted or finished holds nothing; a pod holds GPUs once bound
    to a node (``spec.nodeName``).
    """
    requested: dict[tuple[str, str], int] = {}
    allocated: dict[tuple[str, str], int] = {}
    for groups, raw in servers:
        pod = ServerPod.from_pod(raw)
        if not pod.active or pod.gpu_type is None:
            continue
        for group in sorted(set(groups)) or [""]:
            key = (pod.gpu_type, group)
            requested[key] = requested.get(key, 0) + pod.gpus
            if pod.bound:
                allocated[key] = allocated.get(key, 0) + pod.gpus
    return requested, allocated


class GPUCollector:
    """Scrape-time figures from the hub's memory: tracked spawners, their pod reflector, the inventory."""

    def describe(self):
        return []

    def collect(self):
        requested = GaugeMetricFamily(
            "gpuspawner_gpus_requested",
            "GPUs requested by the hub's servers (pods not finished), by GPU type and user group",
            labels=["gpu_type", "group"],
        )
        allocated = GaugeMetricFamily(
            "gpuspawner_gpus_allocated",
            "GPUs allocated to the hub's servers (pods bound to a node), by GPU type and user group",
            labels=["gpu_type", "group"],
        )
        pool = GaugeMetricFamily(
            "gpuspawner_pool_gpus",
            "The cluster's GPUs per catalog type (allocatable, in_use, free, waiting_pods)",
            labels=["gpu_type", "figure"],
        )
        node_figures = GaugeMetricFamily(
            "gpuspawner_node_gpus",
            "GPUs per node serving a catalog type (allocatable, free)",
            labels=["gpu_type", "node", "figure"],
        )
        demand = GaugeMetricFamily(
            "gpuspawner_gpu_demand",
            "Requests waiting for GPUs (queued, refused lately, pending pods), by GPU type and "
            "count, never by user",
            labels=["gpu_type", "gpus", "source"],
        )
        state = hubstate.current()
        spawners = list(state.spawners)
        server_pods = _server_pods(spawners)
        req, alloc = gpus_by_group(server_pods)
        for (gpu_type, group), value in sorted(req.items()):
            requested.add_metric([gpu_type, group], value)
        for (gpu_type, group), value in sorted(alloc.items()):
            allocated.add_metric([gpu_type, group], value)
        for key, availability in sorted(_pool_figures(spawners).items()):
            pool.add_metric([key, "allocatable"], availability.allocatable)
            pool.add_metric([key, "in_use"], availability.requested)
            pool.add_metric([key, "free"], availability.free)
            pool.add_metric([key, "waiting_pods"], availability.pending)
            for node in availability.nodes:
                node_figures.add_metric([key, node.node, "allocatable"], node.allocatable)
                node_figures.add_metric([key, node.node, "free"], node.free)
        waiting = demand_requests(state.demand(time.monotonic()), (pod for _, pod in server_pods))
        for (gpu_type, gpus, source), count in sorted(waiting.items()):
            demand.add_metric([gpu_type, str(gpus), source], count)
        yield requested
        yield allocated
        yield pool
        yield node_figures
        yield demand
        yield gpu_seconds_family(state.recorder)


def gpu_seconds_family(recorder: Any) -> CounterMetricFamily:
    """``gpuspawner_gpu_seconds_total{gpu_type,group}`` from the usage recorder (empty without one)."""
    family = CounterMetricFamily(
        "gpuspawner_gpu_seconds",
        "GPU-seconds held by the hub's servers (from scheduling to the pod's end), by GPU type "
        "and charge group, never by user",
        labels=["gpu_type", "group"],
    )
    if recorder is not None:
        for (gpu_type, group), value in sorted(recorder.totals().items()):
            family.add_metric([gpu_type, group], value)
    return family


def demand_requests(
    hub_demand: Iterable[tuple[str, str, int]], pods: Iterable[Mapping[str, Any]]
) -> dict[tuple[str, int, str], int]:
    """Number of waiting requests per (gpu_type, gpus, source): the hub's queue and refusals
    (``(source, type, gpus)`` from :meth:`HubState.demand`) and the server pods waiting for GPUs."""
    counts: Tally[tuple[str, int, str]] = Tally()
    for source, gpu_type, gpus in hub_demand:
        counts[(gpu_type, gpus, source)] += 1
    for raw in pods:
        pod = ServerPod.from_pod(raw)
        if pod.gpu_type is not None and pod.waiting_for_gpus:
            counts[(pod.gpu_type, pod.gpus, "pending")] += 1
    return dict(counts)


def _server_pods(spawners: list[Any]) -> list[tuple[list[str], Mapping[str, Any]]]:
    out = []
    seen = set()
    for spawner in spawners:
        try:
            reflector = spawner.pod_reflector
            if reflector is None:
                continue
            key = f"{spawner.namespace}/{spawner.pod_name}"
            pod = reflector.pods.get(key)
            if pod is None or key in seen:
                continue
            seen.add(key)
            groups = [g.name for g in getattr(spawner.user, "groups", None) or []]
            out.append((groups, pod))
        except Exception:  # a half-built or deleted spawner: skip it, never fail a scrape
            continue
    return out


def _pool_figures(spawners: list[Any]) -> dict:
    for spawner in spawners:
        try:
            if not spawner.gpu_catalog_configured or spawner.gpu_inventory() is None:
                continue
            return spawner.gpu_availability(spawner.load_catalog()) or {}
        except Exception:  # no running loop, invalid catalog, inventory off: no pool figures
            continue
    return {}


REGISTRY.register(GPUCollector())
