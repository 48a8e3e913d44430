"""A chat worker's usage batcher (workers/usage.py) on the machine's Redis: rows that end
together leave as one bulk task, nothing is held past the window, a stopping worker sends
what it holds, every row is in Redis from the moment it is added, and a bulk worker's sweep
(workers/usage_sweep.py) sends on a dead process's rows. (That the bulk worker writes them is
the stack tests' and the outage tests'.)"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from shared.keys import PERSIST_USAGE_BATCH_TASK, Keys
from shared.redis.pipe import RedisPipe
from shared.tasks import UsageRecord, parse_task_message
from tests.integration.conftest import Services
from workers import usage
from workers.usage import UsageBatcher
from workers.usage_sweep import UsageSweeper

Queue = tuple[aioredis.Redis, str, RedisPipe, Keys]


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
async def queue(services: Services) -> AsyncIterator[Queue]:
    """(a client, the bulk queue's list, a started pipe, the keys) under a fresh prefix."""
    r = aioredis.Redis.from_url(services.redis_url)
    keys = Keys(f"ftub{uuid.uuid4().hex[:8]}")
    pipe = RedisPipe(services.redis_url)
    await pipe.start()
    try:
        yield r, keys.queue_list("bulk"), pipe, keys
    finally:
        await pipe.close()
        stale = [k async for k in r.scan_iter(f"{keys.prefix}:*")]
        if stale:
            await r.delete(*stale)
        await r.aclose()


async def _batches(r: aioredis.Redis, key: str) -> list[list[str]]:
    """The request ids of each enqueued batch, oldest first."""
    out = []
    for raw in reversed(await r.lrange(key, 0, -1)):
        call = parse_task_message(raw)
        assert call.name == PERSIST_USAGE_BATCH_TASK
        out.append([row["request_id"] for row in call.kwargs["usage"]])
    return out


async def test_rows_within_the_window_leave_as_one_task(queue: Queue) -> None:
    r, key, pipe, keys = queue
    batcher = UsageBatcher(pipe, keys, "test", window_s=0.2)
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


async def test_a_full_batch_leaves_at_once_and_close_sends_the_rest(queue: Queue) -> None:
    r, key, pipe, keys = queue
    batcher = UsageBatcher(pipe, keys, "test", window_s=60.0, max_rows=2)
    rows = [_usage() for _ in range(3)]
    for row in rows:
        batcher.add(row)
    await asyncio.sleep(0.1)
    assert await _batches(r, key) == [[rows[0].request_id, rows[1].request_id]]
    await batcher.close()  # a stopping worker: nothing held is lost
    await pipe.flush()
    assert (await _batches(r, key))[1:] == [[rows[2].request_id]]
    # Nothing pending, and the process has left the owners set.
    assert await r.llen(keys.usage_pending(batcher.owner)) == 0
    assert await r.zscore(keys.usage_owners, batcher.owner) is None


async def test_a_zero_window_sends_each_row(queue: Queue) -> None:
    r, key, pipe, keys = queue
    batcher = UsageBatcher(pipe, keys, "test", window_s=0.0)
    rows = [_usage() for _ in range(2)]
    for row in rows:
        batcher.add(row)
    await batcher.close()
    await pipe.flush()
    assert await _batches(r, key) == [[row.request_id] for row in rows]


async def test_a_row_is_in_redis_as_soon_as_it_is_added(queue: Queue) -> None:
    """Inside the window the row is already in the process's pending list, so a `done` sent
    after it on the same pipe never runs ahead of a row Redis holds."""
    r, key, pipe, keys = queue
    batcher = UsageBatcher(pipe, keys, "test", window_s=60.0)
    row = _usage()
    batcher.add(row)
    await pipe.call("PING")  # everything queued before it has run
    pending = await r.lrange(keys.usage_pending(batcher.owner), 0, -1)
    assert [json.loads(p)["request_id"] for p in pending] == [row.request_id]
    assert await r.llen(key) == 0
    batcher.flush()
    await pipe.flush()
    assert await r.llen(keys.usage_pending(batcher.owner)) == 0
    assert await _batches(r, key) == [[row.request_id]]
    await batcher.close()


async def test_a_sweep_sends_on_a_dead_processs_rows_once(
    queue: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process killed inside its window: a bulk worker's sweep queues its rows once it has
    stopped beating, and a second sweep finds nothing more to send."""
    r, key, pipe, keys = queue
    monkeypatch.setattr(usage, "USAGE_OWNER_DEAD_S", 0.3)
    monkeypatch.setattr("workers.usage_sweep.USAGE_OWNER_DEAD_S", 0.3)
    dead = UsageBatcher(pipe, keys, "dead", window_s=60.0)
    rows = [_usage() for _ in range(3)]
    for row in rows:
        dead.add(row)
    assert dead._beating is not None
    dead._beating.cancel()  # killed: no flush, no more beats
    sweeper = UsageSweeper(pipe, keys, "bulk")
    assert await sweeper.sweep() == 0  # still beating a moment ago
    await asyncio.sleep(0.5)
    assert await sweeper.sweep() == 3
    assert await sweeper.sweep() == 0
    assert await _batches(r, key) == [[row.request_id for row in rows]]
    assert await r.zscore(keys.usage_owners, dead.owner) is None
