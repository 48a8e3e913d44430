"""A chat worker's usage batcher (workers/record.py) on the machine's Redis: rows that end
together leave as one bulk task, nothing is held past the window, and a stopping worker sends
what it holds. (That the bulk worker writes them is the stack tests' and the outage test's.)"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from shared.keys import PERSIST_USAGE_BATCH_TASK, Keys
from shared.tasks import UsageRecord, parse_task_message
from tests.integration.conftest import Services
from workers.record import UsageBatcher


def _usage() -> UsageRecord:
    return UsageRecord(
        request_id=uuid.uuid4().hex,
        tenant_id="t",
        key_id="k",
        model="m",
        route="default",
        cached=False,
        prompt_tokens=1,
        completion_tokens=2,
        finish_reason="stop",
        status="ok",
        created_at=time.time(),
    )


@pytest.fixture
async def queue(services: Services) -> AsyncIterator[tuple[aioredis.Redis, str]]:
    r = aioredis.Redis.from_url(services.redis_url)
    key = Keys(f"ftub{uuid.uuid4().hex[:8]}").queue_list("bulk")
    try:
        yield r, key
    finally:
        await r.delete(key)
        await r.aclose()


async def _batches(r: aioredis.Redis, key: str) -> list[list[str]]:
    """The request ids of each enqueued batch, oldest first."""
    out = []
    for raw in reversed(await r.lrange(key, 0, -1)):
        call = parse_task_message(raw)
        assert call.name == PERSIST_USAGE_BATCH_TASK
        out.append([row["request_id"] for row in call.kwargs["usage"]])
    return out


async def test_rows_within_the_window_leave_as_one_task(queue: tuple[aioredis.Redis, str]) -> None:
    r, key = queue
    batcher = UsageBatcher(r, key, "test", window_s=0.2)
    rows = [_usage() for _ in range(3)]
    for row in rows:
        batcher.add(row)
    await asyncio.sleep(0.05)
    assert await r.llen(key) == 0  # held inside the window
    await asyncio.sleep(0.4)
    assert await _batches(r, key) == [[row.request_id for row in rows]]
    later = _usage()
    batcher.add(later)  # a new window opens with the next row
    await asyncio.sleep(0.4)
    assert (await _batches(r, key))[1:] == [[later.request_id]]
    await batcher.close()


async def test_a_full_batch_leaves_at_once_and_close_sends_the_rest(
    queue: tuple[aioredis.Redis, str],
) -> None:
    r, key = queue
    batcher = UsageBatcher(r, key, "test", window_s=60.0, max_rows=2)
    rows = [_usage() for _ in range(3)]
    for row in rows:
        batcher.add(row)
    await asyncio.sleep(0.1)
    assert await _batches(r, key) == [[rows[0].request_id, rows[1].request_id]]
    await batcher.close()  # a stopping worker: nothing held is lost
    assert (await _batches(r, key))[1:] == [[rows[2].request_id]]


async def test_a_zero_window_sends_each_row(queue: tuple[aioredis.Redis, str]) -> None:
    r, key = queue
    batcher = UsageBatcher(r, key, "test", window_s=0.0)
    rows = [_usage() for _ in range(2)]
    for row in rows:
        batcher.add(row)
    await batcher.close()
    # Each row is its own task (sent concurrently: in either order).
    assert sorted(await _batches(r, key)) == sorted([[row.request_id] for row in rows])
