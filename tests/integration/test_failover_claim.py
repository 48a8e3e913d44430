"""The claim of a dead chat worker's chats (shared/redis/scripts/lease_claim.lua) on real Redis:
each chat goes to exactly one survivor, nothing is taken from a worker whose beat came back, and
a worker left with no chat leaves the heartbeats."""

from __future__ import annotations

import asyncio
import functools
import time
import uuid
from typing import Any

import pytest
import redis.asyncio as aioredis

from shared.keys import CHAT_QUEUE, Keys
from shared.redis import scripts

pytestmark = pytest.mark.integration


async def _setup(services: Any, jobs: int) -> tuple[aioredis.Redis, Keys, Any]:
    client = aioredis.Redis.from_url(services.redis_url, decode_responses=True)
    keys = Keys(f"ftclaim{uuid.uuid4().hex[:8]}")
    now = time.time()
    await client.zadd(keys.worker_heartbeats(CHAT_QUEUE), {"dead": now - 10, "a": now, "b": now})
    await client.hset(keys.worker_jobs("dead"), mapping={f"j{i}": f"p{i}" for i in range(jobs)})
    return client, keys, functools.partial(scripts.run, client, scripts.LEASE_CLAIM)


async def _claim(script: Any, keys: Keys, me: str, horizon: float, most: int) -> list[str]:
    keys_ = [keys.worker_heartbeats(CHAT_QUEUE), keys.worker_jobs("dead"), keys.worker_jobs(me)]
    return list(await script(keys_, ["dead", horizon, 60, most]))


async def _cleanup(client: aioredis.Redis, keys: Keys) -> None:
    found = [k async for k in client.scan_iter(f"{keys.prefix}:*")]
    if found:
        await client.delete(*found)
    await client.aclose()


async def test_two_survivors_claiming_at_once_take_each_chat_exactly_once(services: Any) -> None:
    client, keys, script = await _setup(services, 30)
    try:
        horizon = time.time() - 2
        claims = await asyncio.gather(
            *(_claim(script, keys, me, horizon, 20) for me in ("a", "b", "a", "b"))
        )
        taken = [job for claim in claims for job in claim[::2]]
        assert sorted(taken) == sorted(f"j{i}" for i in range(30))
        held = await client.hkeys(keys.worker_jobs("a")) + await client.hkeys(keys.worker_jobs("b"))
        assert sorted(held) == sorted(taken)
        # Emptied: the dead worker leaves the heartbeats (no gateway counts it any more).
        assert await client.zscore(keys.worker_heartbeats(CHAT_QUEUE), "dead") is None
    finally:
        await _cleanup(client, keys)


async def test_nothing_is_taken_from_a_worker_whose_beat_came_back(services: Any) -> None:
    client, keys, script = await _setup(services, 3)
    try:
        await client.zadd(keys.worker_heartbeats(CHAT_QUEUE), {"dead": time.time()})
        assert await _claim(script, keys, "a", time.time() - 2, 10) == []
        assert len(await client.hkeys(keys.worker_jobs("dead"))) == 3
    finally:
        await _cleanup(client, keys)


async def test_a_claim_takes_at_most_what_the_survivor_has_room_for(services: Any) -> None:
    client, keys, script = await _setup(services, 5)
    try:
        first = await _claim(script, keys, "a", time.time() - 2, 2)
        assert len(first) == 4  # two (id, payload) pairs
        assert await client.zscore(keys.worker_heartbeats(CHAT_QUEUE), "dead") is not None
        rest = await _claim(script, keys, "b", time.time() - 2, 10)
        assert len(rest) == 6
    finally:
        await _cleanup(client, keys)
