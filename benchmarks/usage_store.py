"""The usage store at scale: budget reads and usage tables for 5,000 users × a year of servers.

    .venv/bin/python benchmarks/usage_store.py              (SQLite; builds the store once, ~1 min)
    .venv/bin/python benchmarks/usage_store.py --postgres   (also on a real PostgreSQL, started
                                                              on 127.0.0.1 as tests/postgres.py does)
    .venv/bin/python benchmarks/usage_store.py --smoke      (every step once, small: tests)

The store holds what the issue sizes: 5,000 users, each with one GPU server of
about 4 hours (3 to 5 h, starting between 08:00 and 12:00 UTC) on every working
day of a year (≈1.3M closed intervals, written with ``UsageStore.open_many``,
which adds each to its day segments and monthly rollups as a close does), plus
200 servers running now. 1 or 2 GPUs of 3 types, 3 images, 50 groups.

Measured (p50 and p95 of ``--runs`` runs each):
  * budget: ``used_unit_seconds`` for one user this week (what a spawn's budget
    check costs), and for 200 users (a culler pass);
  * summary: ``UsageStore.summary`` for the last 12 whole months, this month, this
    week, a rolling 365 days, by user (5,000 rows), by group, by GPU type and image;
  * render: the year's rows by user turned into the admin page's table
    (``gpuspawner.admin.usage.usage_table``) and into the CSV (``rows_csv``),
    apart from the store's part so that each is seen;
  * naive: the same year by user as one GROUP BY over every interval (what the
    rollups avoid), and ``closed_totals`` (the hub's metric).
The SQLite store is built once and kept in .cache/bench/ (the file name carries the
sizes). Writes a Markdown report to stdout.
"""

from __future__ import annotations

import argparse
import calendar
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import sqlalchemy as sa  # noqa: E402
from benchlib import Steps, add_arguments, guarded, run, sizes  # noqa: E402

from gpuspawner.accounting.store import (  # noqa: E402
    DAY,
    UsageStore,
    day_start,
    intervals_table,
    month_start,
)
from gpuspawner.admin.usage import usage_table  # noqa: E402
from gpuspawner.core.usage import Interval, rows_csv  # noqa: E402

STEPS = ["build", "sqlite", "postgres"]
#: "Now" for every run: a Thursday afternoon, so "this week" and "this month" have days in them.
NOW = calendar.timegm((2026, 12, 3, 15, 0, 0))
TYPES = (("a100", 1.0), ("h100", 2.0), ("mig", 0.142857))
IMAGES = ("pytorch", "tensorflow", "jax")
GROUPS = 50
RUNNING = 200


def servers(users: int, days: int) -> Iterator[Interval]:
    """One ~4 h server per user per working day for ``days`` days before today, then today's."""
    rng = random.Random(32)
    today = day_start(NOW)
    for d in range(days, 0, -1):
        day = today - d * DAY
        if time.gmtime(day).tm_wday >= 5:
            continue
        for u in range(users):
            start = day + 8 * 3600 + rng.randrange(4 * 3600)
            yield interval(rng, f"{day}-{u}", u, start, start + rng.randrange(3 * 3600, 5 * 3600))
    for u in range(min(RUNNING, users)):
        yield interval(rng, f"running-{u}", u, NOW - rng.randrange(1, 6 * 3600), None)


