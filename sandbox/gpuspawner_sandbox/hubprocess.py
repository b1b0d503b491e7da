"""Start a real JupyterHub process with its real configurable-http-proxy, on loopback only.

Used by the demo (``gpuspawner-sandbox demo``) and by the test suites: the hub,
its proxy and everything they start listen on 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from . import suitecosts
from .lifetime import dying_with_us
from .ports import free_port

REPO = Path(__file__).resolve().parents[2]

#: Scopes of the admin service token a started hub gets (for tests and the demo's own checks).
ADMIN_SCOPES = ("admin:users", "admin:servers", "admin:groups", "access:servers", "tokens")


def proxy_command() -> str:
    """configurable-http-proxy from the repo's npm install (package.json), else from PATH."""
    local = REPO / "node_modules" / ".bin" / "configurable-http-proxy"
    if local.exists():
        return str(local)
    found = shutil.which("configurable-http-proxy")
    if not found:
        raise RuntimeError(
            "configurable-http-proxy is not installed: run 'npm install' in the repository root"
        )
    return found


@dataclass
class Response:
    status: int
    body: bytes
    headers: dict = field(default_factory=dict)

    def json(self):
        return json.loads(self.body or b"null")


@dataclass
class Hub:
    """A running hub: ``public_url`` goes through the proxy, ``token`` is an admin service token."""

    process: subprocess.Popen
    public_url: str
    token: str
    log_path: Path

    def api(self, method: str, path: str, body=None, token: str | None = None) -> Response:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            f"{self.public_url}/hub/api{path}",
            data=data,
            method=method,
            headers={
                "Authorization": f"token {token or self.token}",
                "Content-Type": "application/json",
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as r:
                return Response(r.status, r.read(), dict(r.headers))
        except urllib.error.HTTPError as e:
            return Response(e.code, e.read(), dict(e.headers))

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        """Stop the hub; it stops the proxy and the servers it started.

        Anything left in its session is killed, and so is every process it
        started in a session of its own (a local spawner's server) that its
        shutdown did not stop in time.
        """
        started = descendants(self.process.pid)
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for pid, start_time in started.items():
            if _start_time(pid) == start_time:  # the same process, not a reused pid
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def _stat_fields(text: str) -> list[str]:
    """The fields of a /proc/PID/stat line after the command name (field 3 onwards)."""
    return text.rsplit(")", 1)[1].split()


def _start_time(pid: int) -> str | None:
    """A process's start time (field 22 of /proc/PID/stat), to tell it from a later reuse of its pid."""
    try:
        return _stat_fields(Path(f"/proc/{pid}/stat").read_text())[19]
    except (OSError, IndexError):
        return None


def descendants(pid: int) -> dict[int, str]:
    """Every living process below ``pid`` (children, theirs, …) with its start time, from /proc."""
    children: dict[int, list[tuple[int, str]]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = _stat_fields((entry / "stat").read_text())
            parent, start = int(fields[1]), fields[19]
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append((int(entry.name), start))
    found: dict[int, str] = {}
    todo = list(children.get(pid, []))
    while todo:
        child, start = todo.pop()
        found[child] = start
        todo.extend(children.get(child, []))
    return found


def _ports(workdir: Path, public_port: int | None) -> tuple[int, int, int]:
    """The hub's public, hub-API and proxy-API ports: chosen once per hub folder, kept after.

    Running notebooks were given the hub's API address when they started
    (``JUPYTERHUB_API_URL``); a restarted hub on a new port would leave them
    answering their users with 500 "Failed to connect to Hub API".
    """
    saved = workdir / "ports.json"
    try:
        ports = json.loads(saved.read_text())
        chosen = (int(ports["public"]), int(ports["hub"]), int(ports["proxy_api"]))
    except (OSError, ValueError, KeyError, TypeError):
        chosen = (public_port or free_port(), free_port(), free_port())
    if public_port and public_port != chosen[0]:
        chosen = (public_port, chosen[1], chosen[2])
    saved.write_text(json.dumps(dict(zip(("public", "hub", "proxy_api"), chosen, strict=True))))
    return chosen


def write_config(
    workdir: Path, extra: str, token: str, public_port: int | None = None
) -> tuple[Path, str]:
    public_port, hub_port, api_port = _ports(workdir, public_port)
    config = workdir / "jupyterhub_config.py"
    config.write_text(
        f"""
c = get_config()  # noqa
c.JupyterHub.ip = "127.0.0.1"
c.JupyterHub.port = {public_port}
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = {hub_port}
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{api_port}"
c.ConfigurableHTTPProxy.command = [{proxy_command()!r}]
c.ConfigurableHTTPProxy.should_start = True
c.JupyterHub.db_url = "sqlite:///{workdir / "jupyterhub.sqlite"}"
c.JupyterHub.cookie_secret_file = "{workdir / "cookie_secret"}"
c.JupyterHub.pid_file = "{workdir / "jupyterhub.pid"}"
c.JupyterHub.authenticator_class = "dummy"
c.Authenticator.allow_all = True
c.JupyterHub.allow_named_servers = True
c.JupyterHub.services = [{{"name": "tester", "api_token": {token!r}}}]
c.JupyterHub.load_roles = [
    {{"name": "tester", "scopes": {list(ADMIN_SCOPES)!r}, "services": ["tester"]}}
]
c.JupyterHub.spawner_class = "gpu"
{extra}
"""
    )
    return config, f"http://127.0.0.1:{public_port}"


@suitecosts.recorded(suitecosts.HUB, lambda workdir, *a, **k: str(workdir))
def start_hub(
    workdir: Path,
    extra_config: str = "",
    env: dict | None = None,
    timeout: float = 60,
    public_port: int | None = None,
    token: str | None = None,
) -> Hub:
    """Start ``jupyterhub`` and wait until its API answers through the proxy.

    ``workdir`` keeps the hub's database: starting again in the same folder
    with the same ``token`` is a hub restart.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    token = token or secrets.token_hex(16)
    config, public_url = write_config(workdir, extra_config, token, public_port)
    log_path = workdir / "hub.log"
    if log_path.exists():  # keep the log of an earlier run of this hub
        log_path.rename(workdir / f"hub.{int(time.time() * 1000)}.log")
    jupyterhub = Path(sys.executable).parent / "jupyterhub"
    process = subprocess.Popen(
        [str(jupyterhub), "-f", str(config)],
        cwd=workdir,
        stdout=log_path.open("wb"),
        stderr=subprocess.STDOUT,
        env={**os.environ, **(env or {})},
        start_new_session=True,
        # An interrupted test run (pytest-xdist's workers end without their
        # fixtures' teardown) must not leave its hubs and their servers running.
        preexec_fn=dying_with_us(),
    )
    hub = Hub(process, public_url, token, log_path)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                return hub  # exited: the caller reads the log
            try:
                if hub.api("GET", "/").status == 200:
                    return hub
            except OSError:
                pass
            time.sleep(0.3)
    except BaseException:
        # Interrupted (Ctrl-C, a benchmark's SIGTERM) before the caller holds it to stop.
        hub.stop()
        raise
    hub.stop()
    raise RuntimeError(f"JupyterHub did not answer within {timeout}s; log:\n{hub.log()[-3000:]}")
