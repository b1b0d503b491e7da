"""The usage store: GPU servers' allocation intervals in a database that outlives the hub.

:class:`UsageStore` keeps one row per GPU server pod (its uid: each pod is recorded
once, however often it is seen), in tables of its own (``gpuspawner_*``) in the hub's
database or one of the admin's choosing, SQLite or PostgreSQL. The schema is made and
upgraded by Alembic (:meth:`UsageStore.migrate`) under its own version table,
``gpuspawner_alembic_version``, so JupyterHub's tables and ``alembic_version`` in the
same database are never touched.

Exact under concurrency, across threads and processes: an interval is opened once
(an insert that does nothing on a uid it already has) and closed once (an update
of the row only while it is open); on SQLite every write takes the write lock at
its start (``BEGIN IMMEDIATE`` with a busy timeout), on PostgreSQL the row's own.

Fast at scale (5,000 users × a year of servers: 1.25M intervals): when an interval
closes, in the same transaction, its GPU-seconds are added to

- its per-day *segments* (the interval cut at UTC midnights): a window's edges are
  summed from the days they fall in, never by scanning every interval for overlap;
- monthly *rollups* per user, group, GPU type and image: whole months are summed
  from these (5,000 users × 12 months of rows, not 1.25M);
- *totals* per GPU type and group, for the hub's GPU-seconds counter.

Open intervals (few: one per running GPU server) are summed from their rows, until
``now``. The arithmetic of a single interval is :mod:`gpuspawner.core.usage`'s.
"""

from __future__ import annotations

import calendar
import contextlib
import importlib.util
import math
import threading
from collections.abc import Collection, Iterable, Iterator, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, overload

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.pool import StaticPool

from ..core.usage import DIMENSIONS, Interval, UsageRow, overlap_seconds, sort_rows

#: Alembic's version table for these tables (JupyterHub's own is ``alembic_version``).
VERSION_TABLE = "gpuspawner_alembic_version"
#: The migrations (Alembic's script location): a package, so that the wheel ships it.
MIGRATIONS = Path(__file__).resolve().parent / "migrations"
#: How long a write waits for another process's write on SQLite (milliseconds).
SQLITE_BUSY_TIMEOUT_MS = 30_000
#: The databases the store runs on (SQLAlchemy dialect names).
DIALECTS = ("sqlite", "postgresql")
#: PostgreSQL advisory lock key that serialises concurrent migrations ("gpuspawn").
_MIGRATION_LOCK = 0x6770757370617776
#: Rows per statement when writing or asking for many at once.
_BATCH = 500

DAY = 86_400
#: The longest interval the store takes (a closed one is cut into one row per day).
MAX_SECONDS = 10 * 366 * DAY

_NAME = sa.String(255)
metadata = sa.MetaData()

#: One row per GPU server pod: its allocation interval (``end_at`` NULL while open).
intervals_table = sa.Table(
    "gpuspawner_usage_intervals",
    metadata,
    sa.Column("uid", sa.String(64), primary_key=True),
    sa.Column("user_name", _NAME, nullable=False),
    sa.Column("server_name", _NAME, nullable=False),
    sa.Column("charge_group", _NAME, nullable=False),
    sa.Column("gpu_type", _NAME, nullable=False),
    sa.Column("image", _NAME, nullable=False),
    sa.Column("gpus", sa.Integer, nullable=False),
    sa.Column("units", sa.Double, nullable=False),
    sa.Column("start_at", sa.Double, nullable=False),
    sa.Column("end_at", sa.Double, nullable=True),
    sa.Column("end_source", sa.String(16), nullable=False),
    sa.Column("last_seen", sa.Double, nullable=True),
    sa.Index("ix_gpuspawner_usage_intervals_user_end", "user_name", "end_at"),
    sa.Index("ix_gpuspawner_usage_intervals_end", "end_at"),
)

