"""``gpuspawner.setup(c, …)``: everything gpuspawner adds to a hub's configuration, in one call.

At the end of ``jupyterhub_config.py`` (or in one zero-to-jupyterhub
``hub.extraConfig`` snippet, which runs after the chart's own settings)::

    import gpuspawner
    gpuspawner.setup(c, culler_args=["--config=/etc/gpuspawner/culler_config.py"])

It checks the catalog (a bad one stops the hub at start), shows the stop
notices and cull warnings on the hub's pages, and adds the three services
with their roles:

- ``gpuspawner-culler`` (:mod:`gpuspawner.culler.hubconfig`), which every user
  may ask about their own servers (JupyterLab's cull warning);
- ``gpuspawner-admin``, the GPU page (:mod:`gpuspawner.admin.hubconfig`);
- ``gpuspawner``, the spawn form's live figures and the stop notices, for
  every user (:mod:`gpuspawner.userservice.hubconfig`).

Each module writes its own scopes; entries and roles already in the config
are completed, never replaced or doubled. The services are handed the hub's
own settings as they stand when ``setup`` runs (the catalog, the pod
placement, the namespace, the admin users): call it after them, at the end.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from traitlets.config import Config

from .admin.hubconfig import ADMIN_GROUP, add_admin
from .admin.hubconfig import URL as ADMIN_URL
from .culler.hubconfig import URL as CULLER_URL
from .culler.hubconfig import add_culler
from .hub.catalogcheck import check_catalog
from .hub.pages import configure as show_stop_notices
from .userservice.hubconfig import add_service, passed_on

#: Where the user service listens in the hub's own host or pod unless told otherwise.
USER_SERVICE_URL = "http://127.0.0.1:10103"


def setup(
    c: Config,
    *,
    culler: bool = True,
    admin: bool = True,
    user_service: bool = True,
    culler_url: str = CULLER_URL,
    admin_url: str = ADMIN_URL,
    user_service_url: str = USER_SERVICE_URL,
    ip: str = "",
    culler_args: Sequence[str] = (),
    admin_args: Sequence[str] = (),
    prometheus_url: str = "",
    environment: Mapping[str, str] | None = None,
    warning_url: str | None = None,
    admin_users: Iterable[str] | None = None,
    admin_groups: Sequence[str] = (ADMIN_GROUP,),
    environ: Mapping[str, str] | None = None,
) -> dict[str, dict[str, Any]]:
    """Check the catalog, show the notices, and add the services turned on, with their roles.

    - ``culler``, ``admin``, ``user_service``: which services to add.
    - ``culler_url``, ``admin_url``, ``user_service_url``: where each listens, and
      where the proxy routes ``/services/<name>/`` (an entry's own ``url`` wins).
    - ``ip``: the address they listen on when it differs from their URL's host
      (``0.0.0.0`` when the proxy runs in another pod, as in zero-to-jupyterhub).
    - ``culler_args``, ``admin_args``: the culler's and the GPU page's own arguments
      (``--config=…``, the culler's settings file, which also has the Prometheus names).
    - ``prometheus_url``: passed to the culler and the GPU page (``--prometheus-url``).
    - ``environment``: variables for every service, beside what the hub hands on of its
      own (:data:`~gpuspawner.userservice.hubconfig.PASSED_ON`, from ``environ``,
      default ``os.environ``: the cluster's address, the namespace, ``KUBECONFIG``).
    - ``warning_url``: the culler's base URL as notebooks reach it
      (``$GPUSPAWNER_CULLER_URL``, JupyterLab's cull warning); None: not set.
    - ``admin_users``: who sees the GPU page (None: the hub's admin users set so far);
      ``admin_groups``: the groups that do.

    Returns the service entries added or completed, by name.
    """
    check_catalog(c)
    show_stop_notices(c)
    env = {**passed_on(environ), **(environment or {})}
    prometheus = [f"--prometheus-url={prometheus_url}"] if prometheus_url else []
    added = []
    if culler:
        added.append(
            add_culler(
                c,
                url=culler_url,
                command_args=[*culler_args, *prometheus],
                environment=env,
                ip=ip,
                warning_url=warning_url,
            )
        )
    if admin:
        added.append(
            add_admin(
                c,
                url=admin_url,
                command_args=[*admin_args, *prometheus],
                environment=env,
                ip=ip,
                users=admin_users,
                groups=admin_groups,
            )
        )
    if user_service:
        added.append(
            add_service(c, url=user_service_url, ip=ip, environ=environ, environment=environment)
        )
    return {entry["name"]: entry for entry in added}
