"""The usage store on SQLite and on a real PostgreSQL: migrations, exactness, concurrency, sums."""

from __future__ import annotations

import calendar
import multiprocessing
import threading
from collections import defaultdict

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuspawner.accounting import store as store_module
from gpuspawner.accounting.store import (
    TABLES,
    VERSION_TABLE,
    StoreError,
    UsageStore,
    months,
    segments,
)
from gpuspawner.core.usage import DIMENSIONS, Interval, overlap_seconds, summarize

DAY = 86_400
#: Two hours before the end of January 2026 (UTC): intervals cross a day and a month.
T0 = calendar.timegm((2026, 1, 31, 22, 0, 0))
FEB = calendar.timegm((2026, 2, 1, 0, 0, 0))
MAR = calendar.timegm((2026, 3, 1, 0, 0, 0))


def iv(
    uid: str,
    start: float = T0,
    end: float | None = None,
    *,
    user: str = "ada",
    group: str = "ml",
    gpu_type: str = "a100",
    image: str = "pytorch",
    gpus: int = 1,
    weight: float = 1.0,
) -> Interval:
    return Interval(
        uid=uid,
        user=user,
        server="",
        charge_group=group,
        gpu_type=gpu_type,
        image=image,
        gpus=gpus,
        units=gpus * weight,
        start=start,
        end=end,
        end_source="" if end is None else "pod",
    )


def head_revision() -> str:
    from alembic.script import ScriptDirectory

    return ScriptDirectory(str(store_module.MIGRATIONS)).get_current_head()


def table_names(url: str) -> set[str]:
    engine = UsageStore(url).engine
    try:
        return set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()


# -- pure helpers ---------------------------------------------------------------------------


def test_an_interval_is_cut_at_midnights_and_month_starts() -> None:
    assert segments(T0, T0 + 3 * 3600) == [(FEB - DAY, T0, FEB), (FEB, FEB, T0 + 3 * 3600)]
    # ending on a midnight leaves no empty piece; a zero-length interval has none
    assert segments(FEB - 60, FEB) == [(FEB - DAY, FEB - 60, FEB)]
    assert segments(T0, T0) == []
    assert months(T0, MAR + 10) == [
        (FEB - 31 * DAY, FEB - T0),
        (FEB, MAR - FEB),
        (MAR, 10),
    ]


def test_a_database_other_than_sqlite_or_postgresql_is_refused_in_one_sentence() -> None:
    with pytest.raises(
        StoreError, match=r"^GPU usage is kept in SQLite or PostgreSQL, not 'mysql'"
    ):
        UsageStore("mysql://hub@127.0.0.1/jupyterhub")


# -- migrations -----------------------------------------------------------------------------


def test_migrate_makes_the_tables_and_a_second_migrate_changes_nothing(db_url) -> None:
    store = UsageStore(db_url)
    try:
        assert store.revision() is None
        store.migrate()
        assert store.revision() == head_revision()
        assert {t.name for t in TABLES} | {VERSION_TABLE} <= table_names(db_url)
        assert store.open(iv("a"))
        store.migrate()
        assert store.revision() == head_revision()
        assert [i.uid for i in store.open_intervals()] == ["a"]
    finally:
        store.close()


def test_the_migrated_schema_is_the_one_the_store_queries(store) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    ours = {t.name for t in TABLES}
    with store.engine.connect() as conn:
        context = MigrationContext.configure(
            conn,
            opts={
                "include_name": lambda name, kind, parent: kind != "table" or name in ours,
                "compare_type": True,
            },
        )
        assert compare_metadata(context, store_module.metadata) == []


def _migrate(url: str) -> str | None:
    store = UsageStore(url)
    try:
        store.migrate()
        return store.revision()
    finally:
        store.close()


def test_processes_migrating_at_once_take_turns(db_url) -> None:
    with multiprocessing.get_context("fork").Pool(4) as pool:
        assert pool.map(_migrate, [db_url] * 4) == [head_revision()] * 4


