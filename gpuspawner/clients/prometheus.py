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

The culler's ``/api/gpu-status`` asks, for the GPU pods of its last pass
(matched by regular expressions built from their names, each escaped):

* **device figures**: the raw per-GPU series of utilisation and framebuffer
  memory (``DCGM_FI_DEV_FB_USED`` and ``DCGM_FI_DEV_FB_FREE``, in MiB), one
  instant query for all those pods (:meth:`GPUQueries.devices_query`);
* **last busy** of those pods, as the culler computes it;
* **history**: one pod's mean activity over the last hour (a range query).

``DCGM_FI_DEV_GPU_UTIL`` is in percent; ``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` is a
0..1 ratio and is used for pods without ``GPU_UTIL`` (MIG devices do not report
it). Both are brought to 0..1 and combined with PromQL's ``or`` per pod, so the
number of queries does not depend on the number of servers.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
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


def promql_string(value: str) -> str:
    """``value`` as a PromQL double-quoted string literal: nothing in it ends the string.

    Backslash and double quote are escaped, and every other character that is
    not printable ASCII or a letter beyond ASCII is written as ``\\xHH`` or
    ``\\uHHHH``, which PromQL's lexer reads back as that character.
    """
    out = ['"']
    for ch in value:
        code = ord(ch)
        if ch in ('"', "\\"):
            out.append("\\" + ch)
        elif 0x20 <= code < 0x7F or (code > 0x9F and ch.isprintable() and code < 0xD800):
            out.append(ch)
        elif code < 0x100:
            out.append(f"\\x{code:02x}")
        elif code < 0x10000:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    out.append('"')
    return "".join(out)


def regex_literal(value: str) -> str:
    """A regular expression (RE2, as Prometheus uses) matching exactly ``value``.

    Every ASCII character that is not a letter, digit or underscore gets a
    backslash, which RE2 reads as that character itself.
    """
    return "".join(
        "\\" + ch if ord(ch) < 0x80 and not (ch.isalnum() or ch == "_") else ch for ch in value
    )


def one_of(values: Iterable[str]) -> str:
    """A PromQL string literal of a regular expression matching exactly these values."""
    return promql_string("|".join(regex_literal(v) for v in sorted(set(values))))


#: DCGM's per-GPU labels, beside the pod and namespace (``GPU_I_ID``: a MIG instance).
DEVICE_LABELS = ("gpu", "UUID", "GPU_I_ID")


@dataclass(frozen=True)
class GPUQueries:
    """How to find GPU activity in Prometheus: metric and label names, window, threshold."""

    util_metric: str = "DCGM_FI_DEV_GPU_UTIL"
    engine_metric: str = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
    pod_label: str = "pod"
    namespace_label: str = "namespace"
    #: framebuffer memory used and free, in MiB (DCGM exporter)
    memory_used_metric: str = "DCGM_FI_DEV_FB_USED"
    memory_free_metric: str = "DCGM_FI_DEV_FB_FREE"
    #: busy above this fraction of the GPU (0.05 = 5 % utilisation)
    threshold: float = 0.05
    window: int = 7200
    step: int = 60
    freshness: int = 300

    def __post_init__(self):
        for name, what in (
            (self.util_metric, "metric"),
            (self.engine_metric, "metric"),
            (self.memory_used_metric, "metric"),
            (self.memory_free_metric, "metric"),
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

    def last_busy_query(self, pods: Iterable[tuple[str, str]] | None = None) -> str:
        """The last busy time per pod; ``pods``: only these ``(namespace, pod)``."""
        activity = self.activity() if pods is None else self._pods_activity(pods)
        return (
            f"max_over_time(timestamp(({activity}) > {self.threshold:g})"
            f"[{self.window}s:{self.step}s])"
        )

    def pods_matcher(self, pods: Iterable[tuple[str, str]]) -> str:
        """Label matchers for exactly these ``(namespace, pod)`` names, escaped.

        Namespaces and pods are matched separately, so an answer may hold a pod
        of the same name in another of the namespaces: the caller keeps only the
        pairs it asked for.
        """
        pods = list(pods)
        return (
            f"{self.namespace_label}=~{one_of(ns for ns, _ in pods)}, "
            f"{self.pod_label}=~{one_of(pod for _, pod in pods)}"
        )

    def _pods_activity(self, pods: Iterable[tuple[str, str]], by: str | None = None) -> str:
        matcher = self.pods_matcher(pods)
        by = by or self._by()
        return (
            f"((max by ({by}) ({self.util_metric}{{{matcher}}})) / 100)"
            f" or (max by ({by}) ({self.engine_metric}{{{matcher}}}))"
        )

    def devices_query(self, pods: Iterable[tuple[str, str]]) -> str:
        """The raw per-GPU series of these pods: activity and memory, one instant query."""
        names = "|".join(
            (self.util_metric, self.engine_metric, self.memory_used_metric, self.memory_free_metric)
        )
        return f'{{__name__=~"{names}", {self.pods_matcher(pods)}}}'

    def history_query(self, namespace: str, pod: str) -> str:
        """One pod's activity, 0..1, averaged over its GPUs (for a range query)."""
        by = ", ".join(DEVICE_LABELS)
        return f"avg({self._pods_activity([(namespace, pod)], by)})"


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


def _result(body: Any, expected: str) -> list:
    """The ``result`` list of a successful answer of type ``expected``; raises PrometheusError."""
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
    if result_type != expected:
        raise PrometheusError(
            f"Prometheus answered a {shown(result_type)} result, not a {expected}"
        )
    items = data.get("result")
    if not isinstance(items, list):
        raise _malformed(f"the result is {_kind(items)}, not a list")
    return items


def _sample(value: Any) -> tuple[float, float]:
    """A ``[time, "number"]`` pair, both finite."""
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise _malformed("a sample's value is not a [time, value] pair")
    return _finite(value[0], "sample time"), _finite(value[1], "sample value")


def _metric(item: Any) -> Mapping:
    if not isinstance(item, Mapping):
        raise _malformed(f"a sample is {_kind(item)}, not an object")
    metric = item.get("metric")
    if not isinstance(metric, Mapping):
        raise _malformed(f"a sample's metric is {_kind(metric)}, not an object")
    return metric


def parse_vector(body: Any, queries: GPUQueries | None = None) -> dict[tuple[str, str], float]:
    """An instant-vector answer -> ``{(namespace, pod): value}``, read from the queries' label names.

    Everything is checked, since a wrong shape must never read as data: any
    answer other than a vector of ``{"metric": {...}, "value": [time, "number"]}``
    items with finite numbers and string labels raises :class:`PrometheusError`.
    Two samples of one pod (which the queries' ``max by`` rules out) keep the
    larger value: the later last-busy time, the busier GPU.
    """
    queries = queries or GPUQueries()
    result: dict[tuple[str, str], float] = {}
    for item in _result(body, "vector"):
        metric = _metric(item)
        _, number = _sample(item.get("value"))
        key = (_label(metric, queries.namespace_label), _label(metric, queries.pod_label))
        result[key] = max(number, result.get(key, number))
    return result


def parse_series(body: Any, labels: Iterable[str]) -> list[tuple[dict[str, str], float]]:
    """An instant-vector answer -> ``[({label: value}, value)]``, with only ``labels`` read
    (a missing one reads ""), checked as :func:`parse_vector` checks."""
    labels = tuple(labels)
    result = []
    for item in _result(body, "vector"):
        metric = _metric(item)
        _, number = _sample(item.get("value"))
        result.append(({name: _label(metric, name) for name in labels}, number))
    return result


def parse_matrix(body: Any) -> list[tuple[float, float]]:
    """A range answer of one series (or none) -> its ``[(time, value)]`` points, in time order.

    More than one series (which an ``avg(...)`` rules out) is malformed.
    """
    items = _result(body, "matrix")
    if len(items) > 1:
        raise _malformed(f"{len(items)} series where one was asked for")
    points: list[tuple[float, float]] = []
    for item in items:
        _metric(item)
        values = item.get("values")
        if not isinstance(values, list):
            raise _malformed(f"a series' values are {_kind(values)}, not a list")
        points.extend(_sample(v) for v in values)
    return sorted(points)


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
        return await self._post("query", {"query": promql, "time": f"{at:.3f}"})

    async def _post(self, endpoint: str, form: Mapping[str, str]) -> Any:
        from tornado.httpclient import AsyncHTTPClient, HTTPClientError

        self.requests += 1
        body = urlencode(form)
        try:
            response = await AsyncHTTPClient().fetch(
                f"{self.url}/api/v1/{endpoint}",
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

    async def query_range(self, promql: str, start: float, end: float, step: float) -> Any:
        """The decoded JSON answer to one range query; raises PrometheusError."""
        return await self._post(
            "query_range",
            {"query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"},
        )

    async def per_pod(self, promql: str, at: float) -> dict[tuple[str, str], float]:
        """``{(namespace, pod): value}`` of a query by pod; raises PrometheusError."""
        return parse_vector(await self.query(promql, at), self.queries)
