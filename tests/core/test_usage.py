"""Usage accounting's pure core: intervals from pods, GPU-seconds in a window, summaries, CSV."""

from __future__ import annotations

import copy
import csv
import io
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuspawner.core import labels
from gpuspawner.core.catalog import Allowance, BudgetRules, LimitRules
from gpuspawner.core.serverpod import parse_timestamp
from gpuspawner.core.usage import (
    DIMENSIONS,
    INTERVAL_COLUMNS,
    Interval,
    UsageRow,
    charge_group,
    gpu_seconds,
    interval_from_pod,
    intervals_csv,
    rows_csv,
    summarize,
)

from ..conftest import FIXTURES


def pod_file(name):
    return json.loads((FIXTURES / "pods" / f"{name}.json").read_text())


RUNNING = pod_file("gpu-check-succeeded")  # alice, pytorch, 2 × h100, scheduled 22:41:07
START = parse_timestamp("2026-11-29T22:41:07Z")


def iv(
    start,
    end,
    *,
    gpus=1,
    units=None,
    user="u",
    group="",
    gpu_type="a100",
    image="pytorch",
    uid=None,
):
    return Interval(
        uid=uid or f"{user}-{start}",
        user=user,
        server="",
        charge_group=group,
        gpu_type=gpu_type,
        image=image,
        gpus=gpus,
        units=gpus if units is None else units,
        start=start,
        end=end,
        end_source="" if end is None else "pod",
    )


# ---------------------------------------------------------------------------
# intervals from pods
# ---------------------------------------------------------------------------


def test_a_running_gpu_server_is_an_open_interval():
    pod = copy.deepcopy(RUNNING)
    pod["metadata"]["annotations"][labels.ANNOTATION_CHARGE_GROUP] = "ml-team"
    pod["metadata"]["annotations"][labels.ANNOTATION_GPU_WEIGHT] = "0.5"
    assert interval_from_pod(pod) == Interval(
        uid="3f6c2b1e-9a4d-4c8e-b7f1-2d5e8a9c0b14",
        user="alice",
        server="",
        charge_group="ml-team",
        gpu_type="h100",
        image="pytorch",
        gpus=2,
        units=1.0,
        start=START,
        end=None,
        end_source="",
    )


def test_an_ended_pod_is_closed_from_its_own_times():
    failed = interval_from_pod(pod_file("gpu-check-terminated-message"))
    assert (failed.start, failed.end, failed.end_source) == (
        START,
        parse_timestamp("2026-11-29T22:41:12Z"),
        "pod",
    )
    assert failed.units == 2  # no weight recorded: 1 unit per GPU


def test_a_vanished_pod_that_never_ended_ended_when_its_deletion_was_asked_for():
    pod = copy.deepcopy(RUNNING)
    pod["metadata"]["deletionTimestamp"] = "2026-11-29T23:00:30Z"
    pod["metadata"]["deletionGracePeriodSeconds"] = 30
    assert interval_from_pod(pod).end is None  # still running, being deleted
    gone = interval_from_pod(pod, vanished=True)
    assert (gone.end, gone.end_source) == (parse_timestamp("2026-11-29T23:00:00Z"), "pod")
    # a vanished pod that never said when it was deleted stays open for the recorder
    del pod["metadata"]["deletionTimestamp"]
    assert interval_from_pod(pod, vanished=True).end is None


def test_an_end_before_the_start_is_the_start():
    pod = copy.deepcopy(RUNNING)
    pod["metadata"]["deletionTimestamp"] = "2026-11-29T22:00:00Z"
    assert interval_from_pod(pod, vanished=True).end == START


def without(path, pod=RUNNING):
    pod = copy.deepcopy(pod)
    *parents, last = path
    node = pod
    for key in parents:
        node = node[key]
    del node[last]
    return pod


