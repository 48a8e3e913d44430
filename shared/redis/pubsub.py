"""One Redis pub/sub connection that routes each channel's messages to its handler.

The connection is a bare asyncio protocol with a hiredis reader: a message is parsed and
handed to its channel's handler inside the callback that read it (no task switch per message,
as redis-py's PubSub needs), and `subscribe` writes its command at once, without awaiting
anything. `unsubscribe` stops the routing at once and sends finished channels to Redis
together, every UNSUBSCRIBE_DELAY_S: off every message's path, and one command per finished
channel would cost Redis a command for each.

Ordering: a SUBSCRIBE written here before a command on another connection (the gateway's
enqueue of the job that publishes) has been read by Redis before that command.
`subscribe_confirmed` also waits for Redis to acknowledge (for a caller that reads what was
published before, as the gateway's `resume` does).

If the connection drops, the subscriber reconnects with backoff, subscribes to every channel
again and, once Redis has acknowledged those subscriptions, calls `on_reconnect`: whatever was
published while it was down is the caller's to recover (the gateway reads each job's replay
stream). Not before: a chunk published between a replay read that went out first and the
SUBSCRIBE would be in neither, and its job would end with a gap. Through Sentinels, each
reconnect asks them for the master (shared/redis/sentinel.py); a replica would do too, as it
relays every PUBLISH, and Sentinel drops the clients of a master it demotes. A connection Redis
refuses (a wrong password) is retried once a second, not in a tight loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import hiredis
from redis.exceptions import AuthenticationError

from shared.logs import OutageLog
from shared.redis.address import RedisAddress
from shared.redis.connection import open_transport
from shared.redis.resp import error_text, pack, reply_parser

log = logging.getLogger(__name__)

Handler = Callable[[str], None]

CONFIRM_TIMEOUT_S = 5.0
# Channels per SUBSCRIBE or UNSUBSCRIBE command that names many (after a reconnect, and
# finished channels leaving together).
CHANNELS_PER_COMMAND = 1000
# How long finished channels wait to leave, together, in one UNSUBSCRIBE. A channel's
# handler goes at once, so a late message is dropped here meanwhile.
UNSUBSCRIBE_DELAY_S = 0.05


class _Protocol(asyncio.Protocol):
    def __init__(self, subscriber: Subscriber) -> None:
        self._subscriber = subscriber
        self._parser: hiredis.Reader = reply_parser()
        self._transport: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        parser = self._parser
        parser.feed(data)
        dispatch = self._subscriber._dispatch
        while (reply := parser.gets()) is not False:
            dispatch(reply)
            if self._transport is not None and self._transport.is_closing():
                return  # refused: the rest of what arrived is moot

    def connection_lost(self, exc: Exception | None) -> None:
        self._subscriber._lost(self, exc)


class Subscriber:
    """Channels subscribed on one connection, each routed to its handler (see the module
    docstring). Handlers get the message as str and must not block."""

    def __init__(
        self,
        redis_url: str,
        *,
        on_reconnect: Callable[[], None] | None = None,
        client_name: str = "firsttoken-pubsub",
    ) -> None:
        self._address = RedisAddress.from_url(redis_url)
        self._client_name = client_name
        self.on_reconnect = on_reconnect
        self._handlers: dict[bytes, Handler] = {}
        self._confirm: dict[bytes, asyncio.Future[None]] = {}
        # After a reconnect: the last channel subscribed again, and its acknowledgement (Redis
        # answers a SUBSCRIBE's channels in order, so the last one's means all of them).
        self._resubscribed: tuple[bytes, asyncio.Future[None]] | None = None
        self._transport: asyncio.Transport | None = None
        self._protocol: _Protocol | None = None
        self._reconnecting: asyncio.Task[None] | None = None
        self._closed = False
        self._connected_at = 0.0
        self._outage = OutageLog(log, "pub/sub")  # one line per outage, not per retry
        self._leaving: dict[bytes, None] = {}  # channels to UNSUBSCRIBE, in order
        self._leave_timer: asyncio.TimerHandle | None = None
        self.reconnects = 0

    async def start(self) -> None:
        """Connect (raises OSError or TimeoutError when Redis cannot be reached)."""
        await self._connect()

    async def close(self) -> None:
        self._closed = True
        if self._leave_timer is not None:
            self._leave_timer.cancel()
            self._leave_timer = None
        if self._reconnecting is not None:
            self._reconnecting.cancel()
            with contextlib.suppress(BaseException):
                await self._reconnecting
        if self._transport is not None:
            self._transport.close()
            self._transport = None

    @property
    def channels(self) -> int:
        return len(self._handlers)

    @property
    def connected(self) -> bool:
        return self._transport is not None

    def subscribe(self, channel: str, handler: Handler) -> None:
        """Route `channel`'s messages to `handler`; the SUBSCRIBE is written before returning.

        While the connection is down the channel is recorded and subscribed on reconnect."""
        name = channel.encode()
        self._handlers[name] = handler
        if self._transport is not None:
            self._transport.write(pack((b"SUBSCRIBE", name)))

    def reroute(self, channel: str, handler: Handler) -> bool:
        """Hand a subscribed channel's messages to another handler, sending nothing to Redis;
        False when `channel` is not subscribed."""
        name = channel.encode()
        if name not in self._handlers:
            return False
        self._handlers[name] = handler
        return True

    async def subscribe_confirmed(self, channel: str, handler: Handler) -> None:
        """Subscribe and wait until Redis has acknowledged it (at most CONFIRM_TIMEOUT_S)."""
        name = channel.encode()
        fut = asyncio.get_running_loop().create_future()
        self._confirm[name] = fut
        try:
            self.subscribe(channel, handler)
            async with asyncio.timeout(CONFIRM_TIMEOUT_S):
                await fut
        except BaseException:
            self._confirm.pop(name, None)
            self._handlers.pop(name, None)
            raise

    def unsubscribe(self, channel: str) -> None:
        """Stop routing `channel` now; Redis hears of it within UNSUBSCRIBE_DELAY_S, in one
        command with the other channels that finished meanwhile."""
        name = channel.encode()
        if self._handlers.pop(name, None) is None or self._transport is None:
            return
        self._leaving[name] = None
        if self._leave_timer is None:
            self._leave_timer = asyncio.get_running_loop().call_later(
                UNSUBSCRIBE_DELAY_S, self._unsubscribe_leaving
            )

    def _unsubscribe_leaving(self) -> None:
        self._leave_timer = None
        # A channel subscribed again meanwhile (a resumed job) stays: its SUBSCRIBE went first.
        names = [name for name in self._leaving if name not in self._handlers]
        self._leaving.clear()
        if self._transport is None:
            return  # a new connection subscribes only the channels with handlers
        for i in range(0, len(names), CHANNELS_PER_COMMAND):
            self._transport.write(pack((b"UNSUBSCRIBE", *names[i : i + CHANNELS_PER_COMMAND])))

    # --- connection ---------------------------------------------------------------------
    async def _connect(self) -> None:
        protocol = _Protocol(self)
        address = self._address
        try:
            async with asyncio.timeout(address.connect_timeout_s):
                transport, _ = await open_transport(address, lambda: protocol)
        except TimeoutError:
            raise TimeoutError(
                f"Redis at {address} did not answer within {address.connect_timeout_s:g} s"
            ) from None
        if self._closed:
            transport.close()
            return
        self._transport, self._protocol = transport, protocol
        self._connected_at = asyncio.get_running_loop().time()
        self._leaving.clear()  # this connection has none of the old one's subscriptions
        # The handshake's replies (+OK) come back ahead of any message and are ignored; a
        # refusal closes the connection (see _dispatch).
        transport.writelines(address.handshake(self._client_name))
        names = list(self._handlers)  # every channel again, after a reconnect
        self._resubscribed = (
            (names[-1], asyncio.get_running_loop().create_future()) if names else None
        )
        for i in range(0, len(names), CHANNELS_PER_COMMAND):
            transport.write(pack((b"SUBSCRIBE", *names[i : i + CHANNELS_PER_COMMAND])))

    def _lost(self, protocol: _Protocol, exc: Exception | None) -> None:
        if protocol is not self._protocol:
            return
        self._transport = self._protocol = None
        self._end_resubscribe()
        if self._closed:
            return
        self._outage.failed(exc or ConnectionResetError("the connection was closed"))
        # A connection that drops at once (refused AUTH, say) is not retried in a tight loop.
        lived = asyncio.get_running_loop().time() - self._connected_at
        self._reconnecting = asyncio.ensure_future(self._reconnect(0.0 if lived > 1.0 else 1.0))

    async def _reconnect(self, wait: float) -> None:
        try:
            await asyncio.sleep(wait)
            delay = 0.05
            while not self._closed:
                try:
                    await self._connect()
                    break
                except OSError as exc:  # TimeoutError included
                    self._outage.failed(exc)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 1.0)
            if self._closed or self._transport is None:
                return
            if not await self._resubscribed_in_time():
                return
        finally:
            if self._reconnecting is asyncio.current_task():
                self._reconnecting = None
        self.reconnects += 1
        self._outage.ok()
        log.info("pub/sub reconnected; %d channels subscribed again", len(self._handlers))
        if self.on_reconnect is not None:
            try:
                self.on_reconnect()
            except Exception:
                log.exception("pub/sub reconnect callback failed")

    async def _resubscribed_in_time(self) -> bool:
        """Wait until Redis has acknowledged the channels subscribed again. False when the
        connection was lost meanwhile, or Redis did not answer in time: that connection is then
        dropped, and the reconnect that follows tries again."""
        protocol, again = self._protocol, self._resubscribed
        if again is None:
            return True
        try:
            async with asyncio.timeout(CONFIRM_TIMEOUT_S):
                await again[1]
        except TimeoutError:
            log.warning(
                "pub/sub: Redis did not acknowledge the subscriptions within %gs; reconnecting",
                CONFIRM_TIMEOUT_S,
            )
            if self._protocol is protocol and self._transport is not None:
                self._transport.close()
            return False
        except ConnectionError:
            return False  # lost again: the next reconnect recovers
        finally:
            if self._resubscribed is again:
                self._resubscribed = None
        return not self._closed and self._protocol is protocol

    def _end_resubscribe(self) -> None:
        again = self._resubscribed
        if again is not None and not again[1].done():
            again[1].set_exception(ConnectionError("the connection was lost"))
            again[1].exception()  # retrieved: nobody may be waiting

    # --- replies ------------------------------------------------------------------------
    def _dispatch(self, reply: object) -> None:
        if type(reply) is list:
            kind = reply[0]
            if kind == b"message":
                handler = self._handlers.get(reply[1])
                if handler is not None:
                    try:
                        handler(reply[2].decode())
                    except Exception:
                        log.exception("pub/sub handler for %s failed", reply[1])
            elif kind == b"subscribe":
                fut = self._confirm.pop(reply[1], None)
                if fut is not None and not fut.done():
                    fut.set_result(None)
                again = self._resubscribed
                if again is not None and again[0] == reply[1] and not again[1].done():
                    again[1].set_result(None)
        elif isinstance(reply, Exception):
            # AUTH refused, or a command Redis would not run: nothing works without it.
            text = error_text(reply)
            log.error("Redis refused a pub/sub command: %s", text)
            hint = " (check the user and password in the Redis URL)"
            refused = ConnectionError(
                f"Redis at {self._address} refused the pub/sub connection: {text}"
                + (hint if isinstance(reply, AuthenticationError) else "")
            )
            for fut in self._confirm.values():
                if not fut.done():
                    fut.set_exception(refused)
            self._confirm.clear()
            if self._transport is not None:
                self._transport.close()
