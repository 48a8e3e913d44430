"""One Redis pub/sub connection per gateway process, fanned out to jobs by channel.

Ordering is what keeps pub/sub (at-most-once) from losing a job's first token: the gateway
writes SUBSCRIBE on this connection before it enqueues the job on another one. With
`confirmed=True`, `subscribe()` also waits for Redis to acknowledge (needed before reading a
replay log, as `resume` does). For a new job that wait is not needed: Redis has read the
SUBSCRIBE before the LPUSH that follows it, and a worker can publish only after a BRPOP
round trip and its own work; a token missed anyway shows up as a seq gap and is repaired
from the job's replay stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import redis.asyncio as aioredis

log = logging.getLogger(__name__)

Handler = Callable[[str], None]


class Relay:
    def __init__(self, redis: aioredis.Redis, control_channel: str) -> None:
        self._pubsub = redis.pubsub()
        self._control = control_channel
        self._handlers: dict[str, Handler] = {}
        self._confirm: dict[str, asyncio.Future[None]] = {}
        self._reader: asyncio.Task[None] | None = None

    async def start(self) -> None:
        # A first subscription opens the connection the reader then owns.
        await self._subscribe_and_wait(self._control, lambda _msg: None, start_reader=True)

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(BaseException):
                await self._reader
        with contextlib.suppress(Exception):
            await self._pubsub.aclose()

    @property
    def channels(self) -> int:
        return len(self._handlers)

    async def subscribe(self, channel: str, handler: Handler, *, confirmed: bool = True) -> None:
        if confirmed:
            await self._subscribe_and_wait(channel, handler)
            return
        self._handlers[channel] = handler
        try:
            await self._pubsub.subscribe(channel)
        except BaseException:
            self._handlers.pop(channel, None)
            raise

    async def _subscribe_and_wait(
        self, channel: str, handler: Handler, start_reader: bool = False
    ) -> None:
        fut = asyncio.get_running_loop().create_future()
        self._confirm[channel] = fut
        self._handlers[channel] = handler
        try:
            await self._pubsub.subscribe(channel)
            if start_reader:
                self._reader = asyncio.create_task(self._read())
            await asyncio.wait_for(fut, 5.0)
        except BaseException:
            self._confirm.pop(channel, None)
            self._handlers.pop(channel, None)
            raise

    async def unsubscribe(self, channel: str) -> None:
        self._handlers.pop(channel, None)
        with contextlib.suppress(Exception):
            await self._pubsub.unsubscribe(channel)

    async def _read(self) -> None:
        handlers, confirm = self._handlers, self._confirm
        while True:
            try:
                msg = await self._pubsub.get_message(timeout=None)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.warning("pub/sub connection lost; reconnecting", exc_info=True)
                await asyncio.sleep(0.2)
                continue
            if msg is None:
                continue
            kind = msg["type"]
            channel = msg["channel"]
            if isinstance(channel, bytes):
                channel = channel.decode()
            if kind == "message":
                handler = handlers.get(channel)
                if handler is not None:
                    data = msg["data"]
                    try:
                        handler(data.decode() if isinstance(data, bytes) else data)
                    except Exception:
                        log.exception("relay handler for %s failed", channel)
            elif kind == "subscribe":
                fut = confirm.pop(channel, None)
                if fut is not None and not fut.done():
                    fut.set_result(None)
