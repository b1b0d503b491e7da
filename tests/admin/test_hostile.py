"""The GPU page with hostile names everywhere: shown as text, never run.

User, server and group names come from the hub; profile, GPU type, node and
image from pods anyone who can create a pod may label. Every payload of
tests/security/payloads.py is put in each of them; the page is read through
the real service, and opened in Debian's headless Chromium.
"""

from __future__ import annotations

import re
from html import unescape
from urllib.parse import quote

import pytest

from gpuspawner.admin.collect import KueueReader
from gpuspawner.admin.page import UsageSection, environment, render_page
from gpuspawner.admin.report import KueueData, build_report
from gpuspawner.admin.usage import IdleHolder, UsageQuery, usage_table
from gpuspawner.core import labels
from gpuspawner.core.refusals import shown
from gpuspawner.core.usage import UsageRow

from ..chromium import LAUNCH, require_chromium
from ..security.payloads import PAYLOADS, assert_escaped
from . import kueueobjects
from .hubapi import ADMIN_TOKEN

STARTED = "2026-11-30T00:29:58.830744Z"
ACTIVE = "2026-11-30T00:30:07.344493Z"


def hostile_users() -> list[dict]:
    """One hub user per payload, named with it, in a group named with it, with a server named with it."""
    return [
        {
            "name": value,
            "kind": "user",
            "admin": False,
            "groups": [value],
            "last_activity": ACTIVE,
            "servers": {
                value: {
                    "name": value,
                    "ready": True,
                    "pending": None,
                    "started": STARTED,
                    "last_activity": ACTIVE,
                    "user_options": {"profile": value, "gpu_type": value, "gpus": "1"},
                }
            },
        }
        for _, value in PAYLOADS
    ]


def hostile_pod(i: int, value: str, server: str, node: str | None) -> dict:
    pod = {
        "metadata": {
            "name": f"jupyter-hostile-{i}-{len(server)}",
            "namespace": "jupyterhub",
            "creationTimestamp": STARTED,
            "labels": {
                labels.LABEL_MANAGED: "true",
                labels.LABEL_PROFILE: value,
                labels.LABEL_GPU_TYPE: value,
                labels.LABEL_GPUS: "1",
            },
            "annotations": {
                labels.KUBESPAWNER_ANNOTATION_USER: value,
                labels.KUBESPAWNER_ANNOTATION_SERVER: server,
            },
        },
        "spec": {"containers": [{"name": "notebook", "image": value}]},
        "status": {"phase": "Running" if node else "Pending"},
    }
    if node:
        pod["spec"]["nodeName"] = node
    return pod


def hostile_pods() -> list[dict]:
    """Each user's server pod, on a node named with the payload; and a pod of a server the
    hub does not know (listed as "pod only"), waiting for a GPU type named with it."""
    pods = []
    for i, (_, value) in enumerate(PAYLOADS):
        pods.append(hostile_pod(i, value, value, node=value))
        pods.append(hostile_pod(i, value, f"{value}-orphan", node=None))
    return pods


def test_each_payload_in_each_field_of_the_rendered_page(now):
    report = build_report(
        users=hostile_users(),
        pods=hostile_pods(),
        figures={},
        catalog=None,
        now=now,
        problems=[f"The cluster could not be read: {value}" for _, value in PAYLOADS],
    )
    html = render_page(
        report,
        admin=PAYLOADS[0][1],
        stop_url="/services/gpuspawner-admin/stop",
        xsrf_token=PAYLOADS[1][1],
        notice=PAYLOADS[2][1],
    )
    for _, value in PAYLOADS:
        assert_escaped(html, value)
        assert_escaped(html, f"{value}-orphan")
    # the waiting figures name the GPU types the pods asked for
    assert unescape(html).count("pod only") == len(PAYLOADS)


@pytest.mark.parametrize(("name", "value"), PAYLOADS, ids=[n for n, _ in PAYLOADS])
def test_each_payload_in_each_field_of_the_usage_section(now, name, value):
    """The usage table's keys, the form's inputs as typed, the group filter, the sentence,
    the idle holders: all text; the group goes into the tabs' and downloads' URLs encoded."""
    report = build_report(users=[], pods=[], figures={}, catalog=None, now=now)
    query = UsageQuery(now - 86400, now, ("user", "group"), value, "custom", "")
    section = UsageSection(
        form={"period": value, "since": value, "until": value, "group": value, "by": value},
        query=query,
        table=usage_table([UsageRow((value, value), 3600.0, 1800.0, 1)], ("user", "group")),
        problem=f"The start {value} is not a date.",
        holders=(IdleHolder(value, value, value, 1, 3600.0, "no data", 0.0, 0.0),),
        groups=(value,),
    )
    html = render_page(
        report,
        admin="root",
        stop_url="/services/gpuspawner-admin/stop",
        xsrf_token="t",
        usage=section,
        page_url="/services/gpuspawner-admin/",
    )
    assert_escaped(html, value)
    for link in re.findall(r'href="([^"]*)"', html):
        assert unescape(link).startswith("/services/gpuspawner-admin/"), link


