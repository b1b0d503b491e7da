"""The hub configuration that runs the culler: its service entry, its role and what users get.

In ``jupyterhub_config.py`` :func:`gpuspawner.setup` calls :func:`add_culler`
with the deployment's URL and arguments (docs/culler.md); on its own::

    from gpuspawner.culler.hubconfig import add_culler
    add_culler(c, url="http://127.0.0.1:10101", command_args=["--config=culler_config.py"])

It adds the service ``gpuspawner-culler`` (or completes an entry of that name,
as zero-to-jupyterhub's ``hub.services`` makes), its role with the least
scopes it needs (:data:`CULLER_SCOPES`; a role of the same name already in
``load_roles`` is completed, e.g. one adding ``read:users:groups`` for
``exempt_groups``), and JupyterLab's cull warning: every user may reach the
culler (:data:`USER_SCOPES`, in the hub's ``user`` role), server tokens carry
that access too (:data:`SERVER_TOKEN_SCOPES`), and notebooks are told where
the culler is (``GPUSPAWNER_CULLER_URL``). The service gets the hub's catalog
file (``max_runtime``, ``max_keep``, budgets) and usage database
(:func:`~gpuspawner.core.hubconfig.accounting_db_url`: what budgets have used).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlparse

from traitlets.config import Config, LazyConfigValue

from ..core.endpoints import CULLER_SERVICE_NAME, access_scope
from ..core.hubconfig import (
    accounting_environment,
    add_missing,
    add_role,
    catalog_environment,
    grant_user_scopes,
    named_entry,
    setdefault_item,
    spawner_section,
)

#: The service's name in the hub configuration (URL prefix /services/gpuspawner-culler/).
SERVICE_NAME = CULLER_SERVICE_NAME
#: Where it listens in the hub's own host or pod unless told otherwise.
URL = "http://127.0.0.1:10101"
#: The least the culler needs (never access:servers or admin):
#:   list:users + read:servers     find users' servers, their user_options and state
#:   read:users:activity           the hub's last_activity of users and servers
#:   delete:servers                stop a server
#:   read:metrics                  the GPU demand the hub holds back (queued and lately
#:                                 refused requests) and free GPUs per node
#:   read:users:groups             whose group budget (limits.gpu_hours.groups) applies
#: Pod names, GPU labels and waiting GPU requests are read from Kubernetes with the
#: hub's service account.
CULLER_SCOPES = (
    "list:users",
    "read:users:activity",
    "read:servers",
    "delete:servers",
    "read:metrics",
    "read:users:groups",
)
ROLE_DESCRIPTION = "Stop idle servers (gpuspawner-culler)"
#: What every user holds: they may ask the culler about their own servers (it answers
#: only about the caller's own, whatever else the token may do).
USER_SCOPES = (access_scope(SERVICE_NAME),)
#: The scopes of a server's token: JupyterHub's ``server`` role (its default) and the
#: culler's access, so that JupyterLab's cull warning may ask it.
SERVER_TOKEN_SCOPES = ("users:activity!user", "access:servers!server", *USER_SCOPES)
#: Where a notebook finds the culler's /api/warning (gpuspawner-jupyterlab reads it).
WARNING_URL_ENV = "GPUSPAWNER_CULLER_URL"


def culler_command(
    url: str, command_args: Sequence[str] = (), ip: str = "", python: str = sys.executable
) -> list[str]:
    """``python -m gpuspawner.culler``; with ``ip``, it listens there on ``url``'s port."""
    command = [python, "-m", "gpuspawner.culler"]
    if ip:
        # /metrics, /warnings and /api/warning are served on metrics_url, whose
        # default is the service's url: a name the culler may not be able to bind
        port = urlparse(url).port
        command.append(
            f"--metrics-url=http://{ip}:{port}" if port else f"--metrics-url=http://{ip}"
        )
    command.extend(command_args)
    return command


def add_server_token_scopes(c: Config, scopes: Sequence[str] = SERVER_TOKEN_SCOPES) -> None:
    """Server tokens carry ``scopes``: added to ``server_token_scopes`` where it is set.

    Unset (JupyterHub's default: the ``server`` role), it becomes ``scopes``. A
    callable ``server_token_scopes`` (the admin's own choice per server) is left alone.
    """
    section = spawner_section(c, "server_token_scopes")
    if "server_token_scopes" not in section:
        section.server_token_scopes = list(scopes)
        return
    current = section.server_token_scopes
    if isinstance(current, list):
        add_missing(current, scopes)
    elif isinstance(current, LazyConfigValue):
        # appends to the unset default (no scope): the server role's come with ours
        recorded = current.to_dict().get("extend", [])
        for scope in scopes:
            if scope not in recorded:
                current.append(scope)


def add_culler(
    c: Config,
    *,
    url: str = URL,
    command_args: Sequence[str] = (),
    environment: Mapping[str, str] | None = None,
    ip: str = "",
    warning_url: str | None = None,
    python: str = sys.executable,
) -> dict[str, Any]:
    """Add the culler to ``c.JupyterHub.services`` (or complete its entry), its role, users' access.

    ``url``: where it listens, and where the proxy routes /services/gpuspawner-culler/.
    ``command_args``: the culler's own (``--config=…``, ``--prometheus-url=…``).
    ``environment``: the service's variables (the hub passes services few of its own);
    the hub's catalog file and usage database (as set so far) join them.
    ``ip``: the address to listen on when it differs from ``url``'s host (``0.0.0.0``
    when the proxy runs in another pod). ``warning_url``: the culler's base URL as
    notebooks reach it, given to them as ``$GPUSPAWNER_CULLER_URL``; None: not set.
    An entry's own url, command and variables win. Returns the entry.
    """
    entry = named_entry(c.JupyterHub, "services", SERVICE_NAME)
    entry.setdefault("url", url)
    entry.setdefault("command", culler_command(entry["url"], command_args, ip, python))
    env = dict(environment or {})
    # max_runtime, max_keep and budgets: the catalog the hub uses; what each user's budget
    # has used: the database the hub records in (with PostgreSQL's password, when the hub has one)
    env.update(catalog_environment(c))
    env.update(accounting_environment(c))
    entry["environment"] = {**env, **entry.get("environment", {})}
    add_role(
        c,
        SERVICE_NAME,
        CULLER_SCOPES,
        description=ROLE_DESCRIPTION,
        services=[SERVICE_NAME],
    )
    grant_user_scopes(c, USER_SCOPES)
    add_server_token_scopes(c)
    if warning_url is not None:
        setdefault_item(
            spawner_section(c, "environment"), "environment", WARNING_URL_ENV, warning_url
        )
    return entry