def jupyterhub_url(url: str) -> str:
    # JupyterHub's engine, as z2jh configures it: psycopg2 (SQLAlchemy 2.1's default is psycopg 3)
    return url.replace("postgresql://", "postgresql+psycopg2://")


def test_the_hubs_own_tables_in_the_same_database_are_untouched(db_url) -> None:
    from jupyterhub import orm

    session = orm.new_session_factory(jupyterhub_url(db_url))()
    session.add(orm.User(name="ada"))
    session.commit()
    engine = session.get_bind()
    inspector = sa.inspect(engine)
    hub_tables = {
        name: [(c["name"], str(c["type"])) for c in inspector.get_columns(name)]
        for name in inspector.get_table_names()
    }
    assert "alembic_version" in hub_tables and "users" in hub_tables
    with engine.connect() as conn:
        hub_revision = conn.execute(sa.text("SELECT version_num FROM alembic_version")).all()
    session.close()
    engine.dispose()

    _migrate(db_url)

    session = orm.new_session_factory(jupyterhub_url(db_url))()  # checks the hub's revision
    engine = session.get_bind()
    inspector = sa.inspect(engine)
    names = set(inspector.get_table_names())
    assert names == set(hub_tables) | {t.name for t in TABLES} | {VERSION_TABLE}
    for name, columns in hub_tables.items():
        assert [(c["name"], str(c["type"])) for c in inspector.get_columns(name)] == columns
    with engine.connect() as conn:
        assert (
            conn.execute(sa.text("SELECT version_num FROM alembic_version")).all() == hub_revision
        )
        ours = conn.execute(sa.text(f"SELECT version_num FROM {VERSION_TABLE}")).all()
        assert [r[0] for r in ours] == [head_revision()]
    assert [u.name for u in session.query(orm.User)] == ["ada"]
    session.close()
    engine.dispose()


def test_sqlite_waits_for_the_lock_and_leaves_the_hubs_journal_mode_alone(tmp_path) -> None:
    """The file is usually the hub's own: its journal mode (a setting of the file, which WAL
    would change for JupyterHub too, and which is unsafe on network filesystems) is kept."""
    store = UsageStore(f"sqlite:///{tmp_path / 'hub.sqlite'}")
    store.migrate()
    with store.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "delete"
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() > 0
    store.close()


def test_an_in_memory_sqlite_store_is_one_database_for_every_thread() -> None:
    store = UsageStore("sqlite://")
    store.migrate()
    opened: list[bool] = []
    threads = [
        threading.Thread(target=lambda: opened.append(store.open(iv("a")))) for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(opened) == [False, False, False, True]
    assert store.close("a", T0 + 60, "pod")
    assert store.closed_totals() == {("a100", "ml"): 60.0}
    store.close()


# -- writes ---------------------------------------------------------------------------------


def test_open_is_idempotent_on_the_pods_uid(store) -> None:
    assert store.open(iv("a", gpus=2))
    assert not store.open(iv("a", start=T0 + 60, gpus=4))
    assert store.get("a") == iv("a", gpus=2)
    assert store.open_intervals() == [iv("a", gpus=2)]
    assert store.open_many([iv("a"), iv("b"), iv("b"), iv("c", end=T0 + 60)]) == 2
    assert [i.uid for i in store.open_intervals()] == ["a", "b"]


def test_close_only_closes_an_open_interval_and_the_first_close_wins(store) -> None:
    assert not store.close("nobody", T0 + 60, "pod")
    store.open(iv("a", gpus=2))
    assert store.close("a", T0 + 3600, "event")
    assert not store.close("a", T0 + 7200, "pod")
    assert store.get("a") == Interval(
        **{**vars(iv("a", gpus=2)), "end": T0 + 3600.0, "end_source": "event"}
    )
    assert store.open_intervals() == []
    assert store.closed_totals() == {("a100", "ml"): 7200.0}


def test_an_end_before_the_start_closes_at_the_start(store) -> None:
    store.open(iv("a"))
    assert store.close("a", T0 - 60, "last-seen")
    assert store.get("a").end == T0
    assert store.summary(T0 - DAY, T0 + DAY, T0 + DAY, ("user",)) == []


def test_times_that_are_not_finite_or_a_decade_apart_are_refused(store) -> None:
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match="finite"):
            store.open(iv("a", start=bad))
    with pytest.raises(ValueError, match="longer than 10 years"):
        store.open(iv("a", end=T0 + 11 * 366 * DAY))
    assert store.open(iv("a"))
    with pytest.raises(ValueError, match="finite"):
        store.close("a", float("nan"), "pod")
    with pytest.raises(ValueError, match="longer than 10 years"):
        store.close("a", T0 + 11 * 366 * DAY, "pod")
    assert [i.uid for i in store.open_intervals()] == ["a"]
    assert store.close("a", T0 + 60, "pod")


