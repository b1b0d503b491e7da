"""The admin report from recorded hub users, pods and nodes (pure, no hub, no cluster)."""

from __future__ import annotations

import copy
import json

import pytest

from gpuspawner.admin.report import (
    KueueData,
    KueueQueueRow,
    PoolReport,
    build_report,
    explain_limit,
    format_duration,
    format_text,
    kueue_table,
    parse_time,
    pending_amounts,
    report_from_dict,
)
from gpuspawner.core import kueue
from gpuspawner.core.catalog import parse_catalog

from ..security.payloads import PAYLOADS
from . import kueueobjects
from .kueueobjects import A100, GPU, H100, PRODUCT


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


# ---------------------------------------------------------------------------
# Kueue's ClusterQueues beside the pool figures
# ---------------------------------------------------------------------------

MIG = "nvidia.com/mig-1g.10gb"


def queues_of(*objects, pending=None, partial=(), flavors=None) -> KueueData:
    return KueueData(
        names=tuple(o["metadata"]["name"] for o in objects),
        cluster_queues={o["metadata"]["name"]: o for o in objects},
        flavors=tuple(kueueobjects.flavors() if flavors is None else flavors),
        pending=pending or {},
        partial=frozenset(partial),
    )


def test_one_row_per_gpu_resource_of_each_flavor(users, pods, figures, catalog, now):
    notebooks = kueueobjects.cluster_queue(
        "notebooks",
        [(A100, GPU, 4, None), (H100, GPU, 4, 2)],
        used={(A100, GPU): 3},
        reserved={(A100, GPU): 4},
        pending=1,
    )
    pending = {"notebooks": [kueueobjects.workload("jupyterhub", "w", [(2, {GPU: 1}, {})])]}
    queues = queues_of(notebooks, pending=pending)
    report = report_of(users, pods, figures, catalog, now, queues=queues)
    assert report.problems == ()
    # cpu and memory (default-flavor) are not the GPU page's
    assert [(r.flavor, r.resource) for r in report.kueue] == [(A100, GPU), (H100, GPU)]
    a100, h100 = report.kueue
    assert a100 == KueueQueueRow(
        cluster_queue="notebooks",
        cohort="gpus",
        flavor=A100,
        gpu_type="a100",
        gpu_type_name="NVIDIA A100",
        resource=GPU,
        nominal=4,
        borrowing_limit=None,
        in_use=3,
        reserved=4,
        pending_workloads=1,
        pending_gpus=2,
    )
    assert (h100.gpu_type, h100.borrowing_limit, h100.in_use, h100.pending_gpus) == (
        "h100",
        2,
        0,
        0,
    )


def test_a_mig_flavor_is_the_catalogs_mig_type_not_the_full_gpu(users, now):
    """A100 nodes give full GPUs and MIG slices alike: the resource tells the types apart."""
    catalog = parse_catalog(
        {
            "images": {"x": {"display_name": "X", "image": "example/x:1", "default": True}},
            "gpu_types": {
                "a100": {
                    "display_name": "NVIDIA A100",
                    "node_selector": {PRODUCT: "NVIDIA-A100-SXM4-80GB"},
                },
                "a100-1g": {
                    "display_name": "A100 MIG 1g.10gb",
                    "resource": MIG,
                    "node_selector": {PRODUCT: "NVIDIA-A100-SXM4-80GB"},
                },
            },
        }
    )
    queue = kueueobjects.cluster_queue("notebooks", [(A100, GPU, 4, None), (A100, MIG, 14, None)])
    report = build_report(
        users=[], pods=[], figures={}, catalog=catalog, now=now, queues=queues_of(queue)
    )
    assert [(r.resource, r.gpu_type) for r in report.kueue] == [(GPU, "a100"), (MIG, "a100-1g")]
    # no catalog: no GPU type, the rows still
    bare = build_report(
        users=[], pods=[], figures={}, catalog=None, now=now, queues=queues_of(queue)
    )
    assert [(r.resource, r.gpu_type) for r in bare.kueue] == [(GPU, ""), (MIG, "")]


def test_a_flavor_of_no_catalog_type(users, pods, figures, catalog, now):
    queue = kueueobjects.cluster_queue("notebooks", [("l4", GPU, 2, None)])
    l4 = kueueobjects.flavor("l4", {PRODUCT: "NVIDIA-L4"})
    report = report_of(users, pods, figures, catalog, now, queues=queues_of(queue, flavors=[l4]))
    (row,) = report.kueue
    assert (row.flavor, row.gpu_type, row.gpu_type_name) == ("l4", "", "")
    head, rows = kueue_table(report)
    assert rows[0][head.index("GPU type")] == "-"


