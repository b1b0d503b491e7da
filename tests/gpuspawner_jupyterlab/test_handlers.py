"""The cull warning inside JupyterLab, end to end (browser test).

A real hub and proxy; the culler as the hub-managed service with a warning
period; a real ``jupyterhub-singleuser`` with JupyterLab and this extension
(installed in the test environment by ``make setup``); the grants come from
config/jupyterhub_config.py as shipped. Headless Chromium logs in, opens
JupyterLab, and must see the notification naming when the server stops and
how to keep it, once, however often JupyterLab asks.
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from gpuspawner_jupyterlab.warning import BAD_SECONDS, NO_CULLER

from ..conftest import REPO
from ..culler.hubtools import (
    CULLER_SERVICE,
    shipped_culler_role,
    shipped_server_token_scopes,
    shipped_user_role,
    spawn,
    wait_ready,
)
from ..e2e.conftest import browser, browser_log_in  # noqa: F401 (the fixture)
from ..hub.hubprocess import free_port, start_hub

pytestmark = pytest.mark.hub

USER = "lab-user"


@pytest.fixture(scope="module")
def lab_hub(tmp_path_factory):
    if not (Path(sys.prefix) / "share/jupyter/labextensions/gpuspawner-jupyterlab").is_dir():
        pytest.fail("gpuspawner-jupyterlab is not installed in this environment: run make setup")
    workdir = tmp_path_factory.mktemp("labhub")
    public_port, culler_port = free_port(), free_port()
    user_role, token_scopes = shipped_user_role(), shipped_server_token_scopes()
    singleuser = Path(sys.executable).parent / "jupyterhub-singleuser"
    service = {
        "name": CULLER_SERVICE,
        "url": f"http://127.0.0.1:{culler_port}",
        # warned at once (idle past 1 s), culled only after an hour: the warning stays
        "command": [
            sys.executable,
            "-m",
            "gpuspawner.culler",
            "--cull-every=1",
            "--kubernetes=off",
            "--min-running=0",
            "--timeout=1",
            "--warning-period=3600",
        ],
        "environment": {"PYTHONPATH": str(REPO)},
    }
    args = ["--LanguageServerManager.autodetect=False", "--CullWarning.poll_seconds=1"]
    if os.geteuid() == 0:
        args.append("--allow-root")
    extra = f"""
