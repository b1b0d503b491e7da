"""GPU-hours for admins: the usage table, the idle holders board and their periods (pure).

Shared by the GPU page's usage section (``admin/page.py``) and ``gpuspawner
usage`` (``cli.py``): the same period rules, the same dates accepted and the
same sentences when they are not, the same rows. The figures themselves come
from the usage store (:meth:`gpuspawner.accounting.store.UsageStore.summary`),
added up by :func:`gpuspawner.core.usage.summarize`'s rules.

Dates are UTC. A day given alone (``2026-11-01``) means its midnight as a start,
and the end of that day as an end (``--until 2026-11-30`` includes the 30th).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from urllib.parse import urlencode

from sqlalchemy.engine import make_url

from ..accounting.store import StoreError
from ..core.budgets import current_period
from ..core.catalog import BudgetRules, Catalog
from ..core.refusals import escape_unprintable, listing, shown
from ..core.usage import DIMENSIONS, UsageRow
from .report import PoolReport, format_duration, format_utilisation

#: The column titles of each key (:data:`~gpuspawner.core.usage.DIMENSIONS`).
BY_TITLES = {"user": "user", "group": "group", "gpu_type": "GPU type", "image": "image"}
#: The page's periods: the week and month the budgets use, or dates of the admin's choosing.
PERIODS = ("week", "month", "custom")
#: How a group filter or a date the admin typed is shown back at most (characters).
SHOWN_INPUT = 100

_DATE_FORMATS = ("%Y-%m-%d", "%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M")


class QueryError(ValueError):
    """A period, date, grouping or group the admin asked for that cannot be used; one sentence."""


@dataclass(frozen=True)
class UsageQuery:
    """What to add up: the period ``[since, until)`` (UTC epoch seconds), by what, for which group."""

    since: float
    until: float
    by: tuple[str, ...] = ("user",)
    group: str | None = None
    period: str = "custom"  # "week", "month" or "custom"
    title: str = ""  # "this week", "this month" or "" (dates of the admin's choosing)

    def describe(self) -> str:
        """E.g. "this week (2026-11-30 00:00 to 2026-12-04 18:20 UTC), group 'ml'"."""
        span = f"{format_time(self.since)} to {format_time(self.until)} UTC"
        text = f"{self.title} ({span})" if self.title else span
        if self.group is not None:
            text += f", group {shown(self.group, SHOWN_INPUT)}"
        return text

    def arguments(self, **changes: str) -> dict[str, str]:
        """The query string that asks for this query again (the tabs' and CSV links')."""
        args = {"period": self.period, "by": ",".join(self.by)}
        if self.period == "custom":
            args["since"] = format_input(self.since)
            args["until"] = format_input(self.until, end=True)
        if self.group is not None:
            args["group"] = self.group
        args.update(changes)
        return args

    def link(self, path: str, **changes: str) -> str:
        return f"{path}?{urlencode(self.arguments(**changes))}"

    def filename(self, kind: str) -> str:
        """A download's name: ``gpu-usage-2026-11-01-2026-12-01-by-user.csv``. Only [a-z0-9-.]."""
        name = f"gpu-{kind}-{format_input(self.since)}-{format_input(self.until, end=True)}"
        if kind == "usage":
            name += "-by-" + "-".join(b.replace("_", "-") for b in self.by)
        return name.replace(":", "").replace("T", "-") + ".csv"


def format_time(epoch: float) -> str:
    """``2026-11-01 00:00`` (UTC)."""
    return datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y-%m-%d %H:%M")


def format_input(epoch: float, *, end: bool = False) -> str:
    """The form's and the command line's way to write a time: ``2026-11-01`` at midnight, else
    ``2026-11-01T10:30``; :func:`parse_time` reads it back. ``end``: a midnight is written
    as the day it ends (an end day is included)."""
    moment = datetime.fromtimestamp(epoch, timezone.utc)
    if (moment.hour, moment.minute, moment.second) == (0, 0, 0):
        return (moment - timedelta(days=1) if end else moment).strftime("%Y-%m-%d")
    return moment.strftime("%Y-%m-%dT%H:%M" if moment.second == 0 else "%Y-%m-%dT%H:%M:%S")


def parse_time(text: str, what: str, *, end: bool = False) -> float:
    """A date (``2026-11-01``) or UTC time (``2026-11-01T10:30``, ``…Z``) as epoch seconds.

    ``end``: a day alone means the end of that day (its next midnight).
    ``what``: "start" or "end", for the sentence when ``text`` is no date.
    """
    value = text.strip()
    if value.endswith(("Z", "z")):
        value = value[:-1]
    elif value.endswith("+00:00"):
        value = value[: -len("+00:00")]
    for pattern in _DATE_FORMATS:
        try:
            moment = datetime.strptime(value, pattern).replace(tzinfo=timezone.utc)
        except ValueError:
            continue
        if end and pattern == "%Y-%m-%d":
            moment += timedelta(days=1)
        return moment.timestamp()
    raise QueryError(
        f"The {what} {shown(text, SHOWN_INPUT)} is not a date: write it as YYYY-MM-DD "
        "(for example 2026-11-01), or YYYY-MM-DDTHH:MM in UTC."
    )


