"""GPU busyness of the culler's servers: two Prometheus queries per pass, for all pods at once.

The queries and the client are the services' (:mod:`gpuspawner.clients.prometheus`);
here their answers become the culler policy's :class:`~gpuspawner.culler.policy.GPUView`,
and :class:`GPUStatusReader` reads, with a cache, what ``/api/gpu-status`` shows.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping

from ..clients.prometheus import (
    DEVICE_LABELS,
    PrometheusClient,
    PrometheusError,
    parse_matrix,
    parse_series,
)
from .gpustatus import HISTORY_SECONDS, HISTORY_STEP, PROMETHEUS_DOWN, Figures, figures_from
from .policy import GPUSample, GPUView


def gpu_view_from(
    fresh: Mapping[tuple[str, str], float],
    last_busy: Mapping[tuple[str, str], float],
    now: float,
    window: float,
) -> GPUView:
    """Combine the two answers: only pods with fresh data get a sample."""
    window_start = now - window
    samples = {
        key: GPUSample(last_busy=last_busy.get(key), window_start=window_start) for key in fresh
    }
    return GPUView(enabled=True, ok=True, samples=samples)


async def gpu_view(prometheus: PrometheusClient, now: float | None = None) -> GPUView:
    """Both queries at the same evaluation time; raises PrometheusError."""
    now = time.time() if now is None else now
    queries = prometheus.queries
    fresh = await prometheus.per_pod(queries.fresh_query(), now)
    busy = await prometheus.per_pod(queries.last_busy_query(), now)
    return gpu_view_from(fresh, busy, now, queries.window)


class GPUStatusReader:
    """The figures ``/api/gpu-status`` answers from, read once for every caller together.

    The per-pod "now" figures (two queries: the device series and the last busy
    times of all the pass's GPU pods) are read at most once per ``ttl`` seconds for
    the same pods, a failure included, and requests arriving meanwhile share the
    one reading; a pod's last hour at most once per history step. Its client has a
    short timeout, so a request while Prometheus is down answers promptly.
    """

    def __init__(
        self,
        prometheus: PrometheusClient | None,
        ttl: float,
        timeout: float = 5,
        clock=time.time,
    ):
        self.client = (
            None
            if prometheus is None
            else PrometheusClient(
                prometheus.url,
                prometheus.queries,
                timeout=min(timeout, prometheus.timeout),
                headers=prometheus.headers,
            )
        )
        self.ttl = ttl
        self.clock = clock
        self._figures: tuple[frozenset, Figures] | None = None
        self._history: dict[tuple[str, str], tuple[float, list[tuple[float, float]] | None]] = {}
        self._reading: dict[object, asyncio.Future] = {}

    async def _once(self, key: object, read) -> object:
        """``read()``'s result, shared by every caller asking for ``key`` while it runs."""
        future = self._reading.get(key)
        if future is None:
            future = asyncio.ensure_future(read())
            self._reading[key] = future
            future.add_done_callback(lambda _: self._reading.pop(key, None))
        # shielded: one caller going away does not cancel the others' reading
        return await asyncio.shield(future)

    async def figures(self, pods: frozenset[tuple[str, str]]) -> Figures:
        now = self.clock()
        if self.client is None:
            return Figures(at=now, window_start=now, enabled=False)
        cached = self._figures
        if cached is not None and cached[0] == pods and now - cached[1].at < self.ttl:
            return cached[1]
        figures = await self._once(("figures", pods), lambda: self._read_figures(pods))
        self._figures = (pods, figures)
        return figures

    async def _read_figures(self, pods: frozenset[tuple[str, str]]) -> Figures:
        now = self.clock()
        queries = self.client.queries
        if not pods:
            return Figures(at=now, window_start=now - queries.window)
        try:
            series = parse_series(
                await self.client.query(queries.devices_query(pods), now),
                ("__name__", queries.namespace_label, queries.pod_label, *DEVICE_LABELS),
            )
            last_busy = await self.client.per_pod(queries.last_busy_query(pods), now)
        except PrometheusError:
            return Figures(at=now, window_start=now - queries.window, unavailable=PROMETHEUS_DOWN)
        return figures_from(series, last_busy, pods, queries, now)

    async def history(self, namespace: str, pod: str) -> list[tuple[float, float]] | None:
        """The pod's mean activity over the last hour, one point per step; None if unreadable."""
        if self.client is None:
            return None
        now = self.clock()
        key = (namespace, pod)
        cached = self._history.get(key)
        if cached is not None and now - cached[0] < HISTORY_STEP:
            return cached[1]
        points = await self._once(("history", key), lambda: self._read_history(namespace, pod))
        # keep only what is still fresh: the cache holds no more than the pods asked lately
        self._history = {k: v for k, v in self._history.items() if now - v[0] < HISTORY_STEP} | {
            key: (now, points)
        }
        return points

    async def _read_history(self, namespace: str, pod: str) -> list[tuple[float, float]] | None:
        end = self.clock()
        try:
            return parse_matrix(
                await self.client.query_range(
                    self.client.queries.history_query(namespace, pod),
                    end - HISTORY_SECONDS,
                    end,
                    HISTORY_STEP,
                )
            )
        except PrometheusError:
            return None