c.JupyterHub.spawner_class = "simple"
c.Spawner.ip = "127.0.0.1"
c.Spawner.cmd = [{str(singleuser)!r}]
c.Spawner.args = {args!r}
c.Spawner.default_url = "/lab"
c.Spawner.start_timeout = 120
c.Spawner.http_timeout = 120
c.SimpleLocalProcessSpawner.home_dir_template = {str(workdir / "home" / "{username}")!r}
c.Spawner.environment = {{"GPUSPAWNER_CULLER_URL": "http://127.0.0.1:{public_port}/services/{CULLER_SERVICE}/"}}
c.Spawner.server_token_scopes = {token_scopes!r}
c.JupyterHub.services.append({service!r})
c.JupyterHub.load_roles.append({shipped_culler_role()!r})
c.JupyterHub.load_roles.append({user_role!r})
"""
    hub = start_hub(
        workdir,
        extra_config=extra,
        public_port=public_port,
        env={"PYTHONPATH": str(REPO)},
        timeout=120,
    )
    if hub.process.poll() is not None:
        pytest.fail(f"JupyterHub exited during start:\n{hub.log()[-3000:]}")
    yield hub
    hub.stop()


def wait_warned(hub, user: str, timeout: float = 60) -> None:
    """Until the culler's /warnings (asked with the hub's admin token) lists the user."""
    deadline = time.monotonic() + timeout
    url = f"/services/{CULLER_SERVICE}/warnings"
    while time.monotonic() < deadline:
        request = urllib.request.Request(
            hub.public_url + url, headers={"Authorization": f"token {hub.token}"}
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as r:
                if any(w["user"] == user for w in json.loads(r.read())):
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"the culler never warned {user}:\n{hub.log()[-3000:]}")


def test_jupyterlab_shows_the_cull_warning_once(lab_hub, browser):  # noqa: F811
    spawn(lab_hub, USER, {})
    wait_ready(lab_hub, USER, timeout=120)
    wait_warned(lab_hub, USER)

    page = browser_log_in(browser, lab_hub, USER, f"/user/{USER}/lab")
    polls = []
    page.on(
        "response",
        lambda r: polls.append(r.status) if "/gpuspawner/warning?" in r.url else None,
    )
    toast = page.get_by_text("This server will be stopped at")
    toast.first.wait_for(timeout=120_000)
    text = toast.first.inner_text()
    assert "because it has been idle" in text and "To keep it, use it before then" in text, text

    # JupyterLab asks every second (poll_seconds=1): several answers, one notification
    deadline = time.monotonic() + 60
    while len(polls) < 3 and time.monotonic() < deadline:
        page.wait_for_timeout(500)
    assert len(polls) >= 3 and set(polls) == {200}, polls
    assert toast.count() == 1

    page.context.close()


# --- GPU load in the status bar: /gpuspawner/gpu-status against a stand-in culler ---
#
# A real JupyterLab server (``python -m jupyterlab``) with this extension, told
# by the environment the hub would set where the culler is; the culler is a
# stand-in on 127.0.0.1 whose answer each test sets, so that every case the
# contract allows (busy, idle, no DCGM, a CPU server, a failing culler,
# hostile strings) is shown without a cluster. tests/e2e/test_gpu_status_bar.py
# shows the same against the real culler, Prometheus and nodes.

SERVER_TOKEN = "server-token-for-the-culler"
LAB_TOKEN = "lab-token"
GIB = 1024**3
HOSTILE = '<img src=x onerror="document.title=1">'


class StandInCuller:
    """``/services/gpuspawner-culler/api/gpu-status`` answering what the test sets; also
    ``/api/warning`` (``warning``, once set) and ``POST /api/keep`` (``keep``)."""

    def __init__(self):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.code, self.answer, self.asked = 200, {"poll_seconds": 5, "servers": []}, []
        self.warning = None
        self.keep, self.kept = (200, {}), []
        culler = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                if self.path.endswith("/api/warning") and culler.warning is not None:
                    return self.reply(200, culler.warning)
                culler.asked.append((self.path, self.headers.get("Authorization")))
                self.reply(culler.code, culler.answer)

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                culler.kept.append((self.path, self.headers.get("Authorization"), body))
                self.reply(*culler.keep)

            def reply(self, code, answer):
                body = json.dumps(answer).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/services/{CULLER_SERVICE}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def answer_with(self, *servers, code=200):
        self.code = code
        self.answer = {"user": USER, "poll_seconds": 5, "servers": list(servers)}

    def wait_asked(self, more: int, timeout: float = 60) -> None:
        """Until JupyterLab's server asked ``more`` more times."""
        target = len(self.asked) + more
        deadline = time.monotonic() + timeout
        while len(self.asked) < target and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(self.asked) >= target, f"asked {len(self.asked)} times, not {target}"


def gpu_entry(**changes) -> dict:
    """This server's entry as the culler's contract writes it: two busy A100s."""
    now = time.time()
    entry = {
        "user": USER,
        "server": "",
        "gpus": 2,
        "gpu_type": "A100",
        "source": "dcgm",
        "unavailable": None,
        "utilization": 0.87,
        "memory_used_bytes": 12 * GIB,
        "memory_total_bytes": 160 * GIB,
        "devices": [
            {
                "gpu": "0",
                "uuid": "GPU-0",
                "utilization": 0.9,
                "memory_used_bytes": 8 * GIB,
                "memory_total_bytes": 80 * GIB,
            },
            {
                "gpu": "1",
                "uuid": "GPU-1",
                "utilization": 0.84,
                "memory_used_bytes": 4 * GIB,
                "memory_total_bytes": 80 * GIB,
            },
        ],
        "busy": True,
        "idle_since": None,
        "idle_seconds": None,
        "stop_at": None,
        "stop_at_iso": None,
        "stop_rule": None,
        "history": {
            "step": 60,
            # the last hour, a point a minute up to now: 0 %, 10 %, ... 90 %, and again
            "points": [[now - 3540 + 60 * i, (i % 10) / 10] for i in range(60)],
        },
    }
    entry.update(changes)
    return entry


