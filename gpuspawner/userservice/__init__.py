"""``python -m gpuspawner.userservice``: the user-facing gpuspawner service.

A hub-managed JupyterHub service named ``gpuspawner`` (:data:`SERVICE_NAME`),
reached through the proxy at ``/services/gpuspawner/``. Every logged-in user
may use it with the scope ``access:services!service=gpuspawner``
(:func:`access_scope`), which the shipped configurations add to the hub's
``user`` role (:mod:`gpuspawner.userservice.hubconfig`).

- :mod:`~gpuspawner.userservice.base`: what every handler shares (HubOAuth,
  the service object, GETs fetched by the hub's pages).
- :mod:`~gpuspawner.userservice.availability`: ``GET availability``, the
  spawn form's live GPU figures for the user who asks.
- :mod:`~gpuspawner.userservice.stopnotices`: ``GET stop-notices``, why the
  asking user's servers were stopped (JSON; the hub's REST server model cannot
  carry it).
- :mod:`~gpuspawner.userservice.app`: the service's settings, its own GPU
  inventory (the same watches as the hub's) and its handler list.
- :mod:`~gpuspawner.userservice.hubconfig`: the hub configuration that runs it.
"""

from ..core.endpoints import USER_SERVICE_NAME as SERVICE_NAME
from ..core.endpoints import access_scope

__all__ = ["SERVICE_NAME", "access_scope"]
