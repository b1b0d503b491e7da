"""GPU usage accounting: the usage store (:mod:`~gpuspawner.accounting.store`).

GPU servers' allocation intervals in tables of their own (``gpuspawner_*``), in the
hub's database or one of the admin's choosing (SQLite or PostgreSQL), with Alembic
migrations (:mod:`gpuspawner.accounting.migrations`) under a version table of their
own, so JupyterHub's tables and its ``alembic_version`` are never touched.
"""
