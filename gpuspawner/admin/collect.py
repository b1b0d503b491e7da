"""Gather what the report needs: the hub's users, the cluster's nodes and pods, Prometheus.

A thin I/O layer around :func:`gpuspawner.admin.report.build_report`: each
source that fails becomes a one-sentence note on the report, never an error
page, so the page still shows what the other sources said.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from ..catalog import Catalog, CatalogError, CatalogFile
from ..culler.hub import HubClient, HubError
from ..culler.kube import PodLister
from ..culler.prometheus import GPUQueries, PrometheusClient, PrometheusError, parse_vector
from ..inventory.figures import catalog_availability
from ..inventory.model import inventory_from
from ..labels import LABEL_MANAGED
from ..podspec import gpu_resource_names
from .report import PoolReport, build_report

#: Utilisation is the mean over this many seconds.
UTILISATION_WINDOW = 300


class KubeReader(PodLister):
    """Lists GPUSpawner's pods, every node, and (for the figures) every pod, page by page."""

    def __init__(self, namespace: str, *, all_namespaces: bool = True, timeout: float = 30):
        super().__init__(namespace, timeout=timeout)
        self.all_namespaces = all_namespaces

    async def _pages(self, call, *args, **kwargs) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        token = None
        while True:
            extra = {"_continue": token} if token else {}
            self.requests += 1
            response = await call(
                *args,
                limit=500,
                _preload_content=False,
                _request_timeout=self.timeout,
                **kwargs,
                **extra,
            )
            body = json.loads(await response.read())
            if not 200 <= response.status < 300:
                raise RuntimeError(f"HTTP {response.status}: {body.get('message', '')}")
            items += body.get("items") or []
            token = (body.get("metadata") or {}).get("continue")
            if not token:
                return items

    async def snapshot(self) -> tuple[list[dict], list[dict], list[dict]]:
        """(GPUSpawner's pods in the namespace, nodes, pods counted for the figures)."""
        api = await self._client()
        nodes = await self._pages(api.list_node)
        if self.all_namespaces:
            every = await self._pages(api.list_pod_for_all_namespaces)
        else:
            every = await self._pages(api.list_namespaced_pod, self.namespace)
        ours = [
            p
            for p in every
            if (p.get("metadata") or {}).get("namespace") == self.namespace
            and ((p.get("metadata") or {}).get("labels") or {}).get(LABEL_MANAGED) == "true"
        ]
        return ours, nodes, every


def utilisation_from(body: Mapping[str, Any], queries: GPUQueries) -> dict[tuple[str, str], float]:
    """Prometheus's answer -> {(namespace, pod): 0..1} with the configured label names."""
    for item in (body.get("data") or {}).get("result") or []:
        metric = item.get("metric") or {}
        item["metric"] = {
            "__ns__": metric.get(queries.namespace_label, ""),
            "__pod__": metric.get(queries.pod_label, ""),
        }
    return parse_vector(body)


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
        utilisation = None
        if self.prometheus is not None:
            queries = self.prometheus.queries
            try:
                body = await self.prometheus.query(
                    queries.activity("avg_over_time", UTILISATION_WINDOW), now
                )
                utilisation = utilisation_from(body, queries)
            except PrometheusError as e:
                problems.append(f"GPU utilisation is not shown: {e}")
        report = build_report(
            users=users,
            pods=pods,
            figures=figures,
            catalog=catalog,
            now=now,
            utilisation=utilisation,
            problems=problems,
        )
        if not extra_users:
            self._last = (now, report)
        return report
