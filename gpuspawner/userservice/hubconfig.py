"""The hub configuration that runs the gpuspawner service, from the hub's own settings.

In ``jupyterhub_config.py`` :func:`gpuspawner.setup` calls :func:`add_service`
with the deployment's URL (docs/userservice.md); on its own, after the
GPUSpawner and KubeSpawner settings (it reads them as set so far)::

    from gpuspawner.userservice.hubconfig import add_service
    add_service(c, url="http://127.0.0.1:10103")

adds the service (or completes an entry of the same name, as
zero-to-jupyterhub's ``hub.services`` makes) and grants every user, through
the hub's ``user`` role, its access scope and what the ``/stop-notices``
endpoint reads with the user's own token: their own servers with their state
(:data:`~gpuspawner.userservice.stopnotices.USER_SCOPES`, also the scopes of
the service's OAuth tokens). The service itself gets no role: it holds no
scope on any user. When the config runs gpuspawner-culler (added before it, as
:func:`gpuspawner.setup` does), its environment gets the culler's URL: it
forwards a user's "Keep for 1 h" there with its own token, which needs no
scope (the culler accepts keeps from the services in its ``keep_services``,
for the user they name). It gets what it must agree with the hub on, read from the
same config: the catalog, the pod placement (node selector and tolerations
every server pod gets, which the figures count with) and whether pods of
every namespace count (through the environment, so that it follows the hub's
setting whatever the entry's command).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from typing import Any

from traitlets.config import Config

from ..core.endpoints import CULLER_SERVICE_NAME
from ..core.hubconfig import (
    CATALOG_ENV,
    add_missing,
    catalog_environment,
    entries,
    grant_user_scopes,
    named_entry,
    spawner_setting,
)
from . import SERVICE_NAME, access_scope
from .app import (
    ALL_NAMESPACES_DEFAULT,
    ALL_NAMESPACES_ENV,
    CATALOG_JSON_ENV,
    CULLER_URL_ENV,
    PLACEMENT_ENV,
)
from .stopnotices import USER_SCOPES

#: What the hub passes on from its own environment: the cluster and the namespace.
PASSED_ON = ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT", "POD_NAMESPACE")


def passed_on(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The hub's variables a service needs (:data:`PASSED_ON`), from ``environ`` (``os.environ``)."""
    environ = os.environ if environ is None else environ
    return {key: environ[key] for key in PASSED_ON if key in environ}


def culler_url(c: Config) -> str:
    """The culler's service url in the config so far; "" when it runs no culler."""
    for entry in entries(c.JupyterHub, "services"):
        if entry.get("name") == CULLER_SERVICE_NAME:
            return str(entry.get("url") or "")
    return ""


def service_environment(c: Config, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The service's variables: catalog, placement, the culler's URL, and the cluster's address."""
    env = passed_on(environ)
    culler = culler_url(c)
    if culler:
        env[CULLER_URL_ENV] = culler
    env.update(catalog_environment(c))
    if not env.get(CATALOG_ENV):
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


def user_scopes(service: str = SERVICE_NAME) -> list[str]:
    """What the hub's ``user`` role needs for the service: reach it, and let it read the
    user's own servers with their state with the user's token (stop notices)."""
    return [access_scope(service), *USER_SCOPES]


def grant_access(c: Config, service: str = SERVICE_NAME) -> None:
    """Every user may reach the service, and it may read their own servers with their token.

    The scopes join the hub's ``user`` role; each is filtered to the user's own
    (``!user``), so no token of one user reaches another user's servers.
    """
    grant_user_scopes(c, user_scopes(service))


def oauth_scopes(entry: dict[str, Any]) -> None:
    """The service's OAuth tokens (a browser's login to it) carry the user's own USER_SCOPES.

    The hub issues a token the intersection of these and what the user holds, so a
    user's token never reads more than the user could.
    """
    add_missing(entry.setdefault("oauth_client_allowed_scopes", []), USER_SCOPES)


def add_service(
    c: Config,
    url: str = "http://127.0.0.1:10103",
    *,
    ip: str = "",
    name: str = SERVICE_NAME,
    environ: Mapping[str, str] | None = None,
    environment: Mapping[str, str] | None = None,
    python: str = sys.executable,
) -> dict[str, Any]:
    """Add the service to ``c.JupyterHub.services`` (or complete the entry named ``name``).

    ``ip``: the address to listen on when it differs from ``url``'s host
    (``0.0.0.0`` when the proxy runs in another pod). ``environ``: the hub's own
    variables (default ``os.environ``), of which :data:`PASSED_ON` are handed on;
    ``environment``: more variables for the service. The hub's settings are read
    as set so far: call it after them. An entry's own url, command and variables
    win. Returns the entry.
    """
    entry = named_entry(c.JupyterHub, "services", name)
    entry.setdefault("url", url)
    entry.setdefault("command", service_command(c, python=python, ip=ip))
    entry.setdefault("oauth_no_confirm", True)
    oauth_scopes(entry)
    entry["environment"] = {
        **service_environment(c, environ),
        **(environment or {}),
        **entry.get("environment", {}),
    }
    grant_access(c, name)
    return entry
