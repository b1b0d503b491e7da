"""Alembic's environment for the usage store: online only, on the store's own connection.

:meth:`~gpuspawner.accounting.store.UsageStore.migrate` opens the transaction (SQLite:
``BEGIN IMMEDIATE``; PostgreSQL: an advisory lock), so two processes migrating at once
take turns and the second finds the first's revision; the migrations run inside it.
"""

from __future__ import annotations

from alembic import context

from gpuspawner.accounting.store import VERSION_TABLE

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError(
        "The usage store's migrations run through UsageStore.migrate(), which passes the connection."
    )
context.configure(connection=connection, version_table=VERSION_TABLE)
with context.begin_transaction():
    context.run_migrations()
