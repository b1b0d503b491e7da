"""The hub side of gpuspawner's Helm chart (chart/gpuspawner): its settings, then :func:`setup`.

The chart renders its ``gpuspawner:`` values into the ConfigMap ``gpuspawner-config``,
mounted in the hub pod at :data:`CONFIG_DIR`; the chart's one ``hub.extraConfig``
snippet is::

    import gpuspawner.chartconfig
    gpuspawner.chartconfig.configure(c)

which reads ``settings.json`` there and calls :func:`gpuspawner.setup` with what the
chart's layout fixes: the services listen on the hub pod's ports (the proxy runs in its
own pod) behind z2jh's ``hub`` Service, the culler's and the GPU page's settings are the
JSON files beside it, and notebooks reach the culler through ``proxy-public``. Services
turned off in the values are dropped from the entries z2jh made for them (it lists every
``hub.services`` entry, with a token, whether or not anything runs behind it).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from traitlets.config import Config

from .admin.service import SERVICE_NAME as ADMIN_SERVICE
from .culler.hubconfig import SERVICE_NAME as CULLER_SERVICE
from .hubsetup import setup
from .userservice import SERVICE_NAME as USER_SERVICE

#: Where the chart mounts ``gpuspawner-config`` (chart/gpuspawner/values.yaml, hub.extraVolumeMounts).
CONFIG_DIR = Path("/etc/gpuspawner/config")
#: z2jh's hub Service, on the ports the chart opens (hub.service.extraPorts).
PORTS = {CULLER_SERVICE: 10101, ADMIN_SERVICE: 10102, USER_SERVICE: 10103}
HUB_SERVICE = "hub"
#: The culler as notebooks reach it (JupyterLab's cull warning): through z2jh's proxy.
WARNING_URL = f"http://proxy-public/services/{CULLER_SERVICE}/"


class ChartConfigError(ValueError):
    """The chart's rendered settings cannot be read; one sentence saying which and why."""


#: Each service: its hub name, its switch among :func:`gpuspawner.setup`'s arguments (and
#: the prefix of its ``…_url``), and its key in the chart's ``gpuspawner:`` values.
PARTS = (
    (CULLER_SERVICE, "culler", "culler"),
    (ADMIN_SERVICE, "admin", "admin"),
    (USER_SERVICE, "user_service", "userService"),
)


def _enabled(settings: Mapping[str, Any], key: str) -> bool:
    return bool((settings.get(key) or {}).get("enabled", True))


def setup_arguments(settings: Mapping[str, Any], config_dir: Path = CONFIG_DIR) -> dict[str, Any]:
    """The keyword arguments of :func:`gpuspawner.setup` for the chart's ``settings.json``."""
    admin = settings.get("admin") or {}
    users = admin.get("users")
    # the command line wins over admin_config.json: the chart's own value, when set
    queues = [f"--GPUAdmin.kueue_cluster_queues={q}" for q in admin.get("kueueClusterQueues") or ()]
    culler = settings.get("culler") or {}
    culler_queues = [
        f"--GPUCuller.kueue_cluster_queues={q}" for q in culler.get("kueueClusterQueues") or ()
    ]
    return {
        **{argument: _enabled(settings, key) for _, argument, key in PARTS},
        **{f"{argument}_url": f"http://{HUB_SERVICE}:{PORTS[name]}" for name, argument, _ in PARTS},
        "ip": "0.0.0.0",
        "culler_args": [f"--config={config_dir / 'culler_config.json'}", *culler_queues],
        "admin_args": [f"--config={config_dir / 'admin_config.json'}", *queues],
        "prometheus_url": settings.get("prometheusUrl") or "",
        "warning_url": WARNING_URL,
        "admin_users": None if users is None else tuple(users),
        "admin_groups": tuple(admin.get("groups") or ()),
    }


def turned_off(settings: Mapping[str, Any]) -> set[str]:
    """The hub services the values turn off (their z2jh entries are dropped)."""
    return {name for name, _, key in PARTS if not _enabled(settings, key)}


def read_settings(config_dir: Path = CONFIG_DIR) -> dict[str, Any]:
    """``settings.json`` as the chart rendered it; :class:`ChartConfigError` if unreadable."""
    path = config_dir / "settings.json"
    try:
        settings = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ChartConfigError(
            f"{path} cannot be read ({e.strerror}): is the ConfigMap gpuspawner-config mounted "
            "(the chart's hub.extraVolumes)?"
        ) from None
    except ValueError as e:
        raise ChartConfigError(f"{path} is not JSON ({e}).") from None
    if not isinstance(settings, dict):
        raise ChartConfigError(f"{path} holds no mapping of settings.")
    return settings


def configure(c: Config, config_dir: Path = CONFIG_DIR) -> dict[str, dict[str, Any]]:
    """Apply the chart's settings to the hub's config ``c``; the services added, by name."""
    settings = read_settings(config_dir)
    off = turned_off(settings)
    services = c.JupyterHub.get("services") or []
    c.JupyterHub.services = [s for s in services if s.get("name") not in off]
    c.GPUSpawner.gpu_inventory_all_namespaces = bool(settings.get("inventoryAllNamespaces"))
    accounting = settings.get("accounting") or {}
    c.GPUSpawner.accounting_enabled = bool(accounting.get("enabled", True))
    if accounting.get("dbUrl"):
        c.GPUSpawner.accounting_db_url = str(accounting["dbUrl"])
    kueue = settings.get("kueue") or {}
    if kueue.get("queue"):
        c.GPUSpawner.kueue_queue = str(kueue["queue"])
        c.GPUSpawner.kueue_priority_class = str(kueue.get("priorityClass") or "")
    return setup(c, **setup_arguments(settings, config_dir))
