"""The service: its stop marks the pod "stopped by an admin" only for a stop the hub made,
tells the admin the outcome once, and its page survives every source failing."""

from __future__ import annotations

import csv
import io
import json
import re
import time
from datetime import datetime, timezone
from html import escape, unescape
from urllib.parse import urlencode

import pytest

from gpuspawner.admin.collect import KubeReader
from gpuspawner.admin.service import NOTICE_COOKIE, GPUAdmin
from gpuspawner.admin.usage import format_time, parse_query
from gpuspawner.clients.kube import KubeClient, KubeError
from gpuspawner.core import labels, stopreasons
from gpuspawner.core.usage import Interval, summarize

from ..kubeapi import StandInApi
from ..security.payloads import PAYLOADS, assert_escaped
from .hubapi import USER_TOKEN
from .promapi import BAD_ANSWERS, StandInPrometheus, closed_port_url

PREFIX = "/services/gpuspawner-admin/"


@pytest.fixture
async def kubeapi(tmp_path, monkeypatch, pods):
    server = await StandInApi(pods=pods).start()
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(server.kubeconfig(tmp_path)))
    yield server
    await server.stop()


def annotations(server, name):
    pod = next(p for p in server.objects["pods"] if p["metadata"]["name"] == name)
    return pod["metadata"].get("annotations") or {}


async def test_the_stopped_servers_pod_and_only_it_is_marked(kubeapi):
    admin = GPUAdmin()
    admin.kube = KubeReader(KubeClient("jupyterhub"))
    try:
        await admin.annotate_stop("student", "notes")
    finally:
        await admin.kube.close()
    notice = stopreasons.StopNotice.from_state(
        annotations(kubeapi, "jupyter-student--notes")[labels.ANNOTATION_STOP_REASON]
    )
    assert notice.reason == stopreasons.REASON_ADMIN
    assert notice.sentence().endswith("because an admin stopped it from the GPU page.")
    assert labels.ANNOTATION_STOP_REASON not in annotations(kubeapi, "jupyter-student")
    patches = [r for r in kubeapi.requests if r[0] == "PATCH"]
    assert [r[1] for r in patches] == ["/api/v1/namespaces/jupyterhub/pods/jupyter-student--notes"]


async def test_a_refused_annotation_is_logged_and_the_stop_goes_on(kubeapi, capfd):
    admin = GPUAdmin()
    admin.kube = KubeReader(KubeClient("jupyterhub"))
    kubeapi.always = 403
    try:
        await admin.annotate_stop("ann", "")  # returns: the caller stops the server next
    finally:
        await admin.kube.close()
    assert "Could not mark 'ann/default' as stopped by an admin" in capfd.readouterr().err


# ---------------------------------------------------------------------------
# stopping through the service
# ---------------------------------------------------------------------------


async def post_stop(service, user, server):
    """POST the stop form as the page does."""
    response = await service.fetch("stop", "POST", body=urlencode({"user": user, "server": server}))
    assert response.code == 302, response.body
    return response


def notice_cookie(response):
    """The stop's outcome, to show the next page with: a cookie, and a plain redirect."""
    assert response.headers["Location"] == PREFIX
    cookies = [c for c in response.headers.get_list("Set-Cookie") if c.startswith(NOTICE_COOKIE)]
    assert len(cookies) == 1, response.headers
    return cookies[0].split(";", 1)[0]


async def stop(service, user, server):
    return notice_cookie(await post_stop(service, user, server))


def notices(html):
    return [unescape(n) for n in re.findall(r'<p class="notice" role="status">(.*?)</p>', html)]


def problems(html):
    return [unescape(p) for p in re.findall(r'<p class="problem">(.*?)</p>', html, re.S)]