@pytest.mark.parametrize(
    "pod",
    [
        without(("metadata", "annotations", labels.KUBESPAWNER_ANNOTATION_USER)),  # no user
        without(("metadata", "labels", labels.LABEL_GPUS)),  # no GPUs: a CPU server
        without(("metadata", "labels", labels.LABEL_GPU_TYPE)),
        without(("metadata", "uid")),
        without(("status", "conditions")),  # never scheduled
        {},
        {"metadata": None, "status": None},
    ],
    ids=["no-user", "no-gpus", "no-type", "no-uid", "unscheduled", "empty", "nulls"],
)
def test_pods_without_a_gpu_allocation_have_no_interval(pod):
    assert interval_from_pod(pod) is None


JUNK = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner, max_size=3)
    ),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(
            ["phase", "conditions", "containerStatuses", "initContainerStatuses", "startTime"]
        ),
        JUNK,
    ),
    st.dictionaries(
        st.sampled_from(["uid", "deletionTimestamp", "deletionGracePeriodSeconds"]), JUNK
    ),
    st.dictionaries(
        st.sampled_from(
            [
                labels.ANNOTATION_CHARGE_GROUP,
                labels.ANNOTATION_GPU_WEIGHT,
                labels.ANNOTATION_IDLE_TIMEOUT,
                labels.ANNOTATION_KEEP_UNTIL,
            ]
        ),
        st.text(max_size=20),
    ),
    st.booleans(),
)
def test_garbage_reads_as_absent_and_never_raises(status, meta, annotations, vanished):
    pod = copy.deepcopy(RUNNING)
    pod["status"].update(status)
    pod["metadata"].update(meta)
    pod["metadata"]["annotations"].update(annotations)
    got = interval_from_pod(pod, vanished=vanished)
    if got is not None:
        assert isinstance(got.start, float) and got.uid and got.gpus == 2
        assert got.end is None or got.end >= got.start
        assert got.units > 0


# ---------------------------------------------------------------------------
# GPU-seconds in a window
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "start, end, expected",
    [
        (100, 200, 100),  # inside
        (50, 150, 50),  # starts before the window
        (150, 400, 150),  # ends after it
        (0, 50, 0),  # before it
        (300, 400, 0),  # at its end: [since, until) leaves it out
        (100, None, 150),  # open: until now (250)
        (260, None, 0),  # open, starting after now
        (0, 100, 0),  # ends at the window's start
    ],
)
def test_gpu_seconds_are_clipped_to_the_window_and_to_now(start, end, expected):
    interval = iv(start, end, gpus=2, units=0.5)
    assert gpu_seconds(interval, 100, 300, 250) == 2 * expected
    assert gpu_seconds(interval, 100, 300, 250, weighted=True) == 0.5 * expected


# ---------------------------------------------------------------------------
# summaries
# ---------------------------------------------------------------------------

INTERVALS = [
    iv(0, 3600, gpus=2, user="alice", group="ml-team", gpu_type="a100"),
    iv(1800, None, gpus=1, units=1 / 7, user="bob", group="ml-team", gpu_type="mig-1g"),
    iv(0, 7200, gpus=1, user="carol", group="", gpu_type="a100", image="tensorflow"),
    iv(9000, 9600, gpus=8, user="alice", group="ml-team", gpu_type="a100"),  # after the window
]


def test_a_summary_by_user():
    rows = summarize(INTERVALS, 0, 7200, 5400, ("user",))
    assert rows == [
        UsageRow(("alice",), 7200, 7200, 1),
        UsageRow(("carol",), 7200, 7200, 1),  # same GPU-seconds: by key
        UsageRow(("bob",), 3600, pytest.approx(3600 / 7), 1),
    ]
    assert rows[0].gpu_hours == 2 and rows[2].unit_hours == pytest.approx(1 / 7)