def interval(rng: random.Random, uid: str, u: int, start: float, end: float | None) -> Interval:
    gpu_type, weight = TYPES[u % len(TYPES)]
    gpus = 1 + (u % 7 == 0)
    return Interval(
        uid=uid,
        user=f"user{u:05d}",
        server="",
        charge_group=f"group{u % GROUPS:02d}",
        gpu_type=gpu_type,
        image=IMAGES[(u // 3) % len(IMAGES)],
        gpus=gpus,
        units=gpus * weight,
        start=float(start),
        end=None if end is None else float(end),
        end_source="" if end is None else "pod",
    )


def build(
    url: str, users: int, days: int, ready: Path | None = None
) -> tuple[UsageStore, int, float | None]:
    """The store at ``url`` filled; (store, rows, seconds to build or None: kept).

    ``ready``: a file written once the store is complete; a store with rows is kept while
    it exists (without ``ready``: whenever it has rows).
    """
    store = UsageStore(url)
    store.migrate()
    with store.engine.connect() as conn:
        count = conn.execute(sa.select(sa.func.count()).select_from(intervals_table)).scalar()
    if count and (ready is None or ready.exists()):
        return store, count, None
    count = 0
    started = time.perf_counter()
    batch: list[Interval] = []
    for iv in servers(users, days):
        batch.append(iv)
        if len(batch) == 20_000:
            count += store.open_many(batch)
            batch = []
    count += store.open_many(batch)
    if ready is not None:
        ready.write_text(f"{count}\n")
    return store, count, time.perf_counter() - started


def timed(fn: Callable[[], object], runs: int) -> tuple[float, float, object]:
    """p50 and p95 in ms of ``runs`` calls after one warm-up, and the last result."""
    result = fn()
    samples = []
    for _ in range(runs):
        t = time.perf_counter()
        result = fn()
        samples.append((time.perf_counter() - t) * 1000)
    samples.sort()
    p95 = samples[min(len(samples) - 1, int(len(samples) * 0.95))]
    return statistics.median(samples), p95, result


def naive_year(store: UsageStore, since: float, until: float) -> list:
    """The year by user as one GROUP BY over every interval, overlap computed in SQL."""
    c = intervals_table.c
    lo = sa.func.max if store.dialect == "sqlite" else sa.func.greatest
    hi = sa.func.min if store.dialect == "sqlite" else sa.func.least
    seconds = hi(sa.func.coalesce(c.end_at, NOW), until) - lo(c.start_at, since)
    stmt = (
        sa.select(c.user_name, sa.func.sum(seconds * c.gpus), sa.func.sum(seconds * c.units))
        .where(c.start_at < until, sa.or_(c.end_at.is_(None), c.end_at > since))
        .group_by(c.user_name)
    )
    with store.engine.connect() as conn:
        return conn.execute(stmt).all()


def measure(store: UsageStore, runs: int, users: int) -> list[tuple[str, float, float, str]]:
    this_month = time.gmtime(month_start(NOW))
    year = (
        calendar.timegm((this_month.tm_year - 1, this_month.tm_mon, 1, 0, 0, 0)),
        month_start(NOW),
    )
    week_start = day_start(NOW) - time.gmtime(NOW).tm_wday * DAY
    windows = {
        "the last 12 whole months": year,
        "this month": (month_start(NOW), NOW),
        "this week": (week_start, NOW),
        "a rolling 365 days": (NOW - 365 * DAY, NOW),
    }
    many = [f"user{u:05d}" for u in range(0, users, max(1, users // RUNNING))][:RUNNING]
    results = []

    def add(name: str, fn: Callable[[], object], note: Callable[[object], str]) -> object:
        p50, p95, result = timed(fn, runs)
        results.append((name, p50, p95, note(result)))
        return result

    add(
        "budget: used_unit_seconds, one user, this week",
        lambda: store.used_unit_seconds(["user00007"], week_start, NOW + 1, NOW),
        lambda r: f"{r['user00007'] / 3600:.1f} weighted GPU-h",
    )
    add(
        f"budget: used_unit_seconds, {len(many)} users, this week (a culler pass)",
        lambda: store.used_unit_seconds(many, week_start, NOW + 1, NOW),
        lambda r: f"{len(r)} users",
    )
    for title, (since, until) in windows.items():
        for by in (("user",), ("group",), ("gpu_type", "image")):
            if by != ("user",) and title != "the last 12 whole months":
                continue
            add(
                f"summary: {title}, by {' and '.join(by)}",
                lambda since=since, until=until, by=by: store.summary(since, until, NOW, by),
                lambda r: f"{len(r)} rows",
            )
    rows = store.summary(*year, NOW, ("user",))
    add(
        "render: the year by user as the admin page's table (usage_table)",
        lambda: usage_table(rows, ("user",)),
        lambda r: f"{len(r.rows)} rows",
    )
    add(
        "render: the year by user as CSV (rows_csv)",
        lambda: rows_csv(rows, ("user",)),
        lambda r: f"{len(r) // 1024} KiB",
    )
    add(
        "summary + table: the last 12 whole months by user (the page's whole figure)",
        lambda: usage_table(store.summary(*year, NOW, ("user",)), ("user",)),
        lambda r: f"{len(r.rows)} rows",
    )
    add(
        "summary + table: a rolling 365 days by user",
        lambda: usage_table(
            store.summary(*windows["a rolling 365 days"], NOW, ("user",)), ("user",)
        ),
        lambda r: f"{len(r.rows)} rows",
    )
    add(
        "naive: the year by user, one GROUP BY over every interval",
        lambda: naive_year(store, *year),
        lambda r: f"{len(r)} rows",
    )
    add(
        "metric: closed_totals",
        store.closed_totals,
        lambda r: f"{len(r)} (type, group) pairs",
    )
    return results


def report(title: str, count: int, built: float | None, results: list) -> None:
    how = "kept from an earlier run" if built is None else f"built in {built:.0f} s"
    print(f"\n### {title}: {count:,} intervals ({how})\n")
    print("| what | p50 (ms) | p95 (ms) | result |")
    print("|---|---:|---:|---|")
    for name, p50, p95, note in results:
        print(f"| {name} | {p50:.2f} | {p95:.2f} | {note} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, help="users (5000; --smoke: 20)")
    parser.add_argument("--days", type=int, help="days of servers before now (366; --smoke: 40)")
    parser.add_argument("--runs", type=int, help="runs per measurement (30; --smoke: 2)")
    parser.add_argument(
        "--postgres", action="store_true", help="also measure on a real PostgreSQL (loopback)"
    )
    add_arguments(parser, STEPS)
    args = parser.parse_args()
    sizes(
        args,
        full={"users": 5000, "days": 366, "runs": 30},
        smoke={"users": 20, "days": 40, "runs": 2},
    )
    steps = Steps(args)
    print("# Usage store benchmark\n")
    print(f"`{' '.join([Path(sys.executable).name, *sys.argv])}` on {platform.node()}, ", end="")
    print(f"{os.cpu_count()} CPUs, Python {platform.python_version()}, SQLite ", end="")
    import sqlite3

    print(f"{sqlite3.sqlite_version}, SQLAlchemy {sa.__version__}.")
    with guarded() as stack:
        if args.smoke:
            folder = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        else:
            folder = REPO / ".cache" / "bench"
            folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"usage-store-{args.users}x{args.days}.sqlite"
        ready = path.with_suffix(".ready")
        if not ready.exists():  # a build cut short: start again
            for stale in folder.glob(path.name + "*"):
                stale.unlink()
        store, count, built = build(f"sqlite:///{path}", args.users, args.days, ready)
        stack.callback(store.close)
        steps.done("build")
        report(f"SQLite ({path.name})", count, built, measure(store, args.runs, args.users))
        steps.done("sqlite")
        if args.postgres:
            from tests.postgres import PostgresServer

            server = PostgresServer()
            stack.callback(server.stop)
            server.start()
            pg, count, built = build(server.database(), args.users, args.days)
            stack.callback(pg.close)
            with pg.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.exec_driver_sql("VACUUM ANALYZE")
            report(
                "PostgreSQL 15 (loopback, fsync off)",
                count,
                built,
                measure(pg, args.runs, args.users),
            )
            steps.done("postgres")
    return 0


if __name__ == "__main__":
    run(main)
