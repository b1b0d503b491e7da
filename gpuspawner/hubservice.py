"""Settings every gpuspawner hub service shares (the culler, the admin page)."""

from __future__ import annotations

import os

from traitlets import Unicode, default
from traitlets.config import Configurable


class HubServiceSettings(Configurable):
    """How a hub-managed service reaches the hub's API.

    The hub passes both to the services it starts (``JUPYTERHUB_API_URL``,
    ``JUPYTERHUB_API_TOKEN``); set them for a service run by hand.
    """

    hub_api_url = Unicode(
        help="The hub's API URL. Default: $JUPYTERHUB_API_URL (set by the hub for managed services), else http://127.0.0.1:8081/hub/api."
    ).tag(config=True)

    @default("hub_api_url")
    def _default_api_url(self):
        return os.environ.get("JUPYTERHUB_API_URL", "http://127.0.0.1:8081/hub/api")

    api_token = Unicode(
        help="The service's API token. Default: $JUPYTERHUB_API_TOKEN (set by the hub for managed services)."
    ).tag(config=True)

    @default("api_token")
    def _default_token(self):
        return os.environ.get("JUPYTERHUB_API_TOKEN", "")
