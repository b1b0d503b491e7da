"""What every handler of the gpuspawner service shares: HubOAuth, the service, reads by fetch."""

from __future__ import annotations

from typing import TYPE_CHECKING

from jupyterhub.services.auth import HubOAuthenticated
from tornado import web

if TYPE_CHECKING:
    from .app import UserService


class UserHandler(HubOAuthenticated, web.RequestHandler):
    """A handler for logged-in users (HubOAuth; the scope access:services!service=gpuspawner).

    Routes pass the service as ``{"service": service}`` (see ``app.handlers``).
    """

    def initialize(self, service: UserService) -> None:
        self.service = service

    def check_xsrf_cookie(self) -> None:
        # Pages of the hub (the spawn form) fetch these with the login cookie, and
        # cannot send the service's XSRF token (its cookie belongs to the service's
        # path), so HubOAuth would turn a GET away. A GET here must change nothing,
        # and no other site can read an answer (no CORS headers): nothing to forge.
        # Anything else keeps the check.
        if self.request.method not in ("GET", "HEAD"):
            super().check_xsrf_cookie()