def test_an_interval_recorded_after_its_end_is_closed_and_counted(store) -> None:
    assert store.open(iv("a", end=T0 + 7200, gpus=2))
    assert store.open_intervals() == []
    assert not store.close("a", T0 + 9000, "pod")
    assert store.closed_totals() == {("a100", "ml"): 14400.0}
    (row,) = store.summary(T0, T0 + DAY, T0 + DAY, ("user",))
    assert (row.key, row.gpu_seconds, row.servers) == (("ada",), 14400.0, 1)


def test_hostile_names_are_data_and_never_stop_the_recording(store) -> None:
    """Names come from pods: quotes, NUL, a lone surrogate, an overlong name are stored as data."""
    nasty = "x'); DROP TABLE gpuspawner_usage_intervals; --\x00\ud800" + "é" * 300
    assert store.open(iv("a", user=nasty, group=nasty, image="=cmd|' /C calc'!A0"))
    assert store.open(iv("b\x00", user="bo"))
    (a,) = [i for i in store.open_intervals() if i.uid == "a"]
    assert a.user.startswith("x'); DROP TABLE gpuspawner_usage_intervals; --\ufffd")
    assert len(a.user) == 255 and a.charge_group == a.user
    assert a.image == "=cmd|' /C calc'!A0"
    assert store.close("a", T0 + 60, "pod") and store.close("b\x00", T0 + 60, "pod")
    assert store.used_unit_seconds([nasty, "bo"], T0, T0 + 60, T0 + 60) == {nasty: 60.0, "bo": 60.0}
    (row,) = store.summary(T0, T0 + 60, T0 + 60, ("user",), group=nasty)
    assert (row.key, row.gpu_seconds) == ((a.user,), 60.0)
    assert [i.uid for i in store.intervals(T0, T0 + 60, user=nasty)] == ["a"]


def test_heartbeats_move_last_seen_forward_only_while_open(store) -> None:
    assert store.last_seen("a") is None
    store.open(iv("a"))
    assert store.last_seen("a") == T0
    store.touch(["a", "unknown"], T0 + 60)
    assert store.last_seen("a") == T0 + 60
    store.touch(["a"], T0 + 30)
    assert store.last_seen("a") == T0 + 60
    store.close("a", T0 + 90, "pod")
    store.touch(["a"], T0 + 120)
    assert store.last_seen("a") == T0 + 60


def test_a_restarted_store_finds_what_was_recorded(db_url, store) -> None:
    store.open(iv("a"))
    store.open(iv("b"))
    store.close("b", T0 + 60, "pod")
    again = UsageStore(db_url)
    again.migrate()
    try:
        assert [i.uid for i in again.open_intervals()] == ["a"]
        assert again.close("a", T0 + 120, "event")
        assert not store.close("a", T0 + 180, "pod")
        assert again.closed_totals() == {("a100", "ml"): 180.0}
    finally:
        again.close()


# -- concurrency ----------------------------------------------------------------------------

UIDS = [f"pod-{i}" for i in range(30)]


