"""One Redis pub/sub connection per gateway process, fanned out to jobs by channel.

The connection is a bare asyncio protocol with a hiredis reader: a message is parsed and
handed to its job's handler inside the callback that read it, and `subscribe` writes its
command at once, without awaiting anything (`unsubscribe` stops the routing at once and
sends finished channels to Redis together, every UNSUBSCRIBE_DELAY_S). (redis-py's PubSub
costs a task switch or two per command and ~1/5 of the gateway's CPU per message at 50
streams.)

Ordering is what keeps pub/sub (at-most-once) from losing a job's first token: the gateway
writes SUBSCRIBE on this connection before it enqueues the job on another one. Redis has
then read the SUBSCRIBE before the LPUSH that follows it, and a worker can publish only after
a BRPOP round trip and its own work; a token missed anyway shows up as a seq gap and is
repaired from the job's replay stream. `subscribe_confirmed` also waits for Redis to
acknowledge (needed before reading a replay log, as `resume` does).

If the connection drops, the relay reconnects with backoff, subscribes to every channel again
and calls `on_reconnect`, so the gateway can repair each job from its replay stream: whatever
was published while the connection was down is recovered from there.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Callable
from typing import Any

import hiredis
from redis.asyncio.connection import SSLConnection, UnixDomainSocketConnection, parse_url

from shared.resp import pack

log = logging.getLogger(__name__)

Handler = Callable[[str], None]

CONFIRM_TIMEOUT_S = 5.0
CONNECT_TIMEOUT_S = 5.0
# Channels per SUBSCRIBE or UNSUBSCRIBE command that names many (after a reconnect, and
# finished channels leaving together).
CHANNELS_PER_COMMAND = 1000
# How long finished jobs' channels wait to leave, together, in one UNSUBSCRIBE. Off every
# chat's path (a channel's handler goes at once, so a late message is dropped here); one
# command per finished chat cost Redis 6% more CPU per chat at 50 streams.
UNSUBSCRIBE_DELAY_S = 0.05


class RedisAddress:
    """Where and how to open a connection, from a redis:// / rediss:// / unix:// URL."""

    def __init__(self, url: str) -> None:
        params: dict[str, Any] = dict(parse_url(url))
        cls = params.get("connection_class")
        self.path: str | None = params.get("path") if cls is UnixDomainSocketConnection else None
        self.host: str = params.get("host", "localhost")
        self.port: int = int(params.get("port", 6379))
        self.ssl = _tls_context(params) if cls is SSLConnection else None
        self.username: str | None = params.get("username")
        self.password: str | None = params.get("password")

    def handshake(self, client_name: str) -> list[bytes]:
        """Commands to send first on a new connection (their replies are `+OK`)."""
        commands = []
        if self.password is not None:
            auth = [b"AUTH"]
            if self.username:
                auth.append(self.username.encode())
            auth.append(self.password.encode())
            commands.append(pack(auth))
        commands.append(pack((b"CLIENT", b"SETNAME", client_name.encode())))
        return commands

    async def open(self, protocol_factory: Callable[[], asyncio.Protocol]) -> asyncio.Transport:
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(CONNECT_TIMEOUT_S):
            if self.path is not None:
                transport, _ = await loop.create_unix_connection(protocol_factory, self.path)
            else:
                transport, _ = await loop.create_connection(
                    protocol_factory, self.host, self.port, ssl=self.ssl
                )
        return transport


def _tls_context(params: dict[str, Any]) -> ssl.SSLContext:
    """The TLS settings a rediss:// URL may carry (as redis-py reads them)."""
    context = ssl.create_default_context(cafile=params.get("ssl_ca_certs"))
    reqs = str(params.get("ssl_cert_reqs", "required")).lower()
    if reqs in ("none", "optional"):
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE if reqs == "none" else ssl.CERT_OPTIONAL
    elif params.get("ssl_check_hostname") is False:
        context.check_hostname = False
    if params.get("ssl_certfile"):
        context.load_cert_chain(params["ssl_certfile"], params.get("ssl_keyfile"))
    return context


