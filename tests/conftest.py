"""Shared test helpers: fixture paths and catalog loading."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from hypothesis import settings

from gpuspawner.core.catalog import Catalog, load_catalog_file

from . import jupyterhub_line, timetable

# The property tests run beside the machine tests on a shared, noisy machine: an
# example that takes longer than Hypothesis's default 200 ms deadline is slow, not
# wrong, and must not fail the run as "flaky".
settings.register_profile("gpuspawner", deadline=None)
settings.load_profile("gpuspawner")

FIXTURES = Path(__file__).parent / "fixtures"
REPO = Path(__file__).parent.parent


def pytest_addoption(parser: pytest.Parser) -> None:
    timetable.pytest_addoption(parser)
    jupyterhub_line.pytest_addoption(parser)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    jupyterhub_line.select(config, items)


def pytest_configure(config: pytest.Config) -> None:
    timetable.pytest_configure(config)
    # `make test` runs the unit and hub-level tests as a shell background job, which
    # starts with SIGINT ignored, and an ignored signal stays ignored across exec.
    # JupyterHub stops its local servers and managed services with SIGINT first: each
    # would wait out its kill timeout. A handled signal is reset to default on exec.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture
def pools_catalog() -> Catalog:
    return load_catalog_file(FIXTURES / "catalogs" / "pools.yaml")


@pytest.fixture
def example_catalog() -> Catalog:
    """The example catalog shipped in config/, so the documented example stays valid."""
    return load_catalog_file(REPO / "config" / "catalog.yaml")


@pytest.fixture
def offline_kubeconfig(monkeypatch):
    """Point KubeSpawner's client at a loopback port where nothing listens."""
    from kubernetes_asyncio.config import kube_config

    path = str(FIXTURES / "k8s-offline" / "kubeconfig.yaml")
    monkeypatch.setenv("KUBECONFIG", path)
    # read once at import time by kubernetes_asyncio
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", path)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
