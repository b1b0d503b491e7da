"""``GET /services/gpuspawner/stop-notices``: why the asking user's servers stopped (JSON).

JupyterHub's REST server model cannot be extended, so the notices GPUSpawner
keeps in each server's saved state (:mod:`gpuspawner.stopnotice`) are served
here, to the user they belong to::

    {"notices": [{"server": "train", "reason": "gpu-idle",
                  "stopped_at": "2026-12-01T14:02:00Z", "held": "2 × NVIDIA A100",
                  "message": "Your server 'train' (2 × NVIDIA A100) was stopped at 14:02 UTC because its GPUs were idle for 2 hours."}]}

Only stopped servers have one, until the user starts that server again. The
service reads the user's servers, stopped ones included, through the hub API
with its own token: it needs ``read:users``, ``read:servers`` and
``admin:server_state`` (granted by :func:`gpuspawner.userservice.hubconfig.add_service`).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from jupyterhub.services.auth import HubOAuthenticated
from tornado import web

from ..services.hub import HubClient, HubError
from ..stopnotice import STATE_KEY, StopNotice

#: Where the notices are served, under the service's prefix.
STOP_NOTICES_PATH = "stop-notices"
#: The hub API scopes the service needs for them.
STOP_NOTICE_SCOPES: tuple[str, ...] = ("read:users", "read:servers", "admin:server_state")

log = logging.getLogger(__name__)


def user_notices(user: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The notices of the stopped servers in a hub API user model (with ``state``)."""
    found = []
    for name, server in sorted((user.get("servers") or {}).items()):
        if not isinstance(server, Mapping) or not server.get("stopped"):
            continue
        state = server.get("state")
        notice = StopNotice.from_state(state.get(STATE_KEY)) if isinstance(state, Mapping) else None
        if notice is not None:
            found.append(notice.for_server(name, "").as_json())
    return found


def hub_client() -> HubClient:
    """The hub API with the token the hub hands a managed service."""
    return HubClient(
        os.environ.get("JUPYTERHUB_API_URL", "http://127.0.0.1:8081/hub/api"),
        os.environ.get("JUPYTERHUB_API_TOKEN", ""),
        timeout=10,
        max_retries=2,
        log=log,
    )


class StopNoticesHandler(HubOAuthenticated, web.RequestHandler):
    """Why each of the asking user's stopped servers was stopped."""

    def initialize(self, hub: HubClient) -> None:
        self.hub = hub

    @web.authenticated
    async def get(self) -> None:
        user = self.current_user
        if user.get("kind", "user") != "user":
            return self._refuse(403, "Stop notices are shown to users only.")
        path = f"/users/{quote(user['name'], safe='')}?include_stopped_servers=1"
        try:
            _, model = await self.hub.request("GET", path)
        except HubError as e:
            log.error("Could not read %s's servers for their stop notices: %s", user["name"], e)
            return self._refuse(
                503, "The hub did not tell why your servers stopped; try again in a minute."
            )
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.write(json.dumps({"notices": user_notices(model if isinstance(model, dict) else {})}))

    def _refuse(self, status: int, message: str) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.write(json.dumps({"status": status, "message": message}))
