"""The admin page's HTML from a report built of recorded data."""

from __future__ import annotations

import re
from html import unescape
from html.parser import HTMLParser

from gpuspawner.admin.page import render_page
from gpuspawner.admin.report import KueueData, build_report

from . import kueueobjects
from .kueueobjects import A100, GPU, H100


class Forms(HTMLParser):
    """The stop forms: (action, hidden fields) each."""

    def __init__(self):
        super().__init__()
        self.forms = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "form":
            self.forms.append((attrs.get("action"), {}))
        elif tag == "input" and attrs.get("type") == "hidden" and self.forms:
            self.forms[-1][1][attrs["name"]] = attrs["value"]


def page(users, pods, figures, catalog, now, **kwargs):
    report = build_report(users=users, pods=pods, figures=figures, catalog=catalog, now=now)
    return render_page(
        report,
        admin="admin",
        stop_url="/services/gpuspawner-admin/stop",
        xsrf_token="tok&en",
        **kwargs,
    )


def test_one_stop_form_per_server(users, pods, figures, catalog, now):
    html = page(users, pods, figures, catalog, now)
    parser = Forms()
    parser.feed(html)
    servers = {(f["user"], f["server"]) for _, f in parser.forms}
    assert servers == {("ann", ""), ("student", ""), ("student", "notes"), ("hog", "big")}
    for action, fields in parser.forms:
        assert action == "/services/gpuspawner-admin/stop"
        assert fields["_xsrf"] == "tok&en"  # unescaped by the parser: it was escaped in the HTML
    assert 'value="tok&amp;en"' in html


def test_tables_and_refresh(users, pods, figures, catalog, now):
    html = page(
        users, pods, figures, catalog, now, refresh_seconds=15, notice="Stopped ann/default."
    )
    assert '<meta http-equiv="refresh" content="15">' in html
    assert '<p class="notice" role="status">Stopped ann/default.</p>' in html
    a100 = re.search(r"<tr><td>NVIDIA A100 \(a100\)</td>(.*?)</tr>", html).group(1)
    assert re.findall(r">(\d+)<", a100)[:4] == ["8", "3", "5", "0"]
    row = unescape(re.search(r'<tr data-server="student/">(.*?)</tr>', html, re.S).group(1))
    assert "group rule 'students'" in row and "1 of 1" in row and "h100: 0" in row
    assert "gpu-a100-1" in row


def test_names_are_escaped(users, pods, figures, catalog, now):
    users[0]["name"] = "<script>x</script>"
    html = page(users, pods, figures, catalog, now)
    assert "<script>x</script>" not in html and "&lt;script&gt;x&lt;/script&gt;" in html


def test_empty_pool(now):
    report = build_report(users=[], pods=[], figures={}, catalog=None, now=now)
    html = render_page(report, admin="root", stop_url="/stop", xsrf_token="t")
    assert "No GPU types known." in html and "No servers." in html


def test_the_cluster_queue_table_beside_the_pool(users, pods, figures, catalog, now):
    queue = kueueobjects.cluster_queue(
        "notebooks", [(A100, GPU, 4, None), (H100, GPU, 4, 2)], used={(A100, GPU): 3}, pending=1
    )
    queues = KueueData(
        names=("notebooks",),
        cluster_queues={"notebooks": queue},
        flavors=tuple(kueueobjects.flavors()),
        pending={"notebooks": [kueueobjects.workload("j", "w", [(1, {GPU: 2}, {})])]},
    )
    report = build_report(
        users=users, pods=pods, figures=figures, catalog=catalog, now=now, queues=queues
    )
    html = render_page(report, admin="admin", stop_url="/stop", xsrf_token="t")
    # after the pool's figures, before the servers
    assert (
        html.index('id="gpu-types"') < html.index('id="kueue-queues"') < html.index('id="servers"')
    )
    table = re.search(r'<table id="kueue-queues">(.*?)</table>', html, re.S).group(1)
    head = re.findall(r"<th>(.*?)</th>", table)
    assert head[:5] == ["cluster queue", "cohort", "flavor", "GPU type", "resource"]
    rows = re.findall(r"<tr>(.*?)</tr>", table.split("</thead>")[1])
    cells = [re.findall(r"<td[^>]*>(.*?)</td>", row) for row in rows]
    assert cells == [
        ["notebooks", "gpus", A100, "NVIDIA A100 (a100)", GPU, "4", "none", "3", "3", "1", "2"],
        ["notebooks", "gpus", H100, "NVIDIA H100 (h100)", GPU, "4", "2", "0", "0", "1", "0"],
    ]
    # the figures right-aligned, the names not
    assert re.findall(r"<td( class=\"num\")?>", rows[0]) == [""] * 5 + [' class="num"'] * 6


def test_no_cluster_queue_table_without_the_setting(users, pods, figures, catalog, now):
    html = page(users, pods, figures, catalog, now)
    assert "kueue-queues" not in html and "Cluster queues" not in html
    # named, but none read: the table says so and the note above says why
    report = build_report(
        users=[],
        pods=[],
        figures={},
        catalog=None,
        now=now,
        problems=[
            "The ClusterQueue 'nope' does not exist (GPUAdmin.kueue_cluster_queues names it)."
        ],
        queues=KueueData(names=("nope",)),
    )
    html = render_page(report, admin="root", stop_url="/stop", xsrf_token="t")
    assert "<h2>Cluster queues (Kueue)</h2>" in html
    assert "No GPU quota of the named ClusterQueues was read." in html
    assert "The ClusterQueue &#39;nope&#39; does not exist" in html
