"""Helpers for the culler's real-hub tests: start servers, wait for them, build a culler."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from traitlets.config import Config, PyFileConfigLoader

from gpuspawner.culler.app import GPUCuller

from ..conftest import REPO
from ..hub.hubprocess import Hub, start_hub
from .spawners import NAMESPACE, pod_name

CULLER_SERVICE = "gpuspawner-culler"
#: A service standing for the site's Prometheus: it scrapes with a token of the
#: read:metrics scope, as it scrapes the hub's own /hub/metrics (docs/culler.md, "Metrics").
PROMETHEUS_SERVICE = "prometheus"
PROMETHEUS_ROLE = {"name": "prometheus", "scopes": ["read:metrics"], "services": ["prometheus"]}


def prometheus_token(culler_token: str) -> str:
    """The Prometheus service's token in a hub started with ``culler_token``."""
    return f"{culler_token}-prometheus"


def shipped_config():
    """config/jupyterhub_config.py as we ship it."""
    import os

    old = os.environ.get("GPUSPAWNER_CATALOG")
    os.environ["GPUSPAWNER_CATALOG"] = str(REPO / "config" / "catalog.yaml")
    try:
        return PyFileConfigLoader("jupyterhub_config.py", str(REPO / "config")).load_config()
    finally:
        if old is None:
            os.environ.pop("GPUSPAWNER_CATALOG", None)
        else:
            os.environ["GPUSPAWNER_CATALOG"] = old


def _shipped_roles() -> list[dict]:
    load_roles = shipped_config().JupyterHub.load_roles
    if hasattr(load_roles, "get_value"):  # appended to: a LazyConfigValue
        load_roles = load_roles.get_value([])
    return list(load_roles)


def shipped_culler_role() -> dict:
    """The culler's role as registered in config/jupyterhub_config.py (the one we ship)."""
    roles = [r for r in _shipped_roles() if CULLER_SERVICE in r.get("services", [])]
    assert len(roles) == 1, roles
    return roles[0]


def shipped_user_role() -> dict:
    """The role every user has, as shipped: it lets users (and servers) ask the culler."""
    [role] = [r for r in _shipped_roles() if r["name"] == "user"]
    return role


def shipped_server_token_scopes() -> list[str]:
    """c.Spawner.server_token_scopes as shipped."""
    return list(shipped_config().Spawner.server_token_scopes)


def hub_config(
    token: str,
    extra_scopes: list[str],
    spawner: str = "SingleuserSpawner",
    managed_port: int | None = None,
    home: Path | None = None,
) -> str:
    """Hub config: the test spawner on loopback, and the culler service with the shipped scopes.

    ``extra_scopes``: ``admin:server_state``, which the tests need because their
    servers' pod names come from spawner state (the shipped config reads pods from
    Kubernetes instead).
    """
    role = shipped_culler_role()
    scopes = list(role["scopes"]) + list(extra_scopes)
    singleuser = Path(sys.executable).parent / "jupyterhub-singleuser"
    service = {"name": CULLER_SERVICE, "api_token": token}
    if managed_port:
        # run by the hub like the shipped config does, in dry-run so it only reports
        service.update(
            command=[
                sys.executable,
                "-m",
                "gpuspawner.culler",
                "--dry-run",
                "--cull-every=1",
                "--kubernetes=off",
                "--min-running=0",
                "--timeout=1",
            ],
            url=f"http://127.0.0.1:{managed_port}",
            environment={"PYTHONPATH": str(REPO)},
        )
    return f"""
import sys
sys.path.insert(0, {str(REPO)!r})
c.JupyterHub.spawner_class = "tests.culler.spawners.{spawner}"
c.Spawner.ip = "127.0.0.1"
c.Spawner.cmd = [{str(singleuser)!r}]
c.Spawner.args = ["--allow-root", "--ServerApp.jpserver_extensions={{'jupyterlab': False}}"]
c.Spawner.start_timeout = 90
c.Spawner.http_timeout = 90
c.Spawner.default_url = "/api"
c.SimpleLocalProcessSpawner.home_dir_template = {str(home or "/tmp/gpuspawner-culler-test-home") + "/{username}"!r}
c.JupyterHub.last_activity_interval = 2
c.JupyterHub.tornado_settings = {{"slow_spawn_timeout": 0}}
c.JupyterHub.services.append({service!r})
c.JupyterHub.load_roles.append({{"name": "culler-test", "scopes": {scopes!r}, "services": [{CULLER_SERVICE!r}]}})
c.JupyterHub.load_roles.append({shipped_user_role()!r})
c.JupyterHub.services.append({{"name": {PROMETHEUS_SERVICE!r}, "api_token": {prometheus_token(token)!r}}})
c.JupyterHub.load_roles.append({PROMETHEUS_ROLE!r})
"""


