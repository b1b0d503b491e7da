"""The usage section's pure parts: periods and dates, the table, the idle holders board."""

from __future__ import annotations

from datetime import datetime, timezone
from urllib.parse import parse_qsl, urlsplit

import pytest

from gpuspawner.admin.report import PoolReport, ServerRow, UserRow
from gpuspawner.admin.usage import (
    QueryError,
    database_problem,
    format_input,
    idle_holders,
    missing_sqlite_file,
    parse_query,
    parse_time,
    redacted_url,
    usage_table,
)
from gpuspawner.core.catalog import BudgetRules
from gpuspawner.core.usage import UsageRow


def utc(*args: int) -> float:
    return datetime(*args, tzinfo=timezone.utc).timestamp()


#: A Friday evening.
NOW = utc(2026, 12, 4, 18, 20)


@pytest.mark.parametrize(
    ("text", "end", "expected"),
    [
        ("2026-11-01", False, utc(2026, 11, 1)),
        ("2026-11-30", True, utc(2026, 12, 1)),  # an end day is included
        ("2026-11-01T10:30", False, utc(2026, 11, 1, 10, 30)),
        ("2026-11-01T10:30", True, utc(2026, 11, 1, 10, 30)),  # a time is exact
        ("2026-11-01T10:30:15Z", False, utc(2026, 11, 1, 10, 30, 15)),
        (" 2026-11-01 10:30+00:00 ", False, utc(2026, 11, 1, 10, 30)),
    ],
)
def test_dates_and_times_are_utc(text, end, expected):
    assert parse_time(text, "start", end=end) == expected


@pytest.mark.parametrize("text", ["yesterday", "2026-13-01", "01/11/2026", "2026-11-01T25:00", ""])
def test_a_date_that_is_none_is_one_sentence(text):
    with pytest.raises(QueryError) as e:
        parse_time(text, "start")
    assert str(e.value) == (
        f"The start {text!r} is not a date: write it as YYYY-MM-DD (for example 2026-11-01), "
        "or YYYY-MM-DDTHH:MM in UTC."
    )


def test_a_hostile_date_is_quoted_and_escaped():
    with pytest.raises(QueryError) as e:
        parse_time("2026\r\nSet-Cookie: x=1" + "x" * 500, "end")
    text = str(e.value)
    assert "\r" not in text and "\n" not in text and "'2026\\r\\nSet-Cookie" in text
    assert len(text) < 300


def test_this_week_and_this_month_follow_the_budgets_reset():
    week = parse_query({}, NOW)
    assert (week.since, week.until, week.period, week.by) == (
        utc(2026, 11, 30),
        NOW,
        "week",
        ("user",),
    )
    assert week.describe() == "this week (2026-11-30 00:00 to 2026-12-04 18:20 UTC)"
    # budgets reset on Wednesdays at 06:00: so does the page's week
    rules = BudgetRules(reset_weekday=2, reset_seconds=6 * 3600, period="month")
    assert parse_query({"period": "week"}, NOW, rules).since == utc(2026, 12, 2, 6)
    month = parse_query({"period": "month", "by": "group,gpu_type", "group": "ml"}, NOW)
    assert (month.since, month.by, month.group) == (utc(2026, 12, 1), ("group", "gpu_type"), "ml")
    assert month.describe().startswith(
        "this month (2026-12-01 00:00 to"
    ) and month.describe().endswith(", group 'ml'")


def test_dates_of_the_admins_choosing():
    query = parse_query({"since": "2026-11-01", "until": "2026-11-30", "by": "image"}, NOW)
    assert (query.since, query.until, query.period, query.by) == (
        utc(2026, 11, 1),
        utc(2026, 12, 1),
        "custom",
        ("image",),
    )
    assert query.describe() == "2026-11-01 00:00 to 2026-12-01 00:00 UTC"
    # no end: until now
    assert parse_query({"period": "custom", "since": "2026-11-01"}, NOW).until == NOW


