"""Keys, revocation and every input limit, through a real gateway with tight settings."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import websockets

from firsttoken.keyscli import create_key, fetch_keys, revoke
from shared.settings import Settings, load_settings
from tests.integration.conftest import Client, Services, Stack, make_stack

pytestmark = pytest.mark.integration

TIGHT = {
    "allowed_origins": "https://app.example.com",
    "max_connections": "6",
    "idle_timeout_s": "1.5",
    "max_message_chars": "200",
    "max_tokens_limit": "64",
    "max_tokens_default": "16",
    # The shared 0.3 s heartbeat reads as "no chat worker" on a loaded 2-core machine.
    "worker_heartbeat_s": "1",
}


@pytest.fixture(scope="module")
def tight(
    services: Services, migrated: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """A stack whose gateway has small input limits and an allow-listed origin."""
    with make_stack(services, migrated, tmp_path_factory.mktemp("sec"), bulk=False, **TIGHT) as s:
        s.wait_ready()
        yield s


def _settings(stack: Stack) -> Settings:
    return load_settings(
        database_url=stack.services.database_url,
        redis_url=stack.services.redis_url,
        redis_prefix=stack.prefix,
    )


async def _open(stack: Stack, key: str | None = None, **headers: str) -> Client:
    hdrs = {"Authorization": f"Bearer {key or stack.api_key}", **headers}
    return Client(await websockets.connect(stack.ws_url, additional_headers=hdrs))


async def _first(ws: Any) -> dict[str, Any]:
    return dict(json.loads(await asyncio.wait_for(ws.recv(), 5)))


async def test_origin_check(tight: Stack) -> None:
    """A foreign browser origin is refused with a reason; the listed one and none are let in."""
    bad = await _open(tight, Origin="https://evil.example.com")
    frame = await _first(bad.ws)
    assert frame["code"] == "unauthorized" and "origin" in frame["message"]
    with pytest.raises(websockets.ConnectionClosed):
        await bad.ws.recv()
    for headers in ({"Origin": "https://app.example.com"}, {}):
        good = await _open(tight, **headers)
        await good.send({"type": "ping", "id": "p"})
        assert (await good.next_for("p"))["type"] == "pong"
        await good.ws.close()


async def test_max_connections_per_process(tight: Stack) -> None:
    """Past max_connections the next socket gets `overloaded` and a close; a freed slot reopens."""
    clients = [await _open(tight) for _ in range(6)]
    for c in clients:
        await c.send({"type": "ping", "id": "p"})
        assert (await c.next_for("p"))["type"] == "pong"
    extra = await _open(tight)
    frame = await _first(extra.ws)
    assert frame["code"] == "overloaded" and "6 connections" in frame["message"]
    await clients[0].ws.close()
    await asyncio.sleep(0.2)
    again = await _open(tight)
    await again.send({"type": "ping", "id": "q"})
    assert (await again.next_for("q"))["type"] == "pong"
    for c in [*clients[1:], again]:
        await c.ws.close()


async def test_idle_connection_is_closed(tight: Stack) -> None:
    """A socket that sends nothing for idle_timeout_s gets `timeout` and is closed."""
    client = await _open(tight)
    started = time.monotonic()
    frame = await asyncio.wait_for(client.next_for(None, timeout=5), 5)
    assert frame["code"] == "timeout" and "without a frame" in frame["message"]
    assert 1.4 <= time.monotonic() - started < 3.5
    with pytest.raises(websockets.ConnectionClosed):
        await client.ws.recv()


@pytest.mark.parametrize(
    ("frame", "needle", "named"),
    [
        ({"messages": [{"role": "user", "content": "x" * 201}]}, "201 characters", True),
        ({"max_tokens": 65}, "max_tokens 65", True),
        ({"messages": [{"role": "user", "content": "a"}] * 17}, "too many messages", True),
        # An oversize frame is not parsed at all, so its error cannot name the chat.
        ({"messages": [{"role": "user", "content": "x" * (70 * 1024)}]}, "the limit", False),
    ],
)
async def test_each_input_limit(
    tight: Stack, frame: dict[str, Any], needle: str, named: bool
) -> None:
    """Chars per message, max_tokens ceiling, messages per chat, frame size: invalid_request."""
    client = await _open(tight)
    body = {"type": "chat", "id": "lim", "messages": [{"role": "user", "content": "hi"}]}
    await client.send({**body, **frame})
    err = await client.next_for("lim" if named else None)
    assert err["code"] == "invalid_request" and needle in err["message"], err
    await client.ws.close()


async def test_invalid_utf8_is_refused_and_the_socket_survives(tight: Stack) -> None:
    """Non-UTF-8 binary frames and lone surrogate escapes: invalid_request; the socket survives."""
    client = await _open(tight)
    await client.ws.send(b'{"type":"ping","id":"\xff\xfe"}')
    assert (await client.next_for(None))["code"] == "invalid_request"
    await client.send('{"type":"ping","id":"\\ud800"}')
    assert (await client.next_for(None))["code"] == "invalid_request"
    await client.send('{"type":"chat","id":"s","messages":[{"role":"user","content":"a\\udc00"}]}')
    err = await client.next_for("s")
    assert err["code"] == "invalid_request" and "UTF-8" in err["message"]
    await client.send({"type": "ping", "id": "ok"})
    assert (await client.next_for("ok"))["type"] == "pong"
    await client.ws.close()


async def test_revocation_takes_effect_within_a_second(tight: Stack) -> None:
    """After `keys revoke`: the open socket is closed, new ones refused, all within 1 s."""
    settings = _settings(tight)
    created = await create_key(settings, f"rev-{uuid.uuid4().hex[:6]}")
    client = await _open(tight, created.key)
    await client.chat("before", max_tokens=2)
    assert (await client.next_for("before"))["type"] == "accepted"
    await client.until_end("before")
    await client.send({"type": "ping", "id": "alive"})
    assert (await client.next_for("alive"))["type"] == "pong"
    started = time.monotonic()
    assert await revoke(settings, created.key_id)
    frame = await client.next_for(None, timeout=1.0)
    assert frame["code"] == "unauthorized" and "revoked" in frame["message"]
    fresh = await _open(tight, created.key)
    assert (await _first(fresh.ws))["code"] == "unauthorized"
    assert time.monotonic() - started < 1.0
    listed = {k.key_id: k for k in await fetch_keys(settings)}
    assert listed[created.key_id].revoked_at is not None
    assert not await revoke(settings, created.key_id)  # already revoked


async def test_tokens_are_refunded_when_a_chat_ends(tight: Stack) -> None:
    """tpm 130: a 69-token reservation blocks a second; done settles it to the exact usage."""
    settings = _settings(tight)
    created = await create_key(settings, f"tpm-{uuid.uuid4().hex[:6]}", tpm=130)
    client = await _open(tight, created.key)
    await client.chat("a", "hi", max_tokens=64)  # reserves 1 + 4 + 64 = 69
    first = await client.next_for("a")
    assert first["type"] == "accepted", first
    await client.chat("b", "hi", max_tokens=64)
    refused = await client.next_for("b")
    assert refused["code"] == "rate_limited" and "tokens per minute" in refused["message"]
    assert refused["retry_after_ms"] > 0
    _, done = await client.until_end("a")
    # The reservation is now the exact usage: what is left fits one chat of exactly that size.
    used = done["usage"]["prompt_tokens"] + done["usage"]["completion_tokens"]
    room = 130 - used - 5  # minus the next chat's prompt estimate
    assert room >= 10, done["usage"]
    await asyncio.sleep(0.2)
    third_max = min(room, 64)  # the stack's max_tokens ceiling
    await client.chat("c", "hi", max_tokens=third_max)
    third = await client.next_for("c")
    assert third["type"] == "accepted", third
    left = room - third_max  # tokens still free in the window
    await client.chat("d", "hi", max_tokens=max(1, left - 4))  # reserves left + 1
    assert (await client.next_for("d"))["code"] == "rate_limited"
    await client.ws.close()


async def test_stream_cap_and_release_on_cancel_and_disconnect(tight: Stack) -> None:
    """max_streams 1: a second chat is rate_limited; cancel and disconnect both free the slot."""
    settings = _settings(tight)
    created = await create_key(settings, f"str-{uuid.uuid4().hex[:6]}", max_streams=1)
    client = await _open(tight, created.key)
    await client.chat("one", max_tokens=32)
    first = await client.next_for("one")
    assert first["type"] == "accepted", first
    await client.chat("two", max_tokens=4)
    refused = await client.next_for("two")
    assert refused["code"] == "rate_limited" and "concurrent streams" in refused["message"]
    await client.send({"type": "cancel", "id": "one"})
    _, end = await client.until_end("one")
    assert end.get("code") == "cancelled", end
    await asyncio.sleep(0.2)
    await client.chat("three", max_tokens=32)
    assert (await client.next_for("three"))["type"] == "accepted"
    await client.ws.close()
    await asyncio.sleep(0.5)
    other = await _open(tight, created.key)
    await other.chat("four", max_tokens=2)
    assert (await other.next_for("four"))["type"] == "accepted"
    await other.ws.close()
