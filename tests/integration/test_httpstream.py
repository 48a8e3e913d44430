"""The `openai` engine's HTTP/1.1 client (workers/engines/httpstream.py) against real sockets:
keep-alive reuse, a pooled connection the server closed, back-pressure, malformed responses,
error bodies, abandoning a response, TLS."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from workers.engines.httpstream import END_WAIT_S, HIGH_WATER, HTTPStreamPool, ProtocolError

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def read_request(reader: asyncio.StreamReader) -> bytes:
    """One request's head and body (Content-Length) off the connection; b"" at its end."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return head + await reader.readexactly(length)


def sse_response(*payloads: bytes) -> bytes:
    """A 200 event-stream response, chunked, one chunk per event."""
    out = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
    out += b"transfer-encoding: chunked\r\n\r\n"
    for payload in payloads:
        event = b"data: " + payload + b"\n\n"
        out += b"%x\r\n%s\r\n" % (len(event), event)
    return out + b"0\r\n\r\n"


class Server:
    """An asyncio TCP server on a free port that counts its connections."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.requests: list[bytes] = []
        self.server: asyncio.Server | None = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            await self.handler(reader, writer)
        writer.close()

    async def start(self, ssl_context: ssl.SSLContext | None = None) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=ssl_context)
        return int(self.server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()


@contextlib.asynccontextmanager
async def serving(
    handler: Handler, *, keepalive_s: float = 4.0, warm_s: float = 0.0
) -> AsyncIterator[tuple[Server, HTTPStreamPool]]:
    server = Server(handler)
    port = await server.start()
    pool = HTTPStreamPool(
        f"http://127.0.0.1:{port}/v1",
        connect_timeout_s=2.0,
        keepalive_s=keepalive_s,
        warm_s=warm_s,
    )
    try:
        yield server, pool
    finally:
        await pool.aclose()
        await server.stop()


async def answer_each(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answer every request on the connection with one event."""
    while True:
        await read_request(reader)
        writer.write(sse_response(b"x"))


async def post(pool: HTTPStreamPool, body: bytes = b"{}") -> list[bytes]:
    response = await pool.post(pool.request_head("/chat", {"X-Test": "1"}), body)
    assert response.status == 200
    out = []
    while (data := await response.next_data()) is not None:
        out.append(data)
    return out


async def test_request_line_headers_and_body_reach_the_server() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        server.requests.append(await read_request(reader))
        writer.write(sse_response(b"one"))

    async with serving(handler) as (server, pool):
        assert await post(pool, b'{"q":1}') == [b"one"]
    request = server.requests[0]
    assert request.startswith(b"POST /v1/chat HTTP/1.1\r\n")
    assert f"Host: 127.0.0.1:{pool.port}\r\n".encode() in request
    assert b"X-Test: 1\r\n" in request and b"Content-Length: 7\r\n" in request
    assert request.endswith(b'\r\n\r\n{"q":1}')


async def test_a_last_event_without_its_newline_ends_with_the_body() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        head = sse_response()[: -len(b"0\r\n\r\n")]
        event = b"data: [DONE]"
        writer.write(head + b"%x\r\n%s\r\n0\r\n\r\n" % (len(event), event))

    async with serving(handler) as (_, pool):
        assert await post(pool) == [b"[DONE]"]


async def test_keep_alive_reuses_one_connection() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await read_request(reader)
            writer.write(sse_response(b"a", b"b"))

    async with serving(handler) as (server, pool):
        for _ in range(5):
            assert await post(pool) == [b"a", b"b"]
        assert server.connections == 1


