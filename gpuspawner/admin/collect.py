"""Gather what the report needs: the hub's users, the cluster's nodes and pods, Prometheus, Kueue.

A thin I/O layer around :func:`gpuspawner.admin.report.build_report`: each
source that fails becomes a one-sentence note on the report, never an error
page, so the page still shows what the other sources said.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import quote

from ..clients.hubapi import HubClient, HubError
from ..clients.kube import KubeClient, KubeError, NotFound, Refused
from ..clients.kueue import KueueClient
from ..clients.prometheus import PrometheusClient, PrometheusError
from ..core.catalog import Catalog, CatalogError, CatalogFile
from ..core.podspec import gpu_resource_names
from ..core.refusals import shown
from ..core.serverpod import is_managed
from ..inventory.figures import catalog_availability
from ..inventory.model import inventory_from
from .report import KueueData, PoolReport, build_report

#: Utilisation is the mean over this many seconds.
UTILISATION_WINDOW = 300

#: Pending Workloads read per ClusterQueue and pass (the first in the queue's order), one GET
#: each: their pod sets say what GPUs they wait for. Beyond, the pending GPUs shown are a
#: lower bound. A bound, because a queue of thousands would cost thousands of requests a
#: page view; GETs of named Workloads, because a cluster-wide Workload list would also read
#: every running one (docs/security.md).
MAX_PENDING_READ = 100
#: Workload GETs in flight at once.
PARALLEL_READS = 8

#: Where the admin service's Kueue rights are explained.
KUEUE_RIGHTS = (
    "config/rbac-kueue.yaml grants it, as the chart does with gpuspawner.admin.kueueClusterQueues; "
    "docs/security.md"
)


class KubeReader:
    """The cluster as the report needs it: GPUSpawner's pods, the nodes and the pods counted for the figures."""

    def __init__(self, client: KubeClient, *, all_namespaces: bool = True):
        self.client = client
        self.all_namespaces = all_namespaces

    async def snapshot(self) -> tuple[list[dict], list[dict], list[dict]]:
        """(GPUSpawner's pods in the namespace, nodes, pods counted for the figures)."""
        nodes = await self.client.list_nodes()
        every = await self.client.list_pods(all_namespaces=self.all_namespaces)
        namespace = self.client.namespace
        ours = [
            p
            for p in every
            if (p.get("metadata") or {}).get("namespace") == namespace and is_managed(p)
        ]
        return ours, nodes, every

    async def close(self) -> None:
        await self.client.close()


def kueue_problem(what: str, error: Exception) -> str:
    """The page's sentence for a Kueue read that failed: what is not shown, and why."""
    text = " ".join(str(error).split()).rstrip(".")
    if isinstance(error, Refused):
        return f"{what}: the admin service may not read it ({KUEUE_RIGHTS}): {text}."
    return f"{what}: {text}."


