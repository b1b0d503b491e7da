"""The GPU page with hostile names everywhere: shown as text, never run.

User, server and group names come from the hub; profile, GPU type, node and
image from pods anyone who can create a pod may label. Every payload of
tests/security/payloads.py is put in each of them; the page is read through
the real service, and opened in Debian's headless Chromium.
"""

from __future__ import annotations

from html import unescape
from urllib.parse import quote

import pytest

from gpuspawner.admin.page import environment, render_page
from gpuspawner.admin.report import build_report
from gpuspawner.core import labels

from ..chromium import LAUNCH, require_chromium
from ..security.payloads import PAYLOADS, assert_escaped
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
