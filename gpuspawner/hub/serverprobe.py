"""Whether a started notebook server answers HTTP yet, asked often enough to notice at once.

After a spawner's ``start()`` returns, JupyterHub waits for the server with an
exponential backoff (0.2 s, 0.4 s, 0.8 s, ... up to 5 s between asks), so a
server that answers 0.7 s after its container started is seen up to a second
late. GPUSpawner asks itself, first every 50 ms and then at most every
250 ms, before its ``start()`` returns; the hub's own first ask then finds the
server up. An ask is one HTTP request the server answers in a millisecond, or
a connection its pod refuses at once.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable, Iterator

from tornado.httpclient import AsyncHTTPClient, HTTPClientError
from tornado.iostream import StreamClosedError

#: Seconds before the second ask; each next wait is this many times longer ...
FIRST_WAIT = 0.05
GROWTH = 1.3
#: ... up to this many seconds between asks (the most a server is seen late).
LONGEST_WAIT = 0.25
#: Seconds one ask may take before it counts as "not answering yet".
ASK_TIMEOUT = 5.0
#: What tornado reports for "no HTTP answer".
NO_ANSWER = 599


def waits(
    first: float = FIRST_WAIT, growth: float = GROWTH, longest: float = LONGEST_WAIT
) -> Iterator[float]:
    """The seconds to wait between asks: growing from ``first`` by ``growth``, capped at ``longest``."""
    wait = first
    while True:
        yield min(wait, longest)
        wait *= growth


def is_answer(status: int) -> bool:
    """A server answers when it sends any status below 500 (even 404), as JupyterHub counts it.

    :data:`NO_ANSWER` (599) is tornado's "no HTTP answer" (refused, reset, timed out).
    """
    return 0 < status < 500


async def ask(client: AsyncHTTPClient, url: str) -> int:
    """One ask: the server's HTTP status, or :data:`NO_ANSWER`."""
    try:
        response = await client.fetch(
            url,
            raise_error=False,
            follow_redirects=False,
            connect_timeout=ASK_TIMEOUT,
            request_timeout=ASK_TIMEOUT,
        )
    except (OSError, HTTPClientError, StreamClosedError):
        # Refused, reset or timed out: the server is not listening yet.
        return NO_ANSWER
    return response.code


async def wait_until_answering(
    url: str, timeout: float, status: Callable[[str], Awaitable[int]] | None = None
) -> None:
    """Return once the server at ``url`` answers; :class:`TimeoutError` after ``timeout`` seconds.

    The error's message is JupyterHub's own for a server that never answers.
    ``status`` replaces the HTTP ask (tests). The asks use a client of their own:
    the hub's shared one has few connections, which its proxy calls need.
    """
    client = None
    if status is None:
        client = AsyncHTTPClient(force_instance=True)
        status = functools.partial(ask, client)
    try:
        deadline = time.monotonic() + timeout
        for wait in waits():
            if is_answer(await status(url)):
                return
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"Server at {url} didn't respond in {timeout} seconds")
            await asyncio.sleep(min(wait, left))
    finally:
        if client is not None:
            client.close()