async def test_a_pooled_connection_the_server_closed_is_replaced_before_any_answer() -> None:
    """The server takes the second request on the old connection and hangs up without an
    answer (as one closing an idle connection does): the request goes again, on a new one."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        if server.connections == 1:
            writer.write(sse_response(b"first"))
            await read_request(reader)  # the reuse: dropped unanswered
            return
        writer.write(sse_response(b"second"))

    async with serving(handler) as (server, pool):
        assert await post(pool) == [b"first"]
        assert await post(pool) == [b"second"]
        assert server.connections == 2


async def test_a_fresh_connection_dropped_unanswered_raises() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)

    async with serving(handler) as (_, pool):
        with pytest.raises(ConnectionError):
            await post(pool)


async def test_idle_connections_older_than_keepalive_are_not_reused() -> None:
    async with serving(answer_each, keepalive_s=0.05) as (server, pool):
        await post(pool)
        await asyncio.sleep(0.1)
        await post(pool)
        assert server.connections == 2


async def test_reading_pauses_while_the_consumer_is_behind_and_nothing_is_lost() -> None:
    count = HIGH_WATER * 4  # 2 MB of events: many reads
    pad = b"x" * 2000

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(sse_response(*(b"%d %s" % (i, pad) for i in range(count))))
        await writer.drain()

    async with serving(handler) as (_, pool):
        response = await pool.post(pool.request_head("/chat", {}), b"{}")
        await asyncio.sleep(0.2)  # everything sent; the client read until it paused
        assert HIGH_WATER <= response.buffered < count
        got = []
        while (data := await response.next_data()) is not None:
            got.append(data)
        assert got == [b"%d %s" % (i, pad) for i in range(count)]


async def test_a_response_complete_while_paused_leaves_its_connection_reading() -> None:
    """Many small events in one read: reading pauses, yet the whole response is in. Abandoned
    unread, its connection goes back to the pool, and the next request on it is answered."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(sse_response(*(b"%d" % i for i in range(HIGH_WATER * 2))))
        await read_request(reader)
        writer.write(sse_response(b"next"))

    async with serving(handler) as (server, pool):
        response = await pool.post(pool.request_head("/chat", {}), b"{}")
        await asyncio.sleep(0.1)
        assert response.complete and response.buffered == HIGH_WATER * 2
        response.close()  # never read
        assert await asyncio.wait_for(post(pool), 2.0) == [b"next"]
        assert server.connections == 1


async def test_error_status_gives_its_body_whole() -> None:
    body = b'{"error": {"message": "model not found"}}'

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))

    async with serving(handler) as (_, pool):
        response = await pool.post(pool.request_head("/chat", {}), b"{}")
        assert response.status == 404
        assert await response.read_raw(1 << 16) == body


async def test_malformed_response_is_a_protocol_error() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"this is not HTTP\r\n\r\n")
        await asyncio.sleep(1)

    async with serving(handler) as (_, pool):
        with pytest.raises(ProtocolError, match="malformed HTTP response"):
            await post(pool)


async def test_connection_cut_mid_body_raises_for_the_reader() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(sse_response(b"a", b"b")[:-20])  # cut inside the stream

    async with serving(handler) as (_, pool):
        response = await pool.post(pool.request_head("/chat", {}), b"{}")
        with pytest.raises(ConnectionError):
            while await response.next_data() is not None:
                pass


async def test_abandoning_a_half_read_response_closes_its_connection() -> None:
    closed = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(sse_response(b"a")[:-5])  # an answer still streaming
        if await reader.read(1) == b"":  # the client hung up
            closed.set()

    async with serving(handler) as (_, pool):
        response = await pool.post(pool.request_head("/chat", {}), b"{}")
        assert await response.next_data() == b"a"
        response.close()
        await asyncio.wait_for(closed.wait(), 2.0)
        # and a reader waiting on it is told
        with pytest.raises(ConnectionError):
            await response.next_data()


async def test_a_response_read_to_its_last_event_keeps_its_connection_for_the_next() -> None:
    """The chunked body's end comes a segment after `[DONE]`: a caller that stops at `[DONE]`
    and closes the response leaves the connection to take it, and the next request reuses it
    (no connect on its path)."""
    ended = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await read_request(reader)
            whole = sse_response(b"a", b"[DONE]")
            writer.write(whole[: -len(b"0\r\n\r\n")])
            await ended.wait()  # the caller has read [DONE] and let the response go
            ended.clear()
            writer.write(b"0\r\n\r\n")

    async with serving(handler) as (server, pool):
        for _ in range(2):
            response = await pool.post(pool.request_head("/chat", {}), b"{}")
            assert await response.next_data() == b"a"
            assert await response.next_data() == b"[DONE]"
            response.end_of_events()
            response.close()
            ended.set()
            await asyncio.sleep(0.05)
        assert server.connections == 1


