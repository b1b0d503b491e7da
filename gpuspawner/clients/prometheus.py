"""GPU activity of every GPU pod from Prometheus, the same queries for the culler and the admin page.

The NVIDIA DCGM exporter labels each GPU's series with the pod and namespace
that hold it; :class:`GPUQueries` knows the metric and label names (they are
configurable, see :class:`~gpuspawner.clients.settings.PrometheusSettings`)
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
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from ..core.refusals import shown


class PrometheusError(Exception):
    """Prometheus did not answer, answered with an error, or answered something unreadable."""


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


#: Longest label value read from an answer: a Kubernetes name has at most 253
#: characters, so a longer one names none of our pods.
MAX_LABEL_LENGTH = 253
#: Longest sample value text read: Prometheus writes a timestamp or a ratio in
#: well under this; anything longer is not a number we asked for.
MAX_VALUE_LENGTH = 64

# How Prometheus writes a finite sample value (Go's strconv.FormatFloat, 'f' or 'e').
_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")


def _malformed(what: str) -> PrometheusError:
    return PrometheusError(f"Prometheus answered a malformed query result: {what}")


def _kind(value: Any) -> str:
    """What a JSON value is, in words ("a list", "null")."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    for types, name in (
        (str, "a string"),
        ((int, float), "a number"),
        ((list, tuple), "a list"),
        (Mapping, "an object"),
    ):
        if isinstance(value, types):
            return name
    return f"a {type(value).__name__}"


def _label(metric: Mapping, name: str) -> str:
    value = metric.get(name, "")
    if not isinstance(value, str):
        raise _malformed(f"label {name} is {_kind(value)}, not a string")
    if len(value) > MAX_LABEL_LENGTH:
        raise _malformed(f"label {name} is {len(value)} characters long, {shown(value, 40)}")
    return value


def _finite(value: Any, what: str) -> float:
    """A JSON number, or a number's text as Prometheus writes it, that is finite."""
    if isinstance(value, str):
        if len(value) > MAX_VALUE_LENGTH or not _NUMBER.fullmatch(value):
            raise _malformed(f"the {what} {shown(value, 40)} is not a finite number")
        number = float(value)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            number = float(value)
        except OverflowError:  # an integer too large for a float
            raise _malformed(f"the {what} is out of range") from None
    else:
        raise _malformed(f"the {what} is {_kind(value)}, not a number")
    if not math.isfinite(number):
        raise _malformed(f"the {what} {shown(value, 40)} is not a finite number")
    return number


def parse_vector(body: Any, queries: GPUQueries | None = None) -> dict[tuple[str, str], float]:
    """An instant-vector answer -> ``{(namespace, pod): value}``, read from the queries' label names.

    Everything is checked, since a wrong shape must never read as data: any
    answer other than a vector of ``{"metric": {...}, "value": [time, "number"]}``
    items with finite numbers and string labels raises :class:`PrometheusError`.
    Two samples of one pod (which the queries' ``max by`` rules out) keep the
    larger value: the later last-busy time, the busier GPU.
    """
    queries = queries or GPUQueries()
    if not isinstance(body, Mapping):
        raise _malformed(f"the answer is {_kind(body)}, not an object")
    status = body.get("status")
    if status == "error":
        kind, error = body.get("errorType"), body.get("error")
        raise PrometheusError(
            "Prometheus answered an error"
            + (f" ({shown(kind)})" if isinstance(kind, str) and kind else "")
            + (f": {shown(error)}" if isinstance(error, str) and error else "")
        )
    if status != "success":
        raise _malformed(f"status {shown(status)}")
    data = body.get("data")
    if not isinstance(data, Mapping):
        raise _malformed(f"data is {_kind(data)}, not an object")
    result_type = data.get("resultType")
    if not isinstance(result_type, str):
        raise _malformed(f"resultType is {_kind(result_type)}, not a string")
    if result_type != "vector":
        raise PrometheusError(f"Prometheus answered a {shown(result_type)} result, not a vector")
    items = data.get("result")
    if not isinstance(items, list):
        raise _malformed(f"the result is {_kind(items)}, not a list")
    result: dict[tuple[str, str], float] = {}
    for item in items:
        if not isinstance(item, Mapping):
            raise _malformed(f"a sample is {_kind(item)}, not an object")
        metric, value = item.get("metric"), item.get("value")
        if not isinstance(metric, Mapping):
            raise _malformed(f"a sample's metric is {_kind(metric)}, not an object")
        if not isinstance(value, (list, tuple)) or len(value) != 2:
            raise _malformed("a sample's value is not a [time, value] pair")
        _finite(value[0], "sample time")
        number = _finite(value[1], "sample value")
        key = (_label(metric, queries.namespace_label), _label(metric, queries.pod_label))
        result[key] = max(number, result.get(key, number))
    return result


def _error_detail(body: bytes | None) -> str:
    """The ``error`` of Prometheus's JSON error answer, quoted and short; "" when there is none."""
    if not body:
        return ""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return ""
    error = data.get("error") if isinstance(data, Mapping) else None
    return shown(error) if isinstance(error, str) and error else ""


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

    async def query(self, promql: str, at: float) -> Any:
        """The decoded JSON answer to one instant query; raises PrometheusError.

        The answer's shape is not checked here (see :func:`parse_vector`).
        """
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
        except HTTPClientError as e:
            if e.code == 599:  # tornado's code for a timeout or a dropped connection
                raise PrometheusError(f"Prometheus at {self.url} did not answer: {e}") from e
            detail = _error_detail(e.response.body if e.response is not None else None)
            raise PrometheusError(
                f"Prometheus at {self.url} answered {e.code}" + (f": {detail}" if detail else "")
            ) from e
        except (OSError, ValueError) as e:
            raise PrometheusError(f"Prometheus at {self.url} could not be reached: {e}") from e
        try:
            return json.loads(response.body)
        # RecursionError: JSON nested deeper than the parser goes
        except (ValueError, RecursionError):
            raise PrometheusError(
                f"Prometheus at {self.url} answered something that is not JSON: "
                f"{shown(response.body[:60])}"
            ) from None

    async def per_pod(self, promql: str, at: float) -> dict[tuple[str, str], float]:
        """``{(namespace, pod): value}`` of a query by pod; raises PrometheusError."""
        return parse_vector(await self.query(promql, at), self.queries)
