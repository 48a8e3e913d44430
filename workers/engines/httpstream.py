"""Streamed HTTP/1.1 POSTs to one server over a keep-alive pool: the `openai` engine's client.

Why not aiohttp here: a chat worker sends one POST per chat and reads one server-sent event per
token, and both sit on the first token's path. aiohttp's client (request and response
objects, header multidicts, its stream reader) spends measurably more CPU on each than this
one, in a process whose CPU a burst of chats waits on. The request here is one prebuilt header
block and a JSON body; the response is parsed by httptools
(llhttp, the parser under uvicorn), and its body is split into `data:` payloads in the
protocol's own callback, so a token costs one wake-up of the task that reads it and no
generator layers.

What it does not do, on purpose: redirects, cookies, proxies, compression (it never asks for
it), request bodies that stream. What it does: keep-alive reuse (idle connections are dropped
after ``keepalive_s``, below uvicorn's own 5 s, and a reused connection the server had already
closed is replaced once, before any byte of an answer), TLS for ``https://`` URLs, a connect
deadline, back-pressure (reading pauses while a consumer is behind), and closing the
connection when a response is abandoned half-read, which is how vLLM learns to abort.

A warm connection (``warm_s``): chats seconds apart (a quiet hour's traffic) find every idle
connection past its keep-alive, and a new connection puts a TCP (or TLS) handshake and the
server's accept in front of each first token. So, until ``warm_s`` after the last request, when
no connection is open the pool opens one ahead of need, and replaces it before the server's
keep-alive would close it: one connect per ``keepalive_s`` per pool, off every chat's path.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
import time
from collections.abc import Mapping
from typing import cast
from urllib.parse import urlsplit

import httptools

# Reading pauses when this many payloads wait for the consumer, and resumes below half of it.
HIGH_WATER = 256
# How long a response read to its last event waits for the end of its body (StreamedResponse.close).
END_WAIT_S = 1.0


class ProtocolError(ConnectionError):
    """The server's bytes are not a valid HTTP/1.1 response."""


def sse_payloads(pending: bytes, data: bytes) -> tuple[list[bytes], bytes]:
    """Split raw event-stream bytes into `data:` payloads: ``(payloads, still pending)``.

    ``pending`` is the incomplete last line of the previous read. Comments, event names and
    blank lines are skipped; an event with several `data:` lines is not joined
    (OpenAI-compatible servers send one line per chunk)."""
    if pending:
        data = pending + data
    lines = data.split(b"\n")
    rest = lines.pop()  # an incomplete last line waits for the next read
    return [line[5:].strip() for line in lines if line.startswith(b"data:")], rest


