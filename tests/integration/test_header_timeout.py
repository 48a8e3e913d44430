"""gateway/headertimeout.py on a real uvicorn server in the test's loop: slow or missing headers
are cut, on a fresh connection and on a kept-alive one; prompt requests are served."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import uvicorn

from gateway.headertimeout import header_timeout_protocol
from tests.support import free_port

pytestmark = pytest.mark.integration

TIMEOUT_S = 0.5
REQUEST = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    assert scope["type"] == "http"
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]}
    )
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture
async def port() -> AsyncIterator[int]:
    number = free_port()
    config = uvicorn.Config(
        _app,
        port=number,
        http=header_timeout_protocol(TIMEOUT_S),
        lifespan="off",
        log_level="warning",
        timeout_keep_alive=30,  # far longer than the header deadline: only it may cut
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    for _ in range(500):
        if server.started:
            break
        await asyncio.sleep(0.01)
    yield number
    server.should_exit = True
    await task


async def _closed_after(reader: asyncio.StreamReader) -> float:
    """Seconds until the server closes the connection (reads nothing else)."""
    start = time.monotonic()
    assert await asyncio.wait_for(reader.read(), TIMEOUT_S + 5) == b""
    return time.monotonic() - start


async def test_a_connection_that_sends_nothing_is_closed_at_the_deadline(port: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    took = await _closed_after(reader)
    assert TIMEOUT_S - 0.1 <= took < TIMEOUT_S + 1
    writer.close()


async def test_headers_trickled_past_the_deadline_are_cut_without_an_answer(port: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    start = time.monotonic()
    for byte in REQUEST[:-4]:  # never the end of the headers
        writer.write(bytes([byte]))
        await asyncio.sleep(0.05)
        if reader.at_eof() or time.monotonic() - start > TIMEOUT_S + 1:
            break
    assert await asyncio.wait_for(reader.read(), 2) == b""
    assert time.monotonic() - start < TIMEOUT_S + 1
    writer.close()


async def test_a_kept_alive_connection_gets_a_fresh_deadline_per_request(port: int) -> None:
    """Two prompt requests on one connection, idle longer than the deadline in between (the
    keep-alive timer's business, not this one's), then a slow third request is cut."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    for _ in range(2):
        writer.write(REQUEST)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 2)
        assert head.startswith(b"HTTP/1.1 200") and await reader.readexactly(2) == b"ok"
        await asyncio.sleep(TIMEOUT_S * 2)
    writer.write(REQUEST[:5])
    took = await _closed_after(reader)
    assert TIMEOUT_S - 0.1 <= took < TIMEOUT_S + 1
    writer.close()
