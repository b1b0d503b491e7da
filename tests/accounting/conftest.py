"""The usage store's databases: a SQLite file, and a real PostgreSQL (tests/postgres.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpuspawner.accounting.store import UsageStore

from ..postgres import PostgresServer

BACKENDS = ("sqlite", "postgresql")


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """One PostgreSQL server for the session; each test gets a database of its own."""
    server = PostgresServer()
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture(params=BACKENDS)
def db_url(request, tmp_path) -> str:
    """A fresh, empty database on each backend."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'jupyterhub.sqlite'}"
    return request.getfixturevalue("postgres").database()


@pytest.fixture
def store(db_url) -> Iterator[UsageStore]:
    store = UsageStore(db_url)
    store.migrate()
    try:
        yield store
    finally:
        store.close()
