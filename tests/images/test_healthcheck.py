"""The images' HEALTHCHECK script, against a real HTTP server on loopback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gpuspawner.images import healthcheck
from gpuspawner_sandbox.hubprocess import free_port

from .conftest import REPO

SCRIPT = REPO / "gpuspawner" / "images" / "healthcheck.py"


class _API(BaseHTTPRequestHandler):
    def do_GET(self):
        ok = self.path in ("/user/ada/api", "/api")
        self.send_response(200 if ok else 404)
        self.end_headers()
        self.wfile.write(b'{"version": "2.0.0"}' if ok else b"")

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _API)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def run(home, extra_env=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("JUPYTER_")}
    env["HOME"] = str(home)
    env.update(extra_env or {})
    return subprocess.run(
        [sys.executable, str(SCRIPT)], capture_output=True, text=True, env=env, timeout=60
    )


def write_runtime(directory, url, pid=1234):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"jpserver-{pid}.json").write_text(json.dumps({"url": url, "pid": pid}))


def test_healthy_when_the_server_answers(tmp_path, server):
    write_runtime(tmp_path / ".local" / "share" / "jupyter" / "runtime", f"{server}/user/ada/")
    proc = run(tmp_path)
    assert proc.returncode == 0, proc.stderr


def test_unhealthy_before_the_server_starts(tmp_path):
    closed = free_port()
    proc = run(tmp_path, {"JUPYTER_PORT": str(closed)})
    assert proc.returncode == 1
    assert proc.stderr.strip() == (
        "unhealthy: no Jupyter server runtime file yet, and no answer from "
        f"http://127.0.0.1:{closed}/"
    )


def test_without_a_runtime_file_the_server_is_asked_on_jupyter_port(tmp_path, server):
    """A server whose runtime file is out of reach (another user's home) is still found
    where start-notebook.sh put it."""
    port = server.rsplit(":", 1)[1]
    proc = run(tmp_path, {"JUPYTER_PORT": port})
    assert proc.returncode == 0, proc.stderr


def test_without_a_runtime_file_a_hub_server_is_asked_at_its_service_url(tmp_path, server):
    proc = run(tmp_path, {"JUPYTERHUB_SERVICE_URL": f"{server}/user/ada/", "JUPYTER_PORT": "1"})
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(
    ("env", "url"),
    [
        ({}, "http://127.0.0.1:8888/"),
        ({"JUPYTER_PORT": "9000"}, "http://127.0.0.1:9000/"),
        ({"JUPYTER_PORT": "99999"}, "http://127.0.0.1:8888/"),
        ({"JUPYTER_PORT": "8888; rm -rf ~"}, "http://127.0.0.1:8888/"),
        (
            {"JUPYTERHUB_SERVICE_URL": "http://0.0.0.0:8888/user/a%20b/"},
            "http://127.0.0.1:8888/user/a%20b/",
        ),
        (
            {"JUPYTERHUB_SERVICE_URL": "http://[::1:bad/", "JUPYTER_PORT": "9000"},
            "http://127.0.0.1:9000/",
        ),
    ],
)
def test_expected_url(env, url):
    assert healthcheck.expected_url(env) == url


def test_runtime_dirs_include_nb_user_home():
    dirs = healthcheck.runtime_dirs({"HOME": "/home/jovyan", "NB_USER": "ada"})
    assert [str(d) for d in dirs] == [
        "/home/jovyan/.local/share/jupyter/runtime",
        "/home/ada/.local/share/jupyter/runtime",
    ]
    # NB_USER is never a path: "../../etc" names no directory to read.
    assert len(healthcheck.runtime_dirs({"HOME": "/h", "NB_USER": "../../etc"})) == 1


def test_unhealthy_when_the_server_does_not_answer_200(tmp_path, server):
    write_runtime(tmp_path / "rt", f"{server}/user/bob/")
    proc = run(tmp_path, {"JUPYTER_RUNTIME_DIR": str(tmp_path / "rt")})
    assert proc.returncode == 1
    assert "no answer from" in proc.stderr


def test_runtime_dirs_prefer_explicit_settings(tmp_path):
    dirs = healthcheck.runtime_dirs(
        {"JUPYTER_RUNTIME_DIR": "/r", "JUPYTER_DATA_DIR": "/d", "HOME": "/h"}
    )
    assert [str(d) for d in dirs] == ["/r", "/d/runtime", "/h/.local/share/jupyter/runtime"]
