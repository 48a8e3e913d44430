"""The chat pool's queue consumer (workers/chat/consumer.py) on the machine's Redis: it reads what
Celery's own producer writes, holds to its concurrency, loses nothing when it stops, and reports
its tasks as Celery task events only while those are on."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from celery import Celery

from shared.keys import Keys
from shared.tasks import TaskCall, parse_task_message, task_message
from tests.integration.conftest import Services
from tests.support import free_port, throwaway_redis_server
from workers.chat.consumer import QueueConsumer, priority_lists

Prefixed = tuple[aioredis.Redis, Keys, str]  # a client, this test's keys, the Redis URL


@pytest.fixture
async def prefixed(services: Services) -> AsyncIterator[Prefixed]:
    keys = Keys(f"ftcons{uuid.uuid4().hex[:8]}")
    r = aioredis.Redis.from_url(services.redis_url)
    try:
        yield r, keys, services.redis_url
    finally:
        found = [k async for k in r.scan_iter(match=f"{keys.prefix}*")]
        if found:
            await r.delete(*found)
        await r.aclose()


class Recorder:
    def __init__(self, hold: asyncio.Event | None = None) -> None:
        self.calls: list[TaskCall] = []
        self.hold = hold
        self.started = asyncio.Queue[str]()

    async def __call__(self, call: TaskCall) -> None:
        self.calls.append(call)
        self.started.put_nowait(call.task_id)
        if self.hold is not None:
            await self.hold.wait()


@pytest.fixture(params=[1, 4], ids=["one", "four"])
def batch(request: pytest.FixtureRequest) -> int:
    """Messages per read: one BRPOP each, or up to 4 (a BRPOP and a script that pops 3 more)."""
    return int(request.param)


async def _start(consumer: QueueConsumer) -> asyncio.Task[None]:
    return asyncio.create_task(consumer.run())


async def test_runs_messages_from_celerys_own_producer_at_every_priority(
    services: Services, prefixed: Prefixed, batch: int
) -> None:
    _r, keys, url = prefixed
    producer = Celery("producer", broker=services.redis_url)
    producer.conf.broker_transport_options = {"global_keyprefix": keys.celery_keyprefix}
    recorder = Recorder()
    consumer = QueueConsumer(
        url, priority_lists(keys.queue_list("chat")), {"t.chat": recorder}, 4, 0.2, batch
    )
    reader = await _start(consumer)
    try:
        for priority in (None, 3, 9):
            await asyncio.to_thread(
                producer.send_task,
                "t.chat",
                kwargs={"job": {"p": priority}},
                queue="chat",
                priority=priority,
            )
            task_id = await asyncio.wait_for(recorder.started.get(), 10)
            assert recorder.calls[-1].task_id == task_id
            assert recorder.calls[-1].kwargs == {"job": {"p": priority}}
    finally:
        consumer.stop()
        await asyncio.wait_for(reader, 5)
        producer.close()


async def test_takes_no_more_than_its_slots_and_stops_without_losing_a_message(
    prefixed: Prefixed, batch: int
) -> None:
    r, keys, url = prefixed
    queue = keys.queue_list("chat")
    hold = asyncio.Event()
    recorder = Recorder(hold)
    consumer = QueueConsumer(url, priority_lists(queue), {"t.chat": recorder}, 2, 0.2, batch)
    for i in range(5):
        await r.lpush(queue, task_message("t.chat", {"i": i}, queue="chat", task_id=f"m{i}"))
    reader = await _start(consumer)
    try:
        for _ in range(2):
            await asyncio.wait_for(recorder.started.get(), 10)
        await asyncio.sleep(0.5)  # a third BRPOP would have happened by now
        assert [c.task_id for c in recorder.calls] == ["m0", "m1"]
        assert await r.llen(queue) == 3
        consumer.stop()  # waiting for a slot: stops at once
        await asyncio.wait_for(reader, 5)
        assert await r.llen(queue) == 3  # nothing popped after stop
        hold.set()
        assert await consumer.drain(5) == 0
        assert not consumer.running
    finally:
        hold.set()
        consumer.stop()


async def test_a_message_it_cannot_run_is_dropped_with_a_log_and_the_next_one_runs(
    prefixed: Prefixed, caplog: pytest.LogCaptureFixture
) -> None:
    r, keys, url = prefixed
    queue = keys.queue_list("chat")
    recorder = Recorder()
    consumer = QueueConsumer(url, priority_lists(queue), {"t.chat": recorder}, 4, poll_s=0.2)
    await r.lpush(queue, b"{broken")
    await r.lpush(queue, task_message("t.other", {}, queue="chat", task_id="other"))
    await r.lpush(queue, task_message("t.chat", {}, queue="chat", task_id="good"))
    with caplog.at_level(logging.ERROR, logger="workers.chat.consumer"):
        reader = await _start(consumer)
        try:
            assert await asyncio.wait_for(recorder.started.get(), 10) == "good"
            await asyncio.sleep(0.3)
        finally:
            consumer.stop()
            await asyncio.wait_for(reader, 5)
    assert [c.task_id for c in recorder.calls] == ["good"]
    dropped = [rec.getMessage() for rec in caplog.records]
    assert any("not a Celery protocol-2 JSON task message" in m for m in dropped)
    assert any("'t.other'" in m for m in dropped)
    assert await r.llen(queue) == 0


async def test_a_burst_starts_in_queue_order(prefixed: Prefixed, batch: int) -> None:
    r, keys, url = prefixed
    queue = keys.queue_list("chat")
    recorder = Recorder()
    consumer = QueueConsumer(url, priority_lists(queue), {"t.chat": recorder}, 16, 0.2, batch)
    for i in range(11):
        await r.lpush(queue, task_message("t.chat", {}, queue="chat", task_id=f"b{i}"))
    reader = await _start(consumer)
    try:
        got = [await asyncio.wait_for(recorder.started.get(), 10) for _ in range(11)]
        assert got == [f"b{i}" for i in range(11)]
        assert await r.llen(queue) == 0
    finally:
        consumer.stop()
        await asyncio.wait_for(reader, 5)


async def test_it_reports_whether_each_read_came_back_full(
    prefixed: Prefixed,
) -> None:
    """After each read's chats took their first step: full (a backlog: deferred work waits)
    while a read takes all it asked for, not full once one comes back short or empty."""
    r, keys, url = prefixed
    queue = keys.queue_list("chat")
    reports: list[tuple[bool, int]] = []
    recorder = Recorder()
    consumer = QueueConsumer(
        url,
        priority_lists(queue),
        {"t.chat": recorder},
        16,
        0.2,
        4,
        after_read=lambda full: reports.append((full, len(recorder.calls))),
    )
    for i in range(6):
        await r.lpush(queue, task_message("t.chat", {}, queue="chat", task_id=f"w{i}"))
    reader = await _start(consumer)
    try:
        for _ in range(6):
            await asyncio.wait_for(recorder.started.get(), 10)
        await asyncio.sleep(0.5)  # a read that finds nothing (poll_s 0.2)
    finally:
        consumer.stop()
        await asyncio.wait_for(reader, 5)
    # 4 of 4 (their chats already started), then 2 of 4, then nothing.
    assert reports[:2] == [(True, 4), (False, 6)]
    assert all(report == (False, 6) for report in reports[2:]) and len(reports) >= 3


async def test_one_read_takes_up_to_its_count_in_priority_order(
    prefixed: Prefixed,
) -> None:
    """The BRPOP and the script behind it: the first message of the highest priority, then
    more in the order BRPOP would have taken them, never more than asked for."""
    r, keys, url = prefixed
    lists = priority_lists(keys.queue_list("chat"))
    for name, ids in ((lists[0], ["a0", "a1"]), (lists[3], ["b0", "b1", "b2"])):
        for task_id in ids:
            await r.lpush(name, task_message("t.chat", {}, queue="chat", task_id=task_id))
    consumer = QueueConsumer(url, lists, {}, 8, poll_s=0.2, batch=4)
    try:
        got = [parse_task_message(raw).task_id for raw in await consumer._pop(4)]
        assert got == ["a0", "a1", "b0", "b1"]
        assert [parse_task_message(raw).task_id for raw in await consumer._pop(4)] == ["b2"]
        assert await consumer._pop(4) == []  # nothing waiting: the BRPOP times out
    finally:
        await consumer.aclose()


async def test_what_the_brpop_took_is_kept_when_the_script_behind_it_fails(
    prefixed: Prefixed, caplog: pytest.LogCaptureFixture
) -> None:
    r, keys, url = prefixed
    lists = priority_lists(keys.queue_list("chat"))
    await r.set(lists[3], "not a list")  # the script's RPOP on it fails with WRONGTYPE
    await r.lpush(lists[0], task_message("t.chat", {}, queue="chat", task_id="kept"))
    consumer = QueueConsumer(url, lists, {}, 8, poll_s=0.2, batch=4)
    try:
        with caplog.at_level(logging.WARNING, logger="workers.chat.consumer"):
            got = await consumer._pop(4)
        assert [parse_task_message(raw).task_id for raw in got] == ["kept"]
        assert any("WRONGTYPE" in rec.getMessage() for rec in caplog.records)
        await r.delete(lists[3])
        await r.lpush(lists[0], task_message("t.chat", {}, queue="chat", task_id="next"))
        assert [parse_task_message(raw).task_id for raw in await consumer._pop(4)] == ["next"]
    finally:
        await consumer.aclose()


async def test_a_flushed_script_cache_loses_nothing(tmp_path: Path) -> None:
    """The batched read calls its script by hash. After a SCRIPT FLUSH the script does not run
    (NOSCRIPT): the BRPOP's message is started, the others stay queued, and the next read,
    on a new connection that loaded the script again, takes them."""
    port = free_port()
    server = throwaway_redis_server(port, tmp_path)
    url = f"redis://127.0.0.1:{port}/0"
    r = aioredis.Redis.from_url(url)
    lists = priority_lists("ftcons:flush")
    consumer = QueueConsumer(url, lists, {}, 8, poll_s=0.2, batch=4)

    async def push(*ids: str) -> None:
        for task_id in ids:
            await r.lpush(lists[0], task_message("t.chat", {}, queue="chat", task_id=task_id))

    async def pop() -> list[str]:
        return [parse_task_message(raw).task_id for raw in await consumer._pop(4)]

    try:
        await push("a0")
        assert await pop() == ["a0"]
        await r.script_flush()
        await push("a1", "a2", "a3")
        assert await pop() == ["a1"]
        assert await pop() == ["a2", "a3"]
    finally:
        await consumer.aclose()
        await r.aclose()
        server.terminate()
        server.wait(10)


async def test_a_failing_task_frees_its_slot(prefixed: Prefixed) -> None:
    r, keys, url = prefixed
    queue = keys.queue_list("chat")
    ran: list[str] = []

    async def failing(call: TaskCall) -> None:
        ran.append(call.task_id)
        raise RuntimeError("boom")

    consumer = QueueConsumer(url, priority_lists(queue), {"t.chat": failing}, 1, poll_s=0.2)
    for i in range(3):
        await r.lpush(queue, task_message("t.chat", {}, queue="chat", task_id=f"f{i}"))
    reader = await _start(consumer)
    try:
        for _ in range(100):
            if len(ran) == 3:
                break
            await asyncio.sleep(0.05)
        assert ran == ["f0", "f1", "f2"]
    finally:
        consumer.stop()
        await asyncio.wait_for(reader, 5)


class Events:
    """A TaskEvents recorder (workers/chat/pool.py's TaskEventQueue sends them to Celery)."""

    def __init__(self, on: bool) -> None:
        self.on = on
        self.seen: list[tuple[str, str]] = []

    def received(self, call: TaskCall) -> None:
        self.seen.append(("received", call.task_id))

    def started(self, call: TaskCall) -> None:
        self.seen.append(("started", call.task_id))

    def succeeded(self, call: TaskCall, runtime: float) -> None:
        assert runtime >= 0
        self.seen.append(("succeeded", call.task_id))

    def failed(self, call: TaskCall, exc: BaseException, runtime: float) -> None:
        assert isinstance(exc, RuntimeError) and runtime >= 0
        self.seen.append(("failed", call.task_id))


@pytest.mark.parametrize("on", [True, False], ids=["events-on", "events-off"])
async def test_task_events_are_reported_only_while_on(prefixed: Prefixed, on: bool) -> None:
    r, keys, url = prefixed
    queue = keys.queue_list("chat")
    done: list[str] = []

    async def task(call: TaskCall) -> None:
        done.append(call.task_id)
        if call.kwargs.get("fail"):
            raise RuntimeError("boom")

    events = Events(on)
    consumer = QueueConsumer(
        url, priority_lists(queue), {"t.chat": task}, 1, poll_s=0.2, events=events
    )
    await r.lpush(queue, task_message("t.chat", {}, queue="chat", task_id="ok"))
    await r.lpush(queue, task_message("t.chat", {"fail": True}, queue="chat", task_id="bad"))
    reader = await _start(consumer)
    try:
        for _ in range(100):
            if len(done) == 2 and not consumer.running:
                break
            await asyncio.sleep(0.05)
        assert done == ["ok", "bad"]
    finally:
        consumer.stop()
        await asyncio.wait_for(reader, 5)
    if on:
        assert events.seen == [
            ("received", "ok"),
            ("started", "ok"),
            ("succeeded", "ok"),
            ("received", "bad"),
            ("started", "bad"),
            ("failed", "bad"),
        ]
    else:
        assert events.seen == []


async def test_reads_again_after_redis_restarts_and_stops_while_redis_is_gone(
    tmp_path: Path, batch: int
) -> None:
    """A read cut off by Redis going away is retried until Redis is back (the next chat runs);
    a stop while Redis is gone ends the reader instead of waiting for Redis."""
    port = free_port()
    server = throwaway_redis_server(port, tmp_path)
    url = f"redis://127.0.0.1:{port}/0"
    pusher = aioredis.Redis.from_url(url)
    queue = "ftcons:restart"
    recorder = Recorder()
    try:
        consumer = QueueConsumer(
            f"{url}?socket_connect_timeout=2",
            priority_lists(queue),
            {"t.chat": recorder},
            4,
            0.5,
            batch,
        )
        reader = await _start(consumer)
        await asyncio.sleep(0.1)  # the first read is waiting in Redis
        server.terminate()
        server.wait(10)
        server = throwaway_redis_server(port, tmp_path)
        await pusher.lpush(queue, task_message("t.chat", {}, queue="chat", task_id="after"))
        assert await asyncio.wait_for(recorder.started.get(), 10) == "after"
        server.terminate()
        server.wait(10)
        await asyncio.sleep(0.2)  # the reader finds Redis gone
        consumer.stop()
        await asyncio.wait_for(reader, 3)  # at most the retry's backoff, 0.2 s here
        assert [c.task_id for c in recorder.calls] == ["after"]
    finally:
        await pusher.aclose()
        server.terminate()
        server.wait(10)
