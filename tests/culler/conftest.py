import secrets

import pytest

from ..hub.hubprocess import free_port
from ..kubeapi import StandInApi
from .dcgm import DCGMExporter
from .hubtools import start_culler_hub, stop_all
from .promserver import start_prometheus


@pytest.fixture(scope="module")
def exporter():
    exporter = DCGMExporter()
    exporter.start()
    yield exporter
    exporter.stop()


@pytest.fixture(scope="module")
def prometheus(exporter, tmp_path_factory):
    target = f"127.0.0.1:{exporter._server.server_address[1]}"
    prometheus = start_prometheus(tmp_path_factory.mktemp("prometheus"), target)
    prometheus.wait_for("up", lambda r: bool(r) and r[0]["value"][1] == "1")
    yield prometheus
    prometheus.stop()


@pytest.fixture(scope="module")
def culler_token():
    return secrets.token_hex(16)


@pytest.fixture(scope="module")
def culler_hub(tmp_path_factory, culler_token):
    port = free_port()
    hub = start_culler_hub(tmp_path_factory.mktemp("hub"), culler_token, managed_port=port)
    hub.managed_culler_port = port
    yield hub
    hub.stop()


@pytest.fixture
def hub(culler_hub):
    """The module's hub, with no server left running after the test."""
    yield culler_hub
    stop_all(culler_hub)


@pytest.fixture
async def kubeapi(tmp_path, monkeypatch):
    """A stand-in Kubernetes API server the culler finds through $KUBECONFIG, as a user's would."""
    server = await StandInApi().start()
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(server.kubeconfig(tmp_path)))
    yield server
    await server.stop()
