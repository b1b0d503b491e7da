"""``GET /services/gpuspawner/stop-notices``: why the asking user's servers stopped (JSON).

JupyterHub's REST server model cannot be extended, so the notices GPUSpawner
keeps in each server's saved state (:mod:`gpuspawner.core.stopreasons`) are served
here, to the user they belong to::

    {"notices": [{"server": "train", "reason": "gpu-idle",
                  "stopped_at": "2026-12-01T14:02:00Z", "held": "2 × NVIDIA A100",
                  "message": "Your server 'train' (2 × NVIDIA A100) was stopped at 14:02 UTC because its GPUs were idle for 2 hours."}]}

Only stopped servers have one, until the user starts that server again. The
service reads the user's servers, stopped ones included, through the hub API
with the user's own token (the OAuth token of their login to the service, or
the token a script sends), never with a token of its own: it holds no scope on
any user. That token needs :data:`USER_SCOPES` on the user's own servers,
which :func:`gpuspawner.userservice.hubconfig.add_service` adds to the hub's
``user`` role and to the service's OAuth client.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote

from jupyterhub.services.auth import HubOAuthenticated
from tornado import web

from ..clients.hubapi import HubClient, HubError
from ..core.endpoints import STOP_NOTICES_PATH as STOP_NOTICES_PATH
from ..core.stopreasons import STATE_KEY, StopNotice

#: What the user's own token needs, on their own servers only: list them, stopped
#: ones included (read:servers), with the state the notice is kept in
#: (admin:server_state: read-only through the REST API; nothing writes it).
USER_SCOPES: tuple[str, ...] = ("read:servers!user", "admin:server_state!user")

#: Said when the user's token may not read their servers' state (an older login, or a
#: script's token made with fewer scopes).
NO_STATE = (
    "Your login does not let this service read why your servers stopped: log in again, "
    "or send a token with the scopes read:servers and admin:server_state on your own servers."
)

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


def state_hidden(user: Mapping[str, Any]) -> bool:
    """Whether the user model lacks what the notices are read from (the token lacks a scope).

    The hub answers any token of the user with their model (every token may read
    its owner's name), and leaves out, rather than refusing, what the token may
    not read: ``servers`` without read:servers, a server's ``state`` without
    admin:server_state. A user with no stopped server cannot tell the latter,
    and needs not.
    """
    if "servers" not in user:
        return True
    servers = user.get("servers") or {}
    return any(
        isinstance(s, Mapping) and s.get("stopped") and "state" not in s for s in servers.values()
    )


def hub_api_url() -> str:
    """The hub API's URL, as the hub hands it to a managed service."""
    return os.environ.get("JUPYTERHUB_API_URL", "http://127.0.0.1:8081/hub/api")


def hub_for_token(token: str) -> HubClient:
    """The hub API as the user whose ``token`` this is."""
    return HubClient(hub_api_url(), token, timeout=10, max_retries=2, log=log)


class StopNoticesHandler(HubOAuthenticated, web.RequestHandler):
    """Why each of the asking user's stopped servers was stopped."""

    def initialize(self, hub_for: Callable[[str], HubClient] = hub_for_token) -> None:
        self.hub_for = hub_for

    @web.authenticated
    async def get(self) -> None:
        user = self.current_user
        if user.get("kind", "user") != "user":
            return self._refuse(403, "Stop notices are shown to users only.")
        # The token that identified the user (their OAuth cookie, or the header a
        # script sent): the hub then shows exactly what this user may see.
        token = self.hub_auth.get_token(self)
        path = f"/users/{quote(user['name'], safe='')}?include_stopped_servers=1"
        try:
            _, model = await self.hub_for(token).request("GET", path)
        except HubError as e:
            if e.status == 403:
                return self._refuse(403, NO_STATE)
            log.error(
                "Could not read the servers of %r for their stop notices: %s", user["name"], e
            )
            return self._refuse(
                503, "The hub did not tell why your servers stopped; try again in a minute."
            )
        model = model if isinstance(model, dict) else {}
        if state_hidden(model):
            log.warning(
                "The token of %r may not read their servers' state: %s", user["name"], NO_STATE
            )
            return self._refuse(403, NO_STATE)
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.write(json.dumps({"notices": user_notices(model)}))

    def _refuse(self, status: int, message: str) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.write(json.dumps({"status": status, "message": message}))
