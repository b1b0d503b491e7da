"""Gather what the report needs: the hub's users, the cluster's nodes and pods, Prometheus.

A thin I/O layer around :func:`gpuspawner.admin.report.build_report`: each
source that fails becomes a one-sentence note on the report, never an error
page, so the page still shows what the other sources said.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from ..clients.hubapi import HubClient, HubError
from ..clients.kube import KubeClient
from ..clients.prometheus import PrometheusClient, PrometheusError
from ..core.catalog import Catalog, CatalogError, CatalogFile
from ..core.podspec import gpu_resource_names
from ..core.refusals import shown
from ..core.serverpod import is_managed
from ..inventory.figures import catalog_availability
from ..inventory.model import inventory_from
from .report import PoolReport, build_report

#: Utilisation is the mean over this many seconds.
UTILISATION_WINDOW = 300


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
    ):
        self.hub = hub
        self.kube = kube
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
        report = build_report(
            users=users,
            pods=pods,
            figures=figures,
            catalog=catalog,
            now=now,
            utilisation=utilisation,
            problems=problems,
            utilisation_failed=bool(problem),
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