@pytest.mark.parametrize(("status", "said"), [(202, "Stopping"), (204, "Stopped")])
async def test_a_stop_the_hub_made_keeps_the_reason_on_the_pod(
    start_service, users, pods, status, said
):
    service = await start_service(users, pods)
    service.hub.stop_status = status
    response = await post_stop(service, "student", "notes")
    assert ("DELETE", "/hub/api/users/student/servers/notes") in service.hub.requests
    reason = annotations(service.kube, "jupyter-student--notes")[labels.ANNOTATION_STOP_REASON]
    assert stopreasons.StopNotice.from_state(reason).reason == stopreasons.REASON_ADMIN
    page = await service.fetch(headers={"Cookie": notice_cookie(response)})
    assert notices(page.body.decode()) == [f"{said} student/notes."]


@pytest.mark.parametrize(
    ("status", "said"),
    [
        (403, "student/notes could not be stopped: The hub refused DELETE "),
        (500, "student/notes could not be stopped: The hub API did not answer DELETE "),
        (400, "student/notes was not running."),
    ],
)
async def test_a_stop_the_hub_did_not_make_takes_the_reason_off_again(
    start_service, users, pods, status, said
):
    """Left on, the user who stops the server later would read that an admin stopped it."""
    service = await start_service(users, pods)
    service.hub.stop_status = status
    response = await post_stop(service, "student", "notes")
    assert labels.ANNOTATION_STOP_REASON not in annotations(service.kube, "jupyter-student--notes")
    patches = [r[3] for r in service.kube.requests if r[0] == "PATCH"]
    key = labels.ANNOTATION_STOP_REASON
    assert [p["metadata"]["annotations"][key] is None for p in patches] == [False, True]
    page = await service.fetch(headers={"Cookie": notice_cookie(response)})
    (notice,) = notices(page.body.decode())
    assert notice.startswith(said)
    assert "\n" not in notice and "Traceback" not in notice


async def test_a_mark_that_cannot_be_taken_off_is_logged(
    start_service, users, pods, monkeypatch, capfd
):
    service = await start_service(users, pods)
    service.hub.stop_status = 403
    client = service.admin.kube.client
    annotate = client.annotate_pod

    async def refuse_removal(name, namespace, values):
        if None in values.values():
            raise KubeError("Annotating pod failed with HTTP 403: forbidden", 403)
        await annotate(name, namespace, values)

    monkeypatch.setattr(client, "annotate_pod", refuse_removal)
    await post_stop(service, "student", "notes")
    err = capfd.readouterr().err
    assert "Could not take the admin's stop mark off pod jupyterhub/jupyter-student--notes" in err
    assert "'student/notes'" in err


async def test_the_outcome_is_shown_once_and_never_taken_from_the_url(start_service, users, pods):
    """A link to the page cannot put words on it: the notice comes only from a stop, signed."""
    service = await start_service(users, pods)
    forged = "Your session expired: sign in again at https://evil.example."
    page = await service.fetch("?" + urlencode({"notice": forged}))
    assert page.code == 200
    assert notices(page.body.decode()) == [] and "evil.example" not in page.body.decode()
    tampered = await service.fetch(headers={"Cookie": f"{NOTICE_COOKIE}={forged}"})
    assert notices(tampered.body.decode()) == []

    cookie = await stop(service, "ann", "")
    first = await service.fetch(headers={"Cookie": cookie})
    assert notices(first.body.decode()) == ["Stopping ann/default."]
    # the page view clears it: a reload shows no notice
    cleared = [c for c in first.headers.get_list("Set-Cookie") if c.startswith(NOTICE_COOKIE)]
    assert cleared and "expires=" in cleared[0].lower()


async def test_the_audit_log_quotes_the_names(start_service, users, pods, capfd):
    users[0]["name"] = "ann\nINFO | Admin admin asked to stop nobody"
    service = await start_service(users, pods)
    await post_stop(service, users[0]["name"], "")
    err = capfd.readouterr().err
    assert (
        "Admin 'admin' asked to stop 'ann\\nINFO | Admin admin asked to stop nobody/default'" in err
    )
    assert not any(line.startswith("INFO | Admin admin") for line in err.splitlines())


