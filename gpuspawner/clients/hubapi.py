"""The hub's REST API, as the culler and the admin service use it: list users, stop servers.

Connection errors, timeouts, 429 and 5xx answers are retried with exponential
backoff (with jitter); other errors are raised as :class:`HubError` with one
sentence. ``/users`` is read page by page (JupyterHub's pagination).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import AsyncIterator, Mapping
from typing import Any
from urllib.parse import quote, urlencode

from ..core.serverpod import parse_timestamp

PAGINATION_MEDIA_TYPE = "application/jupyterhub-pagination+json"

_RETRY_STATUSES = {429, 500, 502, 503, 504, 599}


class HubError(Exception):
    """A hub API call failed for good (after retries, or not retryable)."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


def parse_time(value: str | None) -> float | None:
    """The hub's ISO 8601 timestamps (``2026-11-29T10:00:00.123456Z``) -> POSIX seconds; None
    for anything else (read the one way every API time is read)."""
    return parse_timestamp(value)


def _users(items: Any, path: str) -> list[Mapping[str, Any]]:
    """A page's user models, each checked to be a model with a name; else HubError."""
    if not isinstance(items, list) or not all(
        isinstance(u, Mapping) and isinstance(u.get("name"), str) for u in items
    ):
        raise HubError(f"The hub answered GET {path} with something other than user models.")
    return items


class HubClient:
    """A small async client for the hub API with retries, backoff and a request count."""

    def __init__(
        self,
        api_url: str,
        token: str,
        *,
        timeout: float = 30,
        max_retries: int = 4,
        backoff_base: float = 0.5,
        backoff_max: float = 30,
        page_size: int = 200,
        log: logging.Logger | None = None,
    ):
        self.api_url = api_url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.page_size = page_size
        self.log = log or logging.getLogger(__name__)
        #: HTTP requests sent, retries included (the benchmark reports it)
        self.requests = 0
        #: API calls made, each counted once however often it was retried
        self.calls = 0

    def _backoff(self, attempt: int) -> float:
        delay = min(self.backoff_max, self.backoff_base * (2**attempt))
        return delay * (0.5 + random.random() / 2)

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        accept: str = "application/json",
        *,
        base: str | None = None,
    ) -> tuple[int, Any]:
        """Send one API request, retrying what can be retried; return (status, body).

        The body is JSON (or None) unless ``accept`` asks for text. ``base``
        replaces the API URL (for the hub's ``/hub/metrics``, beside its API).
        """
        from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

        url = f"{self.api_url if base is None else base}{path}"
        self.calls += 1
        data = None if body is None else json.dumps(body)
        last = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                delay = self._backoff(attempt - 1)
                self.log.warning(
                    "Hub API %s %s failed (%s); retry %d of %d in %.1fs",
                    method,
                    path,
                    last,
                    attempt,
                    self.max_retries,
                    delay,
                )
                await asyncio.sleep(delay)
            self.requests += 1
            request = HTTPRequest(
                url,
                method=method,
                body=data,
                allow_nonstandard_methods=True,
                headers={"Authorization": f"token {self.token}", "Accept": accept},
                request_timeout=self.timeout,
                connect_timeout=self.timeout,
            )
            try:
                response = await AsyncHTTPClient().fetch(request)
            except HTTPClientError as e:
                if e.code in _RETRY_STATUSES:
                    # tornado's 599 is a timeout or a dropped connection, not the hub's answer
                    last = str(e) if e.code == 599 else f"HTTP {e.code}"
                    continue
                message = ""
                if e.response is not None and e.response.body:
                    try:
                        message = json.loads(e.response.body).get("message", "")
                    except (ValueError, AttributeError):
                        message = ""
                raise HubError(
                    f"The hub refused {method} {path} with {e.code}"
                    + (f": {message}" if message else "."),
                    status=e.code,
                ) from e
            except (OSError, asyncio.TimeoutError) as e:
                last = f"{type(e).__name__}: {e}"
                continue
            if not accept.endswith("json"):
                return response.code, response.body.decode("utf-8", "replace")
            try:
                payload = json.loads(response.body) if response.body else None
            # RecursionError: JSON nested deeper than the parser goes
            except (ValueError, RecursionError):
                raise HubError(
                    f"The hub answered {method} {path} with something that is not JSON.",
                    status=response.code,
                ) from None
            return response.code, payload
        raise HubError(
            f"The hub API did not answer {method} {path} after {self.max_retries + 1} attempts "
            f"(last: {last})."
        )

    async def iter_users(self, state: str = "active") -> AsyncIterator[Mapping[str, Any]]:
        """Every user with a server in ``state``, page by page."""
        offset = 0
        while True:
            query = urlencode({"state": state, "offset": offset, "limit": self.page_size})
            path = f"/users?{query}"
            _, page = await self.request("GET", path, accept=PAGINATION_MEDIA_TYPE)
            if isinstance(page, list):
                # a hub without pagination answers a plain list
                for user in _users(page, path):
                    yield user
                return
            if not isinstance(page, Mapping):
                raise HubError(f"The hub answered GET {path} with no list of users.")
            for user in _users(page.get("items") or [], path):
                yield user
            following = page.get("_pagination")
            following = following.get("next") if isinstance(following, Mapping) else None
            if not following:
                return
            next_offset = following.get("offset") if isinstance(following, Mapping) else None
            if isinstance(next_offset, bool) or not isinstance(next_offset, int):
                raise HubError(f"The hub answered GET {path} with no offset for the next page.")
            if next_offset <= offset:
                # a page that points back would be read for ever
                raise HubError(f"The hub answered GET {path} with a next page that is not later.")
            offset = next_offset

    async def metrics(self) -> str:
        """The hub's Prometheus metrics (``/hub/metrics``, beside the API; scope ``read:metrics``)."""
        base = self.api_url[: -len("/api")] if self.api_url.endswith("/api") else self.api_url
        _, text = await self.request("GET", "/metrics", accept="text/plain", base=base)
        return text

    async def stop_server(self, user: str, server: str) -> int:
        """Ask the hub to stop a server; 202 (stopping), 204 (stopped) and 400/404
        (no longer running or gone) all leave it stopped."""
        path = f"/users/{quote(user, safe='')}/server"
        if server:
            path = f"/users/{quote(user, safe='')}/servers/{quote(server, safe='')}"
        try:
            status, _ = await self.request("DELETE", path)
        except HubError as e:
            if e.status in (400, 404):
                # stopped or removed since it was listed: nothing left to do
                self.log.info("%s/%s was already stopped", user, server)
                return e.status
            raise
        return status