@pytest.fixture(scope="module")
def stand_in_lab(tmp_path_factory):
    if not (Path(sys.prefix) / "share/jupyter/labextensions/gpuspawner-jupyterlab").is_dir():
        pytest.fail("gpuspawner-jupyterlab is not installed in this environment: run make setup")
    import subprocess

    workdir = tmp_path_factory.mktemp("gpulab")
    culler = StandInCuller()
    port = free_port()
    args = [
        sys.executable,
        "-m",
        "jupyterlab",
        "--no-browser",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}",
        f"--IdentityProvider.token={LAB_TOKEN}",
        f"--ServerApp.root_dir={workdir}",
        "--LanguageServerManager.autodetect=False",
        # nothing may dial out: no update check, no extension index
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        "--LabApp.extension_manager=readonly",
    ]
    if os.geteuid() == 0:
        args.append("--allow-root")
    env = {
        **os.environ,
        "GPUSPAWNER_CULLER_URL": culler.url,
        "JUPYTERHUB_API_TOKEN": SERVER_TOKEN,
        "JUPYTERHUB_SERVER_NAME": "",
        "JUPYTER_CONFIG_DIR": str(workdir / "config"),
        "JUPYTER_RUNTIME_DIR": str(workdir / "runtime"),
        "HOME": str(workdir),
    }
    log = open(workdir / "lab.log", "wb")
    process = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        try:
            lab_get(base, "api/status")
            break
        except OSError:
            time.sleep(0.5)
    else:
        process.kill()
        pytest.fail(f"JupyterLab did not start:\n{(workdir / 'lab.log').read_text()[-3000:]}")
    yield base, culler
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        # a slow shutdown on a loaded machine (CI runs these beside the machine tests) is
        # not what these tests check; leaving no process behind is
        process.kill()
        process.wait(timeout=30)
    culler.server.shutdown()


def lab_get(base: str, path: str) -> tuple[int, dict]:
    request = urllib.request.Request(base + path, headers={"Authorization": f"token {LAB_TOKEN}"})
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def test_gpu_status_asks_the_culler_with_the_servers_own_token(stand_in_lab):
    base, culler = stand_in_lab
    culler.answer_with(gpu_entry(server="other"), gpu_entry())
    code, answer = lab_get(base, "gpuspawner/gpu-status")
    assert code == 200
    assert answer["status"]["server"] == "" and answer["status"]["utilization"] == 0.87
    assert answer["poll_seconds"] == 5
    path, authorization = culler.asked[-1]
    assert path == f"/services/{CULLER_SERVICE}/api/gpu-status"
    assert authorization == f"token {SERVER_TOKEN}"


def test_a_cpu_server_or_a_culler_without_the_api_has_no_status(stand_in_lab):
    base, culler = stand_in_lab
    culler.answer_with(gpu_entry(server="other"))  # this server is not listed: no GPUs
    assert lab_get(base, "gpuspawner/gpu-status") == (200, {"status": None, "poll_seconds": 5})
    culler.answer_with(gpu_entry(), code=404)  # a culler from before /api/gpu-status
    assert lab_get(base, "gpuspawner/gpu-status") == (200, {"status": None, "poll_seconds": 30})
    culler.answer_with(gpu_entry(), code=403)  # a token without the culler's scope
    assert lab_get(base, "gpuspawner/gpu-status") == (200, {"status": None, "poll_seconds": 30})


def test_a_failing_culler_is_a_502_so_jupyterlab_keeps_its_figures(stand_in_lab):
    base, culler = stand_in_lab
    culler.answer_with(gpu_entry(), code=500)
    code, answer = lab_get(base, "gpuspawner/gpu-status")
    assert code == 502 and answer == {"status": None, "poll_seconds": 30}


def test_asking_for_the_gpu_status_is_not_activity(stand_in_lab):
    base, culler = stand_in_lab
    culler.answer_with(gpu_entry())
    before = lab_get(base, "api/status")[1]["last_activity"]
    time.sleep(1.1)  # last_activity has millisecond resolution: a tracked request would move it
    for _ in range(3):
        assert lab_get(base, "gpuspawner/gpu-status")[0] == 200
    assert lab_get(base, "api/status")[1]["last_activity"] == before