async def test_a_user_without_the_scope_gets_403(start_service, users, pods):
    service = await start_service(users, pods)
    assert (await service.fetch(token=USER_TOKEN)).code == 403
    refused = await service.fetch("stop", "POST", token=USER_TOKEN, body="user=ann&server=")
    assert refused.code == 403
    assert not [r for r in service.hub.requests if r[0] == "DELETE"]


async def test_the_page_and_the_api_tell_browsers_not_to_guess_or_frame(start_service, users, pods):
    service = await start_service(users, pods)
    page = await service.fetch()
    assert page.code == 200 and page.headers["Content-Type"].startswith("text/html")
    policy = page.headers["Content-Security-Policy"]
    assert "default-src 'none'" in policy and "frame-ancestors 'none'" in policy
    api = await service.fetch("api/status")
    assert api.headers["Content-Type"] == "application/json"
    assert api.headers["X-Content-Type-Options"] == "nosniff"
    assert json.loads(api.body)["users"]


# ---------------------------------------------------------------------------
# each source failing: the page still answers, with one sentence
# ---------------------------------------------------------------------------


async def page_problems(service):
    page = await service.fetch()
    assert page.code == 200, page.body[:500]
    html = page.body.decode()
    found = problems(html)
    for sentence in found:
        assert "\n" not in sentence and "Traceback" not in sentence, sentence
    return html, found


@pytest.mark.parametrize("answer", sorted(BAD_ANSWERS))
async def test_prometheus_answering_garbage_leaves_the_page_without_utilisation(
    start_service, users, pods, answer
):
    prometheus = await StandInPrometheus(BAD_ANSWERS[answer]).start()
    try:
        service = await start_service(users, pods, argv=(f"--prometheus-url={prometheus.url}",))
        html, found = await page_problems(service)
    finally:
        await prometheus.stop()
    assert prometheus.queries >= 1
    (sentence,) = found
    assert sentence.startswith("GPU utilisation is not shown: Prometheus"), sentence
    assert sentence.endswith(".")
    # the rest of the page is there; utilisation is "unknown", not "not configured"
    row = unescape(re.search(r'<tr data-server="ann/">(.*?)</tr>', html, re.S).group(1))
    assert "NVIDIA A100" in row and "unknown" in row and "not configured" not in row


async def test_prometheus_down_or_silent_is_one_sentence(start_service, users, pods):
    down = closed_port_url()
    service = await start_service(users, pods, argv=(f"--prometheus-url={down}",))
    _, found = await page_problems(service)
    assert found == [f"GPU utilisation is not shown: {found[0].split(': ', 1)[1]}"]
    assert found[0].startswith(f"GPU utilisation is not shown: Prometheus at {down} could not be")

    silent = await StandInPrometheus((200, "{}")).start()
    silent.hang = True
    try:
        service = await start_service(
            users,
            pods,
            argv=(f"--prometheus-url={silent.url}", "--GPUAdmin.prometheus_timeout=0.5"),
        )
        _, found = await page_problems(service)
    finally:
        await silent.stop()
    assert found == [
        f"GPU utilisation is not shown: Prometheus at {silent.url} did not answer within 0.5 s."
    ]


@pytest.mark.parametrize(
    ("fault", "said"),
    [
        (500, "The hub's users could not be listed: The hub API did not answer GET /users?"),
        ("hang", "The hub's users could not be listed: The hub API did not answer GET /users?"),
        # the client may say why, or the collector that it is not a user list
        ((200, "<html>proxy error</html>"), "The hub's users could not be listed: "),
    ],
    ids=["500", "timeout", "garbage"],
)
async def test_a_failing_hub_is_one_sentence_and_the_pool_is_still_shown(
    start_service, users, pods, fault, said
):
    service = await start_service(users, pods)
    service.hub.always = fault
    html, found = await page_problems(service)
    assert len(found) == 1 and found[0].startswith(said) and found[0].endswith("."), found
    # the cluster's side is still there: the figures, and the pods (the hub's servers unknown)
    assert "NVIDIA A100 (a100)" in html
    assert 'data-server="ann/"' in html and "pod only" in html


