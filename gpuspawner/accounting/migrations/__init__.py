"""The usage store's Alembic migrations, run by :meth:`~gpuspawner.accounting.store.UsageStore.migrate`.

Configured in code (no ``alembic.ini``): ``env.py`` runs on the connection the store
hands it, in the store's transaction, under the version table
``gpuspawner_alembic_version``. A package, so that the wheel ships it.
"""
