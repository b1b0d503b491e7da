"""The GPU page's service entry, custom scope and roles, as add_admin writes them into a hub config."""

from __future__ import annotations

import copy
import os
import sys

import pytest
from traitlets.config import Config, LazyConfigValue

from gpuspawner.admin.hubconfig import add_admin

#: The spec: what config/jupyterhub_config.py gave the GPU page by hand before add_admin.
CUSTOM_SCOPES = {
    "custom:gpuspawner:admin": {
        "description": "See the GPU pool page and stop servers from it (gpuspawner-admin)."
    }
}
SERVICE_ROLE = {
    "name": "gpuspawner-admin-service",
    "description": "The GPU page: read users and servers, stop servers",
    "scopes": ["list:users", "read:users", "read:servers", "delete:servers"],
    "services": ["gpuspawner-admin"],
}
ADMINS_SCOPES = ["custom:gpuspawner:admin", "access:services!service=gpuspawner-admin"]


def final(value, default):
    """A setting as the hub will load it (a lazy value applied to the default)."""
    if isinstance(value, LazyConfigValue):
        return copy.deepcopy(value).get_value(default)
    return value


def test_the_service_its_scope_its_roles_and_the_group(monkeypatch):
    monkeypatch.delenv("PGPASSWORD", raising=False)
    monkeypatch.delenv("GPUSPAWNER_ACCOUNTING_DB_URL", raising=False)
    c = Config()
    c.GPUSpawner.catalog_file = "/etc/gpuspawner/catalog.yaml"
    c.JupyterHub.db_url = "postgresql://hub@db/jupyterhub"
    c.Authenticator.admin_users = {"zoe", "ann"}
    entry = add_admin(
        c,
        url="http://127.0.0.1:10102",
        command_args=["--config=/etc/gpuspawner/culler_config.py"],
        environment={"POD_NAMESPACE": "jh"},
    )
    assert final(c.JupyterHub.services, []) == [entry]
    assert entry == {
        "name": "gpuspawner-admin",
        "url": "http://127.0.0.1:10102",
        "command": [
            sys.executable,
            "-m",
            "gpuspawner.admin",
            "--config=/etc/gpuspawner/culler_config.py",
        ],
        "oauth_client_allowed_scopes": ["custom:gpuspawner:admin"],
        "oauth_no_confirm": True,
        # limits and GPU type names from the hub's own catalog; GPU-hours from its database
        "environment": {
            "POD_NAMESPACE": "jh",
            "GPUSPAWNER_CATALOG": "/etc/gpuspawner/catalog.yaml",
            "GPUSPAWNER_ACCOUNTING_DB_URL": "postgresql://hub@db/jupyterhub",
        },
    }
    assert final(c.JupyterHub.custom_scopes, {}) == CUSTOM_SCOPES
    assert final(c.JupyterHub.load_roles, []) == [
        SERVICE_ROLE,
        {
            "name": "gpuspawner-admins",
            "description": "See and steer the GPU pool",
            "scopes": ADMINS_SCOPES,
            # the hub's admin users and the group gpu-admins
            "users": ["ann", "zoe"],
            "groups": ["gpu-admins"],
        },
    ]
    assert final(c.JupyterHub.load_groups, {}) == {"gpu-admins": {"users": []}}
    # the page is for its admins only: no 'user' role grant
    assert not [r for r in final(c.JupyterHub.load_roles, []) if r["name"] == "user"]


def test_never_admin():
    c = Config()
    add_admin(c)
    (role,) = [
        r for r in final(c.JupyterHub.load_roles, []) if "gpuspawner-admin" in r.get("services", [])
    ]
    for forbidden in ("admin", "admin:users", "admin:servers", "access:servers"):
        assert forbidden not in role["scopes"]


def test_who_sees_the_page_may_be_named():
    c = Config()
    c.Authenticator.admin_users = {"root"}
    c.GPUSpawner.accounting_enabled = False
    add_admin(c, users=["admin"], groups=(), ip="0.0.0.0", python="python3")
    roles = {r["name"]: r for r in final(c.JupyterHub.load_roles, [])}
    assert roles["gpuspawner-admins"] == {
        "name": "gpuspawner-admins",
        "description": "See and steer the GPU pool",
        "scopes": ADMINS_SCOPES,
        "users": ["admin"],
    }
    assert "load_groups" not in c.JupyterHub
    (entry,) = final(c.JupyterHub.services, [])
    assert entry["command"] == ["python3", "-m", "gpuspawner.admin", "--ip=0.0.0.0"]
    assert entry["environment"] == {}  # no catalog, accounting off: nothing passed on