class _Protocol(asyncio.Protocol):
    def __init__(self, relay: Relay) -> None:
        self._relay = relay
        self._reader = hiredis.Reader()
        self._transport: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        reader = self._reader
        reader.feed(data)
        dispatch = self._relay._dispatch
        while (reply := reader.gets()) is not False:
            dispatch(reply)
            if self._transport is not None and self._transport.is_closing():
                return  # refused: the rest of what arrived is moot

    def connection_lost(self, exc: Exception | None) -> None:
        self._relay._lost(self, exc)


class Relay:
    def __init__(
        self,
        redis_url: str,
        control_channel: str,
        *,
        on_reconnect: Callable[[], None] | None = None,
        client_name: str = "firsttoken-relay",
    ) -> None:
        self._address = RedisAddress(redis_url)
        self._control = control_channel
        self._client_name = client_name
        self.on_reconnect = on_reconnect
        self._handlers: dict[bytes, Handler] = {}
        self._confirm: dict[bytes, asyncio.Future[None]] = {}
        self._transport: asyncio.Transport | None = None
        self._protocol: _Protocol | None = None
        self._reconnecting: asyncio.Task[None] | None = None
        self._closed = False
        self._connected_at = 0.0
        self._leaving: dict[bytes, None] = {}  # channels to UNSUBSCRIBE, in order
        self._leave_timer: asyncio.TimerHandle | None = None
        self.reconnects = 0

    async def start(self) -> None:
        await self._connect()
        await self.subscribe_confirmed(self._control, lambda _msg: None)

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

    async def subscribe_confirmed(self, channel: str, handler: Handler) -> None:
        """Subscribe and wait until Redis has acknowledged it (at most 5 s)."""
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
        transport = await self._address.open(lambda: protocol)
        if self._closed:
            transport.close()
            return
        self._transport, self._protocol = transport, protocol
        self._connected_at = asyncio.get_running_loop().time()
        self._leaving.clear()  # this connection has none of the old one's subscriptions
        transport.writelines(self._address.handshake(self._client_name))
        names = list(self._handlers)  # every channel again, after a reconnect
        for i in range(0, len(names), CHANNELS_PER_COMMAND):
            transport.write(pack((b"SUBSCRIBE", *names[i : i + CHANNELS_PER_COMMAND])))

    def _lost(self, protocol: _Protocol, exc: Exception | None) -> None:
        if protocol is not self._protocol:
            return
        self._transport = self._protocol = None
        if self._closed:
            return
        log.warning("pub/sub connection to Redis lost (%r); reconnecting", exc)
        # A connection that drops at once (refused AUTH, say) is not retried in a tight loop.
        lived = asyncio.get_running_loop().time() - self._connected_at
        self._reconnecting = asyncio.ensure_future(self._reconnect(0.0 if lived > 1.0 else 1.0))

    async def _reconnect(self, wait: float) -> None:
        await asyncio.sleep(wait)
        delay = 0.05
        while not self._closed:
            try:
                await self._connect()
                break
            except (OSError, TimeoutError) as exc:
                log.warning("pub/sub cannot reach Redis (%r); retrying in %.2fs", exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
        self._reconnecting = None
        if self._closed or self._transport is None:
            return
        self.reconnects += 1
        log.info("pub/sub reconnected; %d channels subscribed again", len(self._handlers))
        if self.on_reconnect is not None:
            try:
                self.on_reconnect()
            except Exception:
                log.exception("pub/sub reconnect callback failed")

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
                        log.exception("relay handler for %s failed", reply[1])
            elif kind == b"subscribe":
                fut = self._confirm.pop(reply[1], None)
                if fut is not None and not fut.done():
                    fut.set_result(None)
        elif isinstance(reply, hiredis.ReplyError):
            # AUTH refused, or a command Redis would not run: nothing works without it.
            log.error("Redis refused a pub/sub command: %s", reply)
            refused = ConnectionError(f"Redis refused the pub/sub connection: {reply}")
            for fut in self._confirm.values():
                if not fut.done():
                    fut.set_exception(refused)
            self._confirm.clear()
            if self._transport is not None:
                self._transport.close()