def test_jupyterlab_shows_gpu_load_idle_time_and_no_item_without_gpus(stand_in_lab, browser):  # noqa: F811
    base, culler = stand_in_lab
    culler.answer_with(gpu_entry(gpu_type=f"A100 {HOSTILE}"))
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    page.goto(f"{base}lab?token={LAB_TOKEN}")
    item = page.locator(".gpuspawner-gpu-item")
    item.wait_for(timeout=120_000)
    # JupyterLab's own theme stylesheet once failed to load on a machine loaded by the
    # tests beside (its "Error Loading Theme" dialog then covers the page): that is not
    # the extension's doing, so the page is loaded again, once.
    theme_error = page.locator(".jp-Dialog[aria-label^='Error Loading Theme']")
    if theme_error.count():
        page.reload()
        item.wait_for(timeout=120_000)
    assert theme_error.count() == 0

    # busy: count, type, utilisation and memory; the hostile type is text, not markup
    assert item.inner_text() == f"GPU 2×A100 {HOSTILE} 87% · 12.0/160 GiB"
    assert page.locator("#jp-main-statusbar img").count() == 0
    assert item.get_attribute("title").startswith("No culler rule stops this server as it is now.")

    # the panel: per-GPU figures, the rule and the last hour as a hand-drawn line
    item.click()
    panel = page.locator("#gpuspawner-gpu-panel")
    panel.wait_for(timeout=30_000)
    rows = panel.locator(".gpuspawner-gpu-devices tr")
    assert rows.count() == 3
    assert rows.nth(1).inner_text().split() == ["0", "90%", "8.0/80", "GiB"]
    points = panel.locator("polyline.gpuspawner-gpu-line").get_attribute("points").split()
    assert len(points) == 60
    ys = [float(p.split(",")[1]) for p in points]
    assert max(ys) == 120.0 and min(ys) == pytest.approx(
        120 * 0.1
    )  # 0 % at the bottom, 90 % near the top

    # the culler fails: the last figures stay while JupyterLab asks again
    culler.answer_with(gpu_entry(utilization=0.1), code=500)
    culler.wait_asked(2)
    assert item.inner_text() == f"GPU 2×A100 {HOSTILE} 87% · 12.0/160 GiB"

    # idle for 12 minutes, stopped in 48 by the GPU idle timeout if it stays so
    now = time.time()
    culler.answer_with(
        gpu_entry(
            busy=False,
            utilization=0.0,
            idle_since=now - 12 * 60 - 5,
            idle_seconds=12 * 60 + 5,
            stop_at=now + 48 * 60,
            stop_rule="GPU idle timeout of 60 min",
        )
    )
    stops_at = page.evaluate(
        "t => new Date(t * 1000).toLocaleTimeString([], {hour: '2-digit', minute: '2-digit'})",
        now + 48 * 60,
    )
    expected = f"GPUs idle 12 min · stops {stops_at}"
    poll_until(lambda: item.inner_text() == expected, what=f"the item to read {expected!r}")
    title = item.get_attribute("title")
    assert "GPU idle timeout of 60 min" in title and f"at {stops_at} (in 4" in title, title
    assert "GPU idle timeout of 60 min" in panel.locator(".gpuspawner-gpu-rule").inner_text()

    # no DCGM source: one short line, the reason as its title, no dialog
    reason = "The culler has no Prometheus configured, so there are no GPU figures."
    culler.answer_with(gpu_entry(source=None, unavailable=reason, utilization=None))
    poll_until(lambda: item.inner_text() == "GPU load unavailable", what="the unavailable line")
    assert item.get_attribute("title") == reason
    assert page.locator(".jp-Dialog").count() == 0

    # a CPU server (not listed by the culler): no item at all
    culler.answer_with(gpu_entry(server="other"))
    poll_until(lambda: page.locator(".gpuspawner-gpu-item").count() == 0, what="the item to go")

    # listed again (a culler that restarted lists no server until its first pass): back
    culler.answer_with(gpu_entry())
    poll_until(lambda: page.locator(".gpuspawner-gpu-item").count() == 1, what="the item again")
    assert item.inner_text() == "GPU 2×A100 87% · 12.0/160 GiB"
    context.close()


def poll_until(predicate, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.3)
    raise AssertionError(f"never saw {what}")


# --- "Keep for 1 h": /gpuspawner/keep against the stand-in culler ---------------------


