"""A minimal synchronous HTTPS client for the sandbox's API server.

The control plane's own setup (health checks, applying manifests, token
requests) needs a handful of plain REST calls before any asyncio code runs, so
it uses the standard library rather than a full client. Everything else in the
project talks to the API server through kubernetes_asyncio.
"""

from __future__ import annotations

import base64
import json
import ssl
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml


class ApiError(Exception):
    """A non-2xx answer from the API server."""

    def __init__(self, status: int, method: str, path: str, body: str):
        self.status = status
        self.method = method
        self.path = path
        self.body = body
        try:
            message = json.loads(body).get("message", body)
        except (ValueError, AttributeError):
            message = body
        super().__init__(f"{method} {path} answered {status}: {message}")


@dataclass
class Response:
    status: int
    body: Any


class KubeApi:
    """REST calls against one API server with the credentials of one kubeconfig."""

    def __init__(
        self,
        server: str,
        ca_file: Path,
        *,
        cert_file: Path | None = None,
        key_file: Path | None = None,
        token: str | None = None,
        timeout: float = 30.0,
    ):
        self.server = server.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.context = ssl.create_default_context(cafile=str(ca_file))
        if cert_file is not None:
            self.context.load_cert_chain(str(cert_file), str(key_file) if key_file else None)
        # The API server is on loopback or our pod-range address: never through a proxy.
        self._opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=self.context)
        )

    @classmethod
    def from_kubeconfig(cls, path: Path, *, timeout: float = 30.0) -> KubeApi:
        """A client for the current context of a kubeconfig using embedded ``*-data`` fields."""
        config = yaml.safe_load(Path(path).read_text())
        current = config.get("current-context")
        context = next(c["context"] for c in config["contexts"] if c["name"] == current)
        cluster = next(c["cluster"] for c in config["clusters"] if c["name"] == context["cluster"])
        user = next(u["user"] for u in config["users"] if u["name"] == context["user"])
        # ssl loads credentials from files, once, when the context is built:
        # decoded copies live only until then.
        with tempfile.TemporaryDirectory(prefix="kubeapi-") as tmpdir:
            tmp = Path(tmpdir)
            ca = _materialise(cluster, "certificate-authority", tmp / "ca.crt")
            cert = _materialise(user, "client-certificate", tmp / "client.crt")
            key = _materialise(user, "client-key", tmp / "client.key")
            return cls(
                cluster["server"],
                ca,
                cert_file=cert,
                key_file=key,
                token=user.get("token"),
                timeout=timeout,
            )

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        query: dict[str, str] | None = None,
        raw: bool = False,
    ) -> Response:
        """One call; raises ApiError for any status outside 2xx."""
        url = self.server + path
        if query:
            url += "?" + urllib.parse.urlencode(query)
        data = None
        if body is not None:
            data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        try:
            with self._opener.open(req, timeout=self.timeout) as resp:
                text = resp.read().decode()
                status = resp.status
        except urllib.error.HTTPError as e:
            raise ApiError(e.code, method, path, e.read().decode(errors="replace")) from None
        if raw:
            return Response(status, text)
        return Response(status, json.loads(text) if text.strip() else None)

    def get(self, path: str, **kwargs) -> Any:
        return self.request("GET", path, **kwargs).body

    def post(self, path: str, body: Any, **kwargs) -> Any:
        return self.request("POST", path, body, **kwargs).body

    def delete(self, path: str, **kwargs) -> Any:
        return self.request("DELETE", path, **kwargs).body


def _materialise(section: dict, field: str, dest: Path) -> Path | None:
    """The path of a kubeconfig credential, writing ``<field>-data`` to ``dest`` if embedded."""
    if section.get(f"{field}-data"):
        dest.write_bytes(base64.b64decode(section[f"{field}-data"]))
        dest.chmod(0o600)
        return dest
    if section.get(field):
        return Path(section[field])
    return None


def kubeconfig(
    name: str,
    server: str,
    ca_pem: bytes,
    *,
    cert_pem: bytes | None = None,
    key_pem: bytes | None = None,
    token: str | None = None,
    namespace: str | None = None,
) -> dict[str, Any]:
    """A self-contained kubeconfig (credentials embedded, no paths) as a dict."""

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    user: dict[str, str] = {}
    if cert_pem is not None:
        user["client-certificate-data"] = b64(cert_pem)
    if key_pem is not None:
        user["client-key-data"] = b64(key_pem)
    if token is not None:
        user["token"] = token
    context: dict[str, str] = {"cluster": "gpuspawner-sandbox", "user": name}
    if namespace:
        context["namespace"] = namespace
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "gpuspawner-sandbox",
                "cluster": {"server": server, "certificate-authority-data": b64(ca_pem)},
            }
        ],
        "users": [{"name": name, "user": user}],
        "contexts": [{"name": name, "context": context}],
        "current-context": name,
    }
