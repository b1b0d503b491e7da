"""GPU activity of every GPU pod from Prometheus, the same queries for the culler and the admin page.

The NVIDIA DCGM exporter labels each GPU's series with the pod and namespace
that hold it; :class:`GPUQueries` knows the metric and label names (they are
configurable, see :class:`~gpuspawner.services.settings.PrometheusSettings`)
and builds the PromQL. The culler asks, for all pods at once:

* **fresh**: which pods have GPU data in the last ``freshness`` seconds
  (a GPU server without fresh data counts as busy);
* **last busy**: the last time, within ``window`` seconds, that any GPU of
  the pod was above the threshold (a subquery over ``timestamp()``).

The admin page asks for the mean activity per pod over five minutes.

``DCGM_FI_DEV_GPU_UTIL`` is in percent; ``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` is a
0..1 ratio and is used for pods without ``GPU_UTIL`` (MIG devices do not report
it). Both are brought to 0..1 and combined with PromQL's ``or`` per pod, so the
number of queries does not depend on the number of servers.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlencode


class PrometheusError(Exception):
    """Prometheus did not answer, or answered with an error."""


_LABEL_NAME_OK = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")


def _check_name(name: str, what: str) -> str:
    if not name or not set(name) <= _LABEL_NAME_OK or name[0].isdigit():
        raise ValueError(f"{what} {name!r} is not a valid Prometheus name")
    return name


@dataclass(frozen=True)
class GPUQueries:
    """How to find GPU activity in Prometheus: metric and label names, window, threshold."""

    util_metric: str = "DCGM_FI_DEV_GPU_UTIL"
    engine_metric: str = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
    pod_label: str = "pod"
    namespace_label: str = "namespace"
    #: busy above this fraction of the GPU (0.05 = 5 % utilisation)
    threshold: float = 0.05
    window: int = 7200
    step: int = 60
    freshness: int = 300

    def __post_init__(self):
        for name, what in (
            (self.util_metric, "metric"),
            (self.engine_metric, "metric"),
            (self.pod_label, "label"),
            (self.namespace_label, "label"),
        ):
            _check_name(name, what)

    def _by(self) -> str:
        return f"{self.namespace_label}, {self.pod_label}"

    def _selector(self, metric: str) -> str:
        return f'{metric}{{{self.pod_label}!=""}}'

    def activity(self, range_function: str | None = None, seconds: int = 0) -> str:
        """Per-pod GPU activity as a 0..1 value: GPU_UTIL / 100, else GR_ENGINE_ACTIVE."""

        def series(metric: str) -> str:
            selector = self._selector(metric)
            if range_function:
                selector = f"{range_function}({selector}[{seconds}s])"
            return f"max by ({self._by()}) ({selector})"

        return f"(({series(self.util_metric)}) / 100) or ({series(self.engine_metric)})"

    def fresh_query(self) -> str:
        return self.activity("max_over_time", self.freshness)

    def last_busy_query(self) -> str:
        return (
            f"max_over_time(timestamp(({self.activity()}) > {self.threshold:g})"
            f"[{self.window}s:{self.step}s])"
        )


def parse_vector(body: Mapping, queries: GPUQueries | None = None) -> dict[tuple[str, str], float]:
    """An instant-vector answer -> ``{(namespace, pod): value}``, read from the queries' label names."""
    queries = queries or GPUQueries()
    if body.get("status") != "success":
        raise PrometheusError(
            f"Prometheus answered {body.get('errorType', 'an error')}: {body.get('error', '')}"
        )
    data = body.get("data") or {}
    if data.get("resultType") != "vector":
        raise PrometheusError(f"Prometheus answered a {data.get('resultType')}, not a vector")
    result = {}
    for item in data.get("result") or []:
        metric = item.get("metric") or {}
        value = item.get("value") or [None, "NaN"]
        key = (metric.get(queries.namespace_label, ""), metric.get(queries.pod_label, ""))
        result[key] = float(value[1])
    return result


class PrometheusClient:
    """Runs the GPU queries against Prometheus's HTTP API (``/api/v1/query``)."""

    def __init__(
        self,
        url: str,
        queries: GPUQueries,
        *,
        timeout: float = 30,
        headers: Mapping[str, str] | None = None,
    ):
        self.url = url.rstrip("/")
        self.queries = queries
        self.timeout = timeout
        self.headers = dict(headers or {})
        #: queries sent since start (the benchmark reports it per pass)
        self.requests = 0

    async def query(self, promql: str, at: float) -> Mapping:
        from tornado.httpclient import AsyncHTTPClient, HTTPClientError

        self.requests += 1
        body = urlencode({"query": promql, "time": f"{at:.3f}"})
        try:
            response = await AsyncHTTPClient().fetch(
                f"{self.url}/api/v1/query",
                method="POST",
                body=body,
                headers={"Content-Type": "application/x-www-form-urlencoded", **self.headers},
                request_timeout=self.timeout,
                connect_timeout=self.timeout,
            )
            return json.loads(response.body)
        except HTTPClientError as e:
            detail = ""
            if e.response is not None and e.response.body:
                try:
                    detail = json.loads(e.response.body).get("error", "")
                except ValueError:
                    detail = ""
            raise PrometheusError(f"Prometheus at {self.url} answered {e.code} {detail}") from e
        except (OSError, ValueError) as e:
            raise PrometheusError(f"Prometheus at {self.url} could not be reached: {e}") from e

    async def per_pod(self, promql: str, at: float) -> dict[tuple[str, str], float]:
        """``{(namespace, pod): value}`` of a query by pod; raises PrometheusError."""
        return parse_vector(await self.query(promql, at), self.queries)