def test_a_lazily_added_admin_user_counts():
    c = Config()
    c.Authenticator.admin_users.add("ann")
    add_admin(c, groups=())
    roles = {r["name"]: r for r in final(c.JupyterHub.load_roles, [])}
    assert roles["gpuspawner-admins"]["users"] == ["ann"]


def test_existing_entries_scopes_groups_and_roles_are_completed_not_replaced():
    c = Config()
    c.JupyterHub.services = [{"name": "gpuspawner-admin", "api_token": "secret"}]
    c.JupyterHub.custom_scopes = {"custom:other": {"description": "another"}}
    c.JupyterHub.load_groups = {"gpu-admins": {"users": ["ann"]}, "students": {"users": []}}
    c.JupyterHub.load_roles = [
        {"name": "gpuspawner-admins", "scopes": ["read:users:groups"], "users": ["bob"]},
    ]
    add_admin(c, users=["ann"])
    add_admin(c, users=["ann"])  # twice: nothing doubles
    assert c.JupyterHub.services[0]["api_token"] == "secret"
    assert len(c.JupyterHub.services) == 1
    assert c.JupyterHub.custom_scopes == {
        "custom:other": {"description": "another"},
        **CUSTOM_SCOPES,
    }
    assert c.JupyterHub.load_groups == {
        "gpu-admins": {"users": ["ann"]},
        "students": {"users": []},
    }
    assert c.JupyterHub.load_roles == [
        {
            "name": "gpuspawner-admins",
            "scopes": ["read:users:groups", *ADMINS_SCOPES],
            "users": ["bob", "ann"],
            "description": "See and steer the GPU pool",
            "groups": ["gpu-admins"],
        },
        SERVICE_ROLE,
    ]


@pytest.mark.parametrize(
    ("settings", "environ", "expected"),
    [
        # the hub's own database, a relative SQLite path made absolute against the hub's cwd
        ({}, {}, "sqlite:////srv/jupyterhub/jupyterhub.sqlite"),
        (
            {"JupyterHub.db_url": "sqlite:///data/hub.sqlite"},
            {},
            "sqlite:////srv/jupyterhub/data/hub.sqlite",
        ),
        ({"JupyterHub.db_url": "sqlite:////abs/hub.sqlite"}, {}, "sqlite:////abs/hub.sqlite"),
        # a database of the admin's choosing, in the config or (a Secret's) environment
        (
            {"GPUSpawner.accounting_db_url": "postgresql://acct@db/usage"},
            {},
            "postgresql://acct@db/usage",
        ),
        ({"KubeSpawner.accounting_db_url": "postgresql://k@db/u"}, {}, "postgresql://k@db/u"),
        ({}, {"GPUSPAWNER_ACCOUNTING_DB_URL": "postgresql://env@db/u"}, "postgresql://env@db/u"),
        # accounting off: the page gets no database
        ({"GPUSpawner.accounting_enabled": False, "JupyterHub.db_url": "sqlite:////x"}, {}, None),
    ],
)
def test_the_usage_database_is_the_hubs(monkeypatch, settings, environ, expected):
    monkeypatch.delenv("GPUSPAWNER_ACCOUNTING_DB_URL", raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(os, "getcwd", lambda: "/srv/jupyterhub")
    c = Config()
    for key, value in settings.items():
        section, name = key.split(".")
        setattr(c[section], name, value)
    entry = add_admin(c)
    assert entry["environment"].get("GPUSPAWNER_ACCOUNTING_DB_URL") == expected


def test_a_postgresql_password_the_hub_holds_in_its_environment_is_passed_on(monkeypatch):
    """zero-to-jupyterhub sets hub.db.password as PGPASSWORD in the hub's process only."""
    monkeypatch.delenv("GPUSPAWNER_ACCOUNTING_DB_URL", raising=False)
    monkeypatch.setenv("PGPASSWORD", "s3cret")
    c = Config()
    c.JupyterHub.db_url = "postgresql://jupyterhub@postgres:5432/jupyterhub"
    assert add_admin(c)["environment"] == {
        "GPUSPAWNER_ACCOUNTING_DB_URL": "postgresql://jupyterhub@postgres:5432/jupyterhub",
        "PGPASSWORD": "s3cret",
    }
    sqlite = Config()
    sqlite.JupyterHub.db_url = "sqlite:////srv/jupyterhub/jupyterhub.sqlite"
    assert "PGPASSWORD" not in add_admin(sqlite)["environment"]
