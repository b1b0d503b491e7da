"""The hub configuration that runs the gpuspawner service, read from the hub's own settings."""

from __future__ import annotations

import copy
import json
import sys

from traitlets.config import Config, LazyConfigValue, PyFileConfigLoader

from gpuspawner.userservice import SERVICE_NAME
from gpuspawner.userservice.app import CATALOG_JSON_ENV, PLACEMENT_ENV, UserService
from gpuspawner.userservice.hubconfig import add_service, spawner_setting

SCOPE = "access:services!service=gpuspawner"


def final(value):
    """A list setting as the hub will load it (a lazy value applied to the default [])."""
    return copy.deepcopy(value).get_value([]) if isinstance(value, LazyConfigValue) else value


def test_the_service_gets_the_catalog_and_placement_the_spawner_has():
    c = Config()
    c.GPUSpawner.catalog_file = "/etc/gpuspawner/catalog.yaml"
    c.KubeSpawner.node_selector = {"pool": "gpu"}
    c.KubeSpawner.tolerations = [{"key": "dedicated", "operator": "Exists"}]
    c.KubeSpawner.namespace = "hub-ns"
    entry = add_service(
        c, url="http://127.0.0.1:10103", environ={"KUBECONFIG": "/k", "HOME": "/root"}
    )
    assert final(c.JupyterHub.services) == [entry]
    assert entry["name"] == SERVICE_NAME == "gpuspawner"
    assert entry["url"] == "http://127.0.0.1:10103"
    assert entry["command"] == [
        sys.executable,
        "-m",
        "gpuspawner.userservice",
        "--namespace=hub-ns",
    ]
    env = entry["environment"]
    assert "HOME" not in env and env["KUBECONFIG"] == "/k"
    assert env["GPUSPAWNER_CATALOG"] == "/etc/gpuspawner/catalog.yaml"
    assert json.loads(env[PLACEMENT_ENV]) == {
        "node_selector": {"pool": "gpu"},
        "tolerations": [{"key": "dedicated", "operator": "Exists"}],
    }
    assert final(c.JupyterHub.load_roles) == [
        {"name": "user", "scopes": ["self", SCOPE]},
        SERVICE_ROLE,
    ]


#: The service's own token reads users' servers with their state (/stop-notices).
SERVICE_ROLE = {
    "name": "gpuspawner-service",
    "description": "Why users' servers stopped (gpuspawner service, /stop-notices)",
    "scopes": ["read:users", "read:servers", "admin:server_state"],
    "services": ["gpuspawner"],
}


def test_the_service_reads_what_the_hub_config_passes(monkeypatch):
    c = Config()
    c.GPUSpawner.catalog = {"images": {}}
    c.KubeSpawner.tolerations.append({"key": "a", "operator": "Exists"})
    c.GPUSpawner.gpu_inventory_all_namespaces = False
    entry = add_service(c, ip="0.0.0.0", environ={})
    # an appended toleration after the service was added still reaches the hub
    c.KubeSpawner.tolerations.append({"key": "b", "operator": "Exists"})
    assert spawner_setting(c, "tolerations", []) == [
        {"key": "a", "operator": "Exists"},
        {"key": "b", "operator": "Exists"},
    ]
    for key, value in entry["environment"].items():
        monkeypatch.setenv(key, value)
    service = UserService()
    service.initialize(entry["command"][3:])
    assert service.ip == "0.0.0.0"
    assert service.all_namespaces is False
    assert service.tolerations == [{"key": "a", "operator": "Exists"}]
    assert service.node_selector == {}
    assert CATALOG_JSON_ENV in entry["environment"] and service.catalog == {"images": {}}


def test_an_existing_user_role_and_service_entry_are_completed_not_replaced():
    c = Config()
    c.JupyterHub.load_roles.append({"name": "user", "scopes": ["self", "read:users:groups!user"]})
    c.JupyterHub.services.append(
        {"name": "gpuspawner", "url": "http://hub:10103", "command": ["python3", "-m", "x"]}
    )
    c.JupyterHub.services.append({"name": "gpuspawner-culler"})
    entry = add_service(c, environ={})
    add_service(c, environ={})  # twice: still one entry, one scope
    assert [s["name"] for s in final(c.JupyterHub.services)] == [
        "gpuspawner",
        "gpuspawner-culler",
    ]
    assert entry["url"] == "http://hub:10103" and entry["command"] == ["python3", "-m", "x"]
    assert entry["oauth_no_confirm"] is True
    assert final(c.JupyterHub.load_roles) == [
        {"name": "user", "scopes": ["self", "read:users:groups!user", SCOPE]},
        SERVICE_ROLE,
    ]


def test_a_sub_config_keeps_the_parents_services_and_roles(tmp_path):
    """config/sandbox/jupyterhub_config.py is loaded with load_subconfig after a preamble."""
    (tmp_path / "sub.py").write_text(
        "c = get_config()\n"
        "c.JupyterHub.services.append({'name': 'gpuspawner-culler'})\n"
        "from gpuspawner.userservice.hubconfig import add_service\n"
        "add_service(c, url='http://127.0.0.1:9')\n"
    )
    (tmp_path / "main.py").write_text(
        "c = get_config()\n"
        "c.JupyterHub.services = [{'name': 'tester'}]\n"
        "c.JupyterHub.load_roles = [{'name': 'tester', 'scopes': ['admin:users']}]\n"
        f"load_subconfig({str(tmp_path / 'sub.py')!r})\n"
    )
    c = PyFileConfigLoader("main.py", path=str(tmp_path)).load_config()
    assert [s["name"] for s in final(c.JupyterHub.services)] == [
        "tester",
        "gpuspawner-culler",
        "gpuspawner",
    ]
    assert [r["name"] for r in final(c.JupyterHub.load_roles)] == [
        "tester",
        "user",
        "gpuspawner-service",
    ]
