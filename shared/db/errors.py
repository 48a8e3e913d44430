"""Which database errors mean "try again later" — declared once, used by every durable writer.

A retryable error is one where the same write may succeed later without changes: the server is
down, refusing, restarting, out of connections, or dropped the connection mid-statement. Every
other error (a constraint violated by bad data, a missing table) would fail again identically,
so retrying it only delays the failure.

What the drivers actually raise when PostgreSQL is unreachable (seen here, asyncpg 0.32,
SQLAlchemy 2.1):

- nothing listening: ``ConnectionRefusedError`` straight from ``asyncpg.connect`` (not wrapped);
- accepted then closed (a proxy or pooler up, the server behind it down):
  ``ConnectionError('unexpected connection_lost() call')`` or ``ConnectionResetError``;
- connection cut mid-statement: ``sqlalchemy.exc.DBAPIError`` (a plain DBAPIError, not
  ``OperationalError``) with ``connection_invalidated=True``, caused by asyncpg's
  ``ConnectionDoesNotExistError``.
"""

from __future__ import annotations

import asyncpg
from sqlalchemy import exc as sa_exc

RETRYABLE_DB_ERRORS: tuple[type[BaseException], ...] = (
    sa_exc.OperationalError,  # wrapped "server closed", sqlite "database is locked", ...
    sa_exc.InterfaceError,  # wrapped asyncpg InterfaceError (e.g. connection does not exist)
    sa_exc.TimeoutError,  # the pool had no connection to hand out in time
    OSError,  # refused / reset / timed out while connecting (also covers TimeoutError)
    asyncpg.PostgresConnectionError,  # SQLSTATE class 08
    asyncpg.CannotConnectNowError,  # 57P03: the server is starting up or shutting down
    asyncpg.TooManyConnectionsError,  # 53300
    asyncpg.InterfaceError,  # includes ConnectionDoesNotExistError
)


class DatabaseUnavailable(Exception):
    """The database could not take a write just now; the same write may succeed later.

    Raised ``from`` the driver's error, so task frameworks can retry on this one type.
    """


def is_retryable(exc: BaseException) -> bool:
    """Whether `exc` (or the driver error it wraps) means the database is unavailable."""
    seen: BaseException | None = exc
    for _ in range(4):  # the wrapper, SQLAlchemy's adapted error, the driver's error
        if seen is None:
            return False
        if isinstance(seen, sa_exc.DBAPIError) and seen.connection_invalidated:
            return True
        if isinstance(seen, RETRYABLE_DB_ERRORS):
            return True
        orig = seen.orig if isinstance(seen, sa_exc.DBAPIError) else None
        seen = orig if isinstance(orig, BaseException) else seen.__cause__
    return False
