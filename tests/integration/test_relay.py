"""The gateway's pub/sub relay (gateway/relay.py) on a real Redis: it starts on its control
channel, fans a job's messages out to the session that subscribed it, and says at once why
Redis refused it. The connection itself is tested in test_redis_pubsub.py."""

from __future__ import annotations

import asyncio
import uuid

import pytest
import redis.asyncio as aioredis

from gateway.relay import Relay
from tests.integration.conftest import Services


async def _until(predicate, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def test_starts_on_its_control_channel_and_fans_jobs_out(services: Services) -> None:
    name = f"ftrelay{uuid.uuid4().hex[:8]}"
    relay = Relay(services.redis_url, f"{name}:control", client_name=name)
    admin = aioredis.Redis.from_url(services.redis_url, decode_responses=True)
    await relay.start()
    try:
        assert relay.connected and relay.channels == 1
        assert (await admin.pubsub_numsub(f"{name}:control"))[0][1] == 1
        assert [c for c in await admin.client_list() if c.get("name") == name]
        sessions: dict[str, list[str]] = {"a": [], "b": []}
        for job, got in sessions.items():
            await relay.subscribe_confirmed(f"{name}:job:{job}", got.append)
        await admin.publish(f"{name}:job:b", "to b")
        await admin.publish(f"{name}:job:a", "to a")
        await admin.publish(f"{name}:control", "ignored")
        await _until(lambda: sessions == {"a": ["to a"], "b": ["to b"]})
    finally:
        await relay.close()
        await admin.aclose()


async def test_a_refused_start_says_why(password_redis: int) -> None:
    wrong = Relay(f"redis://:nope@127.0.0.1:{password_redis}/0", "ctl")
    with pytest.raises(ConnectionError, match=r"WRONGPASS.*check the user and password"):
        await wrong.start()  # at once, saying why and what to do
    await wrong.close()