def _race(url: str, worker: int) -> list[tuple[str, bool, bool, float]]:
    """Open and close every uid; this worker's end for a uid is ``worker`` seconds after 1 h."""
    store = UsageStore(url)
    try:
        done = []
        for n, uid in enumerate(UIDS):
            opened = store.open(iv(uid, gpus=1 + n % 3))
            end = T0 + 3600 + worker
            done.append((uid, opened, store.close(uid, end, "pod"), end))
        return done
    finally:
        store.close()


def check_race(store: UsageStore, results: list[list[tuple[str, bool, bool, float]]]) -> None:
    for uid in UIDS:
        outcomes = [r for worker in results for r in worker if r[0] == uid]
        assert sum(r[1] for r in outcomes) == 1, uid
        (won,) = [r for r in outcomes if r[2]]
        assert store.get(uid).end == won[3]
    expected = sum((store.get(uid).end - T0) * (1 + n % 3) for n, uid in enumerate(UIDS))
    assert store.closed_totals() == {("a100", "ml"): pytest.approx(expected, abs=1e-6)}
    (row,) = store.summary(T0 - DAY, T0 + DAY, T0 + DAY, ())
    assert row.servers == len(UIDS)
    assert row.gpu_seconds == pytest.approx(expected, abs=1e-6)


