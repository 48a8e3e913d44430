"""A chat worker's check for chats no live gateway follows (workers/chat/orphans.py) on the
machine's Redis: a chat followed only by gateways that stopped beating is cancelled and its
stream slot freed; one a live gateway follows, or with no followers set, is left alone."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
import redis.asyncio as aioredis

from shared.keys import Keys
from shared.redis.pipe import RedisPipe
from tests.integration.conftest import Services
from workers.chat.orphans import GatewayWatch


@dataclass
class _Job:
    key_id: str = "k1"


@dataclass
class _Run:
    job: _Job = field(default_factory=_Job)
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True


@pytest.fixture
async def redis_and_pipe(
    services: Services,
) -> AsyncIterator[tuple[aioredis.Redis, RedisPipe, Keys]]:
    r = aioredis.Redis.from_url(services.redis_url, decode_responses=True)
    keys = Keys(f"ftorph{uuid.uuid4().hex[:8]}")
    pipe = RedisPipe(services.redis_url)
    await pipe.start()
    try:
        yield r, pipe, keys
    finally:
        await pipe.close()
        stale = [k async for k in r.scan_iter(f"{keys.prefix}:*")]
        if stale:
            await r.delete(*stale)
        await r.aclose()


async def test_only_chats_no_live_gateway_follows_are_stopped(
    redis_and_pipe: tuple[aioredis.Redis, RedisPipe, Keys],
) -> None:
    r, pipe, keys = redis_and_pipe
    now_ms = int(time.time() * 1000)
    await r.zadd(keys.gateways, {"live": now_ms, "dead": now_ms - 10_000})
    await r.sadd(keys.job_followers("orphan"), "dead")
    await r.sadd(keys.job_followers("resumed"), "dead", "live")
    await r.sadd(keys.job_followers("unknown-gw"), "never-beat")
    # "no-set": no followers set at all (expired, or given up and cancelled by its gateway).
    for job_id in ("orphan", "resumed", "unknown-gw", "no-set"):
        await r.zadd(keys.key_streams("k1"), {job_id: now_ms + 60_000})
    running = {job_id: _Run() for job_id in ("orphan", "resumed", "unknown-gw", "no-set")}
    watch = GatewayWatch(pipe, keys, running, gateway_heartbeat_s=0.5, dead_after_s=1.5)
    pipe.up_since -= 60  # connected long ago: no grace left
    assert sorted(await watch.check()) == ["orphan", "unknown-gw"]
    assert {j for j, run in running.items() if run.cancelled} == {"orphan", "unknown-gw"}
    assert sorted(await r.zrange(keys.key_streams("k1"), 0, -1)) == ["no-set", "resumed"]


async def test_right_after_a_reconnect_nothing_is_stopped(
    redis_and_pipe: tuple[aioredis.Redis, RedisPipe, Keys],
) -> None:
    """The gateways' beats may not be back yet after Redis returns: the check waits."""
    r, pipe, keys = redis_and_pipe
    await r.sadd(keys.job_followers("j"), "dead")
    running = {"j": _Run()}
    watch = GatewayWatch(pipe, keys, running, gateway_heartbeat_s=0.5, dead_after_s=1.5)
    assert await watch.check() == []  # the pipe connected a moment ago
    assert not running["j"].cancelled
