"""How the services' wiring goes into a hub's traitlets ``Config`` without replacing what is there.

Each service's ``hubconfig`` module (:mod:`gpuspawner.culler.hubconfig`,
:mod:`gpuspawner.admin.hubconfig`, :mod:`gpuspawner.userservice.hubconfig`)
writes its service entry and roles with these; they are here, below the
services, because the services never import each other.

The hub's list and dict settings may already hold entries: an admin's,
zero-to-jupyterhub's (``hub.services``, ``hub.loadRoles``), a parent
configuration's. An entry is found by its name and completed, or added.
JupyterHub (5 and 6) refuses two ``load_roles`` entries of one name ("Role …
multiply defined"), and a second ``user`` role would replace the first one's
scopes: the scopes a service grants every user join the one ``user`` role.

In a file loaded with ``load_subconfig`` an unset setting is a lazy value that
records appends and updates, and only as such does it merge into the parent's:
it is never replaced by a plain value here. What the parent holds is not seen
from the sub-config.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterable
from typing import Any

from traitlets.config import Config, LazyConfigValue

#: The spawner classes whose settings reach GPUSpawner, most specific first.
SPAWNER_SECTIONS = ("GPUSpawner", "KubeSpawner", "Spawner")
#: JupyterHub's ``user`` role when no configuration redefines it.
DEFAULT_USER_SCOPES = ("self",)


def setting(section: Any, name: str, default: Any) -> Any:
    """A setting of one section as the hub will see it (a lazy value applied to ``default``)."""
    if name not in section:
        return default
    value = section[name]
    if isinstance(value, LazyConfigValue):
        # a copy: get_value caches its result, and the hub must still see later appends
        return copy.deepcopy(value).get_value(default)
    return value


def spawner_setting(c: Config, name: str, default: Any) -> Any:
    """A spawner setting as the hub will see it: GPUSpawner's over KubeSpawner's over ``default``."""
    value = default
    for section in ("KubeSpawner", "GPUSpawner"):
        if section in c:
            value = setting(c[section], name, value)
    return value


#: The variable that carries the usage database's URL to the services that read it
#: (the culler, the GPU page), and that the hub reads when no URL is configured.
ACCOUNTING_DB_URL_ENV = "GPUSPAWNER_ACCOUNTING_DB_URL"
#: JupyterHub's own default database, relative to the hub's working directory.
HUB_DEFAULT_DB_URL = "sqlite:///jupyterhub.sqlite"


def accounting_db_url(c: Config, cwd: str | None = None) -> str:
    """The usage database the hub records GPU-hours in, for a service's environment.

    "" when accounting is off (``GPUSpawner.accounting_enabled``). Else
    ``GPUSpawner.accounting_db_url``, else ``$GPUSPAWNER_ACCOUNTING_DB_URL``, else
    the hub's own ``db_url``. A relative SQLite path is made absolute against
    the hub's working directory (``cwd``), so a service started elsewhere finds it.
    """
    if not spawner_setting(c, "accounting_enabled", True):
        return ""
    url = str(spawner_setting(c, "accounting_db_url", "") or "")
    url = url or os.environ.get(ACCOUNTING_DB_URL_ENV, "")
    if not url:
        url = str(setting(c.JupyterHub, "db_url", HUB_DEFAULT_DB_URL) or HUB_DEFAULT_DB_URL)
    prefix = "sqlite:///"
    path = url[len(prefix) :] if url.startswith(prefix) else ""
    if path and not path.startswith(("/", ":memory:")) and "://" not in path:
        url = prefix + os.path.join(cwd or os.getcwd(), path)
    return url


#: The hub's catalog file, as every service that reads the catalog gets it.
CATALOG_ENV = "GPUSPAWNER_CATALOG"


def catalog_environment(c: Config) -> dict[str, str]:
    """The hub's catalog file (``c.GPUSpawner.catalog_file``, as set so far) for a service's
    environment; {} when the catalog is inline or not set."""
    catalog_file = spawner_setting(c, "catalog_file", "")
    return {CATALOG_ENV: str(catalog_file)} if catalog_file else {}


def accounting_environment(c: Config) -> dict[str, str]:
    """What a service that reads the usage database needs in its environment ({} when off).

    The URL (:func:`accounting_db_url`) and, for PostgreSQL, libpq's ``PGPASSWORD``
    when the hub has one: zero-to-jupyterhub puts ``hub.db.password`` there rather
    than in ``db_url``, and a hub-managed service does not inherit the hub's environment.
    """
    url = accounting_db_url(c)
    if not url:
        return {}
    env = {ACCOUNTING_DB_URL_ENV: url}
    if url.startswith("postgres") and os.environ.get("PGPASSWORD"):
        env["PGPASSWORD"] = os.environ["PGPASSWORD"]
    return env


def spawner_section(c: Config, name: str) -> Any:
    """The most specific spawner section that sets ``name`` (``c.Spawner`` when none does).

    A plain value there is what the spawner starts from, and a lazy value's
    changes there are applied last: either way what is added there reaches it.
    """
    for section in SPAWNER_SECTIONS:
        if section in c and name in c[section]:
            return c[section]
    return c.Spawner


def entries(section: Any, name: str) -> list:
    """The entries of the list setting ``section.<name>`` seen so far, as the objects themselves."""
    value = section[name] if name in section else []
    if not isinstance(value, LazyConfigValue):
        return list(value)
    recorded = value.to_dict()
    return (
        list(recorded.get("prepend", []))
        + [obj for _, obj in recorded.get("inserts", [])]
        + list(recorded.get("extend", []))
    )


def named_entry(section: Any, setting_name: str, name: str) -> dict[str, Any]:
    """The entry called ``name`` in the list setting (``services``, ``load_roles``), added if missing."""
    entry = next((e for e in entries(section, setting_name) if e.get("name") == name), None)
    if entry is None:
        entry = {"name": name}
        section[setting_name].append(entry)
    return entry


def add_missing(values: list, wanted: Iterable) -> None:
    """Append what ``values`` lacks of ``wanted``, in order."""
    values.extend(item for item in wanted if item not in values)


def add_role(
    c: Config,
    name: str,
    scopes: Iterable[str],
    *,
    description: str = "",
    services: Iterable[str] = (),
    users: Iterable[str] = (),
    groups: Iterable[str] = (),
) -> dict[str, Any]:
    """Add the role ``name`` to ``c.JupyterHub.load_roles``, or complete the role of that name.

    Its scopes and members join what the entry already lists; a description
    already there is kept. Returns the entry.
    """
    role = named_entry(c.JupyterHub, "load_roles", name)
    if description:
        role.setdefault("description", description)
    add_missing(role.setdefault("scopes", []), scopes)
    for kind, members in (("services", services), ("users", users), ("groups", groups)):
        members = list(members)
        if members:
            add_missing(role.setdefault(kind, []), members)
    return role


def grant_user_scopes(c: Config, scopes: Iterable[str]) -> dict[str, Any]:
    """Every user holds ``scopes``: they join the hub's ``user`` role (one entry of that name).

    A ``user`` role defined here replaces JupyterHub's default one (``["self"]``),
    so a new entry starts with its scopes.
    """
    role = next((r for r in entries(c.JupyterHub, "load_roles") if r.get("name") == "user"), None)
    if role is None:
        role = {"name": "user", "scopes": list(DEFAULT_USER_SCOPES)}
        c.JupyterHub.load_roles.append(role)
    add_missing(role.setdefault("scopes", list(DEFAULT_USER_SCOPES)), scopes)
    return role


def setdefault_item(section: Any, setting_name: str, key: str, value: Any) -> None:
    """Give the dict setting ``section.<setting_name>`` the item ``key`` unless it holds one."""
    current = section[setting_name] if setting_name in section else None
    if current is None or isinstance(current, LazyConfigValue):
        recorded = current.to_dict().get("update", {}) if current is not None else {}
        if key not in recorded:
            section[setting_name].update({key: value})
    else:
        current.setdefault(key, value)