class KueueReader:
    """Kueue as the report needs it: the named ClusterQueues, the ResourceFlavors, the pending
    Workloads of each queue.

    ``client``: a :class:`~gpuspawner.clients.kueue.KueueClient` (or one like it); else one
    is made from ``kube`` on the first read, sharing its API client.
    """

    def __init__(
        self,
        cluster_queues: Iterable[str],
        *,
        client: Any = None,
        kube: KubeClient | None = None,
        max_pending: int = MAX_PENDING_READ,
    ):
        self.names = tuple(dict.fromkeys(cluster_queues))
        self._client = client
        self._kube = kube
        self.max_pending = max_pending

    async def client(self) -> Any:
        if self._client is None:
            if self._kube is None:
                raise KubeError("Kubernetes is not configured")
            self._client = await KueueClient.from_kube(self._kube)
        return self._client

    async def read(self) -> tuple[KueueData, list[str]]:
        """What was read, and one sentence for each thing that could not be.

        A ClusterQueue that does not exist or cannot be read is a sentence and no rows;
        ResourceFlavors that cannot be read leave the GPU types unknown; a pending list
        (Kueue's visibility API) or Workload that cannot be read leaves that queue's
        pending GPUs unknown. A Workload gone or admitted since the list was read is
        simply not pending any more.
        """
        problems: list[str] = []
        try:
            client = await self.client()
        except Exception as e:  # no configuration: the rest of the page stands
            return KueueData(self.names), [kueue_problem("Kueue's ClusterQueues are not shown", e)]
        queues: dict[str, Mapping[str, Any]] = {}
        for name in self.names:
            try:
                queues[name] = await client.cluster_queue(name)
            except NotFound:
                problems.append(
                    f"The ClusterQueue {shown(name)} does not exist "
                    "(GPUAdmin.kueue_cluster_queues names it)."
                )
            except KubeError as e:
                problems.append(kueue_problem(f"The ClusterQueue {shown(name)} is not shown", e))
        flavors: list[Mapping[str, Any]] = []
        if queues:
            try:
                flavors = await client.resource_flavors()
            except KubeError as e:
                problems.append(
                    kueue_problem(
                        "Kueue's ResourceFlavors could not be read, so the GPU types of the "
                        "ClusterQueues' flavors and their pending GPUs are not known",
                        e,
                    )
                )
        pending: dict[str, list[Mapping[str, Any]]] = {}
        partial: set[str] = set()
        for name in queues:
            what = f"The pending GPUs of the ClusterQueue {shown(name)} are not shown"
            try:
                # one more than shown: enough to tell the list is partial
                entries = await client.pending_in_cluster_queue(name, limit=self.max_pending + 1)
            except KubeError as e:
                problems.append(kueue_problem(f"{what} (Kueue's visibility API)", e))
                continue
            if len(entries) > self.max_pending:
                partial.add(name)
            try:
                pending[name] = await self.workloads(client, entries[: self.max_pending])
            except KubeError as e:
                problems.append(kueue_problem(what, e))
        return (
            KueueData(self.names, queues, tuple(flavors), pending, frozenset(partial)),
            problems,
        )

    async def workloads(self, client: Any, entries: list[Any]) -> list[Mapping[str, Any]]:
        """The Workloads of these pending entries that still exist, in the entries' order."""
        turns = asyncio.Semaphore(PARALLEL_READS)

        async def get(entry: Any) -> Mapping[str, Any] | None:
            async with turns:
                try:
                    return await client.workload(entry.namespace, entry.name)
                except NotFound:  # admitted and finished, or deleted, since the list
                    return None

        found = await asyncio.gather(*(get(e) for e in entries))
        return [w for w in found if w is not None]


