"""The pipelined Redis connection (shared/redis/pipe.py) on a real Redis: order, idle
connections, a killed connection and a flushed script cache lose no chunk; a caller that gave
up is not sent again."""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from shared.redis import scripts
from shared.redis.pipe import PipeScript, RedisPipe
from shared.redis.resp import pack
from tests.integration.conftest import Services
from tests.support import free_port, throwaway_redis_server


@pytest.fixture
async def channel(services: Services) -> AsyncIterator[tuple[str, str, aioredis.client.PubSub]]:
    name = f"ftpipe{uuid.uuid4().hex[:8]}"
    client = aioredis.Redis.from_url(services.redis_url, decode_responses=True)
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    await pubsub.subscribe(f"{name}:ch")
    yield f"{name}:ch", f"{name}:replay", pubsub
    await pubsub.aclose()
    await client.delete(f"{name}:replay")
    await client.aclose()


async def _open(services: Services, name: str = "ftpipe-test") -> tuple[RedisPipe, PipeScript]:
    pipe = RedisPipe(services.redis_url, client_name=name)
    chunks = pipe.script(scripts.CHUNK_SEND)
    await pipe.start()
    return pipe, chunks


async def _received(pubsub: aioredis.client.PubSub, count: int, timeout: float = 5.0) -> list[str]:
    out: list[str] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while len(out) < count and loop.time() < deadline:
        msg = await pubsub.get_message(timeout=0.2)
        if msg is not None and msg["type"] == "message":
            out.append(msg["data"])
    return out


def _send(
    chunks: PipeScript, ch: str, stream: str, messages: list[str], *, merged: bool = False
) -> None:
    """Each message a run of the script, or, `merged`, runs merged as the publisher sends them."""
    keyed = chunks.keyed((ch, stream))
    for i, message in enumerate(messages):
        if merged:
            keyed.merge((message.encode(), b"100", b"60" if i == 0 else b"0"))
        else:
            chunks.send((ch, stream), (message, "100", "60" if i == 0 else "0"))


def test_a_keyed_script_packs_the_same_command() -> None:
    script = RedisPipe("redis://127.0.0.1:6379").script(scripts.CHUNK_SEND)
    keys, args = ("ch:é", "stream:1"), (b"chunk\r\n\xc3\xa9", b"100", b"0")
    sha = hashlib.sha1(scripts.CHUNK_SEND.source.encode()).hexdigest().encode()
    expected = pack((b"EVALSHA", sha, b"2", *(k.encode() for k in keys), *args))
    assert script.keyed(keys).command(args) == expected
    assert script.keyed(("k",)).command(()) == pack((b"EVALSHA", sha, b"1", b"k"))


@pytest.mark.parametrize("how", ["script", "keyed", "merged"])
async def test_chunks_arrive_in_order_on_channel_and_replay_stream(
    services: Services, channel: tuple[str, str, aioredis.client.PubSub], how: str
) -> None:
    ch, stream, pubsub = channel
    pipe, chunks = await _open(services)
    try:
        messages = [f"T{i}\nchunk {i}" for i in range(2000)]
        if how != "script":
            keyed = chunks.keyed((ch, stream))
            send = keyed.send if how == "keyed" else keyed.merge
            for i, message in enumerate(messages):
                send((message.encode(), b"100", b"60" if i == 0 else b"0"))
        else:
            _send(chunks, ch, stream, messages)
        assert await _received(pubsub, len(messages)) == messages
        await asyncio.wait_for(pipe.flush(), 5.0)
        client = aioredis.Redis.from_url(services.redis_url, decode_responses=True)
        entries = await client.xrange(stream)
        ttl = await client.ttl(stream)
        await client.aclose()
        assert [e[1]["m"] for e in entries][-5:] == messages[-5:]
        assert 0 < ttl <= 60  # the first chunk set the replay stream's expiry
    finally:
        await pipe.close()


async def test_idle_connection_survives_redis_clients_default_timeout(
    services: Services, channel: tuple[str, str, aioredis.client.PubSub]
) -> None:
    """redis-py's default socket timeout is 5 s; a worker may see no chat for far longer."""
    ch, stream, pubsub = channel
    pipe, chunks = await _open(services)
    try:
        _send(chunks, ch, stream, ["before"])
        assert await _received(pubsub, 1) == ["before"]
        await asyncio.sleep(5.5)
        _send(chunks, ch, stream, ["after"])
        assert await _received(pubsub, 1) == ["after"]
    finally:
        await pipe.close()


@pytest.mark.parametrize("merged", [False, True], ids=["runs", "merged"])
async def test_killed_connection_reconnects_and_loses_nothing(
    services: Services, channel: tuple[str, str, aioredis.client.PubSub], merged: bool
) -> None:
    ch, stream, pubsub = channel
    name = f"ftpipe-{uuid.uuid4().hex[:8]}"
    pipe, chunks = await _open(services, name)
    admin = aioredis.Redis.from_url(services.redis_url, decode_responses=True)
    try:
        _send(chunks, ch, stream, ["one"])
        assert await _received(pubsub, 1) == ["one"]
        # Kill the pipe's connection the way a Redis restart or a network cut would.
        ids = [c["id"] for c in await admin.client_list() if c.get("name") == name]
        assert len(ids) == 1
        assert await admin.client_kill_filter(_id=ids[0]) == 1
        _send(chunks, ch, stream, [f"after {i}" for i in range(50)], merged=merged)
        got = await _received(pubsub, 50, timeout=10.0)
        # Order kept; a chunk in flight at the cut may come twice (the gateway drops it by seq).
        assert list(dict.fromkeys(got)) == [f"after {i}" for i in range(50)]
    finally:
        await admin.aclose()
        await pipe.close()


