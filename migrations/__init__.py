"""Alembic migrations: the only way the schema changes. Run by ``firsttoken migrate``."""
