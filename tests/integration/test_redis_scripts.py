"""shared/redis/scripts on a real Redis: every script compiles and Redis hashes it as we do, a
script run after the server's script cache was flushed (NOSCRIPT) is loaded and runs, and the
requeue of a lost chat (gateway/requeue.py, by `scripts.run`) does what its inline script did."""

from __future__ import annotations

import uuid

import pytest

from gateway.requeue import requeue_if_lost
from shared.redis import scripts
from shared.redis.client import redis_client
from tests.integration.conftest import Services

pytestmark = pytest.mark.integration


async def test_every_script_loads_under_the_sha_computed_here(services: Services) -> None:
    client = redis_client(services.redis_url)
    try:
        for script in scripts.SCRIPTS.values():
            assert await client.script_load(script.source) == script.sha, script.name
    finally:
        await client.aclose()


async def test_a_script_runs_after_a_script_flush(services: Services) -> None:
    client = redis_client(services.redis_url)
    leases = f"ftlua{uuid.uuid4().hex[:8]}:leases"
    try:
        assert await scripts.run(client, scripts.LEASE_HOLD, [leases], ["j1", "p1", 60]) == 1
        await client.script_flush()
        assert await client.script_exists(scripts.LEASE_HOLD.sha) == [False]
        assert await scripts.run(client, scripts.LEASE_HOLD, [leases], ["j2", "p2", 60]) == 1
        assert await client.hgetall(leases) == {"j1": "p1", "j2": "p2"}
        assert await client.script_exists(scripts.LEASE_HOLD.sha) == [True]
    finally:
        await client.delete(leases)
        await client.aclose()


async def test_a_lost_message_is_queued_again_once_and_never_once_started(
    services: Services,
) -> None:
    client = redis_client(services.redis_url)
    prefix = f"ftlua{uuid.uuid4().hex[:8]}"
    queue, replay = f"{prefix}:queue", f"{prefix}:replay"
    try:
        await client.script_flush()
        for _ in range(2):
            await requeue_if_lost(client, queue, replay, "j1", "message-1")
        assert await client.lrange(queue, 0, -1) == ["message-1"]
        await client.xadd(replay, {"m": "started"})
        await requeue_if_lost(client, queue, replay, "j2", "message-2")
        assert await client.lrange(queue, 0, -1) == ["message-1"]
    finally:
        await client.delete(queue, replay)
        await client.aclose()
