"""The asyncio Redis client every firsttoken process uses for its ordinary commands (redis-py).

redis-py bounds each socket write with ``asyncio.wait_for(write, socket_timeout)``. On Python
3.11 ``wait_for`` runs the write as a new task, so every command (a rate-limit script, a cache
read) costs a task and two extra passes through the event loop before its bytes leave, and
under load each pass waits behind every ready callback. The connection classes here bound the
write with ``asyncio.timeout`` instead: same limit, same error, no task. Reads are unchanged.

That override leans on how redis-py's ``AbstractConnection.send_packed_command`` is written, so
pyproject.toml pins redis-py to the versions it was checked against, and
tests/unit/shared/redis/test_client_pin.py fails, saying what to re-check, when either moves.

A ``sentinel://`` URL gets the same pool with :class:`SentinelConnection`: each connection asks
the Sentinels for the master when it connects (shared/redis/sentinel.py, the one resolver of
every client here), and one that finds its server demoted (``READONLY``) drops and connects
again to the new master, as redis-py's own Sentinel connections do.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import quote

import redis.asyncio as aioredis
from redis.asyncio.connection import Connection, SSLConnection, UnixDomainSocketConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ReadOnlyError
from redis.exceptions import TimeoutError as RedisTimeoutError

from shared.errors import Overloaded
from shared.redis.address import RedisAddress
from shared.redis.sentinel import master_of

# What a client is told to wait when Redis cannot be reached (the connections here and the
# pipe's reconnect with a backoff of at most 1 s).
REDIS_RETRY_AFTER_MS = 1000

# What redis-py (and a bare socket under it) raises when Redis is down or does not answer:
# the service is unavailable for now, not broken. (Builtin ConnectionError and TimeoutError
# are OSErrors.)
UNREACHABLE = (RedisConnectionError, RedisTimeoutError, OSError)


class _WriteWithoutTask:
    socket_timeout: float | None

    async def send_packed_command(
        self, command: bytes | str | Iterable[bytes], check_health: bool = True
    ) -> None:
        timeout = self.socket_timeout
        if not timeout:
            await super().send_packed_command(command, check_health)  # type: ignore[misc]
            return
        self.socket_timeout = None  # the base class then writes without wait_for
        try:
            async with asyncio.timeout(timeout):
                await super().send_packed_command(command, check_health)  # type: ignore[misc]
        except TimeoutError:
            raise RedisTimeoutError("Timeout writing to socket") from None
        finally:
            self.socket_timeout = timeout


class TcpConnection(_WriteWithoutTask, Connection):
    pass


class UnixConnection(_WriteWithoutTask, UnixDomainSocketConnection):
    pass


class TlsConnection(_WriteWithoutTask, SSLConnection):
    pass


class SentinelConnection(_WriteWithoutTask, Connection):
    """A TCP connection to whichever server the Sentinels name master when it connects."""

    def __init__(self, *, sentinel_address: RedisAddress, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.sentinel_address = sentinel_address

    async def _connect(self) -> None:
        master = await master_of(self.sentinel_address)
        self.host, self.port = master.host, master.port
        await super()._connect()  # type: ignore[no-untyped-call]

    async def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().read_response(*args, **kwargs)
        except ReadOnlyError:
            # Demoted by a failover: the next connect asks the Sentinels again. A
            # ConnectionError, so callers treat it as Redis unreachable for now (retry).
            await self.disconnect()
            raise RedisConnectionError(
                f"Redis at {self.host}:{self.port} is no longer the master"
            ) from None


_CLASSES: dict[type, type] = {
    Connection: TcpConnection,
    UnixDomainSocketConnection: UnixConnection,
    SSLConnection: TlsConnection,
}


def redis_client(url: str, *, max_connections: int = 256, **options: Any) -> aioredis.Redis:
    """A client on a blocking pool (a burst waits up to 5 s for a connection instead of
    failing), decoding replies to str unless told otherwise."""
    options.setdefault("decode_responses", True)
    if url.startswith("sentinel://"):
        return aioredis.Redis.from_pool(_sentinel_pool(url, max_connections, options))
    pool = aioredis.BlockingConnectionPool.from_url(
        url, max_connections=max_connections, timeout=5, **options
    )
    pool.connection_class = _CLASSES.get(pool.connection_class, pool.connection_class)
    return aioredis.Redis.from_pool(pool)  # closing the client closes the pool


def _sentinel_pool(
    url: str, max_connections: int, options: dict[str, Any]
) -> aioredis.BlockingConnectionPool:
    address = RedisAddress.from_url(url)
    options.setdefault("socket_connect_timeout", address.connect_timeout_s)
    return aioredis.BlockingConnectionPool(
        connection_class=SentinelConnection,
        max_connections=max_connections,
        timeout=5,
        sentinel_address=address,
        db=address.db,
        username=address.username,
        password=address.password,
        client_name=address.client_name,
        **options,
    )


def master_url(url: str) -> str:
    """A redis:// URL of the server ``url`` names now (the master, for a Sentinel URL; ``url``
    itself otherwise): for the blocking clients of tools and tests, which connect once."""
    address = RedisAddress.from_url(url)
    if not address.sentinel:
        return url
    # On a thread of its own: the caller may be inside a running loop (a test).
    with ThreadPoolExecutor(1) as pool:
        master = pool.submit(asyncio.run, master_of(address)).result()
    auth = ""
    if master.password is not None:
        auth = f"{quote(master.username or '', safe='')}:{quote(master.password, safe='')}@"
    return f"redis://{auth}{master.host}:{master.port}/{master.db}"


@contextlib.contextmanager
def unreachable_as_overloaded(what: str) -> Iterator[None]:
    """Redis down or silent inside the block becomes :class:`~shared.errors.Overloaded` with a
    retry hint, saying what was not done (`what`): the client retries; it is no bug."""
    try:
        yield
    except UNREACHABLE as exc:
        raise Overloaded(
            f"{what}: Redis cannot be reached ({type(exc).__name__}); retry shortly",
            retry_after_ms=REDIS_RETRY_AFTER_MS,
        ) from exc
