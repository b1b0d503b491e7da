"""The service: its stop marks the pod "stopped by an admin" only for a stop the hub made,
tells the admin the outcome once, and its page survives every source failing."""

from __future__ import annotations

import json
import re
from html import unescape
from urllib.parse import urlencode

import pytest

from gpuspawner.admin.collect import KubeReader
from gpuspawner.admin.service import NOTICE_COOKIE, GPUAdmin
from gpuspawner.clients.kube import KubeClient, KubeError
from gpuspawner.core import labels, stopreasons

from ..kubeapi import StandInApi
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
