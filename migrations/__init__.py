"""Alembic migrations: the only way the schema changes. Run with ``python -m firsttoken.migrate``."""
