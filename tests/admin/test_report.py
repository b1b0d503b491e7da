"""The admin report from recorded hub users, pods and nodes (pure, no hub, no cluster)."""

from __future__ import annotations

import copy
import json

import pytest

from gpuspawner.admin.report import (
    PoolReport,
    build_report,
    explain_limit,
    format_duration,
    format_text,
    parse_time,
    report_from_dict,
)

from ..security.payloads import PAYLOADS


def report_of(users, pods, figures, catalog, now, **kwargs):
    return build_report(users=users, pods=pods, figures=figures, catalog=catalog, now=now, **kwargs)


def server(report, user, name=""):
    return next(s for s in report.user(user).servers if s.name == name)


def test_gpu_types(users, pods, figures, catalog, now):
    report = report_of(users, pods, figures, catalog, now)
    types = {t.key: t for t in report.types}
    assert list(types) == ["a100", "h100"]  # catalog order
    a100, h100 = types["a100"], types["h100"]
    # ann holds 2, student 1, of 2 nodes x 4
    assert (a100.allocatable, a100.in_use, a100.free, a100.nodes) == (8, 3, 5, 2)
    assert (h100.allocatable, h100.in_use, h100.free, h100.nodes) == (8, 4, 4, 1)
    assert a100.display_name == "NVIDIA A100" and a100.waiting == 0


def test_waiting_counts_unbound_pods(users, pods, figures, catalog, now):
    waiting = copy.deepcopy(next(p for p in pods if p["metadata"]["name"] == "jupyter-ann"))
    waiting["metadata"]["name"] = "jupyter-ann--more"
    waiting["metadata"]["annotations"]["hub.jupyter.org/servername"] = "more"
    del waiting["spec"]["nodeName"]
    waiting["status"] = {"phase": "Pending"}
    report = report_of(users, [*pods, waiting], figures, catalog, now)
    assert {t.key: t.waiting for t in report.types} == {"a100": 2, "h100": 0}
    # the hub does not know that server: it is listed because it holds (or waits for) GPUs
    orphan = server(report, "ann", "more")
    assert orphan.state == "pod only" and orphan.gpus == 2 and orphan.node == ""
    assert report.user("ann").gpus_used == 4


def test_servers(users, pods, figures, catalog, now):
    report = report_of(users, pods, figures, catalog, now)
    assert [u.name for u in report.users] == ["ann", "hog", "student"]
    ann = server(report, "ann")
    assert (ann.state, ann.profile, ann.gpu_type, ann.gpus, ann.node) == (
        "running",
        "pytorch",
        "a100",
        2,
        "gpu-a100-0",
    )
    assert ann.gpu_type_name == "NVIDIA A100" and ann.pod == "jupyter-ann"
    hub_ann = next(u for u in users if u["name"] == "ann")["servers"][""]
    assert ann.age == now - parse_time(hub_ann["started"])
    assert ann.idle == now - parse_time(hub_ann["last_activity"])
    assert ann.utilisation is None and report.utilisation_source == ""

    notes = server(report, "student", "notes")
    assert notes.gpu_type is None and notes.gpus == 0 and notes.gpu_type_name == "CPU only"
    assert notes.node == "cpu-0" and notes.label == "notes"
    assert server(report, "hog", "big").gpu_type == "h100"


def test_limits_and_their_rules(users, pods, figures, catalog, now):
    report = report_of(users, pods, figures, catalog, now)
    ann, hog, student = (report.user(n) for n in ("ann", "hog", "student"))
    assert (ann.limit, ann.rule, ann.gpus_used) == (2, "the default rule", 2)
    assert (hog.limit, hog.rule, hog.gpus_used) == (None, "user rule 'hog'", 4)
    assert student.groups == ("students",)
    assert (student.limit, student.rule, student.gpus_used) == (1, "group rule 'students'", 1)
    assert student.limit_per_type == {"h100": 0}
    assert explain_limit(student) == (
        "student (groups: students) may hold 1 GPUs (h100: at most 0), "
        "from group rule 'students'; holds 1 GPUs now."
    )


def test_which_images_each_user_may_use(users, pods, figures, catalog, now):
    lin = {"name": "lin", "admin": False, "groups": ["licensed"], "servers": {}}
    report = report_of([*users, lin], pods, figures, catalog, now)
    matlab = "MATLAB (groups 'licensed'; users 'hog')"
    assert report.user("student").image_text == (
        f"student may use the images PyTorch; not {matlab}."
    )
    assert report.user("hog").image_text == f"hog may use the images PyTorch and {matlab}."
    assert report.user("lin").image_text == f"lin may use the images PyTorch and {matlab}."
    # next to the limit, for `gpuspawner status --user student`
    text = format_text(report, "student")
    limit = text.index("student (groups: students) may hold 1 GPUs")
    assert text.index(f"student may use the images PyTorch; not {matlab}.") > limit


def test_image_access_without_the_groups_is_not_guessed(users, pods, figures, catalog, now):
    for u in users:
        del u["groups"]
    report = report_of(users, pods, figures, catalog, now)
    assert report.user("student").image_text == (
        "student may use the images PyTorch; perhaps MATLAB (groups 'licensed'; users 'hog'), "
        "depending on the groups the hub did not show."
    )
    # hog is named by the image: that needs no groups
    assert report.user("hog").image_text.startswith("hog may use the images PyTorch and MATLAB")


