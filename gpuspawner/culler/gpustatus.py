"""What the culler tells one user about their own GPU servers' load (``/api/gpu-status``).

Pure: takes the hub's whoami model of the caller's token, the servers of the
culler's last pass, the per-pod figures Prometheus gave (read at most once per
``poll_seconds`` for every caller together, see
:class:`~gpuspawner.culler.prometheus.GPUStatusReader`), each server's last hour,
the policy and the standing warnings, and returns the JSON answer. Which servers
a token may hear about is :func:`~gpuspawner.culler.warningapi.token_servers`'s
rule, as for ``/api/warning``; when the culler would stop a server is
:func:`~gpuspawner.culler.policy.stop_at`'s, the same rules a pass applies
(deadlines and a user's keep included).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone

from ..clients.prometheus import GPUQueries
from . import policy
from .warningapi import WHY, cull_at, token_servers

#: The history shown: the last hour, one point a minute.
HISTORY_SECONDS = 3600
HISTORY_STEP = 60
#: How often a client may be told to ask, in seconds.
POLL_MIN, POLL_MAX = 5, 60
MIB = 1024 * 1024

NO_PROMETHEUS = "The culler has no Prometheus configured, so it has no GPU figures."
PROMETHEUS_DOWN = "Prometheus did not answer the culler, so there are no GPU figures just now."
NO_POD = "The culler does not know this server's pod, so it cannot find its GPU figures."
NO_SERIES = "Prometheus has no DCGM series for this server's pod yet."

SOURCE_DCGM = "dcgm"


@dataclass(frozen=True)
class Device:
    """One GPU (or MIG instance) of a pod, as the DCGM exporter last reported it."""

    gpu: str
    uuid: str | None = None
    utilization: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None

    def json(self) -> dict:
        return {
            "gpu": self.gpu,
            "uuid": self.uuid,
            "utilization": self.utilization,
            "memory_used_bytes": self.memory_used_bytes,
            "memory_total_bytes": self.memory_total_bytes,
        }


@dataclass(frozen=True)
class PodFigures:
    """A pod's GPUs now, and the last time, within the window, that one of them was busy."""

    devices: tuple[Device, ...]
    last_busy: float | None = None


@dataclass(frozen=True)
class Figures:
    """One reading of Prometheus for the pods of a pass.

    ``unavailable``: one sentence when there was nothing to read (no Prometheus
    configured, or it did not answer); ``pods`` then is empty.
    """

    at: float
    window_start: float
    pods: Mapping[tuple[str, str], PodFigures] = field(default_factory=dict)
    unavailable: str | None = None
    #: Prometheus is configured: pods missing from ``pods`` have no series (vs. nothing asked)
    enabled: bool = True


def poll_seconds(configured: float) -> int:
    """How often a client should ask: the configured cadence, kept within 5..60 seconds."""
    return int(min(POLL_MAX, max(POLL_MIN, configured)))


def _device_key(labels: Mapping[str, str]) -> str:
    """``0`` for a whole GPU, ``2/7`` for MIG instance 7 of GPU 2."""
    gpu, instance = labels.get("gpu", ""), labels.get("GPU_I_ID", "")
    return f"{gpu}/{instance}" if instance else gpu


def figures_from(
    series: Iterable[tuple[Mapping[str, str], float]],
    last_busy: Mapping[tuple[str, str], float],
    pods: Iterable[tuple[str, str]],
    queries: GPUQueries,
    now: float,
) -> Figures:
    """The figures of ``pods`` from the raw device series and the last-busy answer.

    Series of other pods (a pod of the same name in another namespace matches the
    query's regular expressions too) are left out. Utilisation is GPU_UTIL / 100,
    else the engine-active ratio (MIG devices report no GPU_UTIL), as the culler reads it.
    """
    wanted = set(pods)
    by_pod: dict[tuple[str, str], dict[str, dict[str, object]]] = {}
    for labels, value in series:
        key = (labels.get(queries.namespace_label, ""), labels.get(queries.pod_label, ""))
        if key not in wanted:
            continue
        device = by_pod.setdefault(key, {}).setdefault(
            _device_key(labels), {"uuid": labels.get("UUID") or None}
        )
        device[labels.get("__name__", "")] = value
    result = {}
    for key, devices in by_pod.items():
        found = []
        for gpu, values in sorted(devices.items()):
            util = values.get(queries.util_metric)
            util = util / 100 if isinstance(util, float) else values.get(queries.engine_metric)
            used = values.get(queries.memory_used_metric)
            free = values.get(queries.memory_free_metric)
            found.append(
                Device(
                    gpu=gpu,
                    uuid=values["uuid"],
                    utilization=None if util is None else min(1.0, max(0.0, util)),
                    memory_used_bytes=None if used is None else int(used * MIB),
                    memory_total_bytes=(
                        None if used is None or free is None else int((used + free) * MIB)
                    ),
                )
            )
        result[key] = PodFigures(devices=tuple(found), last_busy=last_busy.get(key))
    return Figures(at=now, window_start=now - queries.window, pods=result)


