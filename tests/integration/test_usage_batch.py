"""A chat worker's usage batcher (workers/chat/usage.py) on the machine's Redis: rows that end
together leave as one bulk task, nothing is held past the window, a stopping worker sends
what it holds, every row is in the usage outbox from the moment it is added, and a bulk
worker's sweep (workers/bulk/sweep.py) sends again the rows no task carried to a write. (That
the bulk worker writes them and takes them out is tests/faults/test_durable.py's.)"""

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
from workers.bulk.sweep import UsageSweeper
from workers.chat.usage import UsageBatcher

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
    # Queued is not written: every row stays in the outbox until a bulk worker wrote it.
    assert await r.hlen(keys.usage_rows) == 3


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
    """Inside the window the row is already in the outbox, so a `done` sent after it on the
    same pipe never runs ahead of a row Redis holds; queuing its task moves its due time on."""
    r, key, pipe, keys = queue
    batcher = UsageBatcher(pipe, keys, "test", window_s=60.0, resend_after_s=120.0)
    row = _usage()
    batcher.add(row)
    await pipe.call("PING")  # everything queued before it has run
    stored = await r.hget(keys.usage_rows, row.request_id)
    assert stored is not None and json.loads(stored)["request_id"] == row.request_id
    (_, added_due), now_ms = (await r.zrange(keys.usage_due, 0, -1, withscores=True))[0], _ms()
    assert now_ms + 60_000 < added_due < now_ms + 70_000  # the window, then the grace
    assert await r.llen(key) == 0
    batcher.flush()
    await pipe.flush()
    assert await _batches(r, key) == [[row.request_id]]
    queued_due = await r.zscore(keys.usage_due, row.request_id)
    assert queued_due is not None and queued_due > now_ms + 110_000
    await batcher.close()


def _ms() -> float:
    return time.time() * 1000


async def test_a_sweep_queues_the_rows_past_due_once(
    queue: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows of a process killed inside its window (never queued): a bulk worker's sweep
    queues them once they are due, and the next sweep finds nothing (their due time moved on);
    rows whose task is queued are not due."""
    r, key, pipe, keys = queue
    monkeypatch.setattr("workers.chat.usage.UNQUEUED_GRACE_MS", 300)
    dead = UsageBatcher(pipe, keys, "dead", window_s=0.05)
    live = UsageBatcher(pipe, keys, "live", window_s=0.0)
    rows = [_usage() for _ in range(3)]
    for row in rows:
        dead.add(row)
    assert dead._timer is not None
    dead._timer.cancel()  # killed: its window never closes
    live.add(_usage())
    sweeper = UsageSweeper(pipe, keys, "bulk")
    assert await sweeper.sweep() == 0  # not due yet
    await asyncio.sleep(0.6)
    assert await sweeper.sweep() == 3
    assert await sweeper.sweep() == 0
    swept = (await _batches(r, key))[1:]
    assert [sorted(batch) for batch in swept] == [sorted(row.request_id for row in rows)]


async def test_no_sweep_while_the_bulk_queue_is_backed_up(
    queue: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long bulk queue most likely holds the due rows' tasks: a sweep waits instead of
    lengthening it."""
    r, key, pipe, keys = queue
    monkeypatch.setattr("workers.chat.usage.UNQUEUED_GRACE_MS", 0)
    monkeypatch.setattr("workers.bulk.sweep.MAX_BACKLOG", 0)
    batcher = UsageBatcher(pipe, keys, "test", window_s=0.0, resend_after_s=0.0)
    batcher.add(_usage())  # queued: the backlog of one, and due at once
    await pipe.flush()
    sweeper = UsageSweeper(pipe, keys, "bulk")
    assert await sweeper.sweep() == 0
    await r.delete(key)  # the queue drained, the task lost
    assert await sweeper.sweep() == 1
