"""The revisions, oldest first (Alembic does not load ``__init__``)."""