def lab_post(base: str, path: str, body, headers=None) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(
        base + path,
        data=data,
        headers={"Authorization": f"token {LAB_TOKEN}", **(headers or {})},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def test_keep_asks_the_culler_for_this_server_with_its_own_token(stand_in_lab):
    base, culler = stand_in_lab
    until = time.time() + 3600
    culler.keep = (200, {"status": 200, "message": "Kept.", "keep_until": until})
    culler.kept.clear()
    code, answer = lab_post(base, "gpuspawner/keep", {"seconds": 3600, "server": "other"})
    assert code == 200, answer
    assert answer["until"] == until and answer["message"].startswith("Kept until ")
    ((path, authorization, body),) = culler.kept
    assert path == f"/services/{CULLER_SERVICE}/api/keep"
    assert authorization == f"token {SERVER_TOKEN}"
    # this server, whatever the request named
    assert json.loads(body) == {"server": "", "seconds": 3600}


@pytest.mark.parametrize("body", [{"seconds": "3600"}, {"seconds": True}, {"seconds": 0}, {}, b"<"])
def test_a_forged_duration_is_refused_with_one_sentence_and_not_forwarded(stand_in_lab, body):
    base, culler = stand_in_lab
    culler.kept.clear()
    assert lab_post(base, "gpuspawner/keep", body) == (400, {"message": BAD_SECONDS})
    assert culler.kept == []


def test_the_cullers_refusal_is_passed_on_and_its_failure_is_one_sentence(stand_in_lab):
    base, culler = stand_in_lab
    refused = "Its GPUs are wanted by users waiting for them: it cannot be kept."
    culler.keep = (409, {"status": 409, "message": refused, "keep_until": None})
    assert lab_post(base, "gpuspawner/keep", {"seconds": 3600}) == (409, {"message": refused})
    culler.keep = (500, {"message": "Traceback (most recent call last):"})
    assert lab_post(base, "gpuspawner/keep", {"seconds": 3600}) == (502, {"message": NO_CULLER})


def test_a_keep_posted_with_the_login_cookie_needs_the_xsrf_token(stand_in_lab):
    import http.cookiejar

    base, culler = stand_in_lab
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    opener.open(f"{base}lab?token={LAB_TOKEN}", timeout=60).close()  # the login cookie
    culler.kept.clear()
    request = urllib.request.Request(f"{base}gpuspawner/keep", data=b'{"seconds": 3600}')
    with pytest.raises(urllib.error.HTTPError) as e:
        opener.open(request, timeout=30)
    assert e.value.code == 403
    assert culler.kept == []


def test_jupyterlab_keeps_the_server_from_its_warning(stand_in_lab, browser):  # noqa: F811
    base, culler = stand_in_lab
    now = time.time()
    warning = {
        "user": USER,
        "server": "",
        "reason": "idle",
        "why": "it has been idle",
        "keep": "To keep it, use it before then (run a cell or a terminal command).",
        "warned_at": now,
        "cull_at": now + 600,
        "keep_choices": [3600.0, 14400.0],
        "keep_refused": "",
    }
    culler.warning = {"user": USER, "warnings": [warning]}
    until = now + 3600
    culler.keep = (200, {"status": 200, "message": "Kept.", "keep_until": until})
    culler.kept.clear()
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    try:
        page.goto(f"{base}lab?token={LAB_TOKEN}")
        toast = page.get_by_text("This server will be stopped at")
        toast.first.wait_for(timeout=120_000)
        assert page.get_by_role("button", name="Keep for 4 h").count() == 1
        page.get_by_role("button", name="Keep for 1 h").click()
        clock = page.evaluate(
            "t => new Date(t * 1000).toLocaleTimeString([], {hour: '2-digit', minute: '2-digit'})",
            until,
        )
        page.get_by_text(f"Kept until {clock}.").first.wait_for(timeout=30_000)
        ((_, authorization, body),) = culler.kept
        assert json.loads(body) == {"server": "", "seconds": 3600}
        assert authorization == f"token {SERVER_TOKEN}"

        # a warning that cannot be kept: the culler's sentence, as text, and no button
        culler.warning = {
            "user": USER,
            "warnings": [
                {**warning, "warned_at": now + 1, "keep_choices": [], "keep_refused": HOSTILE}
            ],
        }
        page.reload()
        page.get_by_text(HOSTILE, exact=False).first.wait_for(timeout=120_000)
        assert page.get_by_role("button", name="Keep for 1 h").count() == 0
        assert page.evaluate("document.title") != "1"
    finally:
        culler.warning = None
        context.close()
