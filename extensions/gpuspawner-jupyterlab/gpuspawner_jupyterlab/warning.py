"""Where the culler is, and which of its answers concerns this server (pure, no I/O)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from datetime import datetime, timezone

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


#: The longest keep a request may name (a week); the culler's own bound is lower.
MAX_KEEP_SECONDS = 7 * 86400
#: Said when a request names no usable duration (only a forged one can).
BAD_SECONDS = "Choose how long to keep this server with one of its buttons."
#: Said when the culler cannot be asked, or answers something else than a keep or a refusal.
NO_CULLER = "The culler did not answer, so this server is not kept; try again in a minute."
#: Said when this server is not told where the culler is.
NOT_CONFIGURED = "Keeping this server is not available: the hub runs no culler for it."
#: The longest sentence of the culler's passed on.
MAX_MESSAGE = 300


def keep_url(culler_url: str) -> str:
    """The culler's /api/keep under its base URL."""
    return culler_url.rstrip("/") + "/api/keep"


def keep_seconds(body: object) -> int | None:
    """The whole seconds JupyterLab asks to keep this server for, or None when it is no such number."""
    seconds = body.get("seconds") if isinstance(body, Mapping) else None
    if isinstance(seconds, float) and seconds.is_integer():
        seconds = int(seconds)
    # bool is an int: true must not read as one second
    if isinstance(seconds, bool) or not isinstance(seconds, int):
        return None
    return seconds if 0 < seconds <= MAX_KEEP_SECONDS else None


def keep_answer(status: int, body: bytes | str | None) -> tuple[int, dict]:
    """What JupyterLab is told of the culler's answer: a keep (``until``) or one sentence."""
    try:
        data = json.loads(body or b"")
    except ValueError:
        data = None
    if not isinstance(data, Mapping):
        return 502, {"message": NO_CULLER}
    until = data.get("until", data.get("keep_until"))
    if status == 200 and not isinstance(until, bool) and isinstance(until, (int, float)):
        try:
            clock = datetime.fromtimestamp(until, timezone.utc).strftime("%H:%M UTC")
        except (OverflowError, OSError, ValueError):
            return 502, {"message": NO_CULLER}
        return 200, {"until": float(until), "message": f"Kept until {clock}."}
    message = data.get("message")
    if 400 <= status < 500 and isinstance(message, str) and message:
        return status, {"message": message[:MAX_MESSAGE]}
    return 502, {"message": NO_CULLER}
