"""A stand-in for the hub's REST API on 127.0.0.1, as the admin service talks to it.

It answers what the service asks (``GET /users`` page by page, ``GET
/users/NAME``, ``DELETE`` of a server) and what the service's
``HubOAuthenticated`` handlers ask to identify a token (``GET /user``).
Unlike a real hub it takes any user or server name, so the tests can list
names a hub would refuse to create, and a test scripts its failures: an HTTP
status, ``"hang"`` (no answer until the client gives up) or a body.

It serves from threads of its own, as a real hub answers from another
process: JupyterHub's token check blocks the service's event loop while it
waits for the hub.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit

from gpuspawner.admin.service import ADMIN_SCOPE

#: The token of an admin with the service's custom scope.
ADMIN_TOKEN = "admin-token"
#: The token of a user without it.
USER_TOKEN = "user-token"
#: The service's own token.
SERVICE_TOKEN = "service-token"

_WHO = {
    ADMIN_TOKEN: {
        "kind": "user",
        "name": "admin",
        "admin": False,
        "groups": [],
        "scopes": [ADMIN_SCOPE, "access:services!service=gpuspawner-admin"],
    },
    USER_TOKEN: {
        "kind": "user",
        "name": "bob",
        "admin": False,
        "groups": [],
        "scopes": ["access:services!service=gpuspawner-admin"],
    },
}

_API = "/hub/api"


class StandInHub:
    """``users``: the hub's user models. ``fail``: what the next ``/users`` requests get
    instead (a status, ``"hang"`` or ``(status, body text)``); ``always``: what every
    one gets. ``stop_status``: the answer to a DELETE of a server."""

    def __init__(self, users: list[dict[str, Any]]):
        self.users = users
        self.fail: list[Any] = []
        self.always: Any = None
        self.stop_status = 202
        #: (method, path) of every request but the token checks
        self.requests: list[tuple[str, str]] = []
        self._stopping = threading.Event()
        self._server: ThreadingHTTPServer | None = None

    @property
    def api_url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}{_API}"

    def _fault(self) -> tuple[int, bytes] | None:
        failure = self.fail.pop(0) if self.fail else self.always
        if failure is None:
            return None
        if failure == "hang":
            self._stopping.wait()
            return 503, b""
        if isinstance(failure, tuple):
            return failure[0], failure[1].encode()
        return failure, json.dumps({"status": failure, "message": f"injected {failure}"}).encode()

    def answer(self, method: str, target: str, token: str) -> tuple[int, bytes]:
        path = urlsplit(target).path
        if path == f"{_API}/user":
            model = _WHO.get(token)
            if model is None:
                return 403, json.dumps({"status": 403, "message": "no such token"}).encode()
            return 200, json.dumps(model).encode()
        self.requests.append((method, target))
        if token != SERVICE_TOKEN:
            return 403, json.dumps({"status": 403, "message": "not the service"}).encode()
        parts = [unquote(p) for p in path[len(_API) + 1 :].split("/")]
        if method == "GET" and parts == ["users"]:
            fault = self._fault()
            if fault is not None:
                return fault
            page = {
                "items": self.users,
                "_pagination": {"offset": 0, "limit": 200, "total": len(self.users), "next": None},
            }
            return 200, json.dumps(page).encode()
        if method == "GET" and len(parts) == 2 and parts[0] == "users":
            for user in self.users:
                if user["name"] == parts[1]:
                    return 200, json.dumps(user).encode()
            return 404, json.dumps({"status": 404, "message": "Not Found"}).encode()
        if method == "DELETE" and parts[0] == "users" and parts[2:3] in (["server"], ["servers"]):
            status = self.stop_status
            if status >= 400:
                return status, json.dumps(
                    {"status": status, "message": f"injected {status}"}
                ).encode()
            return status, b""
        return 404, json.dumps({"status": 404, "message": "Not Found"}).encode()

    def start(self) -> StandInHub:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def _any(self) -> None:
                token = self.headers.get("Authorization", "").partition(" ")[2]
                status, body = hub.answer(self.command, self.path, token)
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_DELETE = do_POST = _any

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self._stopping.set()  # a hanging answer ends now
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