@pytest.mark.parametrize("status", [403, 429, 500])
async def test_a_failing_api_server_is_one_sentence_and_the_users_are_still_shown(
    start_service, users, pods, status
):
    service = await start_service(users, pods)
    service.kube.always = status
    html, found = await page_problems(service)
    assert len(found) == 1, found
    assert found[0].startswith("The cluster could not be read: Listing nodes failed with HTTP ")
    assert f"HTTP {status}" in found[0]
    assert 'data-server="student/notes"' in html


async def test_the_named_cluster_queues_are_read_through_the_services_kubernetes_client(
    start_service, users, pods
):
    """GPUAdmin.kueue_cluster_queues: the page gets the table, read with the same
    connection as the pods; this API server serves no Kueue, so each queue is one
    sentence and the rest of the page stands."""
    service = await start_service(
        users,
        pods,
        argv=(
            "--GPUAdmin.kueue_cluster_queues=notebooks",
            "--GPUAdmin.kueue_cluster_queues=batch",
        ),
    )
    reader = service.admin.collector.kueue
    assert reader.names == ("notebooks", "batch")
    html, found = await page_problems(service)
    assert found == [
        "The ClusterQueue 'notebooks' does not exist (GPUAdmin.kueue_cluster_queues names it).",
        "The ClusterQueue 'batch' does not exist (GPUAdmin.kueue_cluster_queues names it).",
    ]
    assert "<h2>Cluster queues (Kueue)</h2>" in html and "NVIDIA A100 (a100)" in html
    # (the stand-in answers 404 to every Kueue path: "does not exist" is its answer, and
    # the queues were asked through its kubeconfig, as the pods were)
    status = json.loads((await service.fetch("api/status")).body)
    assert status["kueue_cluster_queues"] == ["notebooks", "batch"] and status["kueue"] == []


async def test_without_the_setting_the_service_reads_no_kueue(start_service, users, pods):
    service = await start_service(users, pods)
    assert service.admin.collector.kueue is None
    html, _ = await page_problems(service)
    assert "Cluster queues" not in html


# ---------------------------------------------------------------------------
# GPU usage: the table, its downloads and the idle holders, from a real SQLite store
# ---------------------------------------------------------------------------

HOUR = 3600


def usage_intervals(now: float) -> list[Interval]:
    """The recorded users' servers in the last hours (hog's still runs), and one long ago."""
    return [
        Interval(
            "uid-ann",
            "ann",
            "",
            "ml",
            "a100",
            "pytorch",
            2,
            2.0,
            now - 10 * HOUR,
            now - 8 * HOUR,
            "pod",
        ),
        Interval(
            "uid-student",
            "student",
            "",
            "students",
            "h100",
            "pytorch",
            1,
            1.0,
            now - 5 * HOUR,
            now - 4 * HOUR,
            "event",
        ),
        Interval("uid-hog", "hog", "big", "", "h100", "pytorch", 4, 4.0, now - 3 * HOUR, None),
        Interval(
            "uid-old",
            "ann",
            "",
            "ml",
            "a100",
            "pytorch",
            1,
            1.0,
            now - 90 * 86400,
            now - 89 * 86400,
            "pod",
        ),
    ]


