"""The hub configuration that runs the GPU page: its service entry, custom scope and roles.

In ``jupyterhub_config.py`` :func:`gpuspawner.setup` calls :func:`add_admin`
with the deployment's URL and arguments (docs/admin.md); on its own::

    from gpuspawner.admin.hubconfig import add_admin
    add_admin(c, url="http://127.0.0.1:10102", command_args=["--config=culler_config.py"])

It defines the custom scope ``custom:gpuspawner:admin`` (:data:`ADMIN_SCOPE`),
adds the service ``gpuspawner-admin`` (or completes an entry of that name, as
zero-to-jupyterhub's ``hub.services`` makes) with the hub's catalog file and
usage database (:func:`~gpuspawner.core.hubconfig.accounting_environment`), and
two roles: the service's own (:data:`SERVICE_SCOPES`: read users and servers,
stop servers; never admin) and the one of those who may see the page
(:data:`ADMINS_SCOPES`: the hub's admin users and the group ``gpu-admins`` by
default). Roles of these names already in ``load_roles`` are completed.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from traitlets.config import Config

from ..core.endpoints import access_scope
from ..core.hubconfig import (
    accounting_environment,
    add_missing,
    add_role,
    catalog_environment,
    named_entry,
    setdefault_item,
    setting,
)
from .service import ADMIN_SCOPE, SERVICE_NAME

#: Where it listens in the hub's own host or pod unless told otherwise.
URL = "http://127.0.0.1:10102"
ADMIN_SCOPE_DESCRIPTION = "See the GPU pool page and stop servers from it (gpuspawner-admin)."
#: The service's own role: it reads users (with groups) and servers, and stops servers.
SERVICE_ROLE = "gpuspawner-admin-service"
SERVICE_ROLE_DESCRIPTION = "The GPU page: read users and servers, stop servers"
SERVICE_SCOPES = ("list:users", "read:users", "read:servers", "delete:servers")
#: The role of those who see the page and may stop servers from it.
ADMINS_ROLE = "gpuspawner-admins"
ADMINS_ROLE_DESCRIPTION = "See and steer the GPU pool"
ADMINS_SCOPES = (ADMIN_SCOPE, access_scope(SERVICE_NAME))
#: The group whose members get the page (created empty if no config defines it).
ADMIN_GROUP = "gpu-admins"


def admin_command(
    command_args: Sequence[str] = (), ip: str = "", python: str = sys.executable
) -> list[str]:
    command = [python, "-m", "gpuspawner.admin"]
    if ip:
        command.append(f"--ip={ip}")
    command.extend(command_args)
    return command


def hub_admin_users(c: Config) -> list[str]:
    """The hub's admin users as this config sets them (``c.Authenticator.admin_users``)."""
    return sorted(setting(c.Authenticator, "admin_users", set()) if "Authenticator" in c else [])


def add_admin(
    c: Config,
    *,
    url: str = URL,
    command_args: Sequence[str] = (),
    environment: Mapping[str, str] | None = None,
    ip: str = "",
    users: Iterable[str] | None = None,
    groups: Sequence[str] = (ADMIN_GROUP,),
    python: str = sys.executable,
) -> dict[str, Any]:
    """Add the GPU page to ``c.JupyterHub.services`` (or complete its entry), its scope and roles.

    ``url``: where it listens, and where the proxy routes /services/gpuspawner-admin/.
    ``command_args``: the service's own (``--config=…`` for the culler's Prometheus
    settings, ``--prometheus-url=…``). ``environment``: the service's variables; the
    hub's catalog file (``c.GPUSpawner.catalog_file``, as set so far) and usage
    database (``$GPUSPAWNER_ACCOUNTING_DB_URL``, unless accounting is off) join them.
    ``ip``: the address to listen on when it differs from ``url``'s host.
    ``users``: who sees the page (None: the hub's admin users as set so far);
    ``groups``: the groups that do (each created empty unless defined).
    An entry's own url, command and variables win. Returns the entry.
    """
    setdefault_item(
        c.JupyterHub, "custom_scopes", ADMIN_SCOPE, {"description": ADMIN_SCOPE_DESCRIPTION}
    )
    entry = named_entry(c.JupyterHub, "services", SERVICE_NAME)
    entry.setdefault("url", url)
    entry.setdefault("command", admin_command(command_args, ip, python))
    add_missing(entry.setdefault("oauth_client_allowed_scopes", []), [ADMIN_SCOPE])
    entry.setdefault("oauth_no_confirm", True)
    env = dict(environment or {})
    # limits and GPU type names: the catalog the hub uses; the usage table, its CSV and the
    # idle holders' GPU-hours: the database the hub records in
    env.update(catalog_environment(c))
    env.update(accounting_environment(c))
    entry["environment"] = {**env, **entry.get("environment", {})}
    add_role(
        c,
        SERVICE_ROLE,
        SERVICE_SCOPES,
        description=SERVICE_ROLE_DESCRIPTION,
        services=[SERVICE_NAME],
    )
    add_role(
        c,
        ADMINS_ROLE,
        ADMINS_SCOPES,
        description=ADMINS_ROLE_DESCRIPTION,
        users=hub_admin_users(c) if users is None else sorted(users),
        groups=groups,
    )
    for group in groups:
        setdefault_item(c.JupyterHub, "load_groups", group, {"users": []})
    return entry