@pytest.mark.parametrize("merged", [False, True], ids=["runs", "merged"])
async def test_flushed_script_cache_is_reloaded(
    services: Services, channel: tuple[str, str, aioredis.client.PubSub], merged: bool
) -> None:
    ch, stream, pubsub = channel
    pipe, chunks = await _open(services)
    admin = aioredis.Redis.from_url(services.redis_url)
    try:
        await admin.script_flush()
        _send(chunks, ch, stream, ["a", "b", "c"], merged=merged)
        got = await _received(pubsub, 3, timeout=10.0)
        assert list(dict.fromkeys(got)) == ["a", "b", "c"]
        assert pipe.errors == 0
    finally:
        await admin.aclose()
        await pipe.close()


async def test_a_call_that_asks_gets_the_scripts_answer_even_across_a_reconnect(
    services: Services, channel: tuple[str, str, aioredis.client.PubSub]
) -> None:
    """The `started` chunk's call reads the job's cancel flag; its reply future resolves to the
    flag, in order with the chunks around it, and after a killed connection too."""
    ch, stream, pubsub = channel
    name = f"ftpipe-{uuid.uuid4().hex[:8]}"
    flag = f"{stream}:cancel"
    pipe, chunks = await _open(services, name)
    admin = aioredis.Redis.from_url(services.redis_url, decode_responses=True)
    loop = asyncio.get_running_loop()
    try:
        unset: asyncio.Future[object] = loop.create_future()
        chunks.send((ch, stream, flag), ("start", "100", "60"), unset)
        _send(chunks, ch, stream, ["t0"])
        assert await asyncio.wait_for(unset, 5) == 0
        await admin.set(flag, "1", ex=60)
        ids = [c["id"] for c in await admin.client_list() if c.get("name") == name]
        assert await admin.client_kill_filter(_id=ids[0]) == 1
        is_set: asyncio.Future[object] = loop.create_future()
        chunks.send((ch, stream, flag), ("again", "100", "0"), is_set)
        assert await asyncio.wait_for(is_set, 10) == 1
        got = await _received(pubsub, 3, timeout=10.0)
        assert list(dict.fromkeys(got)) == ["start", "t0", "again"]
    finally:
        await admin.delete(flag)
        await admin.aclose()
        await pipe.close()


async def test_plain_commands_are_answered_in_order_with_the_scripts(services: Services) -> None:
    pipe = RedisPipe(services.redis_url)
    await pipe.start()
    key = f"ftpipe{uuid.uuid4().hex[:8]}"
    try:
        answers = await asyncio.gather(
            pipe.call("HSET", key, "=sum", "41"),
            pipe.call("HINCRBY", key, "=sum", "1"),
            pipe.call("HGET", key, "=sum"),
            pipe.call("HGET", key, "missing"),
        )
        assert answers == [1, 42, "42", None]
        with pytest.raises(ResponseError, match=r"WRONGTYPE|wrong kind"):
            await pipe.call("LPUSH", key, "x")  # an error reply goes to its caller
        assert pipe.errors == 0
        pipe.send((b"LPUSH", key.encode(), b"x"))  # nobody waits: counted and logged
        assert await pipe.call("HSET", key, "text", "héllo 中文 😀") == 1  # the pipe goes on
        assert await pipe.call("HGET", key, "text") == "héllo 中文 😀"
        assert pipe.errors == 1
        assert await pipe.call("DEL", key) == 1
    finally:
        await pipe.close()


async def test_a_call_whose_caller_gave_up_is_not_sent_again_after_a_reconnect(
    tmp_path: Path,
) -> None:
    """While Redis is down, calls wait; once it is back, only those whose caller still waits
    are sent: an admission the client was already told had failed must not run later."""
    port = free_port()
    server = throwaway_redis_server(port, tmp_path)
    url = f"redis://127.0.0.1:{port}/0"
    pipe = RedisPipe(url, down_fail_s=30)
    try:
        await pipe.start()
        assert await pipe.call("PING") == "PONG"
        server.terminate()
        server.wait(10)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5
        while pipe.connected:
            assert loop.time() < deadline, "the pipe did not notice Redis going away"
            await asyncio.sleep(0.01)
        abandoned = asyncio.ensure_future(pipe.call("INCR", "gave-up"))
        kept = asyncio.ensure_future(pipe.call("INCR", "waited"))
        await asyncio.sleep(0.05)
        abandoned.cancel()
        server = throwaway_redis_server(port, tmp_path)
        assert await asyncio.wait_for(kept, 10) == 1
        assert await pipe.call("GET", "gave-up") is None
        assert abandoned.cancelled()
    finally:
        await pipe.close(grace_s=0.1)
        server.terminate()
        server.wait(10)


