"""The culler's service entry, role and users' access, as add_culler writes them into a hub config."""

from __future__ import annotations

import os
import sys

from traitlets.config import Config

from gpuspawner.culler.hubconfig import add_culler

from ..hubconfigs import final, load_as_subconfig

#: The spec: the scopes config/jupyterhub_config.py gave the culler by hand before add_culler.
CULLER_SCOPES = [
    "list:users",
    "read:users:activity",
    "read:servers",
    "delete:servers",
    "read:metrics",
    "read:users:groups",  # whose group budget applies
]
ACCESS = "access:services!service=gpuspawner-culler"
CULLER_ROLE = {
    "name": "gpuspawner-culler",
    "description": "Stop idle servers (gpuspawner-culler)",
    "scopes": CULLER_SCOPES,
    "services": ["gpuspawner-culler"],
}
#: The server role's defaults, plus the culler for JupyterLab's cull warning.
SERVER_TOKEN_SCOPES = ["users:activity!user", "access:servers!server", ACCESS]


def test_the_service_its_role_and_every_users_access():
    c = Config()
    entry = add_culler(
        c,
        url="http://127.0.0.1:10101",
        command_args=["--config=/etc/gpuspawner/culler_config.py"],
        environment={"POD_NAMESPACE": "jh"},
    )
    assert final(c.JupyterHub.services) == [entry]
    assert entry == {
        "name": "gpuspawner-culler",
        "url": "http://127.0.0.1:10101",
        "command": [
            sys.executable,
            "-m",
            "gpuspawner.culler",
            "--config=/etc/gpuspawner/culler_config.py",
        ],
        "environment": {
            "POD_NAMESPACE": "jh",
            # the hub's own database, relative to its working directory: what budgets used
            "GPUSPAWNER_ACCOUNTING_DB_URL": f"sqlite:///{os.getcwd()}/jupyterhub.sqlite",
        },
    }
    assert final(c.JupyterHub.load_roles) == [
        CULLER_ROLE,
        {"name": "user", "scopes": ["self", ACCESS]},
    ]
    assert c.Spawner.server_token_scopes == SERVER_TOKEN_SCOPES
    # no notebook variable unless the deployment says where notebooks reach the culler
    assert "environment" not in c.Spawner


def test_least_rights():
    c = Config()
    add_culler(c)
    (role,) = [r for r in final(c.JupyterHub.load_roles) if r["name"] == "gpuspawner-culler"]
    for forbidden in ("access:servers", "admin", "admin:users", "admin:servers", "read:users"):
        assert forbidden not in role["scopes"]


def test_in_another_pod_than_the_proxy_it_listens_on_every_address_of_its_port():
    c = Config()
    entry = add_culler(c, url="http://hub:10101", ip="0.0.0.0", python="python3")
    assert entry["command"] == [
        "python3",
        "-m",
        "gpuspawner.culler",
        "--metrics-url=http://0.0.0.0:10101",
    ]
    assert entry["url"] == "http://hub:10101"


def test_notebooks_are_told_where_the_culler_is():
    c = Config()
    add_culler(c, warning_url="http://hub:8000/services/gpuspawner-culler/")
    assert final(c.Spawner.environment, {}) == {
        "GPUSPAWNER_CULLER_URL": "http://hub:8000/services/gpuspawner-culler/"
    }


def test_the_warning_url_goes_where_the_spawner_reads_its_environment():
    """zero-to-jupyterhub sets c.KubeSpawner.environment (singleuser.extraEnv), which
    hides c.Spawner.environment: the variable joins it, and an admin's own stays."""
    c = Config()
    c.KubeSpawner.environment = {"A": "1"}
    add_culler(c, warning_url="http://proxy-public/services/gpuspawner-culler/")
    assert c.KubeSpawner.environment == {
        "A": "1",
        "GPUSPAWNER_CULLER_URL": "http://proxy-public/services/gpuspawner-culler/",
    }
    assert "environment" not in c.Spawner
    c = Config()
    c.Spawner.environment = {"GPUSPAWNER_CULLER_URL": "http://mine/"}
    add_culler(c, warning_url="http://elsewhere/")
    assert c.Spawner.environment == {"GPUSPAWNER_CULLER_URL": "http://mine/"}


