"""gpuspawner.setup(c, …): the catalog check, the pages, the three services and their roles.

The expected values below are the spec: what the three hub configurations
wired by hand before setup existed (config/jupyterhub_config.py,
config/sandbox/jupyterhub_config.py, config/z2jh-values.yaml), scope for scope.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
import yaml
from traitlets.config import Config, PyFileConfigLoader

import gpuspawner
from gpuspawner import hubsetup
from gpuspawner.hub.pages import TEMPLATE_PATH

from .conftest import FIXTURES, REPO
from .hubconfigs import final, load_as_subconfig
from .hubconfigs import helm_merged as merged

CHART = REPO.parent / "shared" / "third-party" / "zero-to-jupyterhub-k8s-4.4.0" / "jupyterhub"
PY = sys.executable

CULLER_ACCESS = "access:services!service=gpuspawner-culler"
SERVICE_ACCESS = "access:services!service=gpuspawner"
OWN_SERVERS = ["read:servers!user", "admin:server_state!user"]
CULLER_ROLE = {
    "name": "gpuspawner-culler",
    "description": "Stop idle servers (gpuspawner-culler)",
    "scopes": [
        "list:users",
        "read:users:activity",
        "read:servers",
        "delete:servers",
        "read:metrics",
        "read:users:groups",
    ],
    "services": ["gpuspawner-culler"],
}
ADMIN_SERVICE_ROLE = {
    "name": "gpuspawner-admin-service",
    "description": "The GPU page: read users and servers, stop servers",
    "scopes": ["list:users", "read:users", "read:servers", "delete:servers"],
    "services": ["gpuspawner-admin"],
}
ADMINS_SCOPES = ["custom:gpuspawner:admin", "access:services!service=gpuspawner-admin"]
USER_ROLE = {"name": "user", "scopes": ["self", CULLER_ACCESS, SERVICE_ACCESS, *OWN_SERVERS]}
CUSTOM_SCOPES = {
    "custom:gpuspawner:admin": {
        "description": "See the GPU pool page and stop servers from it (gpuspawner-admin)."
    }
}
SERVER_TOKEN_SCOPES = ["users:activity!user", "access:servers!server", CULLER_ACCESS]
IN_CLUSTER = {
    "KUBERNETES_SERVICE_HOST": "10.96.0.1",
    "KUBERNETES_SERVICE_PORT": "443",
    "POD_NAMESPACE": "jupyterhub",
}
NO_PLACEMENT = '{"node_selector": {}, "tolerations": []}'


def wiring(c: Config, spawner_section: str = "Spawner") -> dict:
    """What the services' wiring set, with every role's scopes in order (JupyterHub's is a set)."""
    roles = {}
    hub = c.JupyterHub
    for role in final(hub.get("load_roles", []), []):
        assert role["name"] not in roles, f"JupyterHub refuses a second role {role['name']}"
        roles[role["name"]] = {k: sorted(v) if k == "scopes" else v for k, v in role.items()}
    services = {}
    for service in final(hub.get("services", []), []):
        assert service["name"] not in services
        services[service["name"]] = service
    return {
        "services": services,
        "roles": roles,
        "custom_scopes": final(hub.get("custom_scopes", {}), {}),
        "load_groups": final(hub.get("load_groups", {}), {}),
        "server_token_scopes": c.Spawner.get("server_token_scopes"),
        "environment": final(c[spawner_section].get("environment", {}), {}),
        "template_paths": final(hub.get("template_paths", []), []),
    }


def roles(*specs: dict) -> dict:
    return {r["name"]: {k: sorted(v) if k == "scopes" else v for k, v in r.items()} for r in specs}


def admins_role(**members) -> dict:
    return {
        "name": "gpuspawner-admins",
        "description": "See and steer the GPU pool",
        "scopes": ADMINS_SCOPES,
        **members,
    }


def usage_db(cwd: Path | None = None) -> dict[str, str]:
    """The culler's and the GPU page's usage database by default: the hub's own SQLite file,
    made absolute against the hub's working directory (a service may start elsewhere)."""
    return {"GPUSPAWNER_ACCOUNTING_DB_URL": f"sqlite:///{cwd or Path.cwd()}/jupyterhub.sqlite"}


@pytest.fixture
def hub_environ(monkeypatch):
    """A hub's environment with only what a test sets (the configs read os.environ)."""
    for key in list(os.environ):
        if key.startswith(("GPUSPAWNER_", "KUBERNETES_", "HUB_SERVICE_")) or key in (
            "KUBECONFIG",
            "POD_NAMESPACE",
        ):
            monkeypatch.delenv(key)
    return monkeypatch


def test_setup_adds_the_three_services_their_roles_and_the_pages():
    c = Config()
    added = hubsetup.setup(c, environ={})
    assert list(added) == ["gpuspawner-culler", "gpuspawner-admin", "gpuspawner"]
    got = wiring(c)
    assert got["services"] == {
        "gpuspawner-culler": {
            "name": "gpuspawner-culler",
            "url": "http://127.0.0.1:10101",
            "command": [PY, "-m", "gpuspawner.culler"],
            "environment": usage_db(),
        },
        "gpuspawner-admin": {
            "name": "gpuspawner-admin",
            "url": "http://127.0.0.1:10102",
            "command": [PY, "-m", "gpuspawner.admin"],
            "oauth_client_allowed_scopes": ["custom:gpuspawner:admin"],
            "oauth_no_confirm": True,
            "environment": usage_db(),
        },
        "gpuspawner": {
            "name": "gpuspawner",
            "url": "http://127.0.0.1:10103",
            "command": [PY, "-m", "gpuspawner.userservice"],
            "oauth_no_confirm": True,
            "oauth_client_allowed_scopes": OWN_SERVERS,
            "environment": {
                "GPUSPAWNER_PLACEMENT": NO_PLACEMENT,
                "GPUSPAWNER_ALL_NAMESPACES": "0",
                # where it forwards a user's "keep it"
                "GPUSPAWNER_CULLER_URL": "http://127.0.0.1:10101",
            },
        },
    }
    assert got["roles"] == roles(
        CULLER_ROLE,
        USER_ROLE,
        ADMIN_SERVICE_ROLE,
        admins_role(groups=["gpu-admins"]),
    )
    # every user's role: 'self', then each service's grants in the order of the services
    assert final(c.JupyterHub.load_roles, [])[1] == USER_ROLE
    assert got["custom_scopes"] == CUSTOM_SCOPES
    assert got["load_groups"] == {"gpu-admins": {"users": []}}
    assert got["server_token_scopes"] == SERVER_TOKEN_SCOPES
    assert got["environment"] == {}  # no warning_url: notebooks are not told
    assert got["template_paths"] == [TEMPLATE_PATH]
    assert "gpuspawner_notices" in final(c.JupyterHub.template_vars, {})


def test_services_turned_off_are_not_added_nor_their_grants():
    c = Config()
    assert list(hubsetup.setup(c, culler=False, admin=False, environ={})) == ["gpuspawner"]
    got = wiring(c)
    assert got["roles"] == roles({"name": "user", "scopes": ["self", SERVICE_ACCESS, *OWN_SERVERS]})
    assert "server_token_scopes" not in c.Spawner
    assert "custom_scopes" not in c.JupyterHub
    c = Config()
    assert list(hubsetup.setup(c, user_service=False, admin=False, environ={})) == [
        "gpuspawner-culler"
    ]
    assert wiring(c)["roles"] == roles(
        CULLER_ROLE, {"name": "user", "scopes": ["self", CULLER_ACCESS]}
    )


def test_setup_keeps_what_the_config_has_and_adds_nothing_twice():
    c = Config()
    c.JupyterHub.services = [{"name": "tester", "api_token": "t"}]
    c.JupyterHub.load_roles = [
        {"name": "tester", "scopes": ["admin:users"], "services": ["tester"]},
        {"name": "user", "scopes": ["self", "read:users:groups!user"]},
    ]
    c.JupyterHub.custom_scopes = {"custom:other": {"description": "x"}}
    c.JupyterHub.load_groups = {"students": {"users": ["stu"]}}
    c.JupyterHub.template_paths = ["/mine"]
    for _ in range(2):
        hubsetup.setup(c, environ={})
    got = wiring(c)
    assert list(got["services"]) == [
        "tester",
        "gpuspawner-culler",
        "gpuspawner-admin",
        "gpuspawner",
    ]
    assert got["services"]["tester"] == {"name": "tester", "api_token": "t"}
    assert got["roles"] == roles(
        {"name": "tester", "scopes": ["admin:users"], "services": ["tester"]},
        {"name": "user", "scopes": [*USER_ROLE["scopes"], "read:users:groups!user"]},
        CULLER_ROLE,
        ADMIN_SERVICE_ROLE,
        admins_role(groups=["gpu-admins"]),
    )
    assert got["custom_scopes"] == {"custom:other": {"description": "x"}, **CUSTOM_SCOPES}
    assert got["load_groups"] == {"students": {"users": ["stu"]}, "gpu-admins": {"users": []}}
    assert got["template_paths"] == [TEMPLATE_PATH, "/mine"]


def test_a_sub_config_keeps_the_parents_services_and_roles(tmp_path):
    """config/sandbox/jupyterhub_config.py is loaded with load_subconfig after a preamble."""
    c = load_as_subconfig(tmp_path, "import gpuspawner\ngpuspawner.setup(c, environ={})\n")
    got = wiring(c)
    assert list(got["services"]) == [
        "tester",
        "gpuspawner-culler",
        "gpuspawner-admin",
        "gpuspawner",
    ]
    assert list(got["roles"]) == [
        "tester",
        "gpuspawner-culler",
        "user",
        "gpuspawner-admin-service",
        "gpuspawner-admins",
    ]


def test_a_bad_catalog_stops_the_hub_at_setup(tmp_path):
    bad = tmp_path / "catalog.yaml"
    bad.write_text("images: [not, a, mapping]\n")
    c = Config()
    c.GPUSpawner.catalog_file = str(bad)
    with pytest.raises(SystemExit):
        hubsetup.setup(c, environ={})


def test_gpuspawner_setup_is_imported_only_when_used():
    assert gpuspawner.setup is hubsetup.setup
    assert "setup" in gpuspawner.__all__
    code = "import sys, gpuspawner; assert 'gpuspawner.hubsetup' not in sys.modules, sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, timeout=60)


# --- the three shipped configurations -------------------------------------------------


def test_the_in_cluster_config_wires_what_it_did_by_hand(hub_environ):
    for key, value in {
        **IN_CLUSTER,
        "GPUSPAWNER_CATALOG": str(REPO / "config" / "catalog.yaml"),
    }.items():
        hub_environ.setenv(key, value)
    c = PyFileConfigLoader("jupyterhub_config.py", str(REPO / "config")).load_config()
    catalog = str(REPO / "config" / "catalog.yaml")
    culler_config = "--config=/etc/gpuspawner/culler_config.py"
    got = wiring(c)
    assert got["services"] == {
        "gpuspawner-culler": {
            "name": "gpuspawner-culler",
            "command": [PY, "-m", "gpuspawner.culler", culler_config],
            "url": "http://127.0.0.1:10101",
            "environment": {**IN_CLUSTER, "GPUSPAWNER_CATALOG": catalog, **usage_db()},
        },
        "gpuspawner-admin": {
            "name": "gpuspawner-admin",
            "url": "http://127.0.0.1:10102",
            "command": [PY, "-m", "gpuspawner.admin", culler_config],
            "oauth_client_allowed_scopes": ["custom:gpuspawner:admin"],
            "oauth_no_confirm": True,
            "environment": {"GPUSPAWNER_CATALOG": catalog, **IN_CLUSTER, **usage_db()},
        },
        "gpuspawner": {
            "name": "gpuspawner",
            "url": "http://127.0.0.1:10103",
            "command": [PY, "-m", "gpuspawner.userservice", "--namespace=jupyterhub"],
            "oauth_no_confirm": True,
            "oauth_client_allowed_scopes": OWN_SERVERS,
            "environment": {
                **IN_CLUSTER,
                "GPUSPAWNER_CATALOG": catalog,
                "GPUSPAWNER_PLACEMENT": NO_PLACEMENT,
                "GPUSPAWNER_ALL_NAMESPACES": "0",
                "GPUSPAWNER_CULLER_URL": "http://127.0.0.1:10101",
            },
        },
    }
    assert got["roles"] == roles(
        CULLER_ROLE,
        USER_ROLE,
        ADMIN_SERVICE_ROLE,
        # the hub's admin users (none set in the file) and the group gpu-admins
        admins_role(groups=["gpu-admins"]),
    )
    assert got["custom_scopes"] == CUSTOM_SCOPES
    assert got["load_groups"] == {
        "ml-research": {"users": []},
        "students": {"users": []},
        "gpu-admins": {"users": []},
    }
    assert got["server_token_scopes"] == SERVER_TOKEN_SCOPES
    assert got["environment"] == {
        "GPUSPAWNER_CULLER_URL": "http://hub:8000/services/gpuspawner-culler/"
    }
    assert got["template_paths"] == [TEMPLATE_PATH]


def test_the_local_clusters_config_wires_what_it_did_by_hand(hub_environ):
    env = {
        "KUBECONFIG": "/hub/kubeconfig",
        "GPUSPAWNER_SANDBOX_HUB_ADDRESS": "10.244.0.1",
        "GPUSPAWNER_SANDBOX_PROMETHEUS_URL": "http://127.0.0.1:9090",
        "GPUSPAWNER_DEMO_PRESSURE_TIMEOUT": "30",
    }
    for key, value in env.items():
        hub_environ.setenv(key, value)
    here = REPO / "config" / "sandbox"
    c = PyFileConfigLoader("jupyterhub_config.py", str(here)).load_config()
    got = wiring(c)
    # each on a free loopback port; the culler on the address notebooks reach
    urls = {name: s.pop("url") for name, s in got["services"].items()}
    assert re.fullmatch(r"http://10\.244\.0\.1:\d+", urls["gpuspawner-culler"])
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+", urls["gpuspawner-admin"])
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+", urls["gpuspawner"])
    prometheus = "--prometheus-url=http://127.0.0.1:9090"
    passed = {"KUBECONFIG": "/hub/kubeconfig", "GPUSPAWNER_DEMO_PRESSURE_TIMEOUT": "30"}
    catalog = str(here / "catalog.yaml")
    assert got["services"] == {
        "gpuspawner-culler": {
            "name": "gpuspawner-culler",
            "command": [
                PY,
                "-m",
                "gpuspawner.culler",
                f"--config={here / 'culler_config.py'}",
                prometheus,
            ],
            "environment": {**passed, "GPUSPAWNER_CATALOG": catalog, **usage_db()},
        },
        "gpuspawner-admin": {
            "name": "gpuspawner-admin",
            "command": [PY, "-m", "gpuspawner.admin", prometheus],
            "oauth_client_allowed_scopes": ["custom:gpuspawner:admin"],
            "oauth_no_confirm": True,
            # (the demo's pressure timeout reaches the GPU page too, which ignores it)
            "environment": {**passed, "GPUSPAWNER_CATALOG": catalog, **usage_db()},
        },
        "gpuspawner": {
            "name": "gpuspawner",
            "command": [PY, "-m", "gpuspawner.userservice", "--namespace=jupyterhub"],
            "oauth_no_confirm": True,
            "oauth_client_allowed_scopes": OWN_SERVERS,
            "environment": {
                **passed,
                "GPUSPAWNER_CATALOG": catalog,
                "GPUSPAWNER_PLACEMENT": NO_PLACEMENT,
                "GPUSPAWNER_ALL_NAMESPACES": "0",
                "GPUSPAWNER_CULLER_URL": urls["gpuspawner-culler"],
            },
        },
    }
    assert got["roles"] == roles(
        CULLER_ROLE, USER_ROLE, ADMIN_SERVICE_ROLE, admins_role(users=["admin"])
    )
    assert got["custom_scopes"] == CUSTOM_SCOPES
    assert got["load_groups"] == {"students": {"users": ["student"]}}
    assert got["server_token_scopes"] == SERVER_TOKEN_SCOPES
    # notebooks ask the culler directly
    assert got["environment"] == {"GPUSPAWNER_CULLER_URL": urls["gpuspawner-culler"] + "/"}


def test_the_local_clusters_opt_in_to_every_namespace_reaches_the_service(hub_environ):
    hub_environ.setenv("GPUSPAWNER_SANDBOX_ALL_NAMESPACES", "1")
    c = PyFileConfigLoader("jupyterhub_config.py", str(REPO / "config" / "sandbox")).load_config()
    service = wiring(c)["services"]["gpuspawner"]
    assert service["environment"]["GPUSPAWNER_ALL_NAMESPACES"] == "1"


def z2jh_config(*values_files) -> tuple[dict, Config]:
    """What zero-to-jupyterhub 4.4.0's jupyterhub_config.py makes of our values, in its order:
    the spawner's settings from singleuser/scheduling, hub.services (each with its token
    from the chart's Secret) and hub.loadRoles as lists, hub.config, then hub.extraConfig
    (the catalog is in the cluster's ConfigMap: its check is left out)."""
    if not (CHART / "values.yaml").is_file():
        pytest.fail(
            f"the z2jh 4.4.0 chart is expected at {CHART} (a copy of shared/ beside the clone)"
        )
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    for path in values_files:
        values = merged(values, yaml.safe_load(path.read_text()))
    hub = values["hub"]
    c = Config()
    c.KubeSpawner.namespace = os.environ.get("POD_NAMESPACE", "default")
    c.KubeSpawner.tolerations = values["scheduling"]["userPods"]["tolerations"]
    c.KubeSpawner.environment = values["singleuser"]["extraEnv"]
    c.JupyterHub.services = []
    c.JupyterHub.load_roles = []
    for key, service in hub["services"].items():
        c.JupyterHub.services.append({"name": key, **service, "api_token": f"token-of-{key}"})
    for key, role in hub["loadRoles"].items():
        c.JupyterHub.load_roles.append({"name": key, **role})
    for section, settings in hub["config"].items():
        c[section].update(settings)
    with mock.patch.object(hubsetup, "check_catalog"):
        for _, snippet in sorted(hub["extraConfig"].items()):
            exec(snippet, {"c": c})
    return values, c


def test_the_z2jh_values_wire_what_they_did_by_hand(hub_environ):
    for key, value in IN_CLUSTER.items():
        hub_environ.setenv(key, value)
    values, c = z2jh_config(REPO / "config" / "z2jh-values.yaml")
    # one snippet, no hand-written roles; the services are listed for their API tokens
    assert len(values["hub"]["extraConfig"]) == 1
    assert values["hub"]["loadRoles"] == {}
    assert values["hub"]["services"] == {
        "gpuspawner-culler": {},
        "gpuspawner-admin": {},
        "gpuspawner": {},
    }
    assert values["cull"]["enabled"] is False  # one culler only
    got = wiring(c, "KubeSpawner")
    config_file = "--config=/etc/gpuspawner/culler_config.py"
    tolerations = values["scheduling"]["userPods"]["tolerations"]
    assert got["services"] == {
        "gpuspawner-culler": {
            "name": "gpuspawner-culler",
            "api_token": "token-of-gpuspawner-culler",
            "url": "http://hub:10101",
            # the proxy runs in its own pod: it listens on the hub pod's port 10101
            "command": [
                PY,
                "-m",
                "gpuspawner.culler",
                "--metrics-url=http://0.0.0.0:10101",
                config_file,
            ],
            "environment": {
                **IN_CLUSTER,
                "GPUSPAWNER_CATALOG": "/etc/gpuspawner/catalog.yaml",
                **usage_db(),
            },
        },
        "gpuspawner-admin": {
            "name": "gpuspawner-admin",
            "api_token": "token-of-gpuspawner-admin",
            "url": "http://hub:10102",
            "command": [PY, "-m", "gpuspawner.admin", "--ip=0.0.0.0", config_file],
            "oauth_client_allowed_scopes": ["custom:gpuspawner:admin"],
            "oauth_no_confirm": True,
            "environment": {
                "GPUSPAWNER_CATALOG": "/etc/gpuspawner/catalog.yaml",
                **IN_CLUSTER,
                **usage_db(),
            },
        },
        "gpuspawner": {
            "name": "gpuspawner",
            "api_token": "token-of-gpuspawner",
            "url": "http://hub:10103",
            "command": [
                PY,
                "-m",
                "gpuspawner.userservice",
                "--ip=0.0.0.0",
                "--namespace=jupyterhub",
            ],
            "oauth_no_confirm": True,
            "oauth_client_allowed_scopes": OWN_SERVERS,
            "environment": {
                **IN_CLUSTER,
                "GPUSPAWNER_CATALOG": "/etc/gpuspawner/catalog.yaml",
                "GPUSPAWNER_PLACEMENT": json.dumps(
                    {"node_selector": {}, "tolerations": tolerations}
                ),
                "GPUSPAWNER_ALL_NAMESPACES": "0",
                "GPUSPAWNER_CULLER_URL": "http://hub:10101",
            },
        },
    }
    # the group gpu-admins sees the GPU page (the hub's admin users only as its members)
    assert got["roles"] == roles(
        CULLER_ROLE, USER_ROLE, ADMIN_SERVICE_ROLE, admins_role(groups=["gpu-admins"])
    )
    assert got["custom_scopes"] == CUSTOM_SCOPES
    assert got["load_groups"] == {"gpu-admins": {"users": []}}
    assert got["server_token_scopes"] == SERVER_TOKEN_SCOPES
    # notebooks ask the culler through the proxy (singleuser.networkPolicy lets them)
    assert got["environment"] == {
        "GPUSPAWNER_CULLER_URL": "http://proxy-public/services/gpuspawner-culler/"
    }
    assert got["template_paths"] == [TEMPLATE_PATH]


def test_the_local_clusters_z2jh_release_makes_admin_a_gpu_admin(hub_environ):
    sandbox = REPO / "config" / "sandbox"
    _, c = z2jh_config(
        REPO / "config" / "z2jh-values.yaml",
        sandbox / "z2jh-local-values.yaml",
        sandbox / "z2jh-cluster-values.yaml",
    )
    got = wiring(c, "KubeSpawner")
    assert got["load_groups"] == {"gpu-admins": {"users": ["admin"]}}
    assert (
        got["roles"]["gpuspawner-admins"]
        == roles(admins_role(groups=["gpu-admins"]))["gpuspawner-admins"]
    )


# --- under a real hub -----------------------------------------------------------------

#: A managed service that answers on its url and does nothing else.
STAND_IN_SERVICE = """
import http.server, os, urllib.parse
url = urllib.parse.urlparse(os.environ["JUPYTERHUB_SERVICE_URL"])
server = http.server.HTTPServer((url.hostname, url.port), http.server.SimpleHTTPRequestHandler)
server.serve_forever()
"""


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    from .hub.hubprocess import free_port, start_hub

    # The services' entries come with a token (as zero-to-jupyterhub's hub.services) and a
    # command that only answers HTTP on the service's url (the hub waits for that): this
    # hub shows what the roles grant, not what the services do.
    answers = [sys.executable, "-c", STAND_IN_SERVICE]
    entries = [
        {"name": name, "api_token": f"{name}-token-0123456789", "command": answers}
        for name in ("gpuspawner-culler", "gpuspawner-admin", "gpuspawner")
    ]
    hub = start_hub(
        tmp_path_factory.mktemp("hub"),
        extra_config=f"""
c.GPUSpawner.catalog_file = {str(FIXTURES / "catalogs" / "e2e.yaml")!r}
c.Authenticator.admin_users = {{"boss"}}
c.JupyterHub.load_roles.append({{"name": "user", "scopes": ["self", "read:users:groups!user"]}})
c.JupyterHub.services.extend({entries!r})
import gpuspawner
gpuspawner.setup(
    c,
    culler_url="http://127.0.0.1:{free_port()}",
    admin_url="http://127.0.0.1:{free_port()}",
    user_service_url="http://127.0.0.1:{free_port()}",
)
""",
    )
    if hub.process.poll() is not None:
        pytest.fail(f"JupyterHub exited during start:\n{hub.log()[-3000:]}")
    yield hub
    hub.stop()


def token_scopes(hub, token: str) -> set[str]:
    r = hub.api("GET", "/user", token=token)
    assert r.status == 200, r.body
    return set(r.json()["scopes"])


def user_token(hub, name: str) -> str:
    assert hub.api("POST", f"/users/{name}").status in (201, 409)
    r = hub.api("POST", f"/users/{name}/tokens", {"note": "hubsetup test"})
    assert r.status in (200, 201), r.body
    return r.json()["token"]


@pytest.mark.hub
def test_the_hub_takes_the_roles_and_grants_what_they_say(hub):
    culler = token_scopes(hub, "gpuspawner-culler-token-0123456789")
    assert set(CULLER_ROLE["scopes"]) <= culler
    admin_service = token_scopes(hub, "gpuspawner-admin-token-0123456789")
    assert set(ADMIN_SERVICE_ROLE["scopes"]) <= admin_service
    for scopes in (culler, admin_service):
        assert not {"admin:users", "admin:servers", "access:servers"} & scopes
    # the user service holds no scope on users: it reads with the users' own tokens
    service = token_scopes(hub, "gpuspawner-token-0123456789")
    assert not {s for s in service if "servers" in s or s.startswith("list:users")}
    # every user: the 'user' role, merged with the one the config had
    ann = token_scopes(hub, user_token(hub, "ann"))
    assert {
        CULLER_ACCESS,
        SERVICE_ACCESS,
        "read:servers!user=ann",
        "admin:server_state!user=ann",
        "read:users:groups!user=ann",
    } <= ann
    assert "custom:gpuspawner:admin" not in ann
    # the hub's admin user sees the GPU page
    boss = token_scopes(hub, user_token(hub, "boss"))
    assert "custom:gpuspawner:admin" in boss
    r = hub.api("GET", "/users/boss")
    assert r.status == 200, r.body
    assert {"admin", "user", "gpuspawner-admins"} <= set(r.json()["roles"])
    r = hub.api("GET", "/groups/gpu-admins")
    assert r.status == 200, r.body
