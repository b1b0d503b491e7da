"""GPU usage accounting: allocation intervals, GPU-seconds, summaries and CSV (pure).

A GPU server's usage is one :class:`Interval`: its GPUs (count and weighted units)
from the moment the scheduler bound its pod (the GPUs became its own) to the pod's
end, both the pod's own timestamps (:class:`~gpuspawner.core.serverpod.ServerPod`
reads them), so a chargeback CSV matches the pods to the second. The store
(:mod:`gpuspawner.accounting.store`) keeps intervals; the hub records them; the
admin page, the CLI and budgets sum them here, over a window ``[since, until)``
and never past ``now`` (an open interval runs until now).

Each interval carries one *charge group* (:func:`charge_group`), stamped on the pod
when it is created, so group totals never count a server twice.

This module is pure: no clock (``now`` is passed in), no database, no Kubernetes.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .budgets import most_generous
from .catalog import LimitRules
from .serverpod import ServerPod
from .stopreasons import iso_time

#: Where an interval's end came from: the pod's own status, the Kubernetes Event that
#: killed it, the last time the hub saw it (a pod gone without a trace), or "" (open).
END_SOURCES = ("pod", "event", "last-seen", "")

#: The dimensions a summary may be by, as :func:`summarize` and the CSV name them.
DIMENSIONS = ("user", "group", "gpu_type", "image")

#: The columns of :func:`intervals_csv`, in order.
INTERVAL_COLUMNS = (
    "uid",
    "user",
    "server",
    "group",
    "gpu_type",
    "image",
    "gpus",
    "start",
    "end",
    "seconds",
    "gpu_seconds",
    "end_source",
)
#: The figures of :func:`rows_csv`, in order, after the ``by`` columns.
ROW_FIGURES = ("gpu_seconds", "gpu_hours", "unit_seconds", "unit_hours", "servers")

# Spreadsheets run a cell that starts with one of these as a formula (CSV injection).
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


@dataclass(frozen=True)
class Interval:
    """One GPU server's allocation: ``gpus`` GPUs (``units`` weighted) from ``start`` to ``end``.

    Times are Unix seconds; ``end`` is None while the server holds its GPUs.
    """

    uid: str
    user: str
    server: str
    charge_group: str
    gpu_type: str
    image: str
    gpus: int
    units: float
    start: float
    end: float | None
    #: One of :data:`END_SOURCES`.
    end_source: str = ""

    def key(self, dimension: str) -> str:
        """The interval's value for a summary dimension (:data:`DIMENSIONS`)."""
        if dimension == "group":
            return self.charge_group
        if dimension in ("user", "gpu_type", "image"):
            return getattr(self, dimension)
        raise ValueError(f"not a usage dimension: {dimension!r}")


def interval_from_pod(pod: Mapping[str, Any], *, vanished: bool = False) -> Interval | None:
    """The usage interval of a GPU server pod (raw API JSON), or None when it has none.

    None for a pod that is not a user's GPU server, has no uid, or was never scheduled.
    The interval is closed when the pod has ended (``end_source`` "pod"). ``vanished``:
    the pod is gone (a watch's DELETED event); one that never recorded an end ended
    when its deletion was asked for.
    """
    server = ServerPod.from_pod(pod)
    if not server.user or not server.has_gpus or not server.uid or server.scheduled_at is None:
        return None
    start = server.scheduled_at
    end = server.ended_at
    if end is None and vanished:
        end = server.deleted_at
    if end is not None:
        end = max(end, start)
    return Interval(
        uid=server.uid,
        user=server.user,
        server=server.server,
        charge_group=server.charge_group,
        gpu_type=server.gpu_type or "",
        image=server.profile or "",
        gpus=server.gpus,
        units=server.gpus * (server.weight or 1.0),
        start=start,
        end=end,
        end_source="" if end is None else "pod",
    )


def overlap_seconds(iv: Interval, since: float, until: float, now: float) -> float:
    """How long ``iv`` ran within ``[since, until)``, an open interval until ``now``."""
    end = now if iv.end is None else iv.end
    return max(0.0, min(end, until) - max(iv.start, since))


def gpu_seconds(
    iv: Interval, since: float, until: float, now: float, weighted: bool = False
) -> float:
    """GPU-seconds of ``iv`` within ``[since, until)`` (units × seconds when ``weighted``)."""
    return overlap_seconds(iv, since, until, now) * (iv.units if weighted else iv.gpus)


@dataclass(frozen=True)
class UsageRow:
    """Usage of one key (values of the summary's ``by`` dimensions) over a window."""

    key: tuple[str, ...]
    gpu_seconds: float
    unit_seconds: float
    #: Servers (intervals) that ran within the window.
    servers: int

    @property
    def gpu_hours(self) -> float:
        return self.gpu_seconds / 3600

    @property
    def unit_hours(self) -> float:
        return self.unit_seconds / 3600