def test_summaries_by_several_dimensions_and_in_total():
    rows = summarize(INTERVALS, 0, 10000, 10000, ("group", "gpu_type"))
    assert [(r.key, r.gpu_seconds, r.servers) for r in rows] == [
        (("ml-team", "a100"), 7200 + 4800, 2),
        (("ml-team", "mig-1g"), 8200, 1),
        (("", "a100"), 7200, 1),
    ]
    (total,) = summarize(INTERVALS, 0, 10000, 10000, ())
    assert total.key == () and total.servers == 4
    assert summarize([], 0, 1, 1, DIMENSIONS) == []


@pytest.mark.parametrize("by", [("users",), ("user", "user"), ("uid",)])
def test_a_summary_by_anything_else_is_an_error(by):
    with pytest.raises(ValueError):
        summarize(INTERVALS, 0, 1, 1, by)


TIMES = st.integers(0, 1000)


@st.composite
def intervals(draw):
    out = []
    for n in range(draw(st.integers(0, 12))):
        start = draw(TIMES)
        end = draw(st.none() | st.integers(start, 1200))
        gpus = draw(st.integers(1, 8))
        out.append(
            iv(
                float(start),
                None if end is None else float(end),
                gpus=gpus,
                units=gpus * draw(st.sampled_from([1.0, 1 / 7, 0.5])),
                user=draw(st.sampled_from(["alice", "bob", "=cmd()"])),
                group=draw(st.sampled_from(["", "ml-team", "class"])),
                gpu_type=draw(st.sampled_from(["a100", "h100"])),
                image=draw(st.sampled_from(["pytorch", "jax"])),
                uid=f"pod-{n}",
            )
        )
    return out


BY = st.lists(st.sampled_from(DIMENSIONS), unique=True, max_size=4).map(tuple)


@settings(max_examples=300, deadline=None)
@given(intervals(), BY, TIMES, TIMES, TIMES, TIMES)
def test_summaries_add_up_over_any_dimensions_and_any_split_of_the_window(ivs, by, a, b, cut, now):
    since, until = min(a, b), max(a, b)
    cut = min(max(cut, since), until)
    rows = summarize(ivs, since, until, now, by)
    assert sum(r.gpu_seconds for r in rows) == pytest.approx(
        sum(gpu_seconds(i, since, until, now) for i in ivs)
    )
    assert sum(r.unit_seconds for r in rows) == pytest.approx(
        sum(gpu_seconds(i, since, until, now, weighted=True) for i in ivs)
    )
    # a window split in two adds up to the whole, for every key
    whole = {r.key: r.gpu_seconds for r in rows}
    halves: dict = {}
    for part in (summarize(ivs, since, cut, now, by), summarize(ivs, cut, until, now, by)):
        for r in part:
            halves[r.key] = halves.get(r.key, 0) + r.gpu_seconds
    assert halves == pytest.approx(whole)
    # and the total is the integral of the GPUs held, second by second (whole-second times;
    # an open interval holds them until now)
    held = sum(
        i.gpus
        for t in range(since, until)
        for i in ivs
        if i.start <= t < (now if i.end is None else i.end)
    )
    assert sum(r.gpu_seconds for r in rows) == pytest.approx(held)
    assert rows == sorted(rows, key=lambda r: (-r.gpu_seconds, r.key))
    assert all(r.gpu_seconds > 0 and r.servers >= 1 for r in rows)


# ---------------------------------------------------------------------------
# CSV
# ---------------------------------------------------------------------------


def parse(text):
    return list(csv.reader(io.StringIO(text)))