@pytest.mark.parametrize(
    ("args", "sentence"),
    [
        ({"period": "year"}, "The period can be week, month or custom, not 'year'."),
        ({"period": "custom"}, "Give the first day of the period (since), for example 2026-11-01."),
        (
            {"since": "2026-11-10", "until": "2026-11-01"},
            "The end 2026-11-02 00:00 UTC is not after the start 2026-11-10 00:00 UTC; "
            "choose a later end.",
        ),
        (
            {"since": "2026-12-05"},
            "The start 2026-12-05 00:00 UTC is not in the past, so there is no usage yet; "
            "choose an earlier day.",
        ),
        (
            {"by": "user,user"},
            "Usage can be added up by user, group, gpu_type or image (or several, "
            "comma-separated, each once), not by 'user,user'.",
        ),
        ({"by": "<b>"}, "not by '<b>'."),
    ],
)
def test_a_query_that_cannot_be_used_is_one_sentence(args, sentence):
    with pytest.raises(QueryError) as e:
        parse_query(args, NOW)
    assert str(e.value).endswith(sentence)


def test_links_ask_for_the_same_query_again():
    query = parse_query(
        {"since": "2026-11-01T10:30", "until": "2026-11-30", "group": "a&b=c", "by": "user"}, NOW
    )
    link = query.link("/services/gpuspawner-admin/usage.csv", by="group")
    assert urlsplit(link).path == "/services/gpuspawner-admin/usage.csv"
    args = dict(parse_qsl(urlsplit(link).query))
    assert args == {
        "period": "custom",
        "since": "2026-11-01T10:30",
        "until": "2026-11-30",  # the last day, included
        "group": "a&b=c",
        "by": "group",
    }
    again = parse_query(args, NOW)
    assert (again.since, again.until, again.group, again.by) == (
        query.since,
        query.until,
        "a&b=c",
        ("group",),
    )
    assert format_input(utc(2026, 11, 1, 10, 30, 5)) == "2026-11-01T10:30:05"


def test_download_names_hold_no_user_text():
    query = parse_query({"since": "2026-11-01T10:30", "by": "gpu_type,user", "group": '"; x'}, NOW)
    assert (
        query.filename("usage") == "gpu-usage-2026-11-01-1030-2026-12-04-1820-by-gpu-type-user.csv"
    )
    assert query.filename("intervals") == "gpu-intervals-2026-11-01-1030-2026-12-04-1820.csv"


def test_the_table_names_types_and_images_and_adds_up(catalog):
    rows = [
        UsageRow(("a100", ""), 3 * 3600 * 2, 3 * 3600 * 2, 2),
        UsageRow(("gone", "ml"), 1800, 900, 1),
    ]
    table = usage_table(rows, ("gpu_type", "group"), catalog)
    assert table.head == ("GPU type", "group", "GPU-hours", "weighted GPU-hours", "servers")
    assert table.rows == (
        ("NVIDIA A100 (a100)", "(no group)", "6.0", "6.0", "2"),
        ("gone", "ml", "0.5", "0.2", "1"),
    )
    assert table.total == ("total", "", "6.5", "6.2", "3")
    assert table.keys == 2
    big = usage_table([UsageRow(("u",), 3600 * 12345.67, 0, 1)], ("user",))
    assert big.rows[0][1] == "12,345.7"


def server(name: str, **kw) -> ServerRow:
    values = dict(
        user="u",
        name=name,
        state="running",
        profile="pytorch",
        gpu_type="a100",
        gpu_type_name="NVIDIA A100",
        gpus=1,
        node="gpu-a100-0",
        pod=f"jupyter-u-{name}",
        namespace="jupyterhub",
        age=7200.0,
        idle=3600.0,
        utilisation=None,
    )
    values.update(kw)
    return ServerRow(**values)


def report_with(servers_by_user: dict[str, list[ServerRow]], source: str = "prometheus"):
    users = tuple(
        UserRow(
            name=name,
            admin=False,
            groups=(),
            servers=tuple(servers),
            gpus_used=0,
            limit=None,
            limit_per_type={},
            rule="",
            limit_text="",
        )
        for name, servers in servers_by_user.items()
    )
    return PoolReport(generated=NOW, types=(), users=users, utilisation_source=source)


