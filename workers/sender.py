"""One pipelined Redis connection per chat worker process that carries every job's chunks.

Publishing a token used to be a full redis-py call: take a pooled connection, pack, write,
wait for the reply, give the connection back. At 50 streams that was a fifth of a chat worker's
CPU and one round trip of waiting per token. Here :meth:`ChunkSender.send` only queues the
script call and returns; a writer task sends everything queued during one turn of the event
loop in one write, and a reader task takes the replies off the socket in order.

Ordering: Redis runs one connection's commands in the order they arrive, and every chunk goes
through this one connection, so a job's tokens (and its `done` after them) reach its channel
and replay stream in the order they were sent, without waiting for each reply.

Faults: replies are matched to the calls in flight in order. An error reply is logged (a
``NOSCRIPT`` after a ``SCRIPT FLUSH`` is handled like a lost connection). If the connection
drops, the sender reconnects and sends again every call not yet answered: a chunk may then
arrive twice, which the gateway drops by its ``seq``. While Redis is unreachable the calls wait
in memory; after ``down_fail_s`` without Redis, or with ``max_pending`` calls waiting,
:meth:`send` raises :class:`ConnectionError`, so the chat ends instead of buffering forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections import deque
from dataclasses import dataclass

from redis.asyncio.connection import AbstractConnection, ConnectionPool
from redis.exceptions import NoScriptError, RedisError, ResponseError

from shared.resp import pack

log = logging.getLogger(__name__)

Reply = asyncio.Future[object]


@dataclass(slots=True)
class _Call:
    command: bytes  # the packed EVALSHA, sent again as is after a reconnect
    reply: Reply | None  # set to the script's answer, for the few calls that want it


class ChunkSender:
    """Runs one Lua script per call, pipelined; see the module docstring."""

    def __init__(
        self,
        redis_url: str,
        script: str,
        *,
        max_pending: int = 100_000,
        down_fail_s: float = 2.0,
        client_name: str = "firsttoken-chunks",
    ) -> None:
        # Only to parse the URL. No socket timeout: the reader waits on an idle connection
        # for as long as no chat runs (redis-py's default of 5 s would end it).
        # Named, so `CLIENT LIST` shows which connection carries the chunks.
        self._pool = ConnectionPool.from_url(
            redis_url, socket_timeout=None, client_name=client_name
        )
        self._script = script.encode()
        self._sha = hashlib.sha1(self._script).hexdigest().encode()
        self._max_pending = max_pending
        self._down_fail_s = down_fail_s
        self._conn: AbstractConnection | None = None
        self._buffer: list[bytes] = []
        self._in_flight: deque[_Call] = deque()  # written (or about to be), not yet answered
        self._wake = asyncio.Event()
        self._up = asyncio.Event()
        self._drained = asyncio.Event()  # set whenever nothing waits for a reply
        self._down_since: float | None = None
        self._task: asyncio.Task[None] | None = None
        self.errors = 0

    async def start(self) -> None:
        await self._connect()
        self._task = asyncio.create_task(self._run(), name="chunk-sender")

    def send(
        self, keys: tuple[str, ...], args: tuple[str, ...], reply: Reply | None = None
    ) -> None:
        """Queue one script call; returns at once (unless Redis is gone: then it raises).

        `reply`, when given, gets the script's answer (or its error) once it arrives."""
        if not self._up.is_set():
            down = time.monotonic() - (self._down_since or time.monotonic())
            if down > self._down_fail_s:
                raise ConnectionError(f"Redis has been unreachable for {down:.1f}s")
        if len(self._in_flight) >= self._max_pending:
            raise ConnectionError(
                f"{len(self._in_flight)} chunks wait for Redis; it is too slow or unreachable"
            )
        call = _Call(self._evalsha(keys, args), reply)
        self._in_flight.append(call)
        if self._up.is_set():
            self._buffer.append(call.command)
            self._wake.set()

    async def flush(self) -> None:
        """Wait until every queued call has been answered."""
        while self._in_flight:
            self._drained.clear()
            await self._drained.wait()

    async def close(self, grace_s: float = 2.0) -> None:
        """Give queued chunks `grace_s` to go out, then close the connection."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace_s):
                await self.flush()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await self._conn.disconnect()

    # --- internals ------------------------------------------------------------------------
    def _evalsha(self, keys: tuple[str, ...], args: tuple[str, ...]) -> bytes:
        encoded = [s.encode() for s in (*keys, *args)]
        return pack((b"EVALSHA", self._sha, b"%d" % len(keys), *encoded))

    async def _connect(self) -> None:
        conn = self._pool.make_connection()
        await conn.connect()
        await conn.send_command("SCRIPT", "LOAD", self._script)
        await conn.read_response()
        self._conn = conn
        # Everything not answered on the old connection goes again, in order.
        self._buffer = [call.command for call in self._in_flight]
        self._down_since = None
        self._up.set()
        if self._buffer:
            self._wake.set()

    async def _run(self) -> None:
        while True:
            conn = self._conn
            assert conn is not None
            tasks = {asyncio.create_task(self._read(conn)), asyncio.create_task(self._write(conn))}
            try:
                done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in tasks:
                    task.cancel()
                    with contextlib.suppress(BaseException):
                        await task
            # Either side ending means the connection is broken (each loops forever).
            errors = [t.exception() for t in done if not t.cancelled()]
            log.warning("chunk sender lost Redis (%r); reconnecting", errors[0] if errors else None)
            self._up.clear()
            self._down_since = time.monotonic()
            with contextlib.suppress(Exception):
                await conn.disconnect()
            await self._reconnect()

    async def _reconnect(self) -> None:
        delay = 0.05
        while True:
            try:
                await self._connect()
                return
            except (ConnectionError, OSError, RedisError) as exc:
                log.warning("chunk sender cannot reach Redis (%r); retrying", exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)

    async def _write(self, conn: AbstractConnection) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            data, self._buffer = self._buffer, []
            if data:
                await conn.send_packed_command(data, check_health=False)

    async def _read(self, conn: AbstractConnection) -> None:
        in_flight = self._in_flight
        while True:
            try:
                answer = await conn.read_response()
            except NoScriptError as exc:
                # The script cache was flushed under us: reconnect, load it again and send
                # every call not yet answered, in order.
                raise ConnectionError("the script cache was flushed") from exc
            except ResponseError as exc:
                self.errors += 1
                log.error("publishing a chunk failed: %s", exc)
                answer = exc
            call = in_flight.popleft()
            if call.reply is not None and not call.reply.done():
                if isinstance(answer, ResponseError):
                    call.reply.set_exception(answer)
                else:
                    call.reply.set_result(answer)
            if not in_flight:
                self._drained.set()