def test_a_user_without_servers_still_has_a_limit(users, pods, figures, catalog, now):
    quiet = {"name": "quiet", "admin": False, "groups": ["students"], "servers": {}}
    report = report_of([*users, quiet], pods, figures, catalog, now)
    row = report.user("quiet")
    assert row.servers == () and row.rule == "group rule 'students'" and row.gpus_used == 0
    text = format_text(report, "quiet")
    assert "quiet (groups: students) may hold 1 GPUs" in text and "no server" in text


def test_groups_unknown_without_the_scope(users, pods, figures, catalog, now):
    for u in users:
        del u["groups"]
    report = report_of(users, pods, figures, catalog, now)
    student = report.user("student")
    assert student.groups is None and student.rule == "the default rule"
    assert "groups unknown" in explain_limit(student)


def test_utilisation_by_pod(users, pods, figures, catalog, now):
    util = {("jupyterhub", "jupyter-ann"): 0.42}
    report = report_of(users, pods, figures, catalog, now, utilisation=util)
    assert server(report, "ann").utilisation == 0.42
    assert server(report, "student").utilisation is None
    text = format_text(report)
    assert "42 %" in text and "no data" in text
    assert "not configured" in format_text(report_of(users, pods, figures, catalog, now))


def test_without_catalog_or_cluster(users, now):
    report = report_of(users, [], {}, None, now, problems=["The cluster could not be read: x"])
    assert report.types == ()
    ann = report.user("ann")
    # from the hub's user_options when no pod is known
    assert server(report, "ann").gpus == 2 and server(report, "ann").node == ""
    assert ann.limit is None and ann.rule == "no catalog"
    assert "Note: The cluster could not be read: x" in format_text(report)


def test_json_round_trip(users, pods, figures, catalog, now):
    report = report_of(users, pods, figures, catalog, now, utilisation={})
    again = report_from_dict(report.as_dict())
    assert isinstance(again, PoolReport) and again == report


def test_text_tables(users, pods, figures, catalog, now):
    text = format_text(report_of(users, pods, figures, catalog, now))
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("GPU type"))
    a100 = next(line for line in lines if line.startswith("NVIDIA A100 (a100)"))
    assert header.index("free") == a100.index("5")  # columns line up
    ann = next(line for line in lines if line.startswith("ann "))
    for cell in ("default", "running", "pytorch", "NVIDIA A100", "gpu-a100-0", "2 / 2"):
        assert cell in ann


def test_durations():
    assert [format_duration(s) for s in (None, 42, 300, 3600, 12000, 86400, 90000)] == [
        "-",
        "42 s",
        "5 min",
        "1 h",
        "3 h 20 min",
        "1 d",
        "1 d 1 h",
    ]


def test_prometheus_nan_and_inf_are_no_figure(users, pods, figures, catalog, now):
    """Prometheus answers "NaN" and "+Inf" for some series; JSON has no word for them."""
    util = {
        ("jupyterhub", "jupyter-ann"): float("nan"),
        ("jupyterhub", "jupyter-hog--big"): float("inf"),
    }
    report = report_of(users, pods, figures, catalog, now, utilisation=util)
    assert server(report, "ann").utilisation is None
    assert server(report, "hog", "big").utilisation is None
    # strict JSON, as `jq` and browsers read it
    json.loads(json.dumps(report.as_dict(), allow_nan=False))
    assert "nan" not in format_text(report).lower()


def test_utilisation_that_failed_is_unknown_not_unconfigured(users, pods, figures, catalog, now):
    report = report_of(users, pods, figures, catalog, now, utilisation_failed=True)
    assert report.utilisation_source == "unavailable"
    ann = next(line for line in format_text(report).splitlines() if line.startswith("ann "))
    assert "unknown" in ann and "not configured" not in ann


@pytest.mark.parametrize(("name", "value"), PAYLOADS, ids=[n for n, _ in PAYLOADS])
def test_the_terminal_gets_no_control_characters(users, pods, figures, catalog, now, name, value):
    """`gpuspawner status` prints names: ESC, CR/LF, NUL or U+202E would act on the terminal."""

    def report_with(user_name):
        renamed = copy.deepcopy(users)
        renamed[0]["name"] = user_name
        renamed[0]["groups"] = [user_name]
        return report_of(renamed, pods, figures, catalog, now, problems=[f"x {user_name}"])

    hostile = value + "\x1b]0;pwned\x07"
    text = format_text(report_with(hostile))
    assert all(c.isprintable() or c == "\n" for c in text)
    assert "\\x1b]0;pwned\\x07" in text
    if value.isprintable():
        assert value in text
    # no line of its own: a name cannot forge a row
    assert len(text.splitlines()) == len(format_text(report_with("plain")).splitlines())
    one = format_text(report_with(hostile), hostile)
    assert all(c.isprintable() or c == "\n" for c in one) and "\\x1b" in one