def since_arg(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y-%m-%dT%H:%M")


def table_rows(html: str, table: str) -> list[list[str]]:
    body = re.search(rf'<table id="{table}">(.*?)</table>', html, re.S).group(1)
    return [
        [unescape(c) for c in re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", row, re.S)]
        for row in re.findall(r"<tr>(.*?)</tr>", body, re.S)
    ]


@pytest.fixture
async def usage_service(start_service, users, pods, usage_db):
    now = time.time()
    url = usage_db(usage_intervals(now))
    service = await start_service(users, pods, argv=(f"--GPUAdmin.accounting_db_url={url}",))
    return service, now


async def test_the_usage_table_for_dates_of_the_admins_choosing(usage_service):
    service, now = usage_service
    query = urlencode({"period": "custom", "since": since_arg(now - 12 * HOUR), "by": "user"})
    page = await service.fetch(f"?{query}")
    assert page.code == 200
    html = page.body.decode()
    rows = table_rows(html, "usage-table")
    assert rows[0] == ["user", "GPU-hours", "weighted GPU-hours", "servers"]
    assert rows[1:] == [
        ["hog", "12.0", "12.0", "1"],  # open: until now
        ["ann", "4.0", "4.0", "1"],  # the one long ago is outside the period
        ["student", "1.0", "1.0", "1"],
        ["total", "17.0", "17.0", "3"],
    ]
    # an admin choosing a period is not interrupted by a reload
    assert 'http-equiv="refresh"' not in html
    # the tabs ask for the same period by another key
    tabs = dict(re.findall(r'<a href="([^"]*)">by (\w[\w ]*)</a>', html))
    assert set(tabs.values()) == {"group", "GPU type", "image"}
    by_group = next(link for link, name in tabs.items() if name == "group")
    grouped = table_rows(
        (await service.fetch(unescape(by_group).split(PREFIX, 1)[1])).body.decode(), "usage-table"
    )
    assert grouped[1:] == [
        ["(no group)", "12.0", "12.0", "1"],
        ["ml", "4.0", "4.0", "1"],
        ["students", "1.0", "1.0", "1"],
        ["total", "17.0", "17.0", "3"],
    ]
    by_type = await service.fetch(
        "?" + urlencode({"since": since_arg(now - 12 * HOUR), "by": "gpu_type", "group": "ml"})
    )
    assert table_rows(by_type.body.decode(), "usage-table")[1:] == [
        ["NVIDIA A100 (a100)", "4.0", "4.0", "1"],
        ["total", "4.0", "4.0", "1"],
    ]


async def test_this_week_by_default_and_the_idle_holders(usage_service):
    service, now = usage_service
    page = await service.fetch()
    fetched = time.time()
    assert page.code == 200
    html = page.body.decode()
    week = parse_query({}, now)
    expected = summarize(usage_intervals(now), week.since, now, now, ("user",))
    shown = table_rows(html, "usage-table")[1:-1]
    assert [r[0] for r in shown] == [r.key[0] for r in expected]
    assert f"GPU usage this week ({format_time(week.since)} to " in unescape(html)
    # the live page reloads itself
    assert 'http-equiv="refresh"' in html
    # the recorded servers' last activity is days old: every GPU server on a node is idle
    holders = table_rows(html, "idle-holders")
    assert holders[0] == [
        "user",
        "server",
        "GPUs",
        "idle for",
        "GPU util",
        "GPU-hours this week",
        "weighted",
    ]
    names = [(r[0], r[1], r[2]) for r in holders[1:]]
    assert ("hog", "big", "4 × NVIDIA H100") in names and (
        "ann",
        "default",
        "2 × NVIDIA A100",
    ) in names
    hog = next(r for r in holders[1:] if r[0] == "hog")

    # hog's server still runs: the page counts it up to its own clock, some seconds after `now`
    # (the service's start-up), so the figure lies between the two readings of the clock
    def hog_hours_at(moment: float) -> float:
        rows = summarize(usage_intervals(now), week.since, moment, moment, ("user",))
        return next((r.gpu_seconds for r in rows if r.key == ("hog",)), 0) / 3600

    shown_hours = float(hog[5].replace(",", ""))
    assert round(hog_hours_at(now), 1) <= shown_hours <= round(hog_hours_at(fetched), 1)


async def test_the_page_shows_the_top_rows_and_the_csv_all(start_service, users, pods, usage_db):
    now = time.time()
    url = usage_db(usage_intervals(now))
    service = await start_service(
        users, pods, argv=(f"--GPUAdmin.accounting_db_url={url}", "--GPUAdmin.usage_page_rows=2")
    )
    args = urlencode({"since": since_arg(now - 12 * HOUR)})
    html = (await service.fetch(f"?{args}")).body.decode()
    assert [r[0] for r in table_rows(html, "usage-table")[1:]] == ["hog", "ann", "total"]
    assert table_rows(html, "usage-table")[-1] == ["total", "17.0", "17.0", "3"]
    assert unescape(re.search(r'<p id="usage-left-out">(.*?)</p>', html).group(1)) == (
        "The table shows the 2 rows with the most GPU-hours of 3; the total counts them all, "
        "and usage.csv has every row."
    )
    body = (await service.fetch(f"usage.csv?{args}")).body.decode()
    assert len(list(csv.reader(io.StringIO(body)))) == 4  # the header and every row


async def test_the_downloads_are_the_rows_shown_and_every_interval(usage_service):
    service, now = usage_service
    args = {"period": "custom", "since": since_arg(now - 12 * HOUR), "by": "group,user"}
    response = await service.fetch("usage.csv?" + urlencode(args))
    assert response.code == 200
    assert response.headers["Content-Type"] == "text/csv; charset=utf-8"
    disposition = response.headers["Content-Disposition"]
    assert re.fullmatch(r'attachment; filename="gpu-usage-[0-9-]+-by-group-user\.csv"', disposition)
    rows = list(csv.reader(io.StringIO(response.body.decode())))
    assert rows[0] == [
        "group",
        "user",
        "gpu_seconds",
        "gpu_hours",
        "unit_seconds",
        "unit_hours",
        "servers",
    ]
    assert [(r[0], r[1], r[-1]) for r in rows[1:]] == [
        ("", "hog", "1"),
        ("ml", "ann", "1"),
        ("students", "student", "1"),
    ]
    assert rows[2][2:6] == ["14400", "4", "14400", "4"]

    intervals = await service.fetch("intervals.csv?" + urlencode(args))
    assert intervals.code == 200
    assert re.fullmatch(
        r'attachment; filename="gpu-intervals-[0-9-]+\.csv"',
        intervals.headers["Content-Disposition"],
    )
    lines = list(csv.DictReader(io.StringIO(intervals.body.decode())))
    assert [line["uid"] for line in lines] == ["uid-ann", "uid-student", "uid-hog"]
    ann = lines[0]
    assert (ann["start"], ann["end"], ann["gpu_seconds"]) == (
        datetime.fromtimestamp(now - 10 * HOUR, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        datetime.fromtimestamp(now - 8 * HOUR, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "14400",
    )
    assert lines[2]["end"] == ""  # still running
    only_ml = await service.fetch("intervals.csv?" + urlencode({**args, "group": "ml"}))
    assert [line["uid"] for line in csv.DictReader(io.StringIO(only_ml.body.decode()))] == [
        "uid-ann"
    ]


@pytest.mark.parametrize(
    ("args", "sentence"),
    [
        (
            {"since": "last tuesday"},
            "The start 'last tuesday' is not a date: write it as YYYY-MM-DD",
        ),
        (
            {"since": "2026-11-10", "until": "2026-11-01"},
            "The end 2026-11-02 00:00 UTC is not after the start",
        ),
        ({"by": "password"}, "Usage can be added up by user, group, gpu_type or image"),
    ],
)
async def test_a_bad_query_is_one_sentence_and_the_rest_of_the_page_is_shown(
    usage_service, args, sentence
):
    service, _ = usage_service
    page = await service.fetch("?" + urlencode(args))
    assert page.code == 400
    html = page.body.decode()
    (problem,) = [
        unescape(p)
        for p in re.findall(r'<p class="problem" id="usage-problem">(.*?)</p>', html, re.S)
    ]
    assert problem.startswith(sentence) and "Traceback" not in problem
    assert (
        'id="usage-table"' not in html
        and 'data-server="ann/"' in html
        and 'id="idle-holders"' in html
    )
    # the form shows back what was typed
    if "since" in args:
        assert f'name="since" value="{escape(args["since"])}"' in html
    download = await service.fetch("usage.csv?" + urlencode(args))
    assert download.code == 400 and download.headers["Content-Type"] == "text/plain; charset=utf-8"
    assert download.body.decode().startswith(sentence) and "Traceback" not in download.body.decode()


async def test_hostile_names_in_the_store_are_text_on_the_page_and_in_the_csv(
    start_service, users, pods, usage_db, names_in_store
):
    now = time.time()
    formula = '=HYPERLINK("http://evil.example","x")'
    names = [value for _, value in PAYLOADS] + [formula, "+1", "-1", "@SUM(A1)"]
    url = usage_db(
        [
            Interval(
                f"uid-{i}", name, name, name, name, name, 1, 1.0, now - HOUR - i, now - 60, "pod"
            )
            for i, name in enumerate(names)
        ]
    )
    # the names as the store keeps them (it makes NUL U+FFFD and cuts at 255 characters)
    stored = names_in_store(url, now - 2 * HOUR, now)
    assert len(stored) == len(names) and PAYLOADS[0][1] in stored and formula in stored
    service = await start_service(users, pods, argv=(f"--GPUAdmin.accounting_db_url={url}",))
    since = since_arg(now - 2 * HOUR)
    for by in ("user", "group", "gpu_type", "image"):
        html = (await service.fetch("?" + urlencode({"since": since, "by": by}))).body.decode()
        for value in stored:
            assert_escaped(html, value)
    body = (
        await service.fetch("usage.csv?" + urlencode({"since": since, "by": "user,group"}))
    ).body.decode()
    cells = {row[0] for row in csv.reader(io.StringIO(body, newline=""))}
    for name in stored:
        assert ("'" + name if name[0] in "=+-@" else name) in cells
    assert formula not in cells and "'" + formula in cells
    intervals = (await service.fetch("intervals.csv?" + urlencode({"since": since}))).body.decode()
    users_column = {row["user"] for row in csv.DictReader(io.StringIO(intervals, newline=""))}
    assert "'" + formula in users_column and formula not in users_column


async def test_the_usage_needs_the_admin_scope_and_a_database(
    start_service, users, pods, usage_db, tmp_path
):
    url = usage_db([])
    service = await start_service(users, pods, argv=(f"--GPUAdmin.accounting_db_url={url}",))
    for path in (
        "usage.csv?since=2026-01-01",
        "intervals.csv?since=2026-01-01",
        "?since=2026-01-01",
    ):
        assert (await service.fetch(path, token=USER_TOKEN)).code == 403
        assert (await service.fetch(path, token=None)).code in (302, 403)
    empty = await service.fetch("?since=2026-01-01")
    assert table_rows(empty.body.decode(), "usage-table")[1:] == [["No GPU usage in this period."]]

    # no database configured: the page says so in a word, the downloads are not there
    none = await start_service(users, pods)
    page = await none.fetch()
    assert page.code == 200
    assert unescape(
        re.search(r'<p class="muted" id="usage-note">(.*?)</p>', page.body.decode()).group(1)
    ) == (
        "GPU usage is not shown: no usage database is configured "
        "($GPUSPAWNER_ACCOUNTING_DB_URL or --GPUAdmin.accounting_db_url)."
    )
    assert (await none.fetch("usage.csv")).code == 404

    # a database file that is not there: one sentence, and no empty file made
    gone = tmp_path / "gone.sqlite"
    missing = await start_service(
        users, pods, argv=(f"--GPUAdmin.accounting_db_url=sqlite:///{gone}",)
    )
    html = (await missing.fetch("?since=2026-01-01")).body.decode()
    assert f"There is no SQLite database at '{gone}'" in unescape(html)
    assert not gone.exists()