def gpu_view(figures: Figures) -> policy.GPUView:
    """The figures as the policy reads a pass's GPU data: pods with series are fresh."""
    if not figures.enabled:
        return policy.GPUView()
    if figures.unavailable is not None:
        return policy.GPUView(enabled=True, ok=False)
    return policy.GPUView(
        enabled=True,
        ok=True,
        samples={
            key: policy.GPUSample(last_busy=pod.last_busy, window_start=figures.window_start)
            for key, pod in figures.pods.items()
        },
    )


def gpu_servers(model: Mapping, servers: Iterable[policy.Server]) -> list[policy.Server]:
    """The GPU servers the token of ``model`` speaks for, by name; CPU-only ones are not listed."""
    user, names = token_servers(model)
    return sorted(
        (
            s
            for s in servers
            if s.user == user and s.gpus > 0 and (names is None or s.name in names)
        ),
        key=lambda s: s.name,
    )


def _iso(t: float | None) -> str | None:
    if t is None:
        return None
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="seconds")


def _sum(values: list[int | None]) -> int | None:
    return None if not values or None in values else sum(values)


@dataclass(frozen=True)
class Rules:
    """What decides when a server is stopped: the policy, the passes, the standing warnings."""

    policy: policy.Policy
    last_pass: float
    cull_every: float
    warned: Mapping[tuple[str, str], policy.WarningMark] = field(default_factory=dict)
    #: a dry run stops nothing, so it forecasts no stop
    dry_run: bool = False


def _stop(server: policy.Server, view: policy.GPUView, rules: Rules) -> tuple[float, str] | None:
    if rules.dry_run:
        return None
    forecast = policy.stop_at(server, rules.policy, view, rules.last_pass, rules.cull_every)
    stop = None if forecast is None else (forecast.due, forecast.rule)
    mark = rules.warned.get(server.key)
    if mark is not None:
        # the warning's cull comes on its own pass, which may be earlier than a fresh rule's
        at = cull_at(mark, rules.policy.warning_period, rules.cull_every)
        if stop is None or at < stop[0]:
            stop = (at, f"the cull warning given because {WHY.get(mark.reason, mark.reason)}")
    return stop


def server_entry(
    server: policy.Server,
    figures: Figures,
    history: list[tuple[float, float]] | None,
    rules: Rules,
    threshold: float,
) -> dict:
    """One server's entry of the answer (see docs/culler.md, "GPU load in JupyterLab")."""
    key = (server.namespace, server.pod)
    pod = figures.pods.get(key) if server.pod and server.namespace else None
    if not figures.enabled:
        unavailable = NO_PROMETHEUS
    elif figures.unavailable is not None:
        unavailable = figures.unavailable
    elif not (server.pod and server.namespace):
        unavailable = NO_POD
    elif pod is None or not pod.devices:
        unavailable = NO_SERIES
    else:
        unavailable = None
    entry: dict = {
        "user": server.user,
        "server": server.name,
        "gpus": server.gpus,
        "gpu_type": server.gpu_type,
        "source": None if unavailable else SOURCE_DCGM,
        "unavailable": unavailable,
        "utilization": None,
        "memory_used_bytes": None,
        "memory_total_bytes": None,
        "devices": [],
        "busy": None,
        "idle_since": None,
        "idle_seconds": None,
    }
    if unavailable is None:
        devices = pod.devices
        utils = [d.utilization for d in devices if d.utilization is not None]
        busy = any(u > threshold for u in utils)
        idle_since = None
        if not busy:
            # as the GPU-idle rule counts: from the last busy time, else the window's
            # start, and never before the server started
            idle_since = pod.last_busy if pod.last_busy is not None else figures.window_start
            if server.started is not None:
                idle_since = max(idle_since, server.started)
        entry.update(
            utilization=sum(utils) / len(utils) if utils else None,
            memory_used_bytes=_sum([d.memory_used_bytes for d in devices]),
            memory_total_bytes=_sum([d.memory_total_bytes for d in devices]),
            devices=[d.json() for d in devices],
            busy=busy,
            idle_since=idle_since,
            idle_seconds=None if idle_since is None else max(0.0, figures.at - idle_since),
        )
    stop = _stop(server, gpu_view(figures), rules)
    entry.update(
        stop_at=None if stop is None else stop[0],
        stop_at_iso=None if stop is None else _iso(stop[0]),
        stop_rule=None if stop is None else stop[1],
        # a keep its user chose and that still runs: idle rules wait for its end
        keep_until=server.keep_until
        if server.keep_until is not None and server.keep_until > figures.at
        else None,
        history={
            "step": HISTORY_STEP,
            "points": []
            if unavailable or not history
            else [[t, min(1.0, max(0.0, v))] for t, v in history],
        },
    )
    return entry


def status_answer(
    model: Mapping,
    servers: Iterable[policy.Server],
    figures: Figures,
    histories: Mapping[tuple[str, str], list[tuple[float, float]] | None],
    rules: Rules,
    threshold: float,
    poll: int,
) -> dict:
    """The ``/api/gpu-status`` answer for the token described by ``model``.

    ``servers``: the last pass's servers (only the token's GPU servers are
    listed); ``histories``: the last hour by ``(user, server name)``.
    """
    user, _ = token_servers(model)
    return {
        "user": user,
        "poll_seconds": poll,
        "servers": [
            server_entry(s, figures, histories.get(s.key), rules, threshold)
            for s in gpu_servers(model, servers)
        ],
    }
