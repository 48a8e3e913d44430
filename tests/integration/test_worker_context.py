"""The worker lifecycle (workers/lifecycle.py) on the machine's Redis: a chat worker is counted
by gateways only once it is ready (after its warm-up), a bulk worker from the start; a failed
warm-up still announces; closing takes the worker out of its queues' counts."""

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
from workers.lifecycle import WorkerLifecycle
from workers.resources import WorkerContext
from workers.runtime import LoopRunner


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


async def test_a_chat_worker_is_counted_only_once_it_is_ready(
    services: Services, worker_env: Keys
) -> None:
    lifecycle = WorkerLifecycle(LoopRunner())
    warmed: list[WorkerContext] = []

    async def warm(ctx: WorkerContext) -> None:
        await asyncio.sleep(0.3)  # six heartbeat periods
        assert not await _beats(services, worker_env, "chat", "chat-ctx@test")
        warmed.append(ctx)

    ctx = await lifecycle.open("chat-ctx@test", ("chat",))
    try:
        assert await lifecycle.context() is ctx
        await lifecycle.ready(warm)
        assert warmed == [ctx]
        await _wait_for_beat(services, worker_env, "chat", "chat-ctx@test")
    finally:
        await lifecycle.close()
    assert not await _beats(services, worker_env, "chat", "chat-ctx@test")


async def test_a_chat_worker_whose_warm_up_failed_still_announces_itself(
    services: Services, worker_env: Keys
) -> None:
    lifecycle = WorkerLifecycle(LoopRunner())

    async def warm(ctx: WorkerContext) -> None:
        raise RuntimeError("no model")

    await lifecycle.open("chat-cold@test", ("chat",))
    try:
        await lifecycle.ready(warm)
        await _wait_for_beat(services, worker_env, "chat", "chat-cold@test")
    finally:
        await lifecycle.close()


async def test_a_bulk_worker_heartbeats_from_the_start(
    services: Services, worker_env: Keys
) -> None:
    lifecycle = WorkerLifecycle(LoopRunner())
    await lifecycle.open("bulk-ctx@test", ("bulk",))
    try:
        await _wait_for_beat(services, worker_env, "bulk", "bulk-ctx@test")
    finally:
        await lifecycle.close()
    assert not await _beats(services, worker_env, "bulk", "bulk-ctx@test")


def test_start_and_stop_from_a_celery_thread_run_on_the_process_loop(
    services: Services, worker_env: Keys
) -> None:
    """What Celery's worker_init and worker_shutdown do: the loop starts with the context and
    is gone after stop(); a stop before any start does nothing."""
    runner = LoopRunner()
    lifecycle = WorkerLifecycle(runner)
    lifecycle.stop(grace_s=0.1)
    assert not runner.started
    ctx = lifecycle.start("sum-ctx@test", ("summarize",))
    assert runner.started and ctx.name == "sum-ctx@test"
    assert runner.run(lifecycle.context()) is ctx
    lifecycle.stop(grace_s=1.0)
    assert not runner.started


async def test_the_heartbeat_carries_the_load_and_its_record_expires_or_goes_with_a_goodbye(
    services: Services, worker_env: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 32: each beat writes the worker's status record (what `firsttoken workers`
    reads); a worker that stops beating drops out once the record's TTL has passed, and one
    that closes in order takes its record with it."""
    import os
    import socket

    from firsttoken.workerscli import read_workers

    monkeypatch.setenv("FIRSTTOKEN_WORKER_STATUS_TTL_S", "0.5")
    get_settings.cache_clear()

    async def listed() -> dict[str, object]:
        snapshot = await read_workers(get_settings())
        return {w.name: w for w in snapshot.workers}

    dying, leaving = WorkerLifecycle(LoopRunner()), WorkerLifecycle(LoopRunner())
    ctx = await dying.open("bulk-dies@test", ("bulk",))
    ctx.load.watch(lambda: (2, 5, 9))
    ctx.load.ended("engine_error")
    await leaving.open("bulk-leaves@test", ("bulk", "summarize"))
    try:
        for _ in range(100):
            workers = await listed()
            status = workers.get("bulk-dies@test")
            if status is not None and status.capacity == 5 and "bulk-leaves@test" in workers:
                break
            await asyncio.sleep(0.02)
        assert status is not None, workers
        load = (status.in_flight, status.capacity, status.done, status.engine_errors)
        assert load == (2, 5, 9, 1)
        assert (status.host, status.pid) == (socket.gethostname(), os.getpid())
        assert status.queues == ("bulk",)
        assert workers["bulk-leaves@test"].queues == ("bulk", "summarize")

        beat = ctx._tasks["heartbeat"]
        beat.cancel()  # it dies: no more beats, no goodbye
        for _ in range(100):
            if "bulk-dies@test" not in await listed():
                break
            await asyncio.sleep(0.05)
        assert set(await listed()) == {"bulk-leaves@test"}
    finally:
        await leaving.close()
        await dying.close()
    assert await listed() == {}
    r = aioredis.Redis.from_url(services.redis_url)
    try:
        assert await r.zcard(worker_env.worker_statuses) == 0  # the index goes with them
    finally:
        await r.aclose()
