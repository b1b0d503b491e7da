"""A one-route HTTP server on 127.0.0.1 that answers what the test sets, for clients' error paths."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def scripted_server(path: str, content_type: str | None = None) -> Iterator[dict[str, Any]]:
    """Serve ``path`` (GET and POST) with ``answer["status"]`` and ``answer["body"]``.

    Yields ``answer`` with ``answer["url"]``, the server's ``http://127.0.0.1:PORT``;
    the test changes status and body between requests. Start it inside the test's
    event loop (an async fixture), where the client runs too.
    """
    from tornado import httpserver, netutil, web

    answer: dict[str, Any] = {"status": 200, "body": b""}

    class Scripted(web.RequestHandler):
        def _answer(self) -> None:
            self.set_status(answer["status"])
            if content_type:
                self.set_header("Content-Type", content_type)
            self.finish(answer["body"])

        get = post = _answer

    server = httpserver.HTTPServer(web.Application([(path, Scripted)]))
    [sock] = netutil.bind_sockets(0, "127.0.0.1")
    server.add_sockets([sock])
    answer["url"] = f"http://127.0.0.1:{sock.getsockname()[1]}"
    try:
        yield answer
    finally:
        server.stop()
