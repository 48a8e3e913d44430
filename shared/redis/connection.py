"""One asyncio connection to Redis that writes packed commands and parses replies with hiredis.

It is what the pipelined writer (shared/redis/pipe.py), the chat queue's reads
(workers/chat/consumer.py) and the bench producer stand on: a write hands bytes to the transport
without awaiting anything, and a reply is parsed straight off the stream by the connection's
one hiredis reader. redis-py's own connection does the same work with its reply machinery on
every call (and, on Python 3.11, a task per timed write), which the paths above cannot afford.

Opening a connection (:func:`open_transport`, shared with the gateway's pub/sub reader in
shared/redis/pubsub.py, which parses inside its protocol's callback instead) follows the
address: TCP, TLS or a Unix socket, then AUTH, CLIENT SETNAME and SELECT, all bounded by the
address's connect timeout. A Sentinel URL's address is resolved first, on every open
(shared/redis/sentinel.py): a connection opened again after a failover finds the new master.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import TypeVar

import hiredis

from shared.redis.address import RedisAddress
from shared.redis.resp import error_text, pack, reply_parser
from shared.redis.sentinel import check_master, master_of

READ_SIZE = 65536  # bytes per read of replies
STREAM_LIMIT = 65536  # the stream's buffer (asyncio's default): reading pauses beyond twice it

P = TypeVar("P", bound=asyncio.BaseProtocol)


async def open_transport(
    address: RedisAddress, protocol_factory: Callable[[], P]
) -> tuple[asyncio.Transport, P]:
    """A transport to ``address`` (TCP, TLS or Unix socket; a Sentinel URL's master); the
    caller bounds the time."""
    address = await master_of(address)
    loop = asyncio.get_running_loop()
    if address.path is not None:
        return await loop.create_unix_connection(protocol_factory, address.path)
    tls = address.tls.context() if address.tls is not None else None
    return await loop.create_connection(protocol_factory, address.host, address.port, ssl=tls)


class RedisConnection:
    """One connection: ``write`` packed commands, read their replies in order.

    A hot loop that reads many replies per socket read (the pipe's) may read :attr:`stream`
    and feed :attr:`parser` itself, sparing a coroutine per read; everything else awaits
    :meth:`reply` or :meth:`call`."""

    __slots__ = ("_out", "address", "parser", "stream", "write", "writelines")

    def __init__(
        self,
        address: RedisAddress,
        stream: asyncio.StreamReader,
        out: asyncio.StreamWriter,
        parser: hiredis.Reader,
    ) -> None:
        self.address = address
        self.stream = stream
        self.parser = parser
        self._out = out
        # write(bytes) and writelines(buffers) hand packed commands to the transport and
        # return at once: the stream writer's own methods, bound here so that a write costs
        # no call of this class's on the paths that write per token or per chat.
        self.write: Callable[[bytes], None] = out.write
        self.writelines: Callable[[Iterable[bytes]], None] = out.writelines

    @classmethod
    async def open(
        cls, address: RedisAddress | str, *, client_name: str | None = None, decode: bool = False
    ) -> RedisConnection:
        """Connect and authenticate, name and select as ``address`` says, within its connect
        timeout. ``decode``: strings in replies come back as str instead of bytes. Through
        Sentinels, the server named is checked to be the master (``ROLE``).

        Raises ConnectionError when Redis refuses the handshake (a wrong password, say),
        TimeoutError when it does not answer in time, OSError when it cannot be reached."""
        if isinstance(address, str):
            address = RedisAddress.from_url(address)
        loop = asyncio.get_running_loop()
        stream = asyncio.StreamReader(limit=STREAM_LIMIT, loop=loop)
        protocol = asyncio.StreamReaderProtocol(stream, loop=loop)
        conn: RedisConnection | None = None
        try:
            async with asyncio.timeout(address.connect_timeout_s):
                target = await master_of(address)
                transport, _ = await open_transport(target, lambda: protocol)
                out = asyncio.StreamWriter(transport, protocol, stream, loop)
                conn = cls(target, stream, out, reply_parser(decode=decode))
                await conn.handshake(client_name)
                if address.sentinel:
                    check_master(await conn.call(b"ROLE"), target)
        except TimeoutError:
            if conn is not None:
                conn.close()
            raise TimeoutError(
                f"Redis at {address} did not answer within {address.connect_timeout_s:g} s"
            ) from None
        except BaseException:
            if conn is not None:
                conn.close()
            raise
        return conn

    async def handshake(self, client_name: str | None) -> None:
        """Send the address's AUTH / CLIENT SETNAME / SELECT in one write and check each reply."""
        commands = self.address.handshake(client_name)
        if not commands:
            return
        self.writelines(commands)
        for command in commands:
            answer = await self.reply()
            if isinstance(answer, Exception):
                what = command.split(b"\r\n")[2].decode()  # the command's name
                raise ConnectionError(
                    f"Redis at {self.address} refused {what}: {error_text(answer)}"
                    + (" (check the user and password in the Redis URL)" if what == "AUTH" else "")
                )

    @property
    def closing(self) -> bool:
        return self._out.is_closing()

    async def drain(self) -> None:
        """Wait while the transport's buffer is over its high-water mark."""
        await self._out.drain()

    async def reply(self) -> object:
        """The next reply (an error reply is returned as its exception, not raised)."""
        parser, stream = self.parser, self.stream
        while (answer := parser.gets()) is False:
            data = await stream.read(READ_SIZE)
            if not data:
                raise ConnectionError(f"Redis at {self.address} closed the connection")
            parser.feed(data)
        return answer

    async def call(self, *args: bytes | str) -> object:
        """Send one command and return its reply; an error reply is raised. Only when nothing
        else waits for a reply on this connection."""
        self.write(pack([a.encode() if isinstance(a, str) else a for a in args]))
        answer = await self.reply()
        if isinstance(answer, Exception):
            raise answer
        return answer

    def close(self) -> None:
        self._out.close()

    async def aclose(self, grace_s: float = 1.0) -> None:
        """Close; what is still buffered gets `grace_s` to leave, then the socket is dropped
        (a peer that is gone would otherwise hold the close for as long as TCP retries)."""
        self._out.close()
        try:
            async with asyncio.timeout(grace_s):
                await self._out.wait_closed()
        except Exception:  # noqa: BLE001 - a timeout, or the error the connection died of
            self._out.transport.abort()
