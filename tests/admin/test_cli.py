"""gpuspawner status: reading the admin service's JSON, and what the terminal shows."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gpuspawner import cli
from gpuspawner.admin.report import build_report


@pytest.fixture
def service(users, pods, figures, catalog, now):
    """A stand-in for the service's api/status on 127.0.0.1: 403 unless the token is 'good'."""
    report = build_report(users=users, pods=pods, figures=figures, catalog=catalog, now=now)
    seen = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append((self.path, self.headers.get("Authorization")))
            if self.headers.get("Authorization") != "token good":
                self.send_response(403)
                self.end_headers()
                return
            body = json.dumps(report.as_dict()).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()
    server.server_close()


def test_tables(service, capsys):
    url, seen = service
    assert cli.main(["status", "--hub-url", url, "--token", "good"]) == 0
    out = capsys.readouterr().out
    assert seen == [("/services/gpuspawner-admin/api/status", "token good")]
    assert out.startswith("GPU pool\nGPU type")
    assert "NVIDIA H100 (h100)" in out and "big" in out and "user rule 'hog'" in out


def test_json_for_one_user(service, capsys):
    url, seen = service
    assert (
        cli.main(["status", "--hub-url", url, "--token", "good", "--json", "--user", "student"])
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert seen[0][0] == "/services/gpuspawner-admin/api/status?user=student"
    assert [u["name"] for u in data["users"]] == ["student"]
    assert data["users"][0]["rule"] == "group rule 'students'"
    assert {t["key"] for t in data["types"]} == {"a100", "h100"}


def test_user_explained(service, capsys):
    url, _ = service
    assert cli.main(["status", "--hub-url", url, "--token", "good", "--user", "hog"]) == 0
    out = capsys.readouterr().out
    assert (
        "hog (groups: none) may hold unlimited GPUs, from user rule 'hog'; holds 4 GPUs now.\n"
        "hog may use the images PyTorch and MATLAB (groups 'licensed'; users 'hog').\n" in out
    )
    assert cli.main(["status", "--hub-url", url, "--token", "good", "--user", "nobody"]) == 1
    assert "the hub has no user 'nobody'" in capsys.readouterr().err


def test_refused_token(service, capsys):
    url, _ = service
    assert cli.main(["status", "--hub-url", url, "--token", "bad"]) == 1
    err = capsys.readouterr().err
    assert "custom:gpuspawner:admin" in err and "Traceback" not in err


def test_no_token_and_no_hub(monkeypatch, capsys):
    monkeypatch.delenv("JUPYTERHUB_API_TOKEN", raising=False)
    assert cli.main(["status", "--hub-url", "http://127.0.0.1:9"]) == 2
    assert "needs an API token" in capsys.readouterr().err
    assert cli.main(["status", "--hub-url", "http://127.0.0.1:9", "--token", "t"]) == 1
    assert "could not be reached" in capsys.readouterr().err
