"""A stand-in Kubernetes API server on 127.0.0.1, for the clients' error paths.

It speaks just enough of the API (``GET /api/v1/pods``,
``/api/v1/namespaces/NS/pods``, ``/api/v1/nodes``) for the real
``kubernetes_asyncio`` client to list objects through it: label selectors,
``limit``/``continue`` pages and Kubernetes ``Status`` bodies for errors. A
test scripts the answers (``fail``) to take each error path on purpose: 403,
410, 429, 500, or no answer at all (a hang, for timeouts). The real API server
is used in tests/e2e; here the point is to choose what it says.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from aiohttp import web

REASONS = {
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    410: "Expired",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
}

#: The API server's own text for a list the service account may not do.
FORBIDDEN_PODS = (
    'pods is forbidden: User "system:serviceaccount:jupyterhub:hub" cannot list resource '
    '"pods" in API group "" in the namespace "jupyterhub"'
)

FORBIDDEN_NODES = (
    'nodes is forbidden: User "system:serviceaccount:jupyterhub:hub" cannot list resource '
    '"nodes" in API group "" at the cluster scope'
)


def status_body(code: int, message: str) -> dict:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": REASONS.get(code, "Unknown"),
        "code": code,
    }


def _matches(obj: dict, selector: str) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    for term in filter(None, selector.split(",")):
        key, _, value = term.partition("=")
        if labels.get(key) != value:
            return False
    return True


class StandInApi:
    """Objects by kind ("pods", "nodes"), answered in pages; failures answered first.

    ``fail`` is a list of what the next requests get instead of the data, in
    order: an HTTP status (with a Status body), ``"hang"`` (no answer until
    the client gives up), or a ``(status, message)`` pair. ``always`` is a
    status every request gets; ``forbidden`` the kinds a service account
    without that permission is refused, with the API server's own sentence.
    """

    def __init__(self, pods: Iterable[dict] = (), nodes: Iterable[dict] = ()):
        self.objects = {"pods": list(pods), "nodes": list(nodes)}
        self.fail: list[Any] = []
        self.always: int | None = None
        #: kinds ("pods", "nodes") every request for which gets 403
        self.forbidden: set[str] = set()
        #: (path, query) of every request, in order
        self.requests: list[tuple[str, dict[str, str]]] = []
        self._runner: web.AppRunner | None = None
        self._stopping = asyncio.Event()
        self.port = 0

    async def _answer(self, request: web.Request) -> web.Response:
        self.requests.append((request.path, dict(request.query)))
        kind = "nodes" if request.path.endswith("/nodes") else "pods"
        failure = self.fail.pop(0) if self.fail else self.always
        if kind in self.forbidden:
            message = FORBIDDEN_PODS if kind == "pods" else FORBIDDEN_NODES
            failure = (403, message)
        if failure == "hang":
            await self._stopping.wait()
            return web.Response(status=503)
        if failure is not None:
            code, message = failure if isinstance(failure, tuple) else (failure, "")
            if code == 403 and not message:
                message = FORBIDDEN_PODS
            return web.json_response(status_body(code, message or f"injected {code}"), status=code)
        if (request.query.get("watch") or "").lower() in ("true", "1"):
            # a watch that sees no change: open until its timeout (or the server stops)
            try:
                await asyncio.wait_for(
                    self._stopping.wait(), float(request.query.get("timeoutSeconds") or 300)
                )
            except asyncio.TimeoutError:
                pass
            return web.Response(status=200, content_type="application/json", text="")
        namespace = request.match_info.get("namespace")
        objs = [
            o
            for o in self.objects[kind]
            if (namespace is None or (o.get("metadata") or {}).get("namespace") == namespace)
            and _matches(o, request.query.get("labelSelector", ""))
        ]
        start = int(request.query.get("continue") or 0)
        limit = int(request.query.get("limit") or 0) or len(objs) or 1
        page = objs[start : start + limit]
        meta: dict[str, Any] = {"resourceVersion": "100"}
        if start + limit < len(objs):
            meta["continue"] = str(start + limit)
        list_kind = "NodeList" if kind == "nodes" else "PodList"
        return web.json_response(
            {"kind": list_kind, "apiVersion": "v1", "metadata": meta, "items": page}
        )

    async def _patch(self, request: web.Request) -> web.Response:
        """A merge patch of a pod's annotations (null removes one), as the API server applies it."""
        body = await request.json()
        self.requests.append((request.method, request.path, request.content_type, body))
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        for pod in self.objects["pods"]:
            meta = pod.get("metadata") or {}
            if (meta.get("namespace"), meta.get("name")) == (namespace, name):
                annotations = meta.setdefault("annotations", {})
                for key, value in ((body.get("metadata") or {}).get("annotations") or {}).items():
                    if value is None:
                        annotations.pop(key, None)
                    else:
                        annotations[key] = value
                return web.json_response(pod)
        return web.json_response(status_body(404, f'pods "{name}" not found'), status=404)

    async def _delete(self, request: web.Request) -> web.Response:
        """Delete a pod by name, as the API server does (404 when there is none)."""
        self.requests.append((request.method, request.path, dict(request.query)))
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        for pod in self.objects["pods"]:
            meta = pod.get("metadata") or {}
            if (meta.get("namespace"), meta.get("name")) == (namespace, name):
                self.objects["pods"].remove(pod)
                return web.json_response(pod)
        return web.json_response(status_body(404, f'pods "{name}" not found'), status=404)

    async def start(self) -> StandInApi:
        app = web.Application()
        app.router.add_patch("/api/v1/namespaces/{namespace}/pods/{name}", self._patch)
        app.router.add_delete("/api/v1/namespaces/{namespace}/pods/{name}", self._delete)
        app.router.add_get("/api/v1/pods", self._answer)
        app.router.add_get("/api/v1/nodes", self._answer)
        app.router.add_get("/api/v1/namespaces/{namespace}/pods", self._answer)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        self._stopping.set()  # a hanging answer ends now, not at the runner's shutdown timeout
        if self._runner is not None:
            await self._runner.cleanup()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def kubeconfig(self, directory: Path) -> Path:
        """A kubeconfig pointing at this server, as a user's would."""
        path = directory / "kubeconfig.yaml"
        path.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "standin", "cluster": {"server": self.url}}],
                    "users": [{"name": "hub", "user": {"token": "standin-token"}}],
                    "contexts": [
                        {"name": "standin", "context": {"cluster": "standin", "user": "hub"}}
                    ],
                    "current-context": "standin",
                }
            )
        )
        return path


async def core_api_for(server: StandInApi) -> Any:
    """A real ``kubernetes_asyncio`` CoreV1Api talking to the stand-in."""
    from kubernetes_asyncio import client

    configuration = client.Configuration()
    configuration.host = server.url
    return client.CoreV1Api(client.ApiClient(configuration))