class StreamedResponse:
    """One response: its status once the headers are in, then its body as SSE payloads."""

    def __init__(self, conn: _Connection) -> None:
        self._conn = conn
        self.status = 0
        self.headers: asyncio.Future[None] = conn.loop.create_future()
        self._payloads: collections.deque[bytes] = collections.deque()
        self._pending = b""
        self._waiter: asyncio.Future[None] | None = None
        self._error: BaseException | None = None
        self._paused = False
        self.complete = False  # the whole response has arrived
        self._read_to_end = False  # the caller read the stream's last event (end_of_events)

    @property
    def buffered(self) -> int:
        """Payloads received and not read yet."""
        return len(self._payloads)

    async def next_data(self) -> bytes | None:
        """The next `data:` payload; None at the end of the response. Raises ConnectionError
        (or ProtocolError) when the connection ended before the response did."""
        while not self._payloads:
            if self.complete:
                return None
            if self._error is not None:
                raise self._error
            self._waiter = self._conn.loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        if self._paused and len(self._payloads) <= HIGH_WATER // 2:
            self._paused = False
            self._conn.resume()
        return self._payloads.popleft()

    async def read_raw(self, limit: int) -> bytes:
        """Up to ``limit`` bytes of a non-200 response's body (an error's message). A body
        cut off after some bytes gives those; one cut off before any raises ConnectionError."""
        parts: list[bytes] = []
        size = 0
        while size < limit:
            try:
                data = await self.next_data()
            except ConnectionError:
                if not parts:
                    raise
                break
            if data is None:
                break
            parts.append(data)
            size += len(data)
        return b"".join(parts)[:limit]

    def end_of_events(self) -> None:
        """The caller read the stream's last event (OpenAI's `[DONE]`): what may still be on
        its way is the body's end, so :meth:`close` then leaves the connection to take it
        and go back to the pool."""
        self._read_to_end = True

    def close(self) -> None:
        """Abandon the response: a half-read one closes its connection (the server sees the
        client leave); a complete one has already gone back to the pool. One read to its last
        event waits up to ``END_WAIT_S`` for the body's end (the chunked body's last chunk can
        come a segment after the last event): closed, the connection would cost the next
        request a connect on its first token's path."""
        if self.complete:
            return
        if self._read_to_end and self._error is None:
            self._conn.loop.call_later(END_WAIT_S, self._close_unless_complete)
        else:
            self._conn.close()

    def _close_unless_complete(self) -> None:
        if not self.complete:
            self._conn.close()

    # --- from the connection ----------------------------------------------------------
    def _headers_done(self, status: int) -> None:
        self.status = status
        if not self.headers.done():
            self.headers.set_result(None)

    def _body(self, data: bytes) -> None:
        payloads, self._pending = sse_payloads(self._pending, data)
        if not payloads:
            return
        self._payloads.extend(payloads)
        self._wake()
        if not self._paused and len(self._payloads) >= HIGH_WATER:
            self._paused = True
            self._conn.pause()

    def _raw_body(self, data: bytes) -> None:
        """A non-event body (an error's JSON): kept whole, one payload per read."""
        self._payloads.append(data)
        self._wake()

    def _done(self) -> None:
        if self._pending:  # a last line without its newline: the end of the body ends it
            self._payloads.extend(sse_payloads(self._pending, b"\n")[0])
            self._pending = b""
        self.complete = True
        self._wake()

    def _failed(self, exc: BaseException) -> None:
        if self.complete:
            return
        self._error = exc
        if not self.headers.done():
            self.headers.set_exception(exc)
            self.headers.exception()  # retrieved: a caller may have stopped waiting
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class _Connection(asyncio.Protocol):
    """One keep-alive connection; it serves one response at a time."""

    def __init__(self, pool: HTTPStreamPool) -> None:
        self.pool = pool
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.response: StreamedResponse | None = None
        self.closed = False
        self.idle_since = 0.0

    def send(self, request: bytes) -> StreamedResponse:
        assert self.transport is not None and self.response is None
        response = self.response = StreamedResponse(self)
        self.transport.write(request)
        return response

    def pause(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self.transport is not None:
                self.transport.close()
            self._end(ConnectionResetError("the request was abandoned"))

    # --- asyncio.Protocol ---------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not subclasses of asyncio.Transport, but have its methods.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._end(ProtocolError(f"malformed HTTP response: {exc}"))
            self.close()

    def eof_received(self) -> bool | None:
        return None  # close the transport: half-closed connections are not reused

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool._forget(self)
        self._end(
            ConnectionResetError("the server closed the connection")
            if exc is None
            else ConnectionResetError(f"the connection was lost: {exc!r}")
        )

    def _end(self, exc: BaseException) -> None:
        response, self.response = self.response, None
        if response is not None:
            response._failed(exc)

    # --- httptools callbacks --------------------------------------------------------------
    def on_headers_complete(self) -> None:
        if self.response is not None:
            status = self.parser.get_status_code()
            self.response._headers_done(status)

    def on_body(self, body: bytes) -> None:
        response = self.response
        if response is not None:
            if response.status == 200:
                response._body(body)
            else:  # an error body is read whole, not as events
                response._raw_body(body)

    def on_message_complete(self) -> None:
        response, self.response = self.response, None
        keep = self.parser.should_keep_alive()
        if response is not None:
            response._done()
            if response._paused:  # all of it is in: the next response must not start paused
                response._paused = False
                self.resume()
        if keep and not self.closed:
            self.pool._idle_again(self)
        else:
            self.close()


class HTTPStreamPool:
    """Keep-alive connections to the server of ``url`` (``http://`` or ``https://``)."""

    def __init__(
        self, url: str, *, connect_timeout_s: float, keepalive_s: float = 4.0, warm_s: float = 0.0
    ) -> None:
        """`warm_s`: keep a connection open ahead of need until this long after the last
        request (see the module docstring); 0 opens connections only for requests."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.base_path = parts.path.rstrip("/")
        self._ssl = ssl.create_default_context() if parts.scheme == "https" else None
        default_port = 443 if parts.scheme == "https" else 80
        self._host_header = self.host if self.port == default_port else f"{self.host}:{self.port}"
        if ":" in self.host:  # IPv6 literal
            self._host_header = f"[{self.host}]:{self.port}"
        self._connect_timeout_s = connect_timeout_s
        self._keepalive_s = keepalive_s
        self._idle: list[_Connection] = []
        self._all: set[_Connection] = set()
        self._warm_s = warm_s
        self._last_request = -warm_s  # monotonic; nothing to keep warm for before the first
        self._refresh: asyncio.TimerHandle | None = None
        self._warming: asyncio.Task[None] | None = None
        self._closed = False

    def request_head(self, path: str, headers: Mapping[str, str]) -> bytes:
        """The request line and fixed headers of a POST to ``base path + path``, without its
        Content-Length (see :meth:`post`): build once, send many times."""
        lines = [f"POST {self.base_path}{path} HTTP/1.1", f"Host: {self._host_header}"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        return ("\r\n".join(lines) + "\r\n").encode("latin-1")

    async def post(self, head: bytes, body: bytes) -> StreamedResponse:
        """Send one POST (``head`` from :meth:`request_head`); returns once the response's
        headers are in. Raises OSError when the server cannot be reached, TimeoutError when
        connecting takes longer than the connect deadline."""
        request = b"%sContent-Length: %d\r\n\r\n%s" % (head, len(body), body)
        self._last_request = time.monotonic()
        conn = self._take_idle()
        if conn is not None:
            try:
                return await self._exchange(conn, request)
            except ConnectionError:
                # The server had closed this idle connection as it was reused: nothing of
                # an answer came, so the request goes again on a fresh connection.
                pass
        return await self._exchange(await self._connect(), request)

    def warm(self) -> None:
        """Open a connection now, ahead of the first request, and keep it warm (`warm_s` as if
        a request had just been sent); nothing when the pool is not a warm one or one is open.
        A server that cannot be reached now is left to the first request to report."""
        if self._warm_s <= 0 or self._closed:
            return
        self._last_request = time.monotonic()
        self._open_unless_open()

    async def aclose(self) -> None:
        self._closed = True
        if self._refresh is not None:
            self._refresh.cancel()
            self._refresh = None
        if self._warming is not None:
            self._warming.cancel()
        for conn in list(self._all):
            conn.close()
        self._idle.clear()
        self._all.clear()
        await asyncio.sleep(0)  # let the transports finish closing

    # --- the pool ------------------------------------------------------------------------
    @staticmethod
    async def _exchange(conn: _Connection, request: bytes) -> StreamedResponse:
        response = conn.send(request)
        try:
            await response.headers
        except BaseException:
            conn.close()
            raise
        return response

    def _take_idle(self) -> _Connection | None:
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()  # the most recently used: the least likely to be stale
            if not conn.closed and now - conn.idle_since < self._keepalive_s:
                return conn
            conn.close()
        return None

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(self._connect_timeout_s):
            _, conn = await loop.create_connection(
                lambda: _Connection(self),
                self.host,
                self.port,
                ssl=self._ssl,
                server_hostname=self.host if self._ssl is not None else None,
            )
        self._all.add(conn)
        return conn

    def _idle_again(self, conn: _Connection) -> None:
        conn.idle_since = time.monotonic()
        self._idle.append(conn)
        if self._warm_s > 0 and self._refresh is None and not self._closed:
            self._refresh = conn.loop.call_later(self._keepalive_s, self._keep_warm)

    def _keep_warm(self) -> None:
        """Close the idle connections past their keep-alive; while the pool is in use and no
        connection is left open, open one (see the module docstring)."""
        self._refresh = None
        now = time.monotonic()
        for conn in [c for c in self._idle if now - c.idle_since >= self._keepalive_s]:
            self._idle.remove(conn)
            conn.close()
        if self._idle:  # come back when the youngest is due
            due = self._keepalive_s - (now - self._idle[-1].idle_since)
            self._refresh = self._idle[-1].loop.call_later(due, self._keep_warm)
        elif now - self._last_request < self._warm_s:
            self._open_unless_open()

    def _open_unless_open(self) -> None:
        """Open a connection for the pool unless one is open (those in use come back idle)
        or opening."""
        if self._warming is None and not any(not c.closed for c in self._all):
            self._warming = asyncio.ensure_future(self._open_warm())

    async def _open_warm(self) -> None:
        try:
            conn = await self._connect()
        except (OSError, TimeoutError):
            return  # unreachable now: the next request connects, and says so, as without
        finally:
            self._warming = None
        if self._closed:
            conn.close()
        else:
            self._idle_again(conn)

    def _forget(self, conn: _Connection) -> None:
        self._all.discard(conn)
        if conn in self._idle:
            self._idle.remove(conn)
