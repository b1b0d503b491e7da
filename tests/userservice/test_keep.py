"""The home page's "Keep for 1 h": the gpuspawner service's keep page under a real hub and proxy.

The browser's side is urllib with a cookie jar (the hub's login form, the
OAuth redirects, the service's XSRF cookie and token), marked as Chromium
marks a page view; the culler is a stand-in on 127.0.0.1 whose answer each
test sets, recording what the service forwarded. The real culler's keep is
tests/culler's; the whole way on real nodes is tests/e2e/test_keep.py.
"""

from __future__ import annotations

import html
import json
import re
import threading
import urllib.error
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gpuspawner.core.keep import kept_text
from gpuspawner.userservice.keep import NO_CULLER, keep_answer, render_page

from ..hub.hubprocess import free_port, start_hub
from ..security.payloads import PAYLOADS, assert_escaped
from .test_hub import logged_in as log_in

KEEP = "/services/gpuspawner/keep"
UNTIL = 1_800_003_600.0  # 09:00 UTC
#: What a browser sends with a page view (a link followed, a form posted).
NAVIGATE = {"Sec-Fetch-Mode": "navigate", "Sec-Fetch-Site": "same-origin"}


# --- the pure part -------------------------------------------------------------


def test_a_keep_reads_kept_until_and_a_refusal_passes_the_cullers_sentence():
    kept = json.dumps({"status": 200, "message": "Kept.", "keep_until": UNTIL})
    assert keep_answer(200, kept) == (200, kept_text(UNTIL), UNTIL)
    assert kept_text(UNTIL) == "Kept until 09:00 UTC."
    refused = {"status": 409, "message": "Its GPUs are wanted: it cannot be kept."}
    assert keep_answer(409, json.dumps(refused)) == (409, refused["message"], None)
    assert keep_answer(400, json.dumps({"message": "x" * 999}))[1] == "x" * 300


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (200, b"not json"),
        (200, b"[]"),
        (200, json.dumps({"keep_until": None})),
        (200, json.dumps({"keep_until": True})),
        (200, json.dumps({"keep_until": 1e300})),
        (500, json.dumps({"message": "Traceback (most recent call last): ..."})),
        (502, b""),
        (404, json.dumps({"message": ""})),
    ],
)
def test_anything_else_from_the_culler_is_one_sentence_never_its_text(status, body):
    assert keep_answer(status, body) == (503, NO_CULLER, None)


@pytest.mark.parametrize(("name", "value"), PAYLOADS, ids=[n for n, _ in PAYLOADS])
def test_the_page_shows_every_hostile_string_as_text(name, value):
    asking = render_page(hub_prefix="/hub/", ask=True, xsrf="t", server=value, seconds=3600)
    assert_escaped(asking, value)
    told = render_page(hub_prefix="/hub/", message=value)
    assert_escaped(told, value)


# --- under a real hub ---------------------------------------------------------------