def test_the_intervals_csv_matches_the_pods_to_the_second():
    pod = copy.deepcopy(RUNNING)
    pod["metadata"]["annotations"][labels.ANNOTATION_CHARGE_GROUP] = "ml-team"
    running = interval_from_pod(pod)
    failed = interval_from_pod(pod_file("gpu-check-terminated-message"))
    failed = Interval(**{**failed.__dict__, "uid": "failed-one"})
    now = START + 600.4
    lines = parse(intervals_csv([running, failed], START - 86400, START + 86400, now))
    assert lines[0] == list(INTERVAL_COLUMNS)
    assert lines[1] == [
        "3f6c2b1e-9a4d-4c8e-b7f1-2d5e8a9c0b14",
        "alice",
        "",
        "ml-team",
        "h100",
        "pytorch",
        "2",
        "2026-11-29T22:41:07Z",
        "",  # still running
        "600.4",
        "1200.8",
        "",
    ]
    assert lines[2][7:] == ["2026-11-29T22:41:07Z", "2026-11-29T22:41:12Z", "5", "10", "pod"]
    assert len(lines) == 3


def test_the_intervals_csv_counts_the_part_inside_the_window_only():
    lines = parse(intervals_csv(INTERVALS, 1800, 3600, 5400))
    assert [line[1] for line in lines[1:]] == ["alice", "carol", "bob"]  # by start
    assert [line[-3:-1] for line in lines[1:]] == [
        ["1800", "3600"],
        ["1800", "1800"],
        ["1800", "1800"],
    ]
    assert lines[1][7:9] == ["1970-01-01T00:00:00Z", "1970-01-01T01:00:00Z"]  # their own times


def test_the_summary_csv_has_stable_columns():
    rows = summarize(INTERVALS, 0, 7200, 5400, ("user", "group"))
    lines = parse(rows_csv(rows, ("user", "group")))
    assert lines[0] == [
        "user",
        "group",
        "gpu_seconds",
        "gpu_hours",
        "unit_seconds",
        "unit_hours",
        "servers",
    ]
    assert lines[1] == ["alice", "ml-team", "7200", "2", "7200", "2", "1"]
    assert lines[3] == ["bob", "ml-team", "3600", "1", "514.285714", "0.142857", "1"]


@pytest.mark.parametrize(
    "name, cell",
    [
        ("=cmd()", "'=cmd()"),
        ("+1", "'+1"),
        ("-2+3", "'-2+3"),
        ("@SUM(A1)", "'@SUM(A1)"),
        ("\t=x", "'\t=x"),
        ("a=b", "a=b"),
        ('quote"and,comma\nline', 'quote"and,comma\nline'),
    ],
)
def test_csv_cells_are_never_formulas(name, cell):
    interval = iv(0, 60, user=name, group=name, image=name, uid=name)
    lines = parse(intervals_csv([interval], 0, 60, 60))
    assert lines[1][:2] == [cell, cell] and lines[1][3] == cell and lines[1][5] == cell
    summary = parse(rows_csv(summarize([interval], 0, 60, 60, ("user",)), ("user",)))
    assert summary[1][0] == cell


# ---------------------------------------------------------------------------
# the charge group
# ---------------------------------------------------------------------------

LIMITS = LimitRules(
    groups={"ml-team": Allowance(total=4), "class": Allowance(total=1), "gpu-all": Allowance()},
    gpu_hours=BudgetRules(groups={"ml-team": 100, "research": 200, "free": None}),
)


@pytest.mark.parametrize(
    "groups, expected",
    [
        (["ml-team", "research"], "research"),  # the most generous budget rule
        (["research", "free"], "free"),  # unlimited is the most generous
        (["class", "ml-team"], "ml-team"),  # a budget rule before a limits rule
        (["class", "zoo"], "class"),  # no budget rule: the limits rule
        (["class", "gpu-all"], "gpu-all"),  # the largest limit (unlimited)
        (["zoo", "alpha"], "alpha"),  # no rule: the alphabetically first
        ([], ""),
    ],
)
def test_the_charge_group(groups, expected):
    assert charge_group(LIMITS, groups) == expected


def test_equal_rules_charge_the_alphabetically_first():
    rules = LimitRules(gpu_hours=BudgetRules(groups={"b": 10, "a": 10}))
    assert charge_group(rules, ["b", "a"]) == "a"
    assert charge_group(LimitRules(), ("b", "a", "b")) == "a"