def test_threads_open_and_close_each_interval_exactly_once(db_url, store) -> None:
    results: list[list] = [[] for _ in range(6)]

    def work(worker: int) -> None:
        results[worker] = _race(db_url, worker)

    threads = [threading.Thread(target=work, args=(w,)) for w in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check_race(store, results)


def test_processes_open_and_close_each_interval_exactly_once(db_url, store) -> None:
    with multiprocessing.get_context("fork").Pool(4) as pool:
        results = pool.starmap(_race, [(db_url, w) for w in range(4)])
    check_race(store, results)


def test_one_store_shared_by_threads(store) -> None:
    """The hub's recorder, the spawner and the metrics share one store object."""
    outcomes: list[bool] = []
    lock = threading.Lock()

    def work() -> None:
        for uid in UIDS:
            opened = store.open(iv(uid))
            closed = store.close(uid, T0 + 60, "pod")
            with lock:
                outcomes.extend([opened, closed])

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(outcomes) == 2 * len(UIDS)
    assert store.closed_totals() == {("a100", "ml"): 60.0 * len(UIDS)}


# -- reads ----------------------------------------------------------------------------------

#: Intervals across days, a month end, users, groups, types, images; some open.
SAMPLE = [
    iv("a1", T0, T0 + 4 * 3600, gpus=2),
    iv("a2", T0 + DAY, T0 + DAY + 600, user="bo", group="phys", gpu_type="h100"),
    iv("a3", T0 - 40 * DAY, T0 + 45 * DAY, user="cy", group="", image="tf", weight=0.25, gpus=4),
    iv("a4", FEB, FEB + DAY, image="tf"),
    iv("a5", FEB + 3600, None, user="bo", group="phys", gpus=3, weight=0.5),
    iv("a6", MAR - 7200, MAR + 7200, user="ada", gpu_type="h100"),
    iv("a7", T0 + 10, T0 + 10),
    iv("a8", MAR + 2 * DAY, None, user="cy", group=""),
]
NOW = MAR + 3 * DAY + 1234

WINDOWS = [
    (T0 - 60 * DAY, NOW + DAY),  # everything
    (FEB, MAR),  # one whole month
    (FEB - 31 * DAY, MAR + 31 * DAY),  # whole months and edges
    (FEB + 5, MAR - 5),  # inside a month
    (T0 + 3600, FEB + 3600),  # across midnight and the month start
    (FEB + DAY, FEB + 2 * DAY),  # one whole day
    (FEB + 3600, FEB + 7200),  # within a day
    (T0 + 10, T0 + 11),  # starting when a zero-length interval does
    (MAR - 3600, MAR + 3 * DAY + 60),  # into the open intervals
    (NOW + DAY, NOW + 2 * DAY),  # the future
    (T0 - 300 * DAY, T0 - 100 * DAY),  # before anything
    (FEB, FEB),  # empty
]
BYS = [("user",), ("group",), ("gpu_type", "image"), ("user", "group", "gpu_type", "image"), ()]


@pytest.fixture
def sample_store(store) -> UsageStore:
    for i in SAMPLE:
        store.open(Interval(**{**vars(i), "end": None, "end_source": ""}))
        if i.end is not None:
            store.close(i.uid, i.end, "pod")
    return store


def test_summaries_add_up_as_the_core_does(sample_store) -> None:
    for since, until in WINDOWS:
        for by in BYS:
            expected = summarize(SAMPLE, since, until, NOW, by)
            assert sample_store.summary(since, until, NOW, by) == expected, (since, until, by)
        for group in ("ml", "phys", "", "nobody"):
            kept = [i for i in SAMPLE if i.charge_group == group]
            expected = summarize(kept, since, until, NOW, ("user",))
            assert sample_store.summary(since, until, NOW, ("user",), group=group) == expected


def test_a_summary_by_an_unknown_dimension_is_refused(sample_store) -> None:
    with pytest.raises(ValueError, match="distinct dimensions"):
        sample_store.summary(FEB, MAR, NOW, ("email",))
    with pytest.raises(ValueError, match="distinct dimensions"):
        sample_store.summary(FEB, MAR, NOW, ("user", "user"))
    assert set(DIMENSIONS) == {"user", "group", "gpu_type", "image"}


def test_budget_use_is_the_weighted_overlap_per_user(sample_store) -> None:
    for since, until in WINDOWS:
        got = sample_store.used_unit_seconds(["ada", "bo", "cy", "dee"], since, until, NOW)
        expected = {
            user: sum(
                overlap_seconds(i, since, until, NOW) * i.units for i in SAMPLE if i.user == user
            )
            for user in ("ada", "bo", "cy", "dee")
        }
        assert got == expected, (since, until)
    assert sample_store.used_unit_seconds([], FEB, MAR, NOW) == {}


def test_intervals_lists_those_that_ran_in_the_window(sample_store) -> None:
    def ran(i: Interval, since: float, until: float) -> bool:
        if i.end is None:
            return i.start < until
        return overlap_seconds(i, since, until, NOW) > 0

    for since, until in WINDOWS:
        expected = sorted(
            (i for i in SAMPLE if ran(i, since, until)), key=lambda i: (i.start, i.uid)
        )
        assert sample_store.intervals(since, until) == expected, (since, until)
        assert sample_store.intervals(since, until, user="bo") == [
            i for i in expected if i.user == "bo"
        ]
        assert sample_store.intervals(since, until, group="") == [
            i for i in expected if i.charge_group == ""
        ]


def test_closed_totals_count_closed_intervals_by_type_and_group(sample_store) -> None:
    expected: dict[tuple[str, str], float] = defaultdict(float)
    for i in SAMPLE:
        if i.end is not None and i.end > i.start:
            expected[(i.gpu_type, i.charge_group)] += (i.end - i.start) * i.gpus
    assert sample_store.closed_totals() == dict(expected)


# -- property: recorded GPU-seconds are the integral of the GPUs held ------------------------

DELAYS = st.one_of(
    st.sampled_from([0, 1, 59, 3600, 14_400, DAY - 1, DAY, 7 * DAY, 31 * DAY]),
    st.integers(0, 10 * DAY),
)
POD = st.tuples(
    st.sampled_from(["ada", "bo", "cy"]),
    st.sampled_from(["ml", "phys", ""]),
    st.sampled_from(["a100", "h100"]),
    st.integers(1, 4),
    st.sampled_from([1.0, 0.5, 0.25]),
)
OPS = st.lists(
    st.tuples(st.sampled_from(["open", "close", "restart"]), st.integers(0, 4), DELAYS),
    max_size=25,
)


def held_integral(spans: list[tuple[float, float, float]], since: float, until: float) -> float:
    """The integral over ``[since, until)`` of the step function "amount held" (start: +, end: -)."""
    events = sorted([(s, a) for s, _, a in spans] + [(e, -a) for _, e, a in spans])
    total, level, prev = 0.0, 0.0, since
    for t, change in events:
        t = min(max(t, since), until)
        total += level * (t - prev)
        prev = t
        level += change
    return total + level * (until - prev)


def reset(url: str) -> None:
    """The store's tables, migrated and empty (one database serves every example)."""
    store = UsageStore(url)
    store.migrate()
    with store.engine.begin() as conn:
        for table in TABLES:
            conn.execute(table.delete())
    store.close()


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pods=st.lists(POD, min_size=5, max_size=5), ops=OPS, data=st.data())
def test_recorded_gpu_seconds_are_the_integral_of_gpus_held(db_url, pods, ops, data) -> None:
    reset(db_url)
    store = UsageStore(db_url)
    clock = float(T0)
    model: dict[int, list] = {}  # pod -> [start, end or None]
    try:
        for action, pod, delay in ops:
            clock += delay
            uid = f"pod-{pod}"
            if action == "restart":
                store.close()
                store = UsageStore(db_url)
                store.migrate()
            elif action == "open":
                user, group, gpu_type, gpus, weight = pods[pod]
                opened = store.open(
                    iv(
                        uid,
                        clock,
                        user=user,
                        group=group,
                        gpu_type=gpu_type,
                        gpus=gpus,
                        weight=weight,
                    )
                )
                assert opened == (pod not in model)
                model.setdefault(pod, [clock, None])
            else:
                closed = store.close(uid, clock, "pod")
                assert closed == (pod in model and model[pod][1] is None)
                if closed:
                    model[pod][1] = clock
        now = clock + data.draw(st.integers(0, DAY), label="now")
        span = int(now - T0) + DAY
        windows = [(T0 - DAY, now + DAY)]
        for _ in range(3):
            a, b = sorted(data.draw(st.tuples(st.integers(0, span), st.integers(0, span))))
            windows.append((T0 + a, T0 + b))
        assert {i.uid for i in store.open_intervals()} == {
            f"pod-{p}" for p, (_, end) in model.items() if end is None
        }
        recorded = [
            iv(
                f"pod-{p}",
                s,
                e,
                user=pods[p][0],
                group=pods[p][1],
                gpu_type=pods[p][2],
                gpus=pods[p][3],
                weight=pods[p][4],
            )
            for p, (s, e) in model.items()
        ]
        for since, until in windows:
            by = ("group", "gpu_type")
            assert store.summary(since, until, now, by) == summarize(
                recorded, since, until, now, by
            )
            rows = {r.key: r for r in store.summary(since, until, now, ("user",))}
            used = store.used_unit_seconds(["ada", "bo", "cy"], since, until, now)
            for user in ("ada", "bo", "cy"):
                mine = [
                    (p, s, now if e is None else e)
                    for p, (s, e) in model.items()
                    if pods[p][0] == user
                ]
                gpus = held_integral([(s, e, pods[p][3]) for p, s, e in mine], since, until)
                units = held_integral(
                    [(s, e, pods[p][3] * pods[p][4]) for p, s, e in mine], since, until
                )
                servers = sum(1 for _, s, e in mine if min(e, until) > max(s, since))
                row = rows.get((user,))
                got = (row.gpu_seconds, row.unit_seconds, row.servers) if row else (0, 0, 0)
                assert got == (gpus, units, servers), (user, since, until)
                assert used[user] == units
        totals: dict[tuple[str, str], float] = defaultdict(float)
        for p, (s, e) in model.items():
            if e is not None and e > s:
                totals[(pods[p][2], pods[p][1])] += (e - s) * pods[p][3]
        assert store.closed_totals() == dict(totals)
    finally:
        store.close()