def _check_by(by: Sequence[str]) -> tuple[str, ...]:
    by = tuple(by)
    unknown = [d for d in by if d not in DIMENSIONS]
    if unknown or len(set(by)) != len(by):
        raise ValueError(f"a summary is by distinct dimensions of {DIMENSIONS}, not {by!r}")
    return by


def sort_rows(rows: Iterable[UsageRow]) -> list[UsageRow]:
    """Rows in a summary's order: most GPU-seconds first, then by key."""
    return sorted(rows, key=lambda row: (-row.gpu_seconds, row.key))


def summarize(
    intervals: Iterable[Interval], since: float, until: float, now: float, by: Sequence[str]
) -> list[UsageRow]:
    """Usage within ``[since, until)`` per value of the ``by`` dimensions (:data:`DIMENSIONS`).

    Only intervals that ran within the window for some time count (so a row's
    ``servers`` are the servers that used GPUs in it); ``by=()`` gives one total row.
    Sorted by :func:`sort_rows`.
    """
    by = _check_by(by)
    totals: dict[tuple[str, ...], list[float]] = {}
    for iv in intervals:
        seconds = overlap_seconds(iv, since, until, now)
        if seconds <= 0:
            continue
        entry = totals.setdefault(tuple(iv.key(d) for d in by), [0.0, 0.0, 0])
        entry[0] += seconds * iv.gpus
        entry[1] += seconds * iv.units
        entry[2] += 1
    return sort_rows(
        UsageRow(key=key, gpu_seconds=g, unit_seconds=u, servers=int(n))
        for key, (g, u, n) in totals.items()
    )


def safe_cell(value: str) -> str:
    """A text cell a spreadsheet shows as text: a leading ``=``, ``+``, ``-``, ``@`` gets a ``'``."""
    return "'" + value if value.startswith(_FORMULA_STARTS) else value


def _figure(value: float) -> str:
    """A number as the CSV writes it: whole numbers bare, else up to 6 decimals."""
    if value == int(value):
        return str(int(value))
    return f"{value:.6f}".rstrip("0").rstrip(".")


def _csv(header: Sequence[str], lines: Iterable[Sequence[str]]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow(header)
    writer.writerows(lines)
    return out.getvalue()


def rows_csv(rows: Iterable[UsageRow], by: Sequence[str]) -> str:
    """A summary as CSV: the ``by`` columns, then :data:`ROW_FIGURES`."""
    by = _check_by(by)
    return _csv(
        (*by, *ROW_FIGURES),
        (
            (
                *(safe_cell(k) for k in row.key),
                _figure(row.gpu_seconds),
                _figure(row.gpu_hours),
                _figure(row.unit_seconds),
                _figure(row.unit_hours),
                str(row.servers),
            )
            for row in rows
        ),
    )


def intervals_csv(intervals: Iterable[Interval], since: float, until: float, now: float) -> str:
    """The intervals that ran within ``[since, until)`` as CSV (:data:`INTERVAL_COLUMNS`).

    ``start`` and ``end`` are the server's own (ISO 8601 UTC; ``end`` empty while it
    runs); ``seconds`` and ``gpu_seconds`` count its part inside the window;
    ``end_source`` says where the end came from (:data:`END_SOURCES`). Ordered by start.
    """
    lines = []
    for iv in sorted(intervals, key=lambda iv: (iv.start, iv.uid)):
        seconds = overlap_seconds(iv, since, until, now)
        if seconds <= 0:
            continue
        lines.append(
            (
                safe_cell(iv.uid),
                safe_cell(iv.user),
                safe_cell(iv.server),
                safe_cell(iv.charge_group),
                safe_cell(iv.gpu_type),
                safe_cell(iv.image),
                str(iv.gpus),
                iso_time(iv.start),
                "" if iv.end is None else iso_time(iv.end),
                _figure(seconds),
                _figure(seconds * iv.gpus),
                iv.end_source,
            )
        )
    return _csv(INTERVAL_COLUMNS, lines)


def charge_group(rules: LimitRules, groups: Iterable[str]) -> str:
    """The one group a user's GPU-hours are charged to.

    The group whose GPU-hours budget applies (the most generous when several),
    else the group whose GPU limit applies (the largest), else the user's
    alphabetically first group, else "".
    """
    groups = sorted(set(groups))
    budgeted = [g for g in groups if g in rules.gpu_hours.groups]
    if budgeted:
        return most_generous(budgeted, rules.gpu_hours.groups)
    limited = [g for g in groups if g in rules.groups]
    if limited:
        return most_generous(limited, {g: rules.groups[g].total for g in limited})
    return groups[0] if groups else ""
