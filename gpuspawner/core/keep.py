"""A user's "Keep for 1 h" as the pages show it and as a request carries it (pure).

The culler offers the choices on its warning (:attr:`CullWarning.keep_choices
<gpuspawner.core.stopreasons.CullWarning.keep_choices>`, seconds) and decides
whether a keep is allowed (``POST /api/keep``); the hub's home page and the
user service show the choices as buttons and check what a request carries
before they forward it: a request is data from the browser, and anything
that is not a server name and a whole number of seconds is refused here
with one sentence.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .stopreasons import utc_clock

#: The longest keep a request may name (a week); the culler's own bound is lower.
MAX_KEEP_SECONDS = 7 * 86400
#: The longest server name JupyterHub stores.
MAX_SERVER_NAME = 255


class KeepRequestError(ValueError):
    """A keep request that is not one: its message is the sentence for the user."""


def keep_label(seconds: float) -> str:
    """``Keep for 1 h``, ``Keep for 4 h``, ``Keep for 90 min``: a button's text."""
    seconds = int(seconds)
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"Keep for {seconds // 3600} h"
    return f"Keep for {max(1, round(seconds / 60))} min"


def kept_text(until: float) -> str:
    """``Kept until 15:02 UTC.``: what the user reads after a keep."""
    return f"Kept until {utc_clock(until)}."


def keep_request(data: Mapping[str, Any]) -> tuple[str, int]:
    """The server name and seconds of a keep request (a form's or a JSON body's values).

    ``seconds`` may be a number or the text of a whole number (a form sends text).
    Raises :class:`KeepRequestError` with one sentence for anything else.
    """
    server = data.get("server", "")
    if not isinstance(server, str) or len(server) > MAX_SERVER_NAME:
        raise KeepRequestError("That is not one of your servers' names.")
    # JupyterHub's server names never hold "/" nor control characters
    if "/" in server or any(ord(ch) < 32 or ord(ch) == 127 for ch in server):
        raise KeepRequestError("That is not one of your servers' names.")
    seconds = data.get("seconds")
    if isinstance(seconds, str) and seconds.strip().isdigit() and seconds.isascii():
        seconds = int(seconds.strip())
    if isinstance(seconds, float) and seconds.is_integer():
        seconds = int(seconds)
    if isinstance(seconds, bool) or not isinstance(seconds, int):
        raise KeepRequestError("Choose how long to keep your server with one of its buttons.")
    if not 0 < seconds <= MAX_KEEP_SECONDS:
        raise KeepRequestError("Choose how long to keep your server with one of its buttons.")
    return server, seconds
