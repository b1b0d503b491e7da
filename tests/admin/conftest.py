"""Recorded hub users, pods and nodes (tests/fixtures/admin/README.md) and the admin catalog."""

from __future__ import annotations

import copy
import json

import pytest

from gpuspawner.admin.report import parse_time
from gpuspawner.catalog import load_catalog_file
from gpuspawner.inventory.figures import catalog_availability
from gpuspawner.inventory.model import inventory_from

from ..conftest import FIXTURES

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
