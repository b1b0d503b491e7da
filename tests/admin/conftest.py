"""Recorded hub users, pods and nodes (tests/fixtures/admin/README.md), the admin catalog, and the
service itself running over stand-ins of the hub and the API server."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, replace

import pytest
from jupyterhub.services.auth import HubOAuth
from tornado.httpclient import AsyncHTTPClient, HTTPResponse
from tornado.httpserver import HTTPServer
from tornado.testing import bind_unused_port

from gpuspawner.admin.report import parse_time
from gpuspawner.admin.service import SERVICE_NAME, GPUAdmin
from gpuspawner.clients.kube import Reader, RetryPolicy
from gpuspawner.core.catalog import load_catalog_file
from gpuspawner.inventory.figures import catalog_availability
from gpuspawner.inventory.model import inventory_from

from ..conftest import FIXTURES
from ..kubeapi import StandInApi
from .hubapi import ADMIN_TOKEN, SERVICE_TOKEN, StandInHub

ADMIN = FIXTURES / "admin"


def _load(name):
    data = json.loads((ADMIN / name).read_text())
    return data["items"] if isinstance(data, dict) else data


@pytest.fixture
def users():
    return copy.deepcopy(_load("users.json"))


@pytest.fixture
def pods():
    return copy.deepcopy(_load("pods.json"))


@pytest.fixture
def catalog():
    return load_catalog_file(ADMIN / "catalog.yaml")


@pytest.fixture
def figures(catalog):
    inventory = inventory_from(_load("nodes.json"), _load("all-pods.json"))
    return catalog_availability(inventory, catalog)


@pytest.fixture
def now(users):
    """Ten minutes after the last recorded activity."""
    latest = max(parse_time(s["last_activity"]) for u in users for s in u["servers"].values())
    return latest + 600


@dataclass
class RunningService:
    """The admin service (its real tornado app) on 127.0.0.1, reading stand-ins of the hub and the API server."""

    admin: GPUAdmin
    hub: StandInHub
    kube: StandInApi
    url: str  # the page's URL, with the service's prefix
    server: HTTPServer

    async def fetch(
        self, path: str = "", method: str = "GET", token: str | None = ADMIN_TOKEN, **kwargs
    ) -> HTTPResponse:
        """One request with an admin's token; redirects are not followed, errors are answers."""
        headers = dict(kwargs.pop("headers", {}))
        if token:
            headers["Authorization"] = f"token {token}"
        return await AsyncHTTPClient().fetch(
            self.url + path,
            method=method,
            headers=headers,
            follow_redirects=False,
            raise_error=False,
            allow_nonstandard_methods=True,
            **kwargs,
        )

    async def close(self) -> None:
        self.admin.close_store()
        self.server.stop()
        await self.server.close_all_connections()
        if self.admin.kube is not None:
            await self.admin.kube.close()
        await self.kube.stop()
        self.hub.stop()


@pytest.fixture
async def start_service(tmp_path, monkeypatch):
    """``await start_service(users, pods)``: the service as the hub starts it, over stand-ins.

    Its environment is what the hub gives a managed service; the Kubernetes
    client reads the stand-in API server through a kubeconfig, with retries
    cut short so that a failing API server fails the page view in a second.
    """
    started: list[RunningService] = []

    async def start(
        users: list[dict],
        pods: list[dict],
        nodes: list[dict] | None = None,
        argv: tuple[str, ...] = (),
    ) -> RunningService:
        hub = StandInHub(users).start()
        kube = await StandInApi(
            pods=pods, nodes=_load("nodes.json") if nodes is None else nodes
        ).start()
        sock, port = bind_unused_port()
        prefix = f"/services/{SERVICE_NAME}/"
        monkeypatch.chdir(tmp_path)
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        # a usage database only where a test gives one (--GPUAdmin.accounting_db_url)
        monkeypatch.delenv("GPUSPAWNER_ACCOUNTING_DB_URL", raising=False)
        for name, value in {
            "KUBECONFIG": str(kube.kubeconfig(tmp_path)),
            "POD_NAMESPACE": "jupyterhub",
            "JUPYTERHUB_API_URL": hub.api_url,
            "JUPYTERHUB_API_TOKEN": SERVICE_TOKEN,
            "JUPYTERHUB_SERVICE_PREFIX": prefix,
            "JUPYTERHUB_SERVICE_NAME": SERVICE_NAME,
            "JUPYTERHUB_SERVICE_URL": f"http://127.0.0.1:{port}",
            "JUPYTERHUB_CLIENT_ID": f"service-{SERVICE_NAME}",
            "JUPYTERHUB_BASE_URL": "/",
        }.items():
            monkeypatch.setenv(name, value)
        # JupyterHub keeps one HubOAuth per process, made from the environment of the first
        HubOAuth.clear_instance()
        admin = GPUAdmin()
        admin.initialize(
            [
                "--kubernetes=on",
                f"--catalog={ADMIN / 'catalog.yaml'}",
                "--GPUAdmin.cache_seconds=0",
                *argv,
            ]
        )
        admin.hub.max_retries = 1
        admin.hub.backoff_base = 0.01
        admin.hub.timeout = 2
        if admin.kube is not None:
            admin.kube.client.reader = Reader(
                RetryPolicy(timeout=1, first_delay=0.01), timeout=2, logger=admin.log
            )
        server = HTTPServer(admin.web_app())
        server.add_sockets([sock])
        running = RunningService(admin, hub, kube, f"http://127.0.0.1:{port}{prefix}", server)
        started.append(running)
        return running

    yield start
    for running in started:
        await running.close()
    HubOAuth.clear_instance()


@pytest.fixture
def usage_db(tmp_path):
    """``usage_db(intervals)``: the URL of a real SQLite usage store holding ``intervals``,
    migrated and written by the store itself as the hub's recorder does."""
    from gpuspawner.accounting.store import UsageStore

    def make(intervals, name: str = "usage.sqlite") -> str:
        url = f"sqlite:///{tmp_path / name}"
        store = UsageStore(url)
        try:
            store.migrate()
            for iv in intervals:
                store.open(iv if iv.end is None else replace(iv, end=None, end_source=""))
                if iv.end is not None:
                    assert store.close(iv.uid, iv.end, iv.end_source)
        finally:
            store.close()
        return url

    return make


@pytest.fixture
def names_in_store():
    """``names_in_store(url, since, until)``: the user names the store holds for the period,
    as it keeps them (it makes NUL U+FFFD and cuts a name at 255 characters)."""
    from gpuspawner.accounting.store import UsageStore

    def names(url: str, since: float, until: float) -> set[str]:
        store = UsageStore(url)
        try:
            return {iv.user for iv in store.intervals(since, until)}
        finally:
            store.close()

    return names