def test_existing_entries_roles_and_server_scopes_are_completed_not_replaced():
    c = Config()
    c.JupyterHub.services = [
        {"name": "tester", "api_token": "t"},
        # as zero-to-jupyterhub's hub.services makes it: a name and a token
        {"name": "gpuspawner-culler", "api_token": "secret", "environment": {"X": "own"}},
    ]
    c.JupyterHub.load_roles = [
        {"name": "tester", "scopes": ["admin:users"], "services": ["tester"]},
        {"name": "user", "scopes": ["self", "read:users:groups!user"]},
        # the admin's addition for exempt_groups
        {"name": "gpuspawner-culler", "scopes": ["read:users:groups"]},
    ]
    c.Spawner.server_token_scopes = ["users:activity!user", "access:servers!server", "x:y"]
    add_culler(c, environment={"X": "hub", "Y": "hub"})
    add_culler(c, environment={"X": "hub", "Y": "hub"})  # twice: nothing doubles
    services = c.JupyterHub.services
    assert [s["name"] for s in services] == ["tester", "gpuspawner-culler"]
    culler = services[1]
    assert culler["api_token"] == "secret"
    assert culler["url"] == "http://127.0.0.1:10101"
    assert culler["environment"] == {
        "X": "own",
        "Y": "hub",
        "GPUSPAWNER_ACCOUNTING_DB_URL": f"sqlite:///{os.getcwd()}/jupyterhub.sqlite",
    }
    assert c.JupyterHub.load_roles == [
        {"name": "tester", "scopes": ["admin:users"], "services": ["tester"]},
        {"name": "user", "scopes": ["self", "read:users:groups!user", ACCESS]},
        {
            "name": "gpuspawner-culler",
            # the admin's scope first, ours without doubling it
            "scopes": ["read:users:groups", *CULLER_SCOPES[:-1]],
            "description": "Stop idle servers (gpuspawner-culler)",
            "services": ["gpuspawner-culler"],
        },
    ]
    assert c.Spawner.server_token_scopes == [
        "users:activity!user",
        "access:servers!server",
        "x:y",
        ACCESS,
    ]


def test_a_callable_server_token_scopes_is_left_to_the_admin():
    def scopes(spawner):
        return ["access:servers!server"]

    c = Config()
    c.KubeSpawner.server_token_scopes = scopes
    add_culler(c)
    assert c.KubeSpawner.server_token_scopes is scopes
    assert "server_token_scopes" not in c.Spawner


def test_a_sub_config_keeps_the_parents_services_and_roles(tmp_path):
    """config/sandbox/jupyterhub_config.py is loaded with load_subconfig after a preamble."""
    c = load_as_subconfig(
        tmp_path,
        "from gpuspawner.culler.hubconfig import add_culler\nadd_culler(c, url='http://127.0.0.1:9')\n",
    )
    assert [s["name"] for s in final(c.JupyterHub.services)] == ["tester", "gpuspawner-culler"]
    assert [r["name"] for r in final(c.JupyterHub.load_roles)] == [
        "tester",
        "gpuspawner-culler",
        "user",
    ]


def test_appended_server_token_scopes_keep_the_server_roles_and_get_the_culler():
    c = Config()
    c.Spawner.server_token_scopes.append("read:users:groups!user")
    add_culler(c)
    add_culler(c)
    assert final(c.Spawner.server_token_scopes) == [
        "read:users:groups!user",
        *SERVER_TOKEN_SCOPES,
    ]


def test_the_hubs_catalog_and_usage_database_reach_the_culler(monkeypatch):
    """max_runtime, max_keep and budgets from the hub's catalog; what budgets used from
    the database the hub records in (a relative SQLite path made absolute)."""
    monkeypatch.delenv("GPUSPAWNER_ACCOUNTING_DB_URL", raising=False)
    # zero-to-jupyterhub's hub.db.password is in the hub's process only, as libpq's variable
    monkeypatch.setenv("PGPASSWORD", "s3cret")
    c = Config()
    c.GPUSpawner.catalog_file = "/etc/gpuspawner/catalog.yaml"
    c.JupyterHub.db_url = "postgresql://hub@db/jupyterhub"
    entry = add_culler(c)
    assert entry["environment"] == {
        "GPUSPAWNER_CATALOG": "/etc/gpuspawner/catalog.yaml",
        "GPUSPAWNER_ACCOUNTING_DB_URL": "postgresql://hub@db/jupyterhub",
        "PGPASSWORD": "s3cret",
    }
    c = Config()
    c.GPUSpawner.accounting_enabled = False
    assert add_culler(c)["environment"] == {}
