"""Engines and sessions for PostgreSQL (asyncpg) and SQLite (aiosqlite).

Write helpers in ``shared.db`` never commit: callers own the transaction, e.g.
``async with sessionmaker.begin() as session: await insert_usage(session, record)``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import event, make_url, text
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)

# SQLite serialises writers; a writer waits this long for the lock instead of failing at once
# (gateway reads and bulk-worker writes share one file in the embedded mode).
SQLITE_BUSY_TIMEOUT_MS = 5000
# asyncpg waits 60 s by default for a connection; a blackholed database would pin a bulk task
# that long before its retry is even scheduled.
PG_CONNECT_TIMEOUT_S = 10.0


def _sqlite_file(url: URL) -> Path | None:
    database = url.database
    if not database or database == ":memory:" or database.startswith("file:"):
        return None
    return Path(database)


def _enable_sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    try:
        # WAL lets readers run while a writer holds the lock; it persists in the file.
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA foreign_keys=ON")
    finally:
        cursor.close()


def make_engine(url: str, **kwargs: Any) -> AsyncEngine:
    """An async engine for `url`; extra kwargs go to `create_async_engine` (e.g. poolclass)."""
    parsed = make_url(url)
    # A statement error's message would otherwise carry its bound values, i.e. the prompt and
    # answer text of a turn, into the worker's log and Celery's task result.
    kwargs.setdefault("hide_parameters", True)
    if parsed.get_backend_name() == "sqlite":
        path = _sqlite_file(parsed)
        if path is not None:
            path.expanduser().resolve().parent.mkdir(parents=True, exist_ok=True)
        engine = create_async_engine(parsed, **kwargs)
        event.listen(engine.sync_engine, "connect", _enable_sqlite_pragmas)
        return engine
    kwargs.setdefault("pool_pre_ping", True)  # drop connections a database restart killed
    if parsed.get_driver_name() == "asyncpg":
        connect_args = dict(kwargs.pop("connect_args", {}))
        connect_args.setdefault("timeout", PG_CONNECT_TIMEOUT_S)
        kwargs["connect_args"] = connect_args
    return create_async_engine(parsed, **kwargs)


def make_sessionmaker(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    # expire_on_commit=False: objects stay readable after commit without an implicit (async) reload.
    return async_sessionmaker(engine, expire_on_commit=False)


async def ping(engine: AsyncEngine) -> None:
    """Round-trip `SELECT 1`; raises whatever the driver raises when the database is unusable."""
    async with engine.connect() as conn:
        await conn.execute(text("SELECT 1"))


@asynccontextmanager
async def one_off_session(url: str) -> AsyncIterator[AsyncSession]:
    """A session on a short-lived engine, committed on success: for commands, start-up and
    tests that touch the database once (long-lived processes keep their own engine)."""
    engine = make_engine(url)
    try:
        async with make_sessionmaker(engine).begin() as session:
            yield session
    finally:
        await engine.dispose()
