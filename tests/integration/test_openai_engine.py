"""OpenAIEngine against a real sim server subprocess: deltas, usage, aborts, errors."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import aclosing

import pytest

from shared.errors import EngineError
from shared.protocol import Message
from shared.settings import load_settings
from tests.integration.simserver import metrics, wait_metrics
from tests.support import free_port
from workers.engines.base import Delta, EngineRequest
from workers.engines.factory import make_engine
from workers.engines.openai_engine import OpenAIEngine
from workers.engines.sim import SimOptions, count_prompt_tokens, plan_answer

pytestmark = pytest.mark.integration

ABORTED = "firsttoken_sim_requests_aborted_total"
RUNNING = "firsttoken_sim_requests_running"
REQUEST = EngineRequest(
    messages=[Message(role="user", content="How do I keep time to first token low?")],
    model="sim",
    max_tokens=64,
)


@pytest.fixture
async def engine(server: str) -> AsyncIterator[OpenAIEngine]:
    engine = make_engine(load_settings(engine="openai", engine_url=f"{server}/v1"))
    assert isinstance(engine, OpenAIEngine)
    yield engine
    await engine.aclose()


async def test_streams_deltas_with_usage(engine: OpenAIEngine) -> None:
    """The deltas spell the simulator's answer; the last carries finish_reason and usage."""
    deltas = [d async for d in engine.stream(REQUEST, request_id="a")]
    tokens, reason = plan_answer(REQUEST, SimOptions().max_tokens)
    assert "".join(d.text for d in deltas) == "".join(tokens)
    last = deltas[-1]
    assert last.finish_reason == reason
    assert last.completion_tokens == len(tokens)
    assert last.prompt_tokens == count_prompt_tokens(REQUEST.messages)
    assert (engine.stats.started, engine.stats.finished, engine.stats.aborted) == (1, 1, 0)


async def test_cancelled_task_aborts_on_server(engine: OpenAIEngine, server: str) -> None:
    """Cancelling the consuming task mid-stream shows up as an abort on the server within 1 s."""
    before = await metrics(server)
    got_one = asyncio.Event()

    async def consume() -> None:
        async for _ in engine.stream(REQUEST, request_id="b"):
            got_one.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(got_one.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    after = await wait_metrics(server, lambda m: m[ABORTED] > before[ABORTED], 1.0)
    assert after[ABORTED] == before[ABORTED] + 1 and after[RUNNING] == 0
    assert (engine.stats.finished, engine.stats.aborted, engine.stats.running) == (0, 1, 0)


async def test_abort_by_id_ends_stream(engine: OpenAIEngine, server: str) -> None:
    """abort(request_id) from another task ends the stream with "abort" and aborts on the server."""
    before = await metrics(server)
    deltas: list[Delta] = []
    async with aclosing(engine.stream(REQUEST, request_id="c")) as stream:
        async for delta in stream:
            deltas.append(delta)
            if len(deltas) == 2:
                asyncio.get_running_loop().create_task(engine.abort("c"))
    assert deltas[-1].finish_reason == "abort"
    assert len(deltas) < 20
    after = await wait_metrics(server, lambda m: m[ABORTED] > before[ABORTED], 1.0)
    assert after[ABORTED] == before[ABORTED] + 1
    assert engine.stats.aborted == 1 and engine.stats.finished == 0


async def test_unreachable_engine_raises_engine_error() -> None:
    """A URL with nothing listening raises EngineError, quickly; the URL is in its detail (for
    the log), never in its message (for the client)."""
    url = f"http://127.0.0.1:{free_port()}/v1"
    engine = OpenAIEngine(load_settings(engine="openai", engine_url=url))
    started = time.monotonic()
    try:
        with pytest.raises(EngineError, match="unreachable") as info:
            async for _ in engine.stream(REQUEST, request_id="d"):
                pass
    finally:
        await engine.aclose()
    assert url in (info.value.detail or "")
    assert "127.0.0.1" not in info.value.message and url.split(":")[-1] not in info.value.message
    assert time.monotonic() - started < 3
    assert engine.stats.aborted == 1 and engine.stats.running == 0


async def test_http_500_message_names_no_address_even_when_the_body_does() -> None:
    """A 500 whose body names the server, an upstream URL and an IP: the error's message keeps
    the server's words with every address taken out; the detail has the engine's URL."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        body = (
            b'{"error": {"message": "proxy 127.0.0.1:%d: upstream http://vllm-3.internal:8000/v1'
            b' failed (10.2.3.4)"}}' % port
        )
        writer.write(
            b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: %d\r\n\r\n" % len(body)
        )
        writer.write(body)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    engine = OpenAIEngine(load_settings(engine="openai", engine_url=url))
    try:
        with pytest.raises(EngineError) as info:
            async for _ in engine.stream(REQUEST, request_id="g"):
                pass
    finally:
        await engine.aclose()
        server.close()
    message = info.value.message
    assert (
        message
        == "the engine returned HTTP 500: proxy <engine>: upstream <address> failed (<address>)"
    )
    assert url in (info.value.detail or "") and "vllm-3.internal" in (info.value.detail or "")


async def test_http_error_raises_engine_error(engine: OpenAIEngine) -> None:
    """An HTTP error from the server (unknown model: 404) raises EngineError with the status."""
    bad = EngineRequest(messages=REQUEST.messages, model="no-such-model", max_tokens=8)
    with pytest.raises(EngineError, match="HTTP 404") as info:
        async for _ in engine.stream(bad, request_id="e"):
            pass
    assert "no-such-model" in str(info.value)


async def test_abort_while_the_request_is_in_flight_sends_nothing() -> None:
    """abort() before the server has answered: once the answer's headers come, the stream ends
    with "abort" and no text, and the connection is closed (the server sees the client go)."""
    received, answer, closed = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        received.set()
        await answer.wait()
        chunk = b'data: {"choices":[{"delta":{"content":"late"},"finish_reason":null}]}\n\n'
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n" + b"%x\r\n%s\r\n" % (len(chunk), chunk)
        )
        await writer.drain()
        await reader.read()  # until the client closes the connection
        closed.set()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    engine = OpenAIEngine(load_settings(engine="openai", engine_url=f"http://127.0.0.1:{port}/v1"))
    try:
        stream = asyncio.create_task(_collect(engine.stream(REQUEST, request_id="f")))
        await asyncio.wait_for(received.wait(), 5)
        await engine.abort("f")
        answer.set()
        deltas = await asyncio.wait_for(stream, 5)
        assert deltas == [Delta(finish_reason="abort")]
        await asyncio.wait_for(closed.wait(), 5)
        assert engine.stats.aborted == 1 and engine.stats.running == 0
    finally:
        await engine.aclose()
        server.close()


async def _collect(deltas: AsyncIterator[Delta]) -> list[Delta]:
    return [d async for d in deltas]