def test_idle_holders_are_idle_gpu_servers_longest_first():
    report = report_with(
        {
            "ann": [
                server("idle", idle=3600.0, utilisation=0.01),
                server("busy", idle=7200.0, utilisation=0.9),  # computing, nobody typing
                server("active", idle=60.0, utilisation=0.0),  # someone is at it
                server("cpu", gpu_type=None, gpus=0, idle=9000.0),
                server("waiting", node="", idle=9000.0),  # holds no GPU yet
                server("no-activity", idle=None),
            ],
            "bob": [server("", idle=5400.0, gpus=4, utilisation=None)],  # no figure: activity
        }
    )
    week = {"ann": UsageRow(("ann",), 36000.0, 18000.0, 3)}
    holders = idle_holders(report, week, idle_after=600, busy_threshold=0.05)
    assert [(h.user, h.server, h.gpus) for h in holders] == [
        ("bob", "default", 4),
        ("ann", "idle", 1),
    ]
    bob, ann = holders
    assert (bob.idle, bob.utilisation, bob.week_gpu_seconds) == (5400.0, "no data", 0.0)
    assert (ann.utilisation, ann.week_gpu_seconds, ann.week_unit_seconds) == (
        "1 %",
        36000.0,
        18000.0,
    )
    # without a store the week is unknown, not zero
    assert (
        idle_holders(report, None, idle_after=600, busy_threshold=0.05)[0].week_gpu_seconds is None
    )


def test_database_problems_are_one_sentence_without_the_password():
    url = "postgresql://gpu:s3cret@db.example:5432/hub"
    assert redacted_url(url) == "postgresql://gpu:***@db.example:5432/hub"
    assert redacted_url("sqlite:////srv/hub.sqlite") == "sqlite:////srv/hub.sqlite"

    class OperationalError(Exception):
        def __init__(self, orig):
            self.orig = orig

    text = database_problem(url, OperationalError(RuntimeError("connection refused\nDETAIL: x")))
    assert text == (
        "The usage database 'postgresql://gpu:***@db.example:5432/hub' could not be read: "
        "connection refused."
    )
    missing = database_problem(
        "sqlite:////x.db", OperationalError(RuntimeError("no such table: t"))
    )
    assert "has no GPU-hours tables yet" in missing
    module = ModuleNotFoundError("No module named 'psycopg2'", name="psycopg2")
    assert database_problem(url, module).endswith(
        "needs the Python package 'psycopg2', which is not installed."
    )


def test_the_page_shows_at_most_so_many_rows_and_counts_them_all():
    rows = [UsageRow((f"u{i}",), 3600.0 * (10 - i), 3600.0, 1) for i in range(10)]
    table = usage_table(rows, ("user",), limit=3)
    assert [r[0] for r in table.rows] == ["u0", "u1", "u2"]
    assert table.left_out == 7
    assert table.total == ("total", "55.0", "10.0", "10")
    assert usage_table(rows, ("user",)).left_out == 0


def test_an_end_day_is_written_back_as_the_day_it_includes():
    assert format_input(utc(2026, 12, 1), end=True) == "2026-11-30"
    assert format_input(utc(2026, 12, 1)) == "2026-12-01"
    assert format_input(utc(2026, 12, 1, 9, 5), end=True) == "2026-12-01T09:05"


def test_a_sqlite_file_that_is_not_there_is_named_not_made(tmp_path):
    path = tmp_path / "hub.sqlite"
    assert missing_sqlite_file(f"sqlite:///{path}") == (
        f"There is no SQLite database at '{path}': give the hub's db_url "
        "(or GPUSpawner.accounting_db_url) as it is, with the file's absolute path."
    )
    assert not path.exists()
    path.touch()
    assert missing_sqlite_file(f"sqlite:///{path}") == ""
    assert missing_sqlite_file("postgresql://h/db") == missing_sqlite_file("sqlite://") == ""