def parse_by(text: str) -> tuple[str, ...]:
    """``user``, ``gpu_type`` or several, comma-separated (``group,gpu_type``)."""
    parts = tuple(p.strip() for p in text.split(",") if p.strip())
    wrong = [p for p in parts if p not in DIMENSIONS]
    if wrong or not parts or len(set(parts)) != len(parts):
        raise QueryError(
            f"Usage can be added up by {listing(DIMENSIONS)} (or several, comma-separated, "
            f"each once), not by {shown(text, SHOWN_INPUT)}."
        )
    return parts


def period_bounds(period: str, rules: BudgetRules, now: float) -> tuple[float, float, str]:
    """(start, end, name) of the current week or month, reset as the budgets' (``limits.gpu_hours``)."""
    current = current_period(dataclasses.replace(rules, period=period), now)
    return current.start, current.end, current.name


def parse_query(
    args: Mapping[str, str], now: float, rules: BudgetRules | None = None
) -> UsageQuery:
    """The query from the page's form or the command line's options (strings; missing: defaults).

    ``period``: "week" (default), "month" or "custom" — implied by a ``since``;
    ``since``/``until`` (custom; ``until`` defaults to now); ``by``; ``group``
    (the charge group; "" or missing: every group). Raises :class:`QueryError`
    with one sentence.
    """
    rules = rules or BudgetRules()
    since_text = (args.get("since") or "").strip()
    until_text = (args.get("until") or "").strip()
    period = (args.get("period") or ("custom" if since_text else "week")).strip()
    if period not in PERIODS:
        raise QueryError(f"The period can be {listing(PERIODS)}, not {shown(period, SHOWN_INPUT)}.")
    by = parse_by(args.get("by") or "user")
    group = args.get("group")
    group = None if group is None or group == "" else group
    if period == "custom":
        if not since_text:
            raise QueryError("Give the first day of the period (since), for example 2026-11-01.")
        since = parse_time(since_text, "start")
        until = parse_time(until_text, "end", end=True) if until_text else now
        if since >= now:
            raise QueryError(
                f"The start {format_time(since)} UTC is not in the past, so there is no usage "
                "yet; choose an earlier day."
            )
        if until <= since:
            raise QueryError(
                f"The end {format_time(until)} UTC is not after the start {format_time(since)} "
                "UTC; choose a later end."
            )
        return UsageQuery(since, until, by, group, "custom", "")
    since, _, title = period_bounds(period, rules, now)
    return UsageQuery(since, now, by, group, period, title)


def missing_sqlite_file(url: str) -> str:
    """The sentence for a SQLite URL whose file does not exist ("" when it does, or not SQLite).

    Opening it would make an empty database there, and then say it has no tables.
    """
    try:
        parsed = make_url(url)
    except Exception:  # not a URL: the store says so
        return ""
    path = parsed.database or ""
    if parsed.get_backend_name() != "sqlite" or path in ("", ":memory:") or Path(path).exists():
        return ""
    return (
        f"There is no SQLite database at {shown(path, 200)}: give the hub's db_url "
        "(or GPUSpawner.accounting_db_url) as it is, with the file's absolute path."
    )


def redacted_url(url: str) -> str:
    """A database URL as a message may show it: its password (``user:secret@``) masked."""
    return re.sub(r"(://[^/@]*?:)[^@/]*@", r"\1***@", url)


#: Longest driver message a sentence carries (its first line).
DRIVER_MESSAGE_LENGTH = 300


def database_problem(url: str, error: BaseException) -> str:
    """One sentence for a usage database that could not be opened or read (page, CLI, logs)."""
    if isinstance(error, StoreError):
        return str(error)  # the store's own sentence
    where = shown(redacted_url(url), 200)
    if isinstance(error, ModuleNotFoundError):
        return (
            f"The usage database {where} needs the Python package {shown(error.name or '?')}, "
            "which is not installed."
        )
    cause = getattr(error, "orig", None) or error
    lines = str(cause).strip().splitlines() or [type(cause).__name__]
    message = escape_unprintable(lines[0])[:DRIVER_MESSAGE_LENGTH].rstrip(". ")
    name = type(error).__name__
    if name == "ArgumentError" or (isinstance(error, ValueError) and "URL" in str(error)):
        return (
            f"{where} is not a database URL: write it as sqlite:////path/to/file.sqlite or "
            "postgresql://user@host/database."
        )
    if "no such table" in message or "does not exist" in message:
        return (
            f"The usage database {where} has no GPU-hours tables yet: the hub creates them "
            "when it starts with accounting on (GPUSpawner.accounting_enabled)."
        )
    return f"The usage database {where} could not be read: {message}."


