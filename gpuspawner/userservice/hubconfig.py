"""The hub configuration that runs the gpuspawner service, from the hub's own settings.

In ``jupyterhub_config.py``, after the GPUSpawner and KubeSpawner settings::

    from gpuspawner.userservice.hubconfig import add_service
    add_service(c, url="http://127.0.0.1:10103")

adds the service (or completes an entry of the same name, as
zero-to-jupyterhub's ``hub.services`` makes) and grants every user, through
the hub's ``user`` role, its access scope and what the ``/stop-notices``
endpoint reads with the user's own token: their own servers with their state
(:data:`~gpuspawner.userservice.stopnotices.USER_SCOPES`, also the scopes of
the service's OAuth tokens). The service itself gets no role: it holds no
scope on any user. It gets what it must agree with the hub on, read from the
same config: the catalog, the pod placement (node selector and tolerations
every server pod gets, which the figures count with) and whether pods of
every namespace count (through the environment, so that it follows the hub's
setting whatever the entry's command).
"""

from __future__ import annotations

import copy
import json
import os
import sys
from typing import Any

from traitlets.config import Config, LazyConfigValue

from . import SERVICE_NAME, access_scope
from .app import ALL_NAMESPACES_DEFAULT, ALL_NAMESPACES_ENV, CATALOG_JSON_ENV, PLACEMENT_ENV
from .stopnotices import USER_SCOPES

#: What the hub passes on from its own environment: the cluster and the namespace.
PASSED_ON = ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT", "POD_NAMESPACE")


def spawner_setting(c: Config, name: str, default: Any) -> Any:
    """A spawner setting as the hub will see it: GPUSpawner's over KubeSpawner's over ``default``."""
    value = default
    for section in ("KubeSpawner", "GPUSpawner"):
        if section in c and name in c[section]:
            found = c[section][name]
            if isinstance(found, LazyConfigValue):
                # a copy: get_value caches its result, and the hub must still see later appends
                found = copy.deepcopy(found).get_value(value)
            value = found
    return value


def service_environment(c: Config, environ: dict[str, str] | None = None) -> dict[str, str]:
    """The service's variables: catalog, placement, and the cluster's address from the hub's."""
    environ = os.environ if environ is None else environ
    env = {key: environ[key] for key in PASSED_ON if key in environ}
    catalog_file = spawner_setting(c, "catalog_file", "")
    if catalog_file:
        env["GPUSPAWNER_CATALOG"] = str(catalog_file)
    else:
        catalog = spawner_setting(c, "catalog", {})
        if catalog:
            env[CATALOG_JSON_ENV] = json.dumps(catalog)
    env[PLACEMENT_ENV] = json.dumps(
        {
            "node_selector": spawner_setting(c, "node_selector", {}),
            "tolerations": spawner_setting(c, "tolerations", []),
        }
    )
    all_namespaces = spawner_setting(c, "gpu_inventory_all_namespaces", ALL_NAMESPACES_DEFAULT)
    env[ALL_NAMESPACES_ENV] = "1" if all_namespaces else "0"
    return env


def service_command(c: Config, python: str = sys.executable, ip: str = "") -> list[str]:
    command = [python, "-m", "gpuspawner.userservice"]
    if ip:
        command.append(f"--ip={ip}")
    namespace = spawner_setting(c, "namespace", "")
    if namespace:
        command.append(f"--namespace={namespace}")
    return command


def _entries(c: Config, name: str) -> list:
    """The entries of the list setting ``c.JupyterHub.<name>`` seen so far, as the objects themselves.

    Until it is set, the setting is a lazy value recording appends; it is never
    replaced by a plain list, since a file loaded with load_subconfig merges
    into its parent's list only as such a lazy value.
    """
    value = c.JupyterHub[name] if name in c.JupyterHub else []
    if not isinstance(value, LazyConfigValue):
        return list(value)
    recorded = value.to_dict()
    return (
        list(recorded.get("prepend", []))
        + [obj for _, obj in recorded.get("inserts", [])]
        + list(recorded.get("extend", []))
    )


def user_scopes(service: str = SERVICE_NAME) -> list[str]:
    """What the hub's ``user`` role needs for the service: reach it, and let it read the
    user's own servers with their state with the user's token (stop notices)."""
    return [access_scope(service), *USER_SCOPES]


def _add_missing(scopes: list[str], wanted: list[str]) -> None:
    scopes.extend(scope for scope in wanted if scope not in scopes)


def grant_access(c: Config, service: str = SERVICE_NAME) -> None:
    """Every user may reach the service, and it may read their own servers with their token.

    The scopes join the hub's ``user`` role; each is filtered to the user's own
    (``!user``), so no token of one user reaches another user's servers.
    """
    user_role = next((r for r in _entries(c, "load_roles") if r.get("name") == "user"), None)
    if user_role is None:
        # the hub's default 'user' role is scopes ["self"]; redefining it keeps that
        c.JupyterHub.load_roles.append({"name": "user", "scopes": ["self", *user_scopes(service)]})
        return
    _add_missing(user_role.setdefault("scopes", ["self"]), user_scopes(service))


def oauth_scopes(entry: dict[str, Any]) -> None:
    """The service's OAuth tokens (a browser's login to it) carry the user's own USER_SCOPES.

    The hub issues a token the intersection of these and what the user holds, so a
    user's token never reads more than the user could.
    """
    _add_missing(entry.setdefault("oauth_client_allowed_scopes", []), list(USER_SCOPES))


def add_service(
    c: Config,
    url: str = "http://127.0.0.1:10103",
    *,
    ip: str = "",
    name: str = SERVICE_NAME,
    environ: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Add the service to ``c.JupyterHub.services`` (or complete the entry named ``name``).

    ``ip``: the address to listen on when it differs from ``url``'s host
    (``0.0.0.0`` when the proxy runs in another pod). Returns the entry.
    """
    entry = next((s for s in _entries(c, "services") if s.get("name") == name), None)
    if entry is None:
        entry = {"name": name}
        c.JupyterHub.services.append(entry)
    entry.setdefault("url", url)
    entry.setdefault("command", service_command(c, ip=ip))
    entry.setdefault("oauth_no_confirm", True)
    oauth_scopes(entry)
    entry["environment"] = {**service_environment(c, environ), **entry.get("environment", {})}
    grant_access(c, name)
    return entry
