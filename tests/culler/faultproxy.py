"""A reverse proxy on 127.0.0.1 that counts requests and can fail them on purpose.

Used between the culler and the hub: the tests make the hub "fail" with real
HTTP errors and timeouts; the benchmark counts each culler's hub API requests.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable

from tornado import httpclient, httpserver, web


class FaultProxy:
    def __init__(self, upstream: str):
        self.upstream = upstream.rstrip("/")
        self.counts: Counter[str] = Counter()
        #: (method, path) -> None to forward, or an HTTP status to answer instead
        self.fault: Callable[[str, str], int | None] = lambda method, path: None
        self._server = None
        self.url = ""

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def fail_first(self, n: int, status: int = 503) -> None:
        remaining = [n]

        def fault(method, path):
            if remaining[0] > 0:
                remaining[0] -= 1
                return status
            return None

        self.fault = fault

    def start(self) -> str:
        proxy = self

        class Handler(web.RequestHandler):
            SUPPORTED_METHODS = ("GET", "POST", "DELETE", "PATCH", "PUT")

            async def _any(self):
                method, path = self.request.method, self.request.uri
                proxy.counts[method] += 1
                status = proxy.fault(method, path)
                if status == 0:  # hang: the client's timeout must fire
                    await asyncio.sleep(3600)
                if status:
                    self.set_status(status)
                    self.finish({"status": status, "message": "injected failure"})
                    return
                request = httpclient.HTTPRequest(
                    proxy.upstream + path,
                    method=method,
                    headers=self.request.headers,
                    body=self.request.body if method in ("POST", "PATCH", "PUT") else None,
                    allow_nonstandard_methods=True,
                    request_timeout=120,
                )
                response = await httpclient.AsyncHTTPClient().fetch(request, raise_error=False)
                self.set_status(response.code, response.reason)
                for name in ("Content-Type",):
                    if name in response.headers:
                        self.set_header(name, response.headers[name])
                if response.body:
                    self.write(response.body)

            get = post = delete = patch = put = _any

        self._server = httpserver.HTTPServer(web.Application([(r".*", Handler)]))
        sockets = __import__("tornado.netutil", fromlist=["bind_sockets"]).bind_sockets(
            0, "127.0.0.1"
        )
        self._server.add_sockets(sockets)
        self.url = f"http://127.0.0.1:{sockets[0].getsockname()[1]}"
        return self.url

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None