#: A closed interval's part within one UTC day (``day``: that midnight), one row per day,
#: with its GPU-seconds and whether the interval started in it (``started``: 1 or 0).
#: Kept in day order (SQLite: without rowid), so that a run of days is read in one sweep.
segments_table = sa.Table(
    "gpuspawner_usage_segments",
    metadata,
    sa.Column("day", sa.BigInteger, primary_key=True),
    sa.Column("uid", sa.String(64), primary_key=True),
    sa.Column("user_name", _NAME, nullable=False),
    sa.Column("charge_group", _NAME, nullable=False),
    sa.Column("gpu_type", _NAME, nullable=False),
    sa.Column("image", _NAME, nullable=False),
    sa.Column("gpus", sa.Integer, nullable=False),
    sa.Column("units", sa.Double, nullable=False),
    sa.Column("iv_start", sa.Double, nullable=False),
    sa.Column("seg_start", sa.Double, nullable=False),
    sa.Column("seg_end", sa.Double, nullable=False),
    sa.Column("gpu_seconds", sa.Double, nullable=False),
    sa.Column("unit_seconds", sa.Double, nullable=False),
    sa.Column("started", sa.Integer, nullable=False),
    sqlite_with_rowid=False,
)

#: Closed intervals' usage per UTC month (``month``: its first midnight) and key;
#: ``servers``: the intervals that started in that month.
monthly_table = sa.Table(
    "gpuspawner_usage_monthly",
    metadata,
    sa.Column("month", sa.BigInteger, primary_key=True),
    sa.Column("user_name", _NAME, primary_key=True),
    sa.Column("charge_group", _NAME, primary_key=True),
    sa.Column("gpu_type", _NAME, primary_key=True),
    sa.Column("image", _NAME, primary_key=True),
    sa.Column("gpu_seconds", sa.Double, nullable=False),
    sa.Column("unit_seconds", sa.Double, nullable=False),
    sa.Column("servers", sa.Integer, nullable=False),
    sqlite_with_rowid=False,
)

#: Closed intervals' GPU-seconds per GPU type and group since the store began.
totals_table = sa.Table(
    "gpuspawner_usage_totals",
    metadata,
    sa.Column("gpu_type", _NAME, primary_key=True),
    sa.Column("charge_group", _NAME, primary_key=True),
    sa.Column("gpu_seconds", sa.Double, nullable=False),
)

#: The store's tables, in the order a fresh database gets them.
TABLES = (intervals_table, segments_table, monthly_table, totals_table)

#: A summary dimension's column (:data:`gpuspawner.core.usage.DIMENSIONS`).
_COLUMNS = {"user": "user_name", "group": "charge_group", "gpu_type": "gpu_type", "image": "image"}
assert set(_COLUMNS) == set(DIMENSIONS)


class StoreError(ValueError):
    """A database URL the store cannot use; one sentence."""


def month_start(t: float) -> int:
    """The first UTC midnight of the month ``t`` falls in (Unix seconds)."""
    d = datetime.fromtimestamp(t, timezone.utc)
    return calendar.timegm((d.year, d.month, 1, 0, 0, 0))


def next_month(t: float) -> int:
    """The first UTC midnight of the month after the one ``t`` falls in."""
    d = datetime.fromtimestamp(t, timezone.utc)
    year, month = (d.year + 1, 1) if d.month == 12 else (d.year, d.month + 1)
    return calendar.timegm((year, month, 1, 0, 0, 0))


