"""A stand-in for Prometheus's query endpoint on 127.0.0.1 that answers what a test says.

A real Prometheus (tests/culler/promserver.py) answers well; this one answers
garbage, errors, bodies of the wrong shape, or nothing, over real HTTP, so the
client's whole path (transport, status, JSON, shape) is taken.
"""

from __future__ import annotations

import asyncio
import socket

from aiohttp import web

#: name -> (HTTP status, body) of answers no Prometheus should give, and one error it does give.
BAD_ANSWERS: dict[str, tuple[int, str]] = {
    "html": (200, "<html><body>502 Bad Gateway</body></html>"),
    "empty": (200, ""),
    "json-list": (200, "[1, 2]"),
    "data-not-object": (200, '{"status": "success", "data": "x"}'),
    "result-not-list": (
        200,
        '{"status": "success", "data": {"resultType": "vector", "result": 5}}',
    ),
    "item-not-object": (
        200,
        '{"status": "success", "data": {"resultType": "vector", "result": ["x"]}}',
    ),
    "value-not-number": (
        200,
        '{"status": "success", "data": {"resultType": "vector", "result": '
        '[{"metric": {"namespace": "jupyterhub", "pod": "jupyter-ann"}, "value": [1, "zz"]}]}}',
    ),
    "value-too-short": (
        200,
        '{"status": "success", "data": {"resultType": "vector", "result": '
        '[{"metric": {"namespace": "jupyterhub", "pod": "jupyter-ann"}, "value": [1]}]}}',
    ),
    "matrix": (200, '{"status": "success", "data": {"resultType": "matrix", "result": []}}'),
    "query-error": (
        422,
        '{"status": "error", "errorType": "execution", "error": "many-to-many matching"}',
    ),
    "server-error": (500, "internal error\n"),
}


class StandInPrometheus:
    """``answer``: (status, body) of every query; ``hang``: answer nothing until stopped."""

    def __init__(self, answer: tuple[int, str] = (200, "")):
        self.answer = answer
        self.hang = False
        self.queries = 0
        self._runner: web.AppRunner | None = None
        self._stopping = asyncio.Event()
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _query(self, request: web.Request) -> web.Response:
        self.queries += 1
        if self.hang:
            await self._stopping.wait()
        status, body = self.answer
        return web.Response(status=status, text=body, content_type="application/json")

    async def start(self) -> StandInPrometheus:
        app = web.Application()
        app.router.add_route("*", "/api/v1/query", self._query)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        self._stopping.set()
        if self._runner is not None:
            await self._runner.cleanup()


def closed_port_url() -> str:
    """A URL on 127.0.0.1 where nothing listens (Prometheus is down)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"
