"""Where the culler is, and which of its answers concerns this server (pure, no I/O)."""

from __future__ import annotations

import os
from collections.abc import Mapping

from traitlets import Float, Integer, Unicode, default
from traitlets.config import Configurable


class CullWarning(Configurable):
    """How this single-user server asks gpuspawner-culler whether it is about to be stopped."""

    culler_url = Unicode(
        help="""The culler service's base URL as this server reaches it, e.g.
        http://proxy-public/services/gpuspawner-culler/ (through the hub's proxy) or
        http://hub:10101/ (directly); /api/warning is asked there with the server's
        $JUPYTERHUB_API_TOKEN. Default: $GPUSPAWNER_CULLER_URL (set by the hub's
        configuration). Empty: never ask, show nothing.""",
    ).tag(config=True)

    @default("culler_url")
    def _default_culler_url(self):
        return os.environ.get("GPUSPAWNER_CULLER_URL", "")

    api_token = Unicode(
        help="The token the culler identifies this server by. Default: $JUPYTERHUB_API_TOKEN.",
    ).tag(config=True)

    @default("api_token")
    def _default_api_token(self):
        return os.environ.get("JUPYTERHUB_API_TOKEN", "")

    server_name = Unicode(
        help="This server's name on the hub ('' for the default server). Default: $JUPYTERHUB_SERVER_NAME.",
    ).tag(config=True)

    @default("server_name")
    def _default_server_name(self):
        return os.environ.get("JUPYTERHUB_SERVER_NAME", "")

    poll_seconds = Integer(
        60, help="Seconds between two questions of JupyterLab (and so of the culler)."
    ).tag(config=True)

    timeout = Float(10, help="Seconds before a question to the culler is abandoned.").tag(
        config=True
    )


def warning_url(culler_url: str) -> str:
    """The culler's /api/warning under its base URL."""
    return culler_url.rstrip("/") + "/api/warning"


def this_servers_warning(answer: Mapping, server_name: str) -> dict | None:
    """The culler's warning about this server, if any: the token might speak for more."""
    for warning in answer.get("warnings") or ():
        if isinstance(warning, Mapping) and warning.get("server") == server_name:
            return dict(warning)
    return None
