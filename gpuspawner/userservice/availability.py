"""``GET /services/gpuspawner/availability``: the spawn form's live GPU figures.

The answer is :func:`gpuspawner.inventory.figures.live_payload` for the catalog as the
asking user sees it (:meth:`~gpuspawner.core.catalog.Catalog.visible_to`: images
restricted to groups or users they are not in are left out), read from the
service's own watch of nodes and pods: no API server request per call. The
user and their groups come from the hub through OAuth (the identity the hub
hands every service includes the user's groups), so the service needs no
hub API scope of its own.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tornado import web

from ..core.catalog import Catalog
from ..core.placement import Placement
from ..inventory.figures import live_payload
from .base import UserHandler

if TYPE_CHECKING:
    from ..inventory.reflectors import InventoryReflector

from ..core.endpoints import AVAILABILITY_PATH as AVAILABILITY_PATH


class NotAUser(Exception):
    """The figures follow a user's image access: a service's token has none."""


def user_payload(
    user: Mapping[str, Any],
    catalog: Catalog | None,
    inventory: InventoryReflector | None,
    placement: Placement,
) -> dict[str, Any]:
    """The figures for ``user`` (the hub's identity model: ``kind``, ``name``, ``groups``).

    ``catalog`` is the whole catalog, or None when it is invalid. Raises
    :class:`NotAUser` for a service's identity.
    """
    if user.get("kind", "user") != "user":
        raise NotAUser(user.get("name", ""))
    visible = None
    if catalog is not None:
        visible = catalog.visible_to(user["name"], user.get("groups") or [])
    return live_payload(inventory, visible, placement)


class AvailabilityHandler(UserHandler):
    """GPU figures per catalog type, for the spawn form of the user who asks."""

    @web.authenticated
    def get(self) -> None:
        try:
            payload = user_payload(
                self.current_user,
                self.service.current_catalog(),
                self.service.inventory,
                self.service.placement(),
            )
        except NotAUser:
            raise web.HTTPError(403, "GPU availability is shown to users only") from None
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.write(json.dumps(payload))