def day_start(t: float) -> int:
    """The UTC midnight that begins the day ``t`` falls in."""
    return int(t // DAY) * DAY


def segments(start: float, end: float) -> list[tuple[int, float, float]]:
    """``[start, end)`` cut at UTC midnights: ``(day, from, to)``, empty pieces left out."""
    pieces = []
    day = day_start(start)
    lo = start
    while lo < end:
        hi = min(end, day + DAY)
        pieces.append((day, lo, hi))
        day += DAY
        lo = day
    return pieces


def months(start: float, end: float) -> list[tuple[int, float]]:
    """``[start, end)`` cut at month starts: ``(month, seconds)``, empty pieces left out."""
    pieces = []
    lo = start
    while lo < end:
        month = month_start(lo)
        hi = min(end, next_month(lo))
        pieces.append((month, hi - lo))
        lo = hi
    return pieces


def _interval(row: Any) -> Interval:
    return Interval(
        uid=row.uid,
        user=row.user_name,
        server=row.server_name,
        charge_group=row.charge_group,
        gpu_type=row.gpu_type,
        image=row.image,
        gpus=row.gpus,
        units=row.units,
        start=row.start_at,
        end=row.end_at,
        end_source=row.end_source,
    )


def _text(value: str, length: int = 255) -> str:
    """A name as the database can hold it on every backend.

    The names come from pods (an annotation anyone with edit rights on the pod could
    change): PostgreSQL refuses NUL characters and text that is not UTF-8 (a lone
    surrogate), and a name longer than the column; one such pod must not stop the
    recording of the others.
    """
    value = value.replace("\x00", "\ufffd").encode("utf-8", "replace").decode("utf-8")
    return value[:length]


def _row(iv: Interval) -> dict[str, Any]:
    end = None if iv.end is None else max(iv.end, iv.start)
    return {
        "uid": _text(iv.uid, 64),
        "user_name": _text(iv.user),
        "server_name": _text(iv.server),
        "charge_group": _text(iv.charge_group),
        "gpu_type": _text(iv.gpu_type),
        "image": _text(iv.image),
        "gpus": iv.gpus,
        "units": iv.units,
        "start_at": iv.start,
        "end_at": end,
        "end_source": iv.end_source if end is not None else "",
        "last_seen": None,
    }


def _check_times(start: float, end: float | None) -> None:
    if not math.isfinite(start) or (end is not None and not math.isfinite(end)):
        raise ValueError(f"an interval's times are finite numbers, not {start!r} to {end!r}")
    if end is not None and end - start > MAX_SECONDS:
        raise ValueError(f"an interval of {end - start:.0f} seconds is longer than 10 years")


def _stored(iv: Interval) -> Interval:
    """``iv`` as :meth:`UsageStore.get` will read it back (names as the database holds them)."""
    _check_times(iv.start, iv.end)
    row = _row(iv)
    return Interval(
        uid=row["uid"],
        user=row["user_name"],
        server=row["server_name"],
        charge_group=row["charge_group"],
        gpu_type=row["gpu_type"],
        image=row["image"],
        gpus=iv.gpus,
        units=iv.units,
        start=iv.start,
        end=row["end_at"],
        end_source=row["end_source"],
    )


def _chunks(items: Sequence[Any], size: int = _BATCH) -> Iterator[Sequence[Any]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def _columns(by: Sequence[str]) -> tuple[str, ...]:
    unknown = [d for d in by if d not in _COLUMNS]
    if unknown or len(set(by)) != len(by):
        raise ValueError(f"a summary is by distinct dimensions of {DIMENSIONS}, not {tuple(by)!r}")
    return tuple(_COLUMNS[d] for d in by)


class UsageStore:
    """GPU usage intervals in the database at ``url`` (SQLAlchemy URL: SQLite or PostgreSQL).

    Call :meth:`migrate` once before use (idempotent, safe from several processes).
    Every method is safe to call from several threads; :meth:`close` disposes of the
    connections.
    """

    def __init__(self, url: str):
        parsed = make_url(url)
        self.dialect = parsed.get_backend_name()
        if parsed.drivername == "postgresql":
            # SQLAlchemy 2.1 reads a bare postgresql:// as psycopg 3; z2jh's hub image
            # (and JupyterHub's own docs) have psycopg2: use whichever is installed
            driver = "psycopg2" if importlib.util.find_spec("psycopg2") else "psycopg"
            parsed = parsed.set(drivername=f"postgresql+{driver}")
        if self.dialect not in DIALECTS:
            raise StoreError(
                f"GPU usage is kept in SQLite or PostgreSQL, not {self.dialect!r}: "
                "give the accounting a sqlite:// or postgresql:// database URL."
            )
        self._memory = self.dialect == "sqlite" and parsed.database in (None, "", ":memory:")
        self._lock = threading.Lock() if self._memory else None
        kwargs: dict[str, Any] = {}
        if self._memory:
            # one in-memory database, shared by every thread (each connection would get its own)
            kwargs = {"poolclass": StaticPool, "connect_args": {"check_same_thread": False}}
        elif self.dialect == "postgresql":
            kwargs = {"pool_pre_ping": True}
        self.engine: Engine = sa.create_engine(parsed, **kwargs)
        if self.dialect == "sqlite":
            sa.event.listen(self.engine, "connect", _sqlite_connect)
            sa.event.listen(self.engine, "begin", _sqlite_begin)
        self._insert = sqlite.insert if self.dialect == "sqlite" else postgresql.insert

    # -- schema -------------------------------------------------------------------------

    def migrate(self) -> None:
        """Create or upgrade the store's tables to the newest revision (Alembic "upgrade head").

        A no-op when they are current; concurrent callers take turns (the write lock
        on SQLite, an advisory lock on PostgreSQL), so the second finds the first's work.
        """
        from alembic import command
        from alembic.config import Config

        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS))
        with self._write() as conn:
            if self.dialect == "postgresql":
                conn.execute(sa.select(sa.func.pg_advisory_xact_lock(_MIGRATION_LOCK)))
            config.attributes["connection"] = conn
            command.upgrade(config, "head")

    def revision(self) -> str | None:
        """The schema revision the database is at (None before :meth:`migrate`)."""
        from alembic.runtime.migration import MigrationContext

        with self._read() as conn:
            context = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
            return context.get_current_revision()

    # -- connections --------------------------------------------------------------------

    @contextlib.contextmanager
    def _write(self) -> Iterator[Connection]:
        """A transaction that holds the write lock from its start (SQLite: BEGIN IMMEDIATE)."""
        with self._serial(), self.engine.connect() as conn:
            conn = conn.execution_options(gpuspawner_write=True)
            with conn.begin():
                yield conn

    @contextlib.contextmanager
    def _read(self) -> Iterator[Connection]:
        with self._serial(), self.engine.connect() as conn, conn.begin():
            yield conn

    def _serial(self) -> contextlib.AbstractContextManager[Any]:
        return self._lock if self._lock is not None else contextlib.nullcontext()

    @overload
    def close(self) -> None: ...

    @overload
    def close(self, uid: str, end: float, source: str) -> bool: ...

    def close(
        self, uid: str | None = None, end: float | None = None, source: str = ""
    ) -> bool | None:
        """``close(uid, end, source)``: :meth:`close_interval`; ``close()``: dispose of the pool.

        (The design names both ``close``: the interval's, and the store's own.)
        """
        if uid is None:
            self.engine.dispose()
            return None
        if end is None:
            raise TypeError("close(uid, end, source) needs the interval's end")
        return self.close_interval(uid, end, source)

    # -- writes -------------------------------------------------------------------------

    def open(self, iv: Interval) -> bool:
        """Record ``iv``; False when its uid is already recorded (open or closed).

        An interval that has already ended (``iv.end``) is recorded closed.
        """
        return self.open_many([iv]) == 1

    def open_many(self, ivs: Iterable[Interval]) -> int:
        """Record many intervals at once (batched inserts); how many were new.

        As :meth:`open` for each: a uid already recorded is left as it is. ValueError,
        before anything is written, for a time that is not finite or an interval longer
        than :data:`MAX_SECONDS`.
        """
        first: dict[str, Interval] = {}
        for iv in ivs:
            # as one open() after another: the first of a uid wins; stored as the database holds it
            first.setdefault(_text(iv.uid, 64), _stored(iv))
        ivs = list(first.values())
        added = 0
        stmt = (
            self._insert(intervals_table)
            .on_conflict_do_nothing(index_elements=["uid"])
            .returning(intervals_table.c.uid)
        )
        for chunk in _chunks(ivs, 5_000):
            with self._write() as conn:
                new = {row.uid for row in conn.execute(stmt, [_row(iv) for iv in chunk])}
                self._roll_up(conn, [iv for iv in chunk if iv.uid in new and iv.end is not None])
            added += len(new)
        return added

    def close_interval(self, uid: str, end: float, source: str) -> bool:
        """Close the open interval ``uid`` at ``end`` (``source``: where that time came from).

        False when there is none open (unknown, or closed already: the first close wins).
        An end before the interval's start closes it at its start. ValueError for a time
        that is not finite or an interval longer than :data:`MAX_SECONDS`.
        """
        if not math.isfinite(end):
            raise ValueError(f"an interval's end is a finite number, not {end!r}")
        c = intervals_table.c
        stmt = (
            sa.update(intervals_table)
            .where(c.uid == _text(uid, 64), c.end_at.is_(None))
            .values(
                end_at=sa.case((c.start_at > end, c.start_at), else_=sa.literal(float(end))),
                end_source=source,
            )
            .returning(*intervals_table.c)
        )
        with self._write() as conn:
            row = conn.execute(stmt).first()
            if row is None:
                return False
            _check_times(row.start_at, row.end_at)  # raising rolls the close back
            self._roll_up(conn, [_interval(row)])
        return True

    def touch(self, uids: Iterable[str], at: float) -> None:
        """Record that the open intervals ``uids`` were still running at ``at`` (a heartbeat)."""
        c = intervals_table.c
        uids = sorted({_text(uid, 64) for uid in uids})
        stmt = (
            sa.update(intervals_table)
            .where(
                c.uid.in_(sa.bindparam("uids", expanding=True)),
                c.end_at.is_(None),
                sa.or_(c.last_seen.is_(None), c.last_seen < at),
            )
            .values(last_seen=at)
        )
        for chunk in _chunks(uids):
            with self._write() as conn:
                conn.execute(stmt, {"uids": list(chunk)})

    def _roll_up(self, conn: Connection, closed: Sequence[Interval]) -> None:
        """Add closed intervals to the segments, monthly rollups and totals (same transaction)."""
        if not closed:
            return
        segment_rows = []
        monthly: dict[tuple[Any, ...], list[float]] = {}
        totals: dict[tuple[str, str], float] = {}
        for iv in closed:
            assert iv.end is not None
            keys = {
                "user_name": iv.user,
                "charge_group": iv.charge_group,
                "gpu_type": iv.gpu_type,
                "image": iv.image,
            }
            for i, (day, lo, hi) in enumerate(segments(iv.start, iv.end)):
                segment_rows.append(
                    {
                        "day": day,
                        "uid": iv.uid,
                        **keys,
                        "gpus": iv.gpus,
                        "units": iv.units,
                        "iv_start": iv.start,
                        "seg_start": lo,
                        "seg_end": hi,
                        "gpu_seconds": (hi - lo) * iv.gpus,
                        "unit_seconds": (hi - lo) * iv.units,
                        "started": int(i == 0),
                    }
                )
            for i, (month, seconds) in enumerate(months(iv.start, iv.end)):
                entry = monthly.setdefault((month, *keys.values()), [0.0, 0.0, 0])
                entry[0] += seconds * iv.gpus
                entry[1] += seconds * iv.units
                entry[2] += i == 0
            if iv.end > iv.start:
                total_key = (iv.gpu_type, iv.charge_group)
                totals[total_key] = totals.get(total_key, 0.0) + (iv.end - iv.start) * iv.gpus
        if segment_rows:
            conn.execute(sa.insert(segments_table), segment_rows)
        if monthly:
            stmt = self._insert(monthly_table)
            stmt = stmt.on_conflict_do_update(
                index_elements=[c.name for c in monthly_table.primary_key],
                set_={
                    name: monthly_table.c[name] + stmt.excluded[name]
                    for name in ("gpu_seconds", "unit_seconds", "servers")
                },
            )
            conn.execute(
                stmt,
                [
                    {
                        "month": key[0],
                        "user_name": key[1],
                        "charge_group": key[2],
                        "gpu_type": key[3],
                        "image": key[4],
                        "gpu_seconds": g,
                        "unit_seconds": u,
                        "servers": int(n),
                    }
                    for key, (g, u, n) in monthly.items()
                ],
            )
        if totals:
            stmt = self._insert(totals_table)
            stmt = stmt.on_conflict_do_update(
                index_elements=["gpu_type", "charge_group"],
                set_={"gpu_seconds": totals_table.c.gpu_seconds + stmt.excluded.gpu_seconds},
            )
            conn.execute(
                stmt,
                [
                    {"gpu_type": t, "charge_group": g, "gpu_seconds": s}
                    for (t, g), s in totals.items()
                ],
            )

    # -- reads --------------------------------------------------------------------------

    def open_intervals(self) -> list[Interval]:
        """The intervals not closed yet, oldest first."""
        c = intervals_table.c
        stmt = sa.select(intervals_table).where(c.end_at.is_(None)).order_by(c.start_at, c.uid)
        with self._read() as conn:
            return [_interval(row) for row in conn.execute(stmt)]

    def last_seen(self, uid: str) -> float | None:
        """When ``uid`` was last known to run: its latest heartbeat, else its start.

        None for a uid the store does not have.
        """
        c = intervals_table.c
        stmt = sa.select(sa.func.coalesce(c.last_seen, c.start_at)).where(c.uid == _text(uid, 64))
        with self._read() as conn:
            return conn.execute(stmt).scalar()

    def get(self, uid: str) -> Interval | None:
        """The interval of ``uid``, or None."""
        stmt = sa.select(intervals_table).where(intervals_table.c.uid == _text(uid, 64))
        with self._read() as conn:
            row = conn.execute(stmt).first()
        return None if row is None else _interval(row)

    def intervals(
        self,
        since: float,
        until: float,
        *,
        user: str | None = None,
        group: str | None = None,
    ) -> list[Interval]:
        """The intervals that ran within ``[since, until)`` (open ones: started before ``until``).

        Ordered by start, then uid.
        """
        c = intervals_table.c
        if until <= since:
            return []
        user = None if user is None else _text(user)
        group = None if group is None else _text(group)
        if user is not None:
            # a user's own rows are few: their index, not the days'
            closed = sa.and_(c.user_name == user, c.end_at > since, c.end_at > c.start_at)
        else:
            s = segments_table.c
            ran = (
                sa.select(s.uid)
                .where(
                    s.day >= day_start(since), s.day < until, s.seg_start < until, s.seg_end > since
                )
                .distinct()
            )
            closed = c.uid.in_(ran)
        stmt = sa.select(intervals_table).where(
            c.start_at < until, sa.or_(closed, c.end_at.is_(None))
        )
        if user is not None:
            stmt = stmt.where(c.user_name == user)
        if group is not None:
            stmt = stmt.where(c.charge_group == group)
        with self._read() as conn:
            found = [_interval(row) for row in conn.execute(stmt)]
        return sorted(found, key=lambda iv: (iv.start, iv.uid))

    def used_unit_seconds(
        self, users: Collection[str], since: float, until: float, now: float
    ) -> dict[str, float]:
        """Weighted GPU-seconds of each of ``users`` within ``[since, until)``, open ones until ``now``.

        Every user asked for is in the answer (0.0 when none). One indexed lookup per
        user: what a budget check costs a spawn.
        """
        used = dict.fromkeys(users, 0.0)
        if until <= since or not used:
            return used
        asked = {_text(user): user for user in used}
        c = intervals_table.c
        users_in = c.user_name.in_(sa.bindparam("users", expanding=True))
        # two range scans of (user_name, end_at): the open ones, and those that ended after
        # ``since`` (an OR would read every interval the user ever had)
        stmt = sa.union_all(
            sa.select(intervals_table).where(users_in, c.end_at.is_(None), c.start_at < until),
            sa.select(intervals_table).where(users_in, c.end_at > since, c.start_at < until),
        )
        with self._read() as conn:
            for chunk in _chunks(list(asked)):
                for row in conn.execute(stmt, {"users": list(chunk)}):
                    iv = _interval(row)
                    used[asked[iv.user]] += overlap_seconds(iv, since, until, now) * iv.units
        return used

    def summary(
        self,
        since: float,
        until: float,
        now: float,
        by: Sequence[str],
        *,
        group: str | None = None,
    ) -> list[UsageRow]:
        """Usage within ``[since, until)`` per value of ``by``, as
        :func:`gpuspawner.core.usage.summarize` would add up every interval (same rows,
        same order), from the monthly rollups, the days at the edges and the open intervals.
        """
        names = _columns(by)
        totals: dict[tuple[str, ...], list[float]] = {}

        def add(rows: Iterable[Any], sign: int = 1) -> None:
            for row in rows:
                key = tuple(row[: len(names)])
                entry = totals.setdefault(key, [0.0, 0.0, 0])
                entry[0] += sign * (row[-3] or 0.0)
                entry[1] += sign * (row[-2] or 0.0)
                entry[2] += sign * (row[-1] or 0)

        def span(conn: Connection, lo: float, hi: float, sign: int = 1) -> None:
            """Closed intervals' usage in ``[lo, hi)``: its whole days, and the parts of days."""
            whole_lo, whole_hi = -(-lo // DAY) * DAY, day_start(hi)
            if whole_lo > whole_hi:  # within one day
                parts = [(lo, hi)]
            else:
                if whole_lo < whole_hi:
                    add(conn.execute(self._days_query(names, whole_lo, whole_hi, group)), sign)
                parts = [(lo, whole_lo), (whole_hi, hi)]
            for part_lo, part_hi in parts:
                if part_lo < part_hi:
                    add(conn.execute(self._part_query(names, part_lo, part_hi, group)), sign)

        if until <= since:
            return []
        group = None if group is None else _text(group)
        whole_from = since if month_start(since) == since else next_month(since)
        whole_to = month_start(until)
        with self._read() as conn:
            if whole_from < whole_to:
                add(conn.execute(self._months_query(names, whole_from, whole_to, group)))
            if whole_from <= whole_to:
                edges = [(since, whole_from), (whole_to, until)]
            else:  # within one month
                edges = [(since, until)]
            for lo, hi in edges:
                if lo >= hi:
                    continue
                # part of one month: its days, or the month less the days outside it,
                # whichever reads fewer days (a rolling year starts late in a month)
                month, month_end = month_start(lo), next_month(lo)
                if (lo - month) + (month_end - hi) + 2 * DAY < hi - lo:
                    add(conn.execute(self._months_query(names, month, month_end, group)))
                    span(conn, month, lo, -1)
                    span(conn, hi, month_end, -1)
                else:
                    span(conn, lo, hi)
            add(conn.execute(self._crossing_query(names, since, group)))
            c = intervals_table.c
            stmt = sa.select(intervals_table).where(c.end_at.is_(None), c.start_at < until)
            if group is not None:
                stmt = stmt.where(c.charge_group == group)
            for row in conn.execute(stmt):
                iv = _interval(row)
                seconds = overlap_seconds(iv, since, until, now)
                if seconds > 0:
                    add([(*(iv.key(d) for d in by), seconds * iv.gpus, seconds * iv.units, 1)])
        return sort_rows(
            UsageRow(key=key, gpu_seconds=g, unit_seconds=u, servers=int(n))
            for key, (g, u, n) in totals.items()
            if n > 0
        )

    @staticmethod
    def _grouped(
        table: sa.Table,
        names: Sequence[str],
        figures: tuple[Any, Any, Any],
        where: Sequence[Any],
        group: str | None,
    ) -> sa.Select[Any]:
        """``names``, then the sums of ``figures`` (GPU-seconds, unit-seconds, servers) per key."""
        keys = [table.c[n] for n in names]
        conditions = [*where] if group is None else [*where, table.c.charge_group == group]
        return (
            sa.select(*keys, *(sa.func.sum(f) for f in figures)).where(*conditions).group_by(*keys)
        )

    def _months_query(
        self, names: Sequence[str], lo: int, hi: int, group: str | None
    ) -> sa.Select[Any]:
        """Closed intervals' usage in the whole months ``[lo, hi)``; servers: those started in them."""
        m = monthly_table.c
        figures = (m.gpu_seconds, m.unit_seconds, m.servers)
        return self._grouped(monthly_table, names, figures, [m.month >= lo, m.month < hi], group)

    def _days_query(
        self, names: Sequence[str], lo: float, hi: float, group: str | None
    ) -> sa.Select[Any]:
        """Closed intervals' usage on the whole days ``[lo, hi)``; servers: those started in them."""
        s = segments_table.c
        figures = (s.gpu_seconds, s.unit_seconds, s.started)
        return self._grouped(segments_table, names, figures, [s.day >= lo, s.day < hi], group)

    def _part_query(
        self, names: Sequence[str], lo: float, hi: float, group: str | None
    ) -> sa.Select[Any]:
        """Closed intervals' usage within ``[lo, hi)``, part of one day, clipped to it.

        Servers: those that started in it (an interval's first segment starts where it does).
        """
        s = segments_table.c
        seconds = self._least(s.seg_end, hi) - self._greatest(s.seg_start, lo)
        started = sa.case((sa.and_(s.started == 1, s.seg_start >= lo), 1), else_=0)
        where = [s.day == day_start(lo), s.seg_start < hi, s.seg_end > lo]
        figures = (seconds * s.gpus, seconds * s.units, started)
        return self._grouped(segments_table, names, figures, where, group)

    def _crossing_query(
        self, names: Sequence[str], since: float, group: str | None
    ) -> sa.Select[Any]:
        """Servers that started before ``since`` and still ran after it (their segment of that day)."""
        s = segments_table.c
        where = [
            s.day == day_start(since),
            s.iv_start < since,
            s.seg_start <= since,
            s.seg_end > since,
        ]
        figures = (sa.literal(0.0), sa.literal(0.0), sa.literal(1))
        return self._grouped(segments_table, names, figures, where, group)

    def _least(self, a: Any, b: float) -> Any:
        # SQLite's two-argument min() is PostgreSQL's least()
        return sa.func.min(a, b) if self.dialect == "sqlite" else sa.func.least(a, b)

    def _greatest(self, a: Any, b: float) -> Any:
        return sa.func.max(a, b) if self.dialect == "sqlite" else sa.func.greatest(a, b)

    def closed_totals(self) -> dict[tuple[str, str], float]:
        """(GPU type, charge group) -> GPU-seconds of every closed interval (the metric's base)."""
        with self._read() as conn:
            return {
                (row.gpu_type, row.charge_group): row.gpu_seconds
                for row in conn.execute(sa.select(totals_table))
            }


def _sqlite_connect(dbapi_conn: Any, record: Any) -> None:
    # pysqlite's own transaction handling begins late (at the first write), so a read
    # that turns into a write can deadlock; the store begins its transactions itself.
    dbapi_conn.isolation_level = None
    cursor = dbapi_conn.cursor()
    try:
        # a writer waits for readers and other writers rather than failing at once. The
        # journal mode is left as it is: it is a setting of the file, which is usually the
        # hub's own, and WAL is unsafe on the network filesystems some hub volumes are on.
        cursor.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
    finally:
        cursor.close()


def _sqlite_begin(conn: Connection) -> None:
    write = conn.get_execution_options().get("gpuspawner_write", False)
    conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")