@pytest.mark.parametrize(("name", "value"), PAYLOADS, ids=[n for n, _ in PAYLOADS])
def test_each_payload_in_each_field_of_the_cluster_queue_table(now, name, value):
    """ClusterQueue, cohort, flavor and resource names, and a flavor's node labels, come from
    the cluster (anyone who may create them), and a ClusterQueue's name from the setting."""
    queue = kueueobjects.cluster_queue(
        value, [(value, "nvidia.com/gpu", 4, None), (value, value, 2, 1)], cohort=value
    )
    queues = KueueData(
        names=(value, f"{value}-missing"),
        cluster_queues={value: queue},
        flavors=(kueueobjects.flavor(value, {value: value}),),
        pending={value: [kueueobjects.workload(value, value, [(1, {"nvidia.com/gpu": 1}, {})])]},
    )
    report = build_report(
        users=[],
        pods=[],
        figures={},
        catalog=None,
        now=now,
        queues=queues,
        problems=[f"The ClusterQueue {shown(value + '-missing')} does not exist."],
    )
    assert {r.cluster_queue for r in report.kueue} == {value}
    html = render_page(report, admin="root", stop_url="/stop", xsrf_token="t")
    assert "kueue-queues" in html
    assert_escaped(html, value)


@pytest.mark.parametrize(("name", "value"), PAYLOADS, ids=[n for n, _ in PAYLOADS])
def test_the_template_environment_escapes_strings_too(name, value):
    """A template made from a string, or named other than .html, is escaped as well."""
    assert_escaped(environment().from_string("<p>{{ v }}</p>").render(v=value), value)


async def test_the_page_through_the_service(start_service):
    service = await start_service(hostile_users(), hostile_pods())
    page = await service.fetch()
    assert page.code == 200
    html = page.body.decode()
    for _, value in PAYLOADS:
        assert_escaped(html, value)
    assert "pod only" in html and '<p class="problem">' not in html


async def test_the_page_in_chromium_runs_nothing(start_service):
    from playwright.async_api import async_playwright

    require_chromium()
    service = await start_service(hostile_users(), hostile_pods())
    served = (await service.fetch()).body.decode()
    async with async_playwright() as p:
        browser = await p.chromium.launch(**LAUNCH)
        try:
            context = await browser.new_context(
                extra_http_headers={"Authorization": f"token {ADMIN_TOKEN}"}
            )
            page = await context.new_page()
            response = await page.goto(service.url)
            assert response is not None and response.status == 200
            text = await page.inner_text("#servers")
            for _, value in PAYLOADS:
                if value.isprintable():  # the browser shows NUL and CR/LF its own way
                    assert value in text
            assert await page.locator("img, script, iframe, a").count() == 0
            assert await page.evaluate("typeof window.__pwned") == "undefined"

            # a stop of a hostile server: the service posts it to the hub, quoted, and says so
            value = dict(PAYLOADS)["attribute-breakout"]
            await page.get_by_role("button", name=f"stop {value}/{value}", exact=True).click()
            await page.wait_for_load_state()
            notice = await page.inner_text("[role=status]")
            assert notice == f"Stopping {value}/{value}."
            assert await page.evaluate("typeof window.__pwned") == "undefined"
            deletes = [path for method, path in service.hub.requests if method == "DELETE"]
            assert deletes == [
                f"/hub/api/users/{quote(value, safe='')}/servers/{quote(value, safe='')}"
            ]

            # the same HTML without the service's Content-Security-Policy: the escaping alone holds
            blank = await context.new_page()
            await blank.set_content(served)
            assert await blank.locator("#servers").count() == 1
            assert await blank.evaluate("typeof window.__pwned") == "undefined"
        finally:
            await browser.close()