def test_a_queue_without_gpus_or_not_a_queue_is_a_note(users, pods, figures, catalog, now):
    cpu_only = kueueobjects.cluster_queue("cpu-only", [])
    nameless = {"kind": "Status", "metadata": {}}
    queues = KueueData(
        names=("cpu-only", "odd"), cluster_queues={"cpu-only": cpu_only, "odd": nameless}
    )
    report = report_of(users, pods, figures, catalog, now, queues=queues)
    assert report.kueue == ()
    assert report.problems == (
        "The ClusterQueue 'cpu-only' has no GPU resource in its quota.",
        "The ClusterQueue 'odd' is not shown: what Kueue answered is not a ClusterQueue.",
    )
    text = format_text(report)
    assert "Cluster queues (Kueue)" in text
    assert "No GPU quota of the named ClusterQueues was read (see the notes)." in text


def test_pending_gpus_go_to_the_flavor_kueue_tries_first():
    """A pod set's node selector rules out flavors whose labels it contradicts; without one,
    the first flavor of the queue's order takes it; an admitted Workload is not pending."""
    queue = kueue.cluster_queue_status(
        kueueobjects.cluster_queue("notebooks", [(A100, GPU, 4, None), (H100, GPU, 4, None)])
    )
    labels = kueue.flavor_node_labels(kueueobjects.flavors())
    on_h100 = {PRODUCT: "NVIDIA-H100-80GB-HBM3"}
    workloads = [
        kueueobjects.workload("a", "two-sets", [(2, {GPU: 4}, on_h100), (3, {GPU: 1}, {})]),
        kueueobjects.workload("a", "cpu", [(5, {"cpu": 2}, {})]),
        kueueobjects.workload("a", "admitted", [(1, {GPU: 8}, {})], admitted=True),
        kueueobjects.workload("a", "elsewhere", [(1, {GPU: 1}, {PRODUCT: "NVIDIA-L4"})]),
    ]
    assert pending_amounts(workloads, queue, labels) == {(H100, GPU): 8, (A100, GPU): 3}
    assert pending_amounts(None, queue, labels) is None
    assert pending_amounts([], queue, labels) == {}


def test_kueue_rows_round_trip_through_json(users, pods, figures, catalog, now):
    queue = kueueobjects.cluster_queue("notebooks", [(A100, GPU, 4, None), (H100, GPU, 4, 2)])
    queues = queues_of(queue, pending={"notebooks": []}, partial=("notebooks",))
    report = report_of(users, pods, figures, catalog, now, queues=queues)
    data = json.loads(json.dumps(report.as_dict(), allow_nan=False))
    assert data["kueue_cluster_queues"] == ["notebooks"]
    assert data["kueue"][1]["borrowing_limit"] == 2 and data["kueue"][0]["borrowing_limit"] is None
    assert report_from_dict(data) == report
    # a service from before the table sends neither key
    del data["kueue"], data["kueue_cluster_queues"]
    older = report_from_dict(data)
    assert older.kueue == () and "Cluster queues" not in format_text(older)


def test_kueue_text_table_beside_the_pool(users, pods, figures, catalog, now):
    notebooks = kueueobjects.cluster_queue(
        "notebooks", [(A100, GPU, 4, None), (H100, GPU, 4, 2)], used={(A100, GPU): 3}, pending=2
    )
    batch = kueueobjects.cluster_queue("batch", [(A100, GPU, 4, None)], cohort="")
    pending = {"notebooks": [kueueobjects.workload("j", "w", [(1, {GPU: 2}, {})])]}
    queues = queues_of(notebooks, batch, pending=pending, partial=("notebooks",))
    text = format_text(report_of(users, pods, figures, catalog, now, queues=queues))
    lines = text.splitlines()
    # after the pool's table, before the servers
    assert lines.index("Cluster queues (Kueue)") < lines.index("Servers")
    assert lines.index("GPU pool") < lines.index("Cluster queues (Kueue)")
    header = next(line for line in lines if line.startswith("cluster queue"))
    a100 = next(line for line in lines if line.startswith("notebooks") and A100 in line)
    h100 = next(line for line in lines if line.startswith("notebooks") and H100 in line)
    assert a100.split() == [
        "notebooks", "gpus", A100, "NVIDIA", "A100", "(a100)", GPU,
        "4", "none", "3", "3", "2", "at", "least", "2",
    ]  # fmt: skip
    assert header.index("borrowing limit") == h100.index("2  ")  # columns line up
    assert "at least 0" in h100
    batch_line = next(line for line in lines if line.startswith("batch "))
    # no cohort; its pending workloads not read
    assert batch_line.split()[1] == "-" and batch_line.split()[-1] == "unknown"


@pytest.mark.parametrize(("name", "value"), PAYLOADS, ids=[n for n, _ in PAYLOADS])
def test_kueue_names_reach_the_terminal_escaped(now, name, value):
    """ClusterQueue, cohort and flavor names come from the cluster."""
    queue = kueueobjects.cluster_queue(value, [(value, GPU, 1, None)], cohort=value)
    report = build_report(
        users=[], pods=[], figures={}, catalog=None, now=now, queues=queues_of(queue)
    )
    text = format_text(report)
    for bad in ("\x1b", "\r", "\x00", "\u202e"):
        assert bad not in text