async def test_an_urgent_call_is_written_at_once_with_what_was_queued_before_it(
    services: Services,
) -> None:
    """`urgent` writes without waiting for the writer task: the commands reach Redis while this
    test holds the event loop (a blocking client polls for them), in the order sent."""
    import redis

    pipe = RedisPipe(services.redis_url)
    await pipe.start()
    key = f"ftpipe{uuid.uuid4().hex[:8]}"
    sync = redis.Redis.from_url(services.redis_url, decode_responses=True)
    try:
        pipe.send([b"RPUSH", key.encode(), b"queued"])
        pipe.send([b"RPUSH", key.encode(), b"urgent"], urgent=True)
        got: list[str] = []
        for _ in range(200):  # the loop does not run in here: only the urgent write got out
            got = sync.lrange(key, 0, -1)  # type: ignore[assignment]
            if len(got) == 2:
                break
            time.sleep(0.005)  # noqa: ASYNC251 - holding the loop is the point
        assert got == ["queued", "urgent"]
        await pipe.flush()
    finally:
        sync.delete(key)
        sync.close()
        await pipe.close()


async def test_linger_holds_chunks_until_an_awaited_call_or_urgent_one(services: Services) -> None:
    """With a linger (here 30 s, far past anything the test waits), chunks nobody awaits stay
    in the process; a call with a reply, or an urgent one, writes them at once, in order."""
    key = f"ftlinger{uuid.uuid4().hex[:8]}"
    pipe = RedisPipe(services.redis_url, client_name="ftpipe-linger", linger_s=30.0)
    await pipe.start()
    client = aioredis.Redis.from_url(services.redis_url, decode_responses=True)
    try:
        pipe.send((b"RPUSH", key.encode(), b"a"))
        pipe.send((b"RPUSH", key.encode(), b"b"))
        for _ in range(20):  # turns of the loop: the writer is lingering, not writing
            await asyncio.sleep(0)
        await asyncio.sleep(0.05)
        assert await client.llen(key) == 0
        # An awaited call goes out at once, behind what was held.
        async with asyncio.timeout(5):
            assert await pipe.call("LRANGE", key, "0", "-1") == ["a", "b"]
        pipe.send((b"RPUSH", key.encode(), b"c"))
        await asyncio.sleep(0.05)
        assert await client.llen(key) == 2
        pipe.send((b"RPUSH", key.encode(), b"d"), urgent=True)  # a chat's first token
        for _ in range(500):  # up to 5 s; the writer task would have waited 30
            if await client.llen(key) == 4:
                break
            await asyncio.sleep(0.01)
        assert await client.lrange(key, 0, -1) == ["a", "b", "c", "d"]
    finally:
        await pipe.close(grace_s=0.5)
        await client.delete(key)
        await client.aclose()


async def test_merged_chunks_of_several_jobs_go_as_one_call_in_the_order_sent(
    tmp_path: Path,
) -> None:
    """Chunks of two jobs queued back to back are one EVALSHA (a private Redis counts them);
    a plain command between them closes the run, and everything keeps the order sent."""
    port = free_port()
    server = throwaway_redis_server(port, tmp_path)
    url = f"redis://127.0.0.1:{port}/0"
    pipe = RedisPipe(url)
    chunks = pipe.script(scripts.CHUNK_SEND)
    client = aioredis.Redis.from_url(url, decode_responses=True)
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    try:
        await pubsub.subscribe("a:ch", "b:ch")
        await pipe.start()
        a, b = chunks.keyed(("a:ch", "a:replay")), chunks.keyed(("b:ch", "b:replay"))
        await client.config_resetstat()
        for i in range(6):
            a.merge((b"a%d" % i, b"100", b"60" if i == 0 else b"0"))
            b.merge((b"b%d" % i, b"100", b"60" if i == 0 else b"0"))
            if i == 2:
                pipe.send((b"PUBLISH", b"a:ch", b"plain"))
        await asyncio.wait_for(pipe.flush(), 5.0)
        got: list[tuple[str, str]] = []
        async with asyncio.timeout(5):
            while len(got) < 13:
                msg = await pubsub.get_message(timeout=0.2)
                if msg is not None and msg["type"] == "message":
                    got.append((msg["channel"], msg["data"]))
        assert [data for ch, data in got if ch == "a:ch"] == [
            *("a0", "a1", "a2", "plain", "a3", "a4", "a5")
        ]
        assert [data for ch, data in got if ch == "b:ch"] == [f"b{i}" for i in range(6)]
        assert [e[1]["m"] for e in await client.xrange("b:replay")] == [f"b{i}" for i in range(6)]
        assert 0 < await client.ttl("a:replay") <= 60
        stats = await client.info("commandstats")
        assert stats["cmdstat_evalsha"]["calls"] == 2
    finally:
        await pipe.close(grace_s=0.5)
        await pubsub.aclose()
        await client.aclose()
        server.terminate()
        server.wait(10)