def start_culler_hub(workdir: Path, token: str, extra: str = "", **kw) -> Hub:
    hub = start_hub(
        workdir,
        extra_config=hub_config(token, ["admin:server_state"], home=workdir / "home", **kw) + extra,
        env={"PYTHONPATH": str(REPO)},
        timeout=90,
    )
    if hub.process.poll() is not None:
        raise RuntimeError(f"JupyterHub exited during start:\n{hub.log()[-3000:]}")
    return hub


def spawn(hub: Hub, user: str, options: dict, server: str = "") -> None:
    hub.api("POST", f"/users/{user}")  # 201, or 409 if it exists
    path = f"/users/{user}/servers/{server}" if server else f"/users/{user}/server"
    r = hub.api("POST", path, options)
    assert r.status in (201, 202), (r.status, r.body)


def wait_ready(hub: Hub, user: str, server: str = "", timeout: float = 90) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        model = hub.api("GET", f"/users/{user}").json()
        s = (model.get("servers") or {}).get(server)
        if s and s.get("ready"):
            return s
        time.sleep(0.3)
    raise AssertionError(f"{user}/{server} did not become ready:\n{hub.log()[-3000:]}")


def server_state(hub: Hub, user: str, server: str = "") -> str:
    """'running', 'stopping' or 'stopped' as the hub says."""
    model = hub.api("GET", f"/users/{user}").json()
    s = (model.get("servers") or {}).get(server)
    if s is None:
        return "stopped"
    if s.get("pending") == "stop":
        return "stopping"
    return "running" if s.get("ready") else str(s.get("pending"))


def wait_stopped(hub: Hub, user: str, server: str = "", timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server_state(hub, user, server) == "stopped":
            return
        time.sleep(0.3)
    raise AssertionError(f"{user}/{server} was not stopped")


def stop_all(hub: Hub) -> None:
    for user in hub.api("GET", "/users?state=active").json():
        for name in user.get("servers", {}):
            path = (
                f"/users/{user['name']}/servers/{name}" if name else f"/users/{user['name']}/server"
            )
            hub.api("DELETE", path)
    for user in hub.api("GET", "/users").json():
        for name in user.get("servers", {}):
            wait_stopped(hub, user["name"], name)


def make_culler(hub: Hub, token: str, **traits) -> GPUCuller:
    """A culler in this process, configured like the service, talking to the hub through its proxy."""
    config = Config()
    defaults = {
        "hub_api_url": f"{hub.public_url}/hub/api",
        "api_token": token,
        "kubernetes": "off",
        "metrics_url": "",
        "min_running": 0,
        "gpu_window": 120,
        "gpu_query_step": 1,
        "gpu_freshness": 5,
        "backoff_base": 0.05,
        "backoff_max": 0.2,
        # the service's own default: a DELETE answers once the hub has stopped the server,
        # which took 8 s for a JupyterHub 5.5 single-user server on a loaded machine
        "hub_timeout": 30,
        "prometheus_timeout": 5,
    }
    defaults.update(traits)
    for key, value in defaults.items():
        setattr(config.GPUCuller, key, value)
    app = GPUCuller(config=config)
    app.initialize([])
    return app


__all__ = ["NAMESPACE", "pod_name"]