class Collector:
    """Builds reports; keeps the last one for ``cache_seconds`` so many admins cost one pass."""

    def __init__(
        self,
        hub: HubClient,
        kube: KubeReader | None,
        catalog_file: str = "",
        prometheus: PrometheusClient | None = None,
        cache_seconds: float = 10,
        log: logging.Logger | None = None,
        kueue: KueueReader | None = None,
    ):
        self.hub = hub
        self.kube = kube
        self.kueue = kueue
        self.catalog_source = CatalogFile(catalog_file) if catalog_file else None
        self.prometheus = prometheus
        self.cache_seconds = cache_seconds
        self.log = log or logging.getLogger(__name__)
        self._last: tuple[float, PoolReport] | None = None

    def invalidate(self) -> None:
        self._last = None

    def catalog(self) -> tuple[Catalog | None, str]:
        if self.catalog_source is None:
            return None, "No catalog file is configured, so limits are not shown."
        try:
            catalog, _ = self.catalog_source.get()
            return catalog, ""
        except CatalogError as e:
            return None, f"The catalog could not be read, so limits are not shown: {e}"

    async def users(self, extra: tuple[str, ...] = ()) -> list[Mapping[str, Any]]:
        users = {u["name"]: u async for u in self.hub.iter_users(state="active")}
        for name in extra:
            if name not in users:
                try:
                    _, model = await self.hub.request("GET", f"/users/{quote(name, safe='')}")
                    users[name] = model
                except HubError as e:
                    if e.status != 404:
                        raise
        return list(users.values())

    async def utilisation(
        self, prometheus: PrometheusClient, now: float
    ) -> tuple[dict[tuple[str, str], float] | None, str]:
        """(GPU utilisation per (namespace, pod), "") or (None, why it is not shown).

        Whatever Prometheus does (no answer, a timeout, an error, a body that
        is not a query result), the page is shown without utilisation.
        """
        mean = prometheus.queries.activity("avg_over_time", UTILISATION_WINDOW)
        try:
            return await prometheus.per_pod(mean, now), ""
        except PrometheusError as e:
            return None, utilisation_problem(e, prometheus.url, prometheus.timeout)
        except Exception as e:  # a body the client did not recognise as wrong
            self.log.warning(
                "Prometheus at %s answered something that is not a query result: %s",
                prometheus.url,
                shown(f"{type(e).__name__}: {e}", 200),
            )
            return None, (
                f"GPU utilisation is not shown: Prometheus at {prometheus.url} answered "
                "something that is not a query result."
            )

    async def queues(self) -> tuple[KueueData, list[str]]:
        """Kueue's named ClusterQueues; whatever goes wrong, a sentence and the rest of the page."""
        reader = self.kueue
        if reader is None:
            return KueueData(()), []
        try:
            return await reader.read()
        except Exception as e:  # an answer of a shape no client check caught
            self.log.warning(
                "Kueue's ClusterQueues could not be read: %s",
                shown(f"{type(e).__name__}: {e}", 200),
            )
            return KueueData(reader.names), [
                "Kueue's ClusterQueues are not shown: the API server answered something that "
                "is not a Kueue object."
            ]

    async def report(self, extra_users: tuple[str, ...] = (), fresh: bool = False) -> PoolReport:
        """The report; the last one if younger than ``cache_seconds``, unless ``fresh``."""
        now = time.time()
        if not (extra_users or fresh) and self._last and now - self._last[0] < self.cache_seconds:
            return self._last[1]
        problems: list[str] = []
        catalog, problem = self.catalog()
        if problem:
            problems.append(problem)
        try:
            users = await self.users(extra_users)
        except HubError as e:
            users = []
            problems.append(f"The hub's users could not be listed: {e}")
        except Exception as e:  # an answer of the wrong shape: the page shows the cluster still
            self.log.warning(
                "The hub's user list could not be read: %s", shown(f"{type(e).__name__}: {e}", 200)
            )
            users = []
            problems.append(
                "The hub's users could not be listed: the hub API answered something that is "
                "not a user list."
            )
        pods: list[dict] = []
        figures: dict = {}
        if self.kube is None:
            problems.append("Kubernetes is not configured, so pods and GPU figures are not shown.")
        else:
            try:
                pods, nodes, every = await self.kube.snapshot()
                extra = gpu_resource_names(catalog) if catalog else ()
                inventory = inventory_from(nodes, every, extra)
                if catalog is not None:
                    figures = catalog_availability(inventory, catalog)
                else:
                    figures = inventory.by_resource()
            except Exception as e:  # any API or transport failure: show the rest
                problems.append(f"The cluster could not be read: {e}")
        utilisation, problem = None, ""
        if self.prometheus is not None:
            utilisation, problem = await self.utilisation(self.prometheus, now)
            if problem:
                problems.append(problem)
        queues: KueueData | None = None
        if self.kueue is not None:
            queues, more = await self.queues()
            problems += more
        report = build_report(
            users=users,
            pods=pods,
            figures=figures,
            catalog=catalog,
            now=now,
            utilisation=utilisation,
            problems=problems,
            utilisation_failed=bool(problem),
            queues=queues,
        )
        if not extra_users:
            self._last = (now, report)
        return report


def utilisation_problem(error: PrometheusError, url: str, timeout: float) -> str:
    """The page's sentence for a failed utilisation query."""
    from tornado.simple_httpclient import HTTPTimeoutError

    # the client reports a timeout as tornado's pseudo-status 599, which says nothing to an admin
    if isinstance(error.__cause__, HTTPTimeoutError):
        return f"GPU utilisation is not shown: Prometheus at {url} did not answer within {timeout:g} s."
    text = " ".join(str(error).split())
    return f"GPU utilisation is not shown: {text}" + ("" if text.endswith(".") else ".")
