"""The chat worker's pipelined chunk connection (workers/sender.py) on a real Redis: order,
idle connections, a killed connection and a flushed script cache lose no chunk."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from shared.resp import pack
from tests.integration.conftest import Services
from workers.publish import SEND_LUA
from workers.sender import ChunkSender


@pytest.fixture
async def channel(services: Services) -> AsyncIterator[tuple[str, str, aioredis.client.PubSub]]:
    name = f"ftsender{uuid.uuid4().hex[:8]}"
    client = aioredis.Redis.from_url(services.redis_url, decode_responses=True)
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    await pubsub.subscribe(f"{name}:ch")
    yield f"{name}:ch", f"{name}:replay", pubsub
    await pubsub.aclose()
    await client.delete(f"{name}:replay")
    await client.aclose()


async def _sender(services: Services, name: str = "ftsender-test") -> ChunkSender:
    sender = ChunkSender(services.redis_url, SEND_LUA, client_name=name)
    await sender.start()
    return sender


async def _received(pubsub: aioredis.client.PubSub, count: int, timeout: float = 5.0) -> list[str]:
    out: list[str] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while len(out) < count and loop.time() < deadline:
        msg = await pubsub.get_message(timeout=0.2)
        if msg is not None and msg["type"] == "message":
            out.append(msg["data"])
    return out


def _send(sender: ChunkSender, ch: str, stream: str, messages: list[str]) -> None:
    for i, message in enumerate(messages):
        sender.send((ch, stream), (message, "100", "60" if i == 0 else "0"))


def test_pack_is_resp() -> None:
    assert pack((b"PING",)) == b"*1\r\n$4\r\nPING\r\n"
    assert pack((b"ECHO", b"a\r\nb")) == b"*2\r\n$4\r\nECHO\r\n$4\r\na\r\nb\r\n"


async def test_chunks_arrive_in_order_on_channel_and_replay_stream(
    services: Services, channel: tuple[str, str, aioredis.client.PubSub]
) -> None:
    ch, stream, pubsub = channel
    sender = await _sender(services)
    try:
        messages = [f"T{i}\nchunk {i}" for i in range(2000)]
        _send(sender, ch, stream, messages)
        assert await _received(pubsub, len(messages)) == messages
        await asyncio.wait_for(sender.flush(), 5.0)
        client = aioredis.Redis.from_url(services.redis_url, decode_responses=True)
        entries = await client.xrange(stream)
        ttl = await client.ttl(stream)
        await client.aclose()
        assert [e[1]["m"] for e in entries][-5:] == messages[-5:]
        assert 0 < ttl <= 60  # the first chunk set the replay stream's expiry
    finally:
        await sender.close()


async def test_idle_connection_survives_redis_clients_default_timeout(
    services: Services, channel: tuple[str, str, aioredis.client.PubSub]
) -> None:
    """redis-py's default socket timeout is 5 s; a worker may see no chat for far longer."""
    ch, stream, pubsub = channel
    sender = await _sender(services)
    try:
        _send(sender, ch, stream, ["before"])
        assert await _received(pubsub, 1) == ["before"]
        await asyncio.sleep(5.5)
        _send(sender, ch, stream, ["after"])
        assert await _received(pubsub, 1) == ["after"]
    finally:
        await sender.close()


async def test_killed_connection_reconnects_and_loses_nothing(
    services: Services, channel: tuple[str, str, aioredis.client.PubSub]
) -> None:
    ch, stream, pubsub = channel
    name = f"ftsender-{uuid.uuid4().hex[:8]}"
    sender = await _sender(services, name)
    admin = aioredis.Redis.from_url(services.redis_url, decode_responses=True)
    try:
        _send(sender, ch, stream, ["one"])
        assert await _received(pubsub, 1) == ["one"]
        # Kill the sender's connection the way a Redis restart or a network cut would.
        ids = [c["id"] for c in await admin.client_list() if c.get("name") == name]
        assert len(ids) == 1
        assert await admin.client_kill_filter(_id=ids[0]) == 1
        _send(sender, ch, stream, [f"after {i}" for i in range(50)])
        got = await _received(pubsub, 50, timeout=10.0)
        # Order kept; a chunk in flight at the cut may come twice (the gateway drops it by seq).
        assert list(dict.fromkeys(got)) == [f"after {i}" for i in range(50)]
    finally:
        await admin.aclose()
        await sender.close()


async def test_flushed_script_cache_is_reloaded(
    services: Services, channel: tuple[str, str, aioredis.client.PubSub]
) -> None:
    ch, stream, pubsub = channel
    sender = await _sender(services)
    admin = aioredis.Redis.from_url(services.redis_url)
    try:
        await admin.script_flush()
        _send(sender, ch, stream, ["a", "b", "c"])
        got = await _received(pubsub, 3, timeout=10.0)
        assert list(dict.fromkeys(got)) == ["a", "b", "c"]
        assert sender.errors == 0
    finally:
        await admin.aclose()
        await sender.close()


async def test_a_call_that_asks_gets_the_scripts_answer_even_across_a_reconnect(
    services: Services, channel: tuple[str, str, aioredis.client.PubSub]
) -> None:
    """The `started` chunk's call reads the job's cancel flag; its reply future resolves to the
    flag, in order with the chunks around it, and after a killed connection too."""
    ch, stream, pubsub = channel
    name = f"ftsender-{uuid.uuid4().hex[:8]}"
    flag = f"{stream}:cancel"
    sender = await _sender(services, name)
    admin = aioredis.Redis.from_url(services.redis_url, decode_responses=True)
    loop = asyncio.get_running_loop()
    try:
        unset: asyncio.Future[object] = loop.create_future()
        sender.send((ch, stream, flag), ("start", "100", "60"), unset)
        _send(sender, ch, stream, ["t0"])
        assert await asyncio.wait_for(unset, 5) == 0
        await admin.set(flag, "1", ex=60)
        ids = [c["id"] for c in await admin.client_list() if c.get("name") == name]
        assert await admin.client_kill_filter(_id=ids[0]) == 1
        is_set: asyncio.Future[object] = loop.create_future()
        sender.send((ch, stream, flag), ("again", "100", "0"), is_set)
        assert await asyncio.wait_for(is_set, 10) == 1
        got = await _received(pubsub, 3, timeout=10.0)
        assert list(dict.fromkeys(got)) == ["start", "t0", "again"]
    finally:
        await admin.delete(flag)
        await admin.aclose()
        await sender.close()