# ---------------------------------------------------------------------------
# the table
# ---------------------------------------------------------------------------


def hours(seconds: float) -> str:
    """GPU-seconds as hours with one decimal: ``1,234.5``."""
    return f"{seconds / 3600:,.1f}"


def key_text(by: str, value: str, catalog: Catalog | None) -> str:
    """A key's cell: a GPU type's or image's display name with its key, "(no group)"."""
    if by == "group" and not value:
        return "(no group)"
    if catalog is not None:
        if by == "gpu_type" and value in catalog.gpu_types:
            return f"{catalog.gpu_types[value].display_name} ({value})"
        if by == "image" and value in catalog.images:
            return f"{catalog.images[value].display_name} ({value})"
    return value or "-"


@dataclass(frozen=True)
class UsageTable:
    """The rows as text; the last ``len(FIGURES)`` columns are figures."""

    head: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    total: tuple[str, ...]  # of every row, shown or not
    keys: int  # how many leading columns are the key
    left_out: int = 0  # rows past the limit (fewest GPU-hours): in the CSV, not shown


#: The figures of each row, after its key.
FIGURES = ("GPU-hours", "weighted GPU-hours", "servers")


def usage_table(
    rows: Iterable[UsageRow],
    by: tuple[str, ...],
    catalog: Catalog | None = None,
    limit: int | None = None,
) -> UsageTable:
    """The rows as the page and the terminal show them, in the store's order, with a total.

    ``limit``: show at most this many rows (the most GPU-hours first); the total
    still counts them all.
    """
    body = []
    gpu = unit = 0.0
    servers = 0
    left_out = 0
    for row in rows:
        if limit is None or len(body) < limit:
            body.append(
                (
                    *(key_text(b, k, catalog) for b, k in zip(by, row.key, strict=True)),
                    hours(row.gpu_seconds),
                    hours(row.unit_seconds),
                    str(row.servers),
                )
            )
        else:
            left_out += 1
        gpu += row.gpu_seconds
        unit += row.unit_seconds
        servers += row.servers
    head = (*(BY_TITLES[b] for b in by), *FIGURES)
    blanks = ("",) * (len(by) - 1)
    total = ("total", *blanks, hours(gpu), hours(unit), str(servers))
    return UsageTable(head, tuple(body), total, len(by), left_out)


# ---------------------------------------------------------------------------
# the idle holders board
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class IdleHolder:
    """A server holding GPUs that nobody uses now."""

    user: str
    server: str  # its label: "default" or the name
    gpu_type: str  # display name
    gpus: int
    idle: float  # seconds since the hub last saw activity
    utilisation: str  # as the servers table shows it
    week_gpu_seconds: float | None  # the user's GPU-seconds this week; None: not known
    week_unit_seconds: float | None


def idle_holders(
    report: PoolReport,
    week: Mapping[str, UsageRow] | None,
    *,
    idle_after: float,
    busy_threshold: float,
) -> list[IdleHolder]:
    """Servers holding GPUs idle now, the longest idle first (ties: most GPUs, then names).

    Idle: no activity the hub recorded for ``idle_after`` seconds, and, where
    Prometheus gave a figure, its GPUs under ``busy_threshold`` (0..1) over the
    last 5 minutes: a server busy computing with nobody at the keyboard is not
    idle. ``week``: the store's rows by user for this week (None: no store).
    """
    holders = []
    for user in report.users:
        used = week.get(user.name) if week is not None else None
        for s in user.servers:
            if not s.gpu_type or s.gpus <= 0 or not s.node or s.idle is None:
                continue
            if s.idle < idle_after:
                continue
            if s.utilisation is not None and s.utilisation >= busy_threshold:
                continue
            holders.append(
                IdleHolder(
                    user=user.name,
                    server=s.label,
                    gpu_type=s.gpu_type_name,
                    gpus=s.gpus,
                    idle=s.idle,
                    utilisation=format_utilisation(s.utilisation, report.utilisation_source),
                    week_gpu_seconds=None if week is None else (used.gpu_seconds if used else 0.0),
                    week_unit_seconds=None
                    if week is None
                    else (used.unit_seconds if used else 0.0),
                )
            )
    holders.sort(key=lambda h: (-h.idle, -h.gpus, h.user, h.server))
    return holders


def holder_cells(holder: IdleHolder) -> tuple[str, ...]:
    """user, server, GPUs, idle for, GPU util, GPU-hours this week, weighted."""
    return (
        holder.user,
        holder.server,
        f"{holder.gpus} × {holder.gpu_type}",
        format_duration(holder.idle),
        holder.utilisation,
        "-" if holder.week_gpu_seconds is None else hours(holder.week_gpu_seconds),
        "-" if holder.week_unit_seconds is None else hours(holder.week_unit_seconds),
    )


HOLDER_HEAD = (
    "user",
    "server",
    "GPUs",
    "idle for",
    "GPU util",
    "GPU-hours this week",
    "weighted",
)
