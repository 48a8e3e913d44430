"""The worker context's heartbeat on the machine's Redis: a chat worker is counted by gateways
only once it announces itself (after its warm-up), a bulk worker from the start."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from shared.keys import Keys
from shared.settings import get_settings
from tests.integration.conftest import Services
from workers import context


@pytest.fixture
def worker_env(
    services: Services, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Iterator[Keys]:
    keys = Keys(f"ftctx{uuid.uuid4().hex[:8]}")
    monkeypatch.setenv("FIRSTTOKEN_REDIS_URL", services.redis_url)
    monkeypatch.setenv("FIRSTTOKEN_REDIS_PREFIX", keys.prefix)
    monkeypatch.setenv("FIRSTTOKEN_DATABASE_URL", f"sqlite+aiosqlite:///{tmp_path}/ctx.db")
    monkeypatch.setenv("FIRSTTOKEN_WORKER_HEARTBEAT_S", "0.05")
    get_settings.cache_clear()
    try:
        yield keys
    finally:
        context.configure("worker", ())
        get_settings.cache_clear()


async def _beats(services: Services, keys: Keys, queue: str, name: str) -> bool:
    r = aioredis.Redis.from_url(services.redis_url)
    try:
        return await r.zscore(keys.worker_heartbeats(queue), name) is not None
    finally:
        await r.aclose()


async def _wait_for_beat(services: Services, keys: Keys, queue: str, name: str) -> None:
    for _ in range(100):
        if await _beats(services, keys, queue, name):
            return
        await asyncio.sleep(0.02)
    pytest.fail(f"{name} did not heartbeat for {queue}")


async def test_a_chat_worker_is_counted_only_once_it_announces_itself(
    services: Services, worker_env: Keys
) -> None:
    context.configure("chat-ctx@test", ("chat",), announce_at_start=False)
    await context.get_context()
    try:
        await asyncio.sleep(0.3)  # six heartbeat periods
        assert not await _beats(services, worker_env, "chat", "chat-ctx@test")
        await context.announce()
        await _wait_for_beat(services, worker_env, "chat", "chat-ctx@test")
    finally:
        await context.close_context()
    assert not await _beats(services, worker_env, "chat", "chat-ctx@test")


async def test_a_bulk_worker_heartbeats_from_the_start(
    services: Services, worker_env: Keys
) -> None:
    context.configure("bulk-ctx@test", ("bulk",))
    await context.get_context()
    try:
        await _wait_for_beat(services, worker_env, "bulk", "bulk-ctx@test")
    finally:
        await context.close_context()
