"""The gpuspawner service under a real hub and proxy: OAuth, the access scope, the figures.

The service watches a stand-in Kubernetes API (tests/kubeapi.py) serving the
recorded sandbox nodes and pods, through $KUBECONFIG as the hub's own service
account would be found. The real API server is in tests/e2e.
"""

from __future__ import annotations

import asyncio
import http.cookiejar
import json
import re
import threading
import urllib.error
import urllib.parse
import urllib.request

import pytest

from gpuspawner_sandbox.testing import wait_for

from ..conftest import FIXTURES
from ..hub.hubprocess import free_port, start_hub
from ..kubeapi import StandInApi

NODES = FIXTURES / "nodes"
FIGURES = "/services/gpuspawner/availability"


def items(name):
    return json.loads((NODES / name).read_text())["items"]


@pytest.fixture(scope="module")
def kubeapi(tmp_path_factory):
    """The stand-in API server on its own event loop, for the hub's service to watch."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    server = StandInApi(pods=items("recorded-pods.json"), nodes=items("recorded-nodes.json"))
    asyncio.run_coroutine_threadsafe(server.start(), loop).result(30)
    try:
        yield server, server.kubeconfig(tmp_path_factory.mktemp("kube"))
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()


@pytest.fixture(scope="module")
def hub(tmp_path_factory, kubeapi):
    _, kubeconfig = kubeapi
    catalog = FIXTURES / "catalogs" / "e2e.yaml"  # 'licensed' is for the group 'licensed'
    hub = start_hub(
        tmp_path_factory.mktemp("hub"),
        extra_config=f"""
c.GPUSpawner.catalog_file = {str(catalog)!r}
c.JupyterHub.load_groups = {{"licensed": {{"users": ["lin"]}}}}
from gpuspawner.userservice.hubconfig import add_service
add_service(c, url="http://127.0.0.1:{free_port()}")
""",
        env={"KUBECONFIG": str(kubeconfig)},
    )
    if hub.process.poll() is not None:
        pytest.fail(f"JupyterHub exited during start:\n{hub.log()[-3000:]}")
    yield hub
    hub.stop()


def user_token(hub, name):
    assert hub.api("POST", f"/users/{name}").status in (201, 409)
    r = hub.api("POST", f"/users/{name}/tokens", {"note": "gpuspawner service test"})
    assert r.status in (200, 201), r.body
    return r.json()["token"]


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def get(hub, token=None, opener=None, headers=None):
    headers = dict(headers or {})
    if token:
        headers["Authorization"] = f"token {token}"
    request = urllib.request.Request(f"{hub.public_url}{FIGURES}", headers=headers)
    try:
        with (opener or urllib.request.build_opener()).open(request, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def figures(hub, token):
    def ready():
        status, body = get(hub, token)
        return json.loads(body) if status == 200 and json.loads(body)["available"] else None

    return wait_for("the service's first figures", ready, timeout=60)


def test_users_get_their_own_figures_with_a_token(hub):
    lin = figures(hub, user_token(hub, "lin"))
    otto = figures(hub, user_token(hub, "otto"))
    # the recorded cluster: 2 nodes of 4 A100 and 1 of 8 H100
    assert (lin["types"]["a100"]["allocatable"], lin["types"]["a100"]["nodes"]) == (8, 2)
    assert lin["types"]["h100"]["largest_node"] == 8
    # the group comes with the hub's identity of the user: only lin sees the licensed image
    assert sorted(lin["images"]) == ["licensed", "pytorch"]
    assert sorted(otto["images"]) == ["pytorch"]


def logged_in(hub, name):
    """An opener with the hub's login cookie for ``name`` (the dummy authenticator), as a
    browser's: the hub's login form and its XSRF token."""
    from gpuspawner_sandbox.demo import DEMO_PASSWORD

    opener = urllib.request.build_opener(
        urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar())
    )
    with opener.open(f"{hub.public_url}/hub/login", timeout=30) as response:
        xsrf = re.search(r'name="_xsrf" value="([^"]+)"', response.read().decode()).group(1)
    body = urllib.parse.urlencode({"username": name, "password": DEMO_PASSWORD, "_xsrf": xsrf})
    opener.open(f"{hub.public_url}/hub/login", body.encode(), timeout=30).close()
    return opener


def test_a_browser_logs_in_to_the_service_through_the_hub(hub):
    user_token(hub, "otto")
    opener = logged_in(hub, "otto")
    # the form's fetch (as the browser marks it): redirected through the hub's OAuth
    # (no confirmation page) and back, then answered on the service's cookie alone
    fetch = {
        "Sec-Fetch-Mode": "cors",
        "Sec-Fetch-Site": "same-origin",
        "Accept": "application/json",
    }
    for _ in range(2):
        status, body = get(hub, opener=opener, headers=fetch)
        assert status == 200, body
        assert sorted(json.loads(body)["images"]) == ["pytorch"]


def test_services_and_strangers_are_refused(hub):
    status, _ = get(hub, hub.token)  # the harness's admin service: not a user
    assert status == 403
    # no login: sent to log in at the hub, never answered
    status, _ = get(hub, "not-a-token", opener=urllib.request.build_opener(NoRedirect))
    assert status == 302
    # a token of a user limited to other scopes has no access to the service
    assert hub.api("POST", "/users/mia").status in (201, 409)
    r = hub.api("POST", "/users/mia/tokens", {"scopes": ["read:users:name!user"]})
    assert r.status in (200, 201), r.body
    assert get(hub, r.json()["token"])[0] == 403


def test_the_hub_logs_no_deprecation(hub):
    figures(hub, user_token(hub, "otto"))
    log = hub.log()
    assert "gpuspawner serving on" in log  # the service's own log goes to the hub's
    assert "deprecat" not in log.lower(), [
        line for line in log.splitlines() if "deprecat" in line.lower()
    ]
