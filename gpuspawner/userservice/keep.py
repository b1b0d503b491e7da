"""``/services/gpuspawner/keep``: "Keep for 1 h" from the hub's home page, forwarded to the culler.

The home page's warning line links each of the culler's keep choices here
(``GET keep?server=train&seconds=3600``): a page with one button that posts
the choice back (``POST keep``, HubOAuth cookie and the service's XSRF token).
The hub's pages cannot post here themselves: the service's XSRF token is
signed with its own secret, and its cookie belongs to its own path. A script
may post JSON (``{"server": "train", "seconds": 3600}``) with a token of the
user's instead; it is answered in JSON.

The service asks the culler's ``POST /api/keep`` with its own token, naming
the user the hub identified (``{"user": …, "server": …, "seconds": …}``): the
culler honours that from the services in its ``keep_services`` only, and
decides whether the keep is allowed (the image's ``max_keep``, pressure).
The service's token needs no hub scope for it: the culler asks the hub whose
token it is and trusts only the names in ``keep_services``
(:mod:`gpuspawner.userservice.hubconfig` hands the service the culler's URL). Whatever the request carries is
checked first (:func:`gpuspawner.core.keep.keep_request`), and every answer is
one sentence.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from typing import Any

from jinja2 import Environment
from markupsafe import Markup
from tornado import web
from tornado.httpclient import AsyncHTTPClient, HTTPClientError

from ..core.endpoints import CULLER_KEEP_API
from ..core.endpoints import KEEP_PATH as KEEP_PATH
from ..core.keep import KeepRequestError, keep_label, keep_request, kept_text
from ..core.stopreasons import LOCAL_TIME_SCRIPT, MAX_TEXT, iso_time, utc_clock
from .base import UserHandler

log = logging.getLogger(__name__)

#: Said when the culler cannot be asked (not configured, not answering, a broken answer).
NO_CULLER = "The culler did not answer, so your server is not kept; try again in a minute."
#: Said when the service is not told where the culler is.
NOT_CONFIGURED = "Keeping a server is not available on this hub: it runs no culler."
#: Said to a token that is not a user's.
USERS_ONLY = "Only a server's own user can keep it."


def culler_keep_url(culler_url: str) -> str:
    """The culler's keep API under its base URL."""
    return culler_url.rstrip("/") + "/" + CULLER_KEEP_API


def keep_answer(status: int, body: bytes | str | None) -> tuple[int, str, float | None]:
    """What to tell the user of the culler's answer: ``(status, sentence, kept until)``.

    A keep (200 with ``until``, an epoch) reads "Kept until 15:02 UTC."; a refusal
    (4xx) passes on the culler's own sentence; anything else is :data:`NO_CULLER`.
    """
    try:
        data = json.loads(body or b"")
    except ValueError:
        data = None
    if not isinstance(data, Mapping):
        return 503, NO_CULLER, None
    until = data.get("until", data.get("keep_until"))
    if status == 200:
        if isinstance(until, bool) or not isinstance(until, (int, float)):
            return 503, NO_CULLER, None
        try:
            return 200, kept_text(until), float(until)
        except (OverflowError, OSError, ValueError):  # not a time datetime can show
            return 503, NO_CULLER, None
    message = data.get("message")
    if 400 <= status < 500 and isinstance(message, str) and message:
        return status, message[:MAX_TEXT], None
    return 503, NO_CULLER, None


async def ask_culler(
    culler_url: str, token: str, user: str, server: str, seconds: int, timeout: float = 10
) -> tuple[int, str, float | None]:
    """Forward one keep to the culler with the service's ``token``; see :func:`keep_answer`."""
    url = culler_keep_url(culler_url)
    body = json.dumps({"user": user, "server": server, "seconds": seconds})
    try:
        response = await AsyncHTTPClient().fetch(
            url,
            method="POST",
            body=body,
            headers={"Authorization": f"token {token}", "Content-Type": "application/json"},
            request_timeout=timeout,
            follow_redirects=False,
            raise_error=False,
        )
    except (HTTPClientError, OSError) as e:
        log.warning("Could not ask the culler at %s to keep %r/%r: %s", url, user, server, e)
        return 503, NO_CULLER, None
    status, message, until = keep_answer(response.code, response.body)
    if status == 503:
        log.warning(
            "The culler at %s answered %d to a keep of %r/%r", url, response.code, user, server
        )
    elif response.code == 403 and not until:
        # the service itself was refused: it is not in the culler's keep_services
        log.warning("The culler refused to keep %r/%r: %r", user, server, message)
    return status, message, until


PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Keep your server</title>
<link rel="stylesheet" href="{{ hub_prefix }}static/css/style.min.css">
</head>
<body>
<div class="container gpuspawner-keep" style="margin-top: 2em">
{% if message %}
  <p class="alert {{ 'alert-success' if kept else 'alert-warning' }} gpuspawner-keep-message"
     role="status">{{ message }}</p>
{% endif %}
{% if ask %}
  <form method="post" action="">
    <input type="hidden" name="_xsrf" value="{{ xsrf }}">
    <input type="hidden" name="server" value="{{ server }}">
    <input type="hidden" name="seconds" value="{{ seconds }}">
    <p>Keep {{ server_phrase }} running though it is idle, until {{ until_text }}?</p>
    <button type="submit" class="btn btn-primary gpuspawner-keep-button">{{ label }}</button>
  </form>
{% endif %}
  <p><a href="{{ hub_prefix }}home">Back to the home page</a></p>
</div>
{{ local_time_script }}
</body>
</html>
"""

_environment = Environment(autoescape=True)


def time_html(epoch: float) -> Markup:
    """``<time datetime=…>15:02 UTC</time>``, shown in the reader's local time by the page's script."""
    return Markup('<time datetime="{}" data-gpuspawner-time>{}</time>').format(
        iso_time(epoch), utc_clock(epoch)
    )


def render_page(
    *,
    hub_prefix: str,
    message: str | Markup = "",
    kept: bool = False,
    ask: bool = False,
    xsrf: str = "",
    server: str = "",
    seconds: int = 0,
    now: float = 0.0,
) -> str:
    """The service's keep page: a question with one button, or what came of it (escaped)."""
    phrase = f"your server '{server}'" if server else "your server"
    return _environment.from_string(PAGE).render(
        hub_prefix=hub_prefix,
        message=message,
        kept=kept,
        ask=ask,
        xsrf=xsrf,
        server=server,
        seconds=seconds,
        server_phrase=phrase,
        label=keep_label(seconds) if seconds else "",
        until_text=time_html(now + seconds) if ask else "",
        local_time_script=LOCAL_TIME_SCRIPT,
    )


class KeepHandler(UserHandler):
    """``GET``: the page that asks; ``POST``: the keep, forwarded to the culler."""

    def _json_request(self) -> bool:
        return self.request.headers.get("Content-Type", "").startswith("application/json")

    def _request_data(self) -> Mapping[str, Any]:
        if self.request.method == "GET":
            return {
                "server": self.get_query_argument("server", ""),
                "seconds": self.get_query_argument("seconds", ""),
            }
        if self._json_request():
            try:
                data = json.loads(self.request.body or b"{}")
            except ValueError:
                data = None
            return data if isinstance(data, Mapping) else {}
        return {
            "server": self.get_body_argument("server", ""),
            "seconds": self.get_body_argument("seconds", ""),
        }

    def _answer(self, status: int, message: str | Markup, until: float | None = None) -> None:
        self.set_status(status)
        self.set_header("Cache-Control", "no-store")
        if self._json_request():
            self.set_header("Content-Type", "application/json")
            answer: dict[str, Any] = {"status": status, "message": str(message)}
            if until is not None:
                answer.update(until=until, until_iso=iso_time(until))
            self.finish(json.dumps(answer))
            return
        if until is not None:
            message = Markup("Kept until {}.").format(time_html(until))
        self.finish(
            render_page(
                hub_prefix=self.hub_auth.hub_prefix, message=message, kept=until is not None
            )
        )

    def _user(self) -> str | None:
        user = self.current_user
        if user.get("kind", "user") != "user":
            self._answer(403, USERS_ONLY)
            return None
        return user["name"]

    @web.authenticated
    def get(self) -> None:
        if self._user() is None:
            return
        try:
            server, seconds = keep_request(self._request_data())
        except KeepRequestError as e:
            return self._answer(400, str(e))
        token = self.xsrf_token  # bytes; on a page view it also sets the service's XSRF cookie
        self.set_header("Cache-Control", "no-store")
        self.finish(
            render_page(
                hub_prefix=self.hub_auth.hub_prefix,
                ask=True,
                xsrf=token.decode() if isinstance(token, bytes) else token,
                server=server,
                seconds=seconds,
                now=time.time(),
            )
        )

    @web.authenticated
    async def post(self) -> None:
        user = self._user()
        if user is None:
            return
        try:
            server, seconds = keep_request(self._request_data())
        except KeepRequestError as e:
            return self._answer(400, str(e))
        if not self.service.culler_url:
            return self._answer(503, NOT_CONFIGURED)
        status, message, until = await ask_culler(
            self.service.culler_url, self.hub_auth.api_token, user, server, seconds
        )
        log.info("Keep of %r/%r for %d s: %d %r", user, server, seconds, status, message)
        self._answer(status, message, until)
