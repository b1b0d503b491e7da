"""The admin page's HTML from a report built of recorded data."""

from __future__ import annotations

import re
from html import unescape
from html.parser import HTMLParser

from gpuspawner.admin.page import render_page
from gpuspawner.admin.report import build_report


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
