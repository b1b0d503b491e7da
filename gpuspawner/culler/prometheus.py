"""GPU busyness of the culler's servers: two Prometheus queries per pass, for all pods at once.

The queries and the client are the services' (:mod:`gpuspawner.clients.prometheus`);
here their answers become the culler policy's :class:`~gpuspawner.culler.policy.GPUView`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from ..clients.prometheus import PrometheusClient
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