class StandInCuller:
    """``POST /api/keep`` answering what the test sets, recording what it was sent."""

    def __init__(self):
        self.code, self.answer, self.asked = 200, {}, []
        culler = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                culler.asked.append((self.path, self.headers.get("Authorization"), body))
                data = json.dumps(culler.answer).encode()
                self.send_response(culler.code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture(scope="module")
def culler():
    stand_in = StandInCuller()
    yield stand_in
    stand_in.server.shutdown()


@pytest.fixture(scope="module")
def hub(tmp_path_factory, culler):
    hub = start_hub(
        tmp_path_factory.mktemp("hub"),
        extra_config=f"""
# no server is started here: the login lands on the home page
c.JupyterHub.spawner_class = "simple"
c.JupyterHub.default_url = "/hub/home"
from gpuspawner.userservice.hubconfig import add_service
add_service(c, url="http://127.0.0.1:{free_port()}",
            environment={{"GPUSPAWNER_CULLER_URL": {culler.url!r}}})
""",
    )
    if hub.process.poll() is not None:
        pytest.fail(f"JupyterHub exited during start:\n{hub.log()[-3000:]}")
    yield hub
    hub.stop()


def logged_in(hub, name):
    assert hub.api("POST", f"/users/{name}").status in (201, 409)
    return log_in(hub, name)


def call(opener, url, data=None, headers=None):
    request = urllib.request.Request(url, data=data, headers={**NAVIGATE, **(headers or {})})
    try:
        with opener.open(request, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def text(page: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", page))


def ask_page(hub, opener, query):
    """The keep page for ``query``: through the hub's OAuth on first use, then the cookie."""
    return call(opener, f"{hub.public_url}{KEEP}?{urllib.parse.urlencode(query)}")


def test_the_link_asks_once_more_and_the_post_forwards_the_keep_for_the_user(hub, culler):
    opener = logged_in(hub, "kim")
    status, page = ask_page(hub, opener, {"server": "train", "seconds": "3600"})
    assert status == 200, page
    assert "Keep your server 'train' running though it is idle, until" in text(page)
    assert ">Keep for 1 h</button>" in page
    xsrf = re.search(r'name="_xsrf" value="([^"]+)"', page).group(1)

    culler.code, culler.answer = 200, {"status": 200, "message": "Kept.", "keep_until": UNTIL}
    culler.asked.clear()
    form = {"_xsrf": xsrf, "server": "train", "seconds": "3600"}
    status, page = call(opener, hub.public_url + KEEP, urllib.parse.urlencode(form).encode())
    assert status == 200, page
    assert "Kept until 09:00 UTC." in text(page)
    assert 'datetime="2027-01-15T09:00:00Z"' in page  # shown in the reader's local time
    ((path, authorization, body),) = culler.asked
    assert path == "/api/keep"
    # the service's own token, naming the user the hub identified
    assert authorization.startswith("token ") and len(authorization) > 10
    assert json.loads(body) == {"user": "kim", "server": "train", "seconds": 3600}


def test_a_post_without_the_services_xsrf_token_is_refused_and_forwards_nothing(hub, culler):
    opener = logged_in(hub, "kim")
    assert ask_page(hub, opener, {"server": "", "seconds": "3600"})[0] == 200  # logged in
    culler.asked.clear()
    form = urllib.parse.urlencode({"server": "", "seconds": "3600"}).encode()
    status, _ = call(opener, hub.public_url + KEEP, form)
    assert status == 403
    forged = urllib.parse.urlencode({"_xsrf": "forged", "server": "", "seconds": "3600"})
    assert call(opener, hub.public_url + KEEP, forged.encode())[0] == 403
    assert culler.asked == []


@pytest.mark.parametrize(
    "query",
    [
        {"server": "a/b", "seconds": "3600"},
        {"server": "", "seconds": "0"},
        {"server": "", "seconds": "1e9"},
        {"server": "", "seconds": "<b>"},
    ],
)
def test_a_forged_server_or_duration_is_refused_with_one_sentence(hub, culler, query):
    opener = logged_in(hub, "kim")
    status, page = ask_page(hub, opener, query)
    assert status == 400, page
    said = re.search(r'gpuspawner-keep-message"\s+role="status">([^<]*)<', page).group(1)
    assert said.endswith(".") and ". " not in said, said
    assert "<b>" not in page and "Traceback" not in page


def test_a_script_posts_json_with_the_users_token_and_reads_json(hub, culler):
    assert hub.api("POST", "/users/kim").status in (201, 409)
    r = hub.api("POST", "/users/kim/tokens", {"note": "keep test"})
    token = r.json()["token"]
    refused = "Its GPUs are wanted by users waiting for them: it cannot be kept."
    culler.code, culler.answer = 409, {"status": 409, "message": refused, "keep_until": None}
    culler.asked.clear()
    status, body = call(
        urllib.request.build_opener(),
        hub.public_url + KEEP,
        json.dumps({"server": "", "seconds": 3600}).encode(),
        {"Authorization": f"token {token}", "Content-Type": "application/json"},
    )
    assert (status, json.loads(body)) == (409, {"status": 409, "message": refused})
    assert json.loads(culler.asked[0][2])["user"] == "kim"
    # the culler gone: one sentence, no traceback
    culler.code, culler.answer = 500, {"message": "Traceback (most recent call last):"}
    status, body = call(
        urllib.request.build_opener(),
        hub.public_url + KEEP,
        json.dumps({"server": "", "seconds": 3600}).encode(),
        {"Authorization": f"token {token}", "Content-Type": "application/json"},
    )
    assert (status, json.loads(body)["message"]) == (503, NO_CULLER)
    # a service's token is not a user's: it keeps nothing
    status, body = call(
        urllib.request.build_opener(),
        hub.public_url + KEEP,
        json.dumps({"server": "", "seconds": 3600}).encode(),
        {"Authorization": f"token {hub.token}", "Content-Type": "application/json"},
    )
    assert status == 403, body
