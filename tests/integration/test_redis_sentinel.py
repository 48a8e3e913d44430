"""Every Redis client of the stack through a sentinel:// URL (issue 33), on a real primary, its
replica and three Sentinels: redis-py's pool, the pipe, the pub/sub reader, a bare connection
and Celery's broker find the master, and find the new one after the primary is killed."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kombu import Connection

from shared.redis.address import RedisAddress, celery_broker_url, celery_transport_options
from shared.redis.client import master_url, redis_client
from shared.redis.connection import RedisConnection
from shared.redis.pipe import RedisPipe
from shared.redis.pubsub import Subscriber
from shared.redis.sentinel import MasterNotFound, master_of
from tests.sentinels import SentinelGroup, sentinel_group
from tests.support import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


@pytest.fixture
def group(tmp_path: Path) -> Iterator[SentinelGroup]:
    g = sentinel_group(tmp_path)
    try:
        yield g
    finally:
        g.close()


def _broker_roundtrip(url: str, queue: str) -> object:
    with Connection(celery_broker_url(url), transport_options=celery_transport_options(url)) as c:
        c.SimpleQueue(queue).put({"n": 1})
        message = c.SimpleQueue(queue).get(timeout=10)
        message.ack()
        return message.payload


async def test_every_client_follows_the_master_through_a_failover(group: SentinelGroup) -> None:
    """Before and after the primary is killed, each client reads and writes on whichever server
    the Sentinels name master (the pipe and pub/sub reconnect by themselves)."""
    url = group.url
    client = redis_client(url)
    pipe = RedisPipe(url, down_fail_s=30)
    got: list[str] = []
    subscriber = Subscriber(url)
    await pipe.start()
    await subscriber.start()
    channel = f"ftsentinel-{uuid.uuid4().hex[:6]}"
    await subscriber.subscribe_confirmed(channel, got.append)
    try:
        await client.set("ftsentinel:x", "1")
        assert await pipe.call("INCR", "ftsentinel:n") == 1
        assert await asyncio.to_thread(_broker_roundtrip, url, f"ftq{uuid.uuid4().hex[:6]}") == {
            "n": 1
        }

        new_host, new_port = await asyncio.to_thread(group.failover)
        assert (await master_of(RedisAddress.from_url(url))).port == new_port
        assert master_url(url).endswith(f"{new_host}:{new_port}/0")
        # The pipe sends again what was not answered; a replica had the INCR already or not.
        assert await pipe.call("INCR", "ftsentinel:n") in (1, 2)
        for _ in range(50):  # the pool's next connect asks the Sentinels
            try:
                await client.set("ftsentinel:y", "2")
                break
            except ConnectionError:
                await asyncio.sleep(0.1)
        assert await client.get("ftsentinel:y") == "2"
        conn = await RedisConnection.open(url, decode=True)
        assert await conn.call("GET", "ftsentinel:y") == "2"
        await conn.aclose()
        for _ in range(100):  # the subscriber reconnected to the new master
            await client.publish(channel, "after")
            if got:
                break
            await asyncio.sleep(0.05)
        # Each try publishes again: one sent before the first arrived may arrive as well.
        assert got and set(got) == {"after"}, got
        assert await asyncio.to_thread(_broker_roundtrip, url, f"ftq{uuid.uuid4().hex[:6]}") == {
            "n": 1
        }
    finally:
        await subscriber.close()
        await pipe.close()
        await client.aclose()


async def test_no_sentinel_answering_says_so_naming_each() -> None:
    """Sentinels that are all down: MasterNotFound naming each and the master's name."""
    ports = [free_port(), free_port()]
    url = ";".join(f"sentinel://127.0.0.1:{p}" for p in ports) + "?master_name=nosuch"
    with pytest.raises(MasterNotFound, match="nosuch") as caught:
        await master_of(RedisAddress.from_url(url))
    assert all(str(p) in str(caught.value) for p in ports)
