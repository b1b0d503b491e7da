"""The GPU page's usage section for 5,000 users x a year of servers: query and render, p50/p95.

    .venv/bin/python benchmarks/admin_usage.py [--users 5000] [--days 366] [--runs 20] [--smoke]

The usage store is ``benchmarks/usage_store.py``'s (its builder and its cached
SQLite file in .cache/bench/: 5,000 users with a ~4 h server every working day of
a year, ≈1.3M intervals, 50 groups, 3 GPU types, 3 images; "now" is its Thursday
afternoon). Each case is what the page's handler does for one view, timed in two
parts: the store's ``summary`` (the query) and the section (``usage_table`` and the
whole page rendered by its autoescaped template around an empty pool, at most
``GPUAdmin.usage_page_rows`` rows); the total is what an admin waits for beyond
the pool's own listing. The issue's target: the table for 5,000 users × a year in
at most 200 ms. ``intervals.csv`` for a week (every interval, as a download) is
timed once, for scale.

Writes Markdown to stdout. ``--smoke`` (20 users x 40 days in a temporary
directory, 2 runs) goes through every step for the tests; it starts no process.
"""

from __future__ import annotations

import argparse
import calendar
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchlib import Steps, add_arguments, guarded, run, sizes  # noqa: E402
from usage_store import NOW, build  # noqa: E402

from gpuspawner.admin.page import UsageSection, render_page  # noqa: E402
from gpuspawner.admin.report import build_report  # noqa: E402
from gpuspawner.admin.service import GPUAdmin  # noqa: E402
from gpuspawner.admin.usage import format_input, parse_query, usage_table  # noqa: E402
from gpuspawner.core.usage import intervals_csv  # noqa: E402

#: --fail-after's steps, in order.
STEPS = ("build", "measured")


def cases() -> list[tuple[str, dict[str, str]]]:
    """(case, the page's query arguments as a browser sends them)."""
    month = time.gmtime(NOW)
    year = calendar.timegm((month.tm_year - 1, month.tm_mon, 1, 0, 0, 0))
    this_month = calendar.timegm((month.tm_year, month.tm_mon, 1, 0, 0, 0))
    # the last 12 whole months, as chargeback asks: since the 1st, until the last day (included)
    whole = {"since": format_input(year), "until": format_input(this_month, end=True)}
    return [
        ("this week, by user (the default view)", {}),
        ("this month, by user", {"period": "month"}),
        ("the last 12 whole months, by user", whole),
        ("the last 12 whole months, by group", {**whole, "by": "group"}),
        ("the last 12 whole months, by GPU type", {**whole, "by": "gpu_type"}),
        ("the last 12 whole months, by user, one group", {**whole, "group": "group07"}),
        ("a rolling year to now, by user", {"since": format_input(NOW - 365 * 86400)}),
    ]


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--users", type=int, help="users (5000; --smoke: 20)")
    parser.add_argument("--days", type=int, help="days of servers before now (366; --smoke: 40)")
    parser.add_argument("--runs", type=int, help="timed views per case (20; --smoke: 2)")
    add_arguments(parser, STEPS)
    args = parser.parse_args()
    sizes(args, {"users": 5000, "days": 366, "runs": 20}, {"users": 20, "days": 40, "runs": 2})
    steps = Steps(args)
    limit = GPUAdmin.usage_page_rows.default_value
    report = build_report(users=[], pods=[], figures={}, catalog=None, now=NOW)

    with guarded() as stack:
        if args.smoke:
            folder = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        else:
            folder = REPO / ".cache" / "bench"
            folder.mkdir(parents=True, exist_ok=True)
        # usage_store.py's file of these sizes, built by whichever runs first
        path = folder / f"usage-store-{args.users}x{args.days}.sqlite"
        ready = path.with_suffix(".ready")
        store, count, _ = build(f"sqlite:///{path}", args.users, args.days, ready)
        stack.callback(store.close)
        steps.done("build")

        print("# The GPU page's usage section\n")
        print(
            f"{count:,} intervals ({args.users:,} users x {args.days} days, {path.name}); "
            f"{platform.python_implementation()} {platform.python_version()}, SQLite; "
            f"{args.runs} views per case after one warm-up; at most {limit:,} rows on the page.\n"
        )
        print(
            "| case | rows | query p50 ms | query p95 ms | table + page p50 ms "
            "| table + page p95 ms | total p50 ms | total p95 ms |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        for name, form in cases():
            query = parse_query(form, NOW)
            queried, rendered, totals = [], [], []
            rows: list = []
            for i in range(args.runs + 1):
                t0 = time.perf_counter()
                rows = store.summary(query.since, query.until, NOW, query.by, group=query.group)
                t1 = time.perf_counter()
                table = usage_table(rows, query.by, limit=limit)
                render_page(
                    report,
                    admin="admin",
                    stop_url="/services/gpuspawner-admin/stop",
                    xsrf_token="x",
                    usage=UsageSection(form=form, query=query, table=table, holders=()),
                    page_url="/services/gpuspawner-admin/",
                )
                t2 = time.perf_counter()
                if i:  # the first is the warm-up
                    queried.append(t1 - t0)
                    rendered.append(t2 - t1)
                    totals.append(t2 - t0)
            print(
                f"| {name} | {len(rows):,} | {ms(statistics.median(queried))} | "
                f"{ms(percentile(queried, 0.95))} | {ms(statistics.median(rendered))} | "
                f"{ms(percentile(rendered, 0.95))} | {ms(statistics.median(totals))} | "
                f"{ms(percentile(totals, 0.95))} |"
            )
        week = parse_query({}, NOW)
        t0 = time.perf_counter()
        intervals = store.intervals(week.since, week.until)
        body = intervals_csv(intervals, week.since, week.until, NOW)
        took = time.perf_counter() - t0
        print(
            f"\nintervals.csv for this week: {len(intervals):,} intervals, "
            f"{len(body) / 1e6:.1f} MB in {ms(took)} ms (once)."
        )
        steps.done("measured")
    return 0


if __name__ == "__main__":
    run(main)
