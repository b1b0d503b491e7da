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

from .conftest import REPO

SCRIPT = REPO / "gpuspawner" / "images" / "healthcheck.py"


class _API(BaseHTTPRequestHandler):
    def do_GET(self):
        ok = self.path == "/user/ada/api"
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
    proc = run(tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.strip() == "unhealthy: no Jupyter server runtime file yet"


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