async def test_the_usage_table_in_chromium_and_its_csv_download(
    start_service, usage_db, names_in_store, tmp_path
):
    """An admin picks dates and a tab in the browser, sees hostile names as text, and
    downloads the CSV the browser names from the service's Content-Disposition."""
    import csv
    import io
    import time
    from datetime import datetime, timezone

    from playwright.async_api import async_playwright

    from gpuspawner.core.usage import Interval

    require_chromium()
    now = time.time()
    values = [value for _, value in PAYLOADS if value.isprintable()] + ["=1+1"]
    url = usage_db(
        [
            Interval(
                f"uid-{i}",
                v,
                v,
                f"group-{i}",
                "a100",
                "pytorch",
                2,
                2.0,
                now - 7200,
                now - 3600,
                "pod",
            )
            for i, v in enumerate(values)
        ]
    )
    # as the store keeps them: the 10 kB one cut at 255 characters
    values = sorted(names_in_store(url, now - 7200, now))
    service = await start_service(
        hostile_users(), hostile_pods(), argv=(f"--GPUAdmin.accounting_db_url={url}",)
    )
    since = datetime.fromtimestamp(now - 3 * 3600, timezone.utc).strftime("%Y-%m-%dT%H:%M")
    async with async_playwright() as p:
        browser = await p.chromium.launch(**LAUNCH)
        try:
            context = await browser.new_context(
                extra_http_headers={"Authorization": f"token {ADMIN_TOKEN}"}, accept_downloads=True
            )
            page = await context.new_page()
            response = await page.goto(service.url)
            assert response is not None and response.status == 200
            await page.select_option("select[name=period]", "custom")
            await page.fill("input[name=since]", since)
            await page.click("#usage-form button[type=submit]")
            await page.wait_for_load_state()
            table = await page.inner_text("#usage-table")
            for value in values:
                assert value in table
            assert "total" in table and str(2 * len(values)) + ".0" in table
            assert await page.evaluate("typeof window.__pwned") == "undefined"

            # the group tab keeps the dates
            await page.click("#usage-tabs >> text=by group")
            await page.wait_for_load_state()
            assert "group-0" in await page.inner_text("#usage-table")
            await page.click("#usage-tabs >> text=by user")
            await page.wait_for_load_state()

            async with page.expect_download() as info:
                await page.click("text=usage.csv")
            download = await info.value
            assert download.suggested_filename.startswith("gpu-usage-")
            assert download.suggested_filename.endswith("-by-user.csv")
            saved = tmp_path / download.suggested_filename
            await download.save_as(saved)
            rows = list(csv.DictReader(io.StringIO(saved.read_text(), newline="")))
            assert sorted(r["user"] for r in rows) == sorted(
                "'" + v if v[0] in "=+-@" else v for v in values
            )
            assert {r["gpu_hours"] for r in rows} == {"2"}
            assert await page.evaluate("typeof window.__pwned") == "undefined"
        finally:
            await browser.close()


async def test_the_cluster_queue_table_in_chromium_runs_nothing(start_service, users, pods):
    """Kueue objects named with each payload (anyone who may create a ClusterQueue or a
    ResourceFlavor names them), read by the service and shown in Chromium, with and
    without the page's Content-Security-Policy."""
    from playwright.async_api import async_playwright

    require_chromium()
    service = await start_service(users, pods)
    values = [value for _, value in PAYLOADS]
    queues = [
        kueueobjects.cluster_queue(v, [(f"{v}-flavor", "nvidia.com/gpu", 4, None)], cohort=v)
        for v in values
    ]
    flavors = [kueueobjects.flavor(f"{v}-flavor", {v: v}) for v in values]
    client = kueueobjects.StandInKueue(queues, flavors)
    service.admin.collector.kueue = KueueReader(values, client=client)
    served = (await service.fetch()).body.decode()
    for value in values:
        assert_escaped(served, value)
    async with async_playwright() as p:
        browser = await p.chromium.launch(**LAUNCH)
        try:
            context = await browser.new_context(
                extra_http_headers={"Authorization": f"token {ADMIN_TOKEN}"}
            )
            page = await context.new_page()
            response = await page.goto(service.url)
            assert response is not None and response.status == 200
            text = await page.inner_text("#kueue-queues")
            for value in values:
                if value.isprintable():  # the browser shows NUL and CR/LF its own way
                    assert value in text
            assert await page.locator("#kueue-queues img, #kueue-queues script").count() == 0
            assert await page.evaluate("typeof window.__pwned") == "undefined"
            blank = await context.new_page()
            await blank.set_content(served)
            assert await blank.locator("#kueue-queues").count() == 1
            assert await blank.evaluate("typeof window.__pwned") == "undefined"
        finally:
            await browser.close()