async def test_a_response_read_to_its_last_event_whose_body_never_ends_is_closed() -> None:
    closed = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(sse_response(b"[DONE]")[: -len(b"0\r\n\r\n")])
        if await reader.read(1) == b"":
            closed.set()

    async with serving(handler) as (_, pool):
        response = await pool.post(pool.request_head("/chat", {}), b"{}")
        assert await response.next_data() == b"[DONE]"
        response.end_of_events()
        response.close()
        await asyncio.wait_for(closed.wait(), END_WAIT_S + 2.0)


async def test_a_warm_pool_replaces_its_connection_before_the_keep_alive_runs_out() -> None:
    """With `warm_s`, an idle connection past its keep-alive is closed and a fresh one opened
    ahead of the next request, which then connects nothing on its path; without, the request
    connects."""
    for warm_s, connects_on_path in ((60.0, 0), (0.0, 1)):
        async with serving(answer_each, keepalive_s=0.2, warm_s=warm_s) as (server, pool):
            await post(pool)
            await asyncio.sleep(0.5)  # between the second and the third replacement, if warm
            opened = server.connections
            assert opened >= 2 if warm_s else opened == 1, opened
            await post(pool)
            assert server.connections - opened == connects_on_path


async def test_warming_a_pool_opens_the_connection_its_first_request_uses() -> None:
    async with serving(answer_each, warm_s=60.0) as (server, pool):
        pool.warm()
        pool.warm()  # one is opening: no second
        for _ in range(100):
            if server.connections:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        assert server.connections == 1
        assert await post(pool) == [b"x"]
        assert server.connections == 1


async def test_a_warm_pool_stops_opening_connections_after_warm_s() -> None:
    async with serving(answer_each, keepalive_s=0.1, warm_s=0.25) as (server, pool):
        await post(pool)
        await asyncio.sleep(0.8)
        # Replaced 0.1 and 0.2 s after the request; not at 0.3, past warm_s.
        assert server.connections == 3, server.connections


async def test_unreachable_server_is_an_os_error() -> None:
    server = Server(read_request)  # type: ignore[arg-type]
    port = await server.start()
    await server.stop()
    assert server.server is not None
    await server.server.wait_closed()
    pool = HTTPStreamPool(f"http://127.0.0.1:{port}", connect_timeout_s=2.0)
    with pytest.raises(OSError):
        await post(pool)


def test_url_must_be_http() -> None:
    with pytest.raises(ValueError, match="not an http"):
        HTTPStreamPool("ftp://example.org/v1", connect_timeout_s=1.0)
    pool = HTTPStreamPool("https://engine.example.org/v1/", connect_timeout_s=1.0)
    assert (pool.port, pool.base_path) == (443, "/v1")
    assert b"Host: engine.example.org\r\n" in pool.request_head("/x", {})


async def test_https_verifies_the_server_certificate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    openssl = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
    names = ["-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost"]
    await asyncio.to_thread(
        subprocess.run,
        [*openssl, *names, "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(sse_response(b"secret"))

    server = Server(handler)
    port = await server.start(context)
    try:
        untrusted = HTTPStreamPool(f"https://localhost:{port}/v1", connect_timeout_s=2.0)
        with pytest.raises(ssl.SSLCertVerificationError):
            await post(untrusted)
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # the machine now trusts it
        trusted = HTTPStreamPool(f"https://localhost:{port}/v1", connect_timeout_s=2.0)
        assert await post(trusted) == [b"secret"]
        await trusted.aclose()
    finally:
        await server.stop()
