"""The hub configuration that runs the gpuspawner service, read from the hub's own settings."""

from __future__ import annotations

import json
import sys

from traitlets.config import Config

from gpuspawner.userservice import SERVICE_NAME
from gpuspawner.userservice.app import (
    ALL_NAMESPACES_ENV,
    CATALOG_JSON_ENV,
    CULLER_URL_ENV,
    PLACEMENT_ENV,
    UserService,
)
from gpuspawner.userservice.hubconfig import add_service, spawner_setting

from ..hubconfigs import final, load_as_subconfig

SCOPE = "access:services!service=gpuspawner"
#: What a user's own token lets the service read for /stop-notices: their own servers,
#: with the saved state the notices are kept in, and nobody else's.
OWN_SERVERS = ["read:servers!user", "admin:server_state!user"]


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
    # the hub's default: its own namespace's pods only, and so the service
    assert env[ALL_NAMESPACES_ENV] == "0"
    # no role for the service: its token holds no scope on users
    assert final(c.JupyterHub.load_roles) == [
        {"name": "user", "scopes": ["self", SCOPE, *OWN_SERVERS]}
    ]
    assert entry["oauth_client_allowed_scopes"] == OWN_SERVERS


def test_the_service_gets_no_scope_on_users_only_their_own_tokens_do():
    """/stop-notices reads with the asking user's token; nothing grants the service's own."""
    c = Config()
    add_service(c, environ={})
    roles = final(c.JupyterHub.load_roles)
    assert not any(r.get("services") for r in roles), roles
    (user,) = roles
    # every scope beyond 'self' is filtered to the user's own, or is the access scope
    assert all(s == SCOPE or s.endswith("!user") for s in user["scopes"] if s != "self")


def test_the_service_follows_the_hubs_namespace_setting_whatever_its_command(monkeypatch):
    """zero-to-jupyterhub's entry comes with its own command: the setting travels by the
    environment, so an admin's opt-in reaches the service too."""
    for setting, expected in ((True, True), (False, False), (None, False)):
        c = Config()
        if setting is not None:
            c.GPUSpawner.gpu_inventory_all_namespaces = setting
        c.JupyterHub.services.append(
            {"name": "gpuspawner", "command": ["python3", "-m", "gpuspawner.userservice"]}
        )
        entry = add_service(c, environ={})
        monkeypatch.setenv(ALL_NAMESPACES_ENV, entry["environment"][ALL_NAMESPACES_ENV])
        service = UserService()
        service.initialize(entry["command"][3:])
        assert service.all_namespaces is expected, setting
    monkeypatch.delenv(ALL_NAMESPACES_ENV)
    alone = UserService()
    alone.initialize([])
    assert alone.all_namespaces is False  # started by hand: the hub's default


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
        {"name": "user", "scopes": ["self", "read:users:groups!user", SCOPE, *OWN_SERVERS]}
    ]


def test_a_sub_config_keeps_the_parents_services_and_roles(tmp_path):
    """config/sandbox/jupyterhub_config.py is loaded with load_subconfig after a preamble."""
    c = load_as_subconfig(
        tmp_path,
        "c.JupyterHub.services.append({'name': 'gpuspawner-culler'})\n"
        "from gpuspawner.userservice.hubconfig import add_service\n"
        "add_service(c, url='http://127.0.0.1:9')\n",
    )
    assert [s["name"] for s in final(c.JupyterHub.services)] == [
        "tester",
        "gpuspawner-culler",
        "gpuspawner",
    ]
    assert [r["name"] for r in final(c.JupyterHub.load_roles)] == ["tester", "user"]


def test_the_service_is_told_where_the_culler_is_and_gets_no_role_for_it(monkeypatch):
    """Keeps go to the culler's own url with the service's token, which needs no scope."""
    c = Config()
    c.JupyterHub.services.append({"name": "gpuspawner-culler", "url": "http://hub:10101"})
    entry = add_service(c, environ={})
    assert entry["environment"][CULLER_URL_ENV] == "http://hub:10101"
    roles = final(c.JupyterHub.load_roles)
    assert not any(r.get("services") for r in roles), roles
    monkeypatch.setenv(CULLER_URL_ENV, entry["environment"][CULLER_URL_ENV])
    service = UserService()
    service.initialize([])
    assert service.culler_url == "http://hub:10101"
    # no culler in the config: nothing to forward to, and the service says so when asked
    alone = add_service(Config(), environ={})
    assert CULLER_URL_ENV not in alone["environment"]
