"""The chat pool: the chat queue read on the process loop, inside Celery's own worker.

`celery -A workers.app worker -Q chat` (what `firsttoken worker --queues chat` runs) is a
Celery worker like the bulk and summarize pools: `celery inspect` and `celery control` reach
it through Celery's own control plane (the pidbox, on Celery's main thread), and with task
events on (`-E`) Flower sees its chats. What differs is who reads the chat queue:

- kombu does not (workers/app.py's TaskConsumer keeps the `chat` queue in its list, so
  `inspect active_queues` names it, but never reads its Redis lists);
- :class:`ChatPool`, a worker bootstep, does: it warms the worker, starts a
  workers/chat/consumer.py QueueConsumer on the process loop (workers/runtime.py) and announces the
  worker to the gateways. Each message becomes a task on that loop, with no thread between the
  read and the chat.

On a warm shutdown (SIGTERM, or `celery control shutdown`) Celery stops its consumer first,
then this step: the reader stops reading, running chats get SHUTDOWN_GRACE_S to finish, and
the process lifecycle (workers/lifecycle.py) closes the loop after the pool has stopped. A
cold shutdown cancels the running chats at once.

Task events: the consumer's event dispatcher belongs to Celery's main thread (its `task`
events are buffered in an unguarded list and flushed by the main thread's hub, and a publish
is a blocking round trip to the broker), so the loop never touches it. While task events are
on, the loop appends each event to a deque and :class:`ChatTaskEvents`, a consumer bootstep,
sends them from the main thread's hub every EVENTS_FLUSH_S. While they are off the loop reads
one flag per chat; while the dispatcher is off altogether (`firsttoken worker` without
`--events`) the main thread has no timer either.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import sys
import time
from collections import deque
from typing import Any

from celery import bootsteps
from celery.worker import state as worker_state
from kombu.asynchronous.hub import Hub
from kombu.asynchronous.timer import Entry

from shared.heap import freeze_startup_objects
from shared.keys import CHAT_QUEUE
from shared.metrics import recorder
from shared.tasks import TaskCall
from workers.app import SHUTDOWN_GRACE_S
from workers.chat.consumer import QueueConsumer, chat_consumer
from workers.chat.deferred import deferred
from workers.chat.load import chat_pool_probe
from workers.chat.prefill import HANDLERS as PREFILL_HANDLERS
from workers.chat.run import HANDLERS, start_failover
from workers.chat.warm import warm_chat_worker
from workers.lifecycle import lifecycle
from workers.resources import WorkerContext

log = logging.getLogger(__name__)

# How often a draining worker's main thread looks for a cold shutdown (a second signal).
DRAIN_POLL_S = 0.2
# How often the main thread sends the task events the loop queued (only while events are on).
EVENTS_FLUSH_S = 0.2
# The loop shares the GIL with the main thread and the embedding threads: a thread that wakes
# (a chat's socket is readable) waits for the GIL at most this long, not the default 5 ms.
CHAT_SWITCH_INTERVAL_S = 0.0005


def consumes_chat(app: Any) -> bool:
    """Whether this worker was started on the chat queue (`-Q chat`, or no -Q at all)."""
    return CHAT_QUEUE in (app.amqp.queues.consume_from or app.amqp.queues)


class TaskEventQueue:
    """Task events from the loop, waiting for the main thread (see the module docstring).

    `deque.append` and `popleft` are atomic: the loop only appends, the main thread only pops."""

    def __init__(self) -> None:
        self.on = False
        self.pending: deque[tuple[str, dict[str, Any]]] = deque()

    def _put(self, type_: str, **fields: Any) -> None:
        self.pending.append((type_, {"timestamp": time.time(), **fields}))

    def received(self, call: TaskCall) -> None:
        self._put(
            "task-received",
            uuid=call.task_id,
            name=call.name,
            args=repr(call.args),
            kwargs=repr(call.kwargs),
            root_id=call.task_id,
            parent_id=None,
            retries=0,
            eta=None,
            expires=None,
        )

    def started(self, call: TaskCall) -> None:
        self._put("task-started", uuid=call.task_id)

    def succeeded(self, call: TaskCall, runtime: float) -> None:
        self._put("task-succeeded", uuid=call.task_id, result="None", runtime=runtime)

    def failed(self, call: TaskCall, exc: BaseException, runtime: float) -> None:
        self._put(
            "task-failed",
            uuid=call.task_id,
            exception=repr(exc),
            traceback="",
            runtime=runtime,
        )


events = TaskEventQueue()


class ChatPool(bootsteps.StartStopStep):  # type: ignore[misc]  # celery: no annotations
    """Worker bootstep: the chat queue's reader on the process loop (see the module docstring).

    Starts after the pool and before Celery's consumer, so the worker is warm and reading by
    the time it answers `inspect ping`; stops after Celery's consumer (no more control
    commands), before the pool."""

    label = "ChatPool"
    requires = ("celery.worker.components:Pool",)

    def __init__(self, w: Any, **kwargs: Any) -> None:
        self.reader: QueueConsumer | None = None
        self._reading: asyncio.Task[None] | None = None
        # Takes over the chats of chat workers that died (workers/chat/failover.py).
        self._keeping: asyncio.Task[None] | None = None
        super().__init__(w, **kwargs)

    def include_if(self, w: Any) -> bool:
        return consumes_chat(w.app)

    def start(self, w: Any) -> None:
        sys.setswitchinterval(CHAT_SWITCH_INTERVAL_S)

        async def warm_and_read(ctx: WorkerContext) -> None:
            try:
                await warm_chat_worker(ctx)
            except Exception:  # a worker whose warm-up failed still serves chats, slower at first
                log.warning("chat worker warm-up failed", exc_info=True)
            freeze_startup_objects()
            self.reader = chat_consumer(
                ctx.settings,
                ctx.keys,
                {**HANDLERS, **PREFILL_HANDLERS},
                name=w.hostname,
                after_read=deferred.after_read,
                events=events,
            )
            ctx.load.watch(chat_pool_probe(self.reader))  # what the heartbeat reports
            self.reader.load = recorder.worker_load(w.hostname, self.reader.concurrency)
            self._reading = asyncio.create_task(self.reader.run(), name="chat-queue-reader")
            self._keeping = asyncio.create_task(start_failover(ctx).run(), name="lease-keeper")

        # Warm-up and reader, then the announcement (workers/lifecycle.py).
        lifecycle.runner.run(lifecycle.ready(warm_and_read))
        if self.reader is not None:
            log.info("%s ready: chat with %d slots", w.hostname, self.reader.concurrency)

    def stop(self, w: Any) -> None:
        """Warm: stop reading, give running chats the grace period."""
        self._drain(SHUTDOWN_GRACE_S)

    def terminate(self, w: Any) -> None:
        """Cold: stop reading, cancel running chats."""
        self._drain(0.0)

    def _drain(self, grace_s: float) -> None:
        reader, self.reader = self.reader, None
        if reader is None or not lifecycle.runner.started:
            return
        if grace_s:
            log.warning("warm shutdown: no new chats; waiting up to %.0f s", grace_s)
        done = lifecycle.runner.submit(self._stop_reader(reader, grace_s))
        cancelled = False
        try:
            while True:
                try:
                    left = done.result(timeout=DRAIN_POLL_S)
                    break
                except concurrent.futures.TimeoutError:
                    if worker_state.should_terminate and not cancelled:  # a cold shutdown
                        cancelled = True
                        self._cancel_now(reader)
        except BaseException:  # the wait interrupted (Celery's hard shutdown raises here)
            self._cancel_now(reader)
            raise
        if left:
            log.warning("%d chats were still running at the end of the grace period", left)

    @staticmethod
    def _cancel_now(reader: QueueConsumer) -> None:
        log.warning("cold shutdown: cancelling %d running chats", len(reader.running))
        with contextlib.suppress(Exception):
            lifecycle.runner.run(reader.drain(0.0), timeout=6.0)

    async def _stop_reader(self, reader: QueueConsumer, grace_s: float) -> int:
        if self._keeping is not None:  # a stopping worker takes nothing over
            self._keeping.cancel()
        reader.stop()
        if self._reading is not None:
            await asyncio.wait([self._reading])  # ends after the read in progress (poll_s)
        return await reader.drain(grace_s)

    def info(self, w: Any) -> dict[str, Any]:
        """The chat pool in `celery inspect stats` (read from the main thread: plain ints)."""
        reader = self.reader
        if reader is None:
            return {}
        return {
            "chat": {
                "slots": reader.concurrency,
                "running": len(reader.running),
                "started": reader.started,
            }
        }


class ChatTaskEvents(bootsteps.StartStopStep):  # type: ignore[misc]
    """Consumer bootstep: sends the chat pool's task events from the main thread, while the
    consumer's dispatcher has task events on (`-E`, or `celery control enable_events`)."""

    label = "ChatTaskEvents"
    requires = ("celery.worker.consumer.events:Events",)

    def __init__(self, c: Any, **kwargs: Any) -> None:
        self._hub: Hub | None = None
        self._timer: Entry | None = None
        super().__init__(c, **kwargs)

    def include_if(self, c: Any) -> bool:
        return consumes_chat(c.app)

    def start(self, c: Any) -> None:
        dispatcher = c.event_dispatcher
        if dispatcher is None:
            return
        dispatcher.on_enabled.add(lambda: self._sync(c))
        dispatcher.on_disabled.add(lambda: self._sync(c))
        self._sync(c)

    def register_with_event_loop(self, c: Any, hub: Hub) -> None:
        self._hub, self._timer = hub, None
        self._sync(c)

    def _sync(self, c: Any) -> None:
        """Follow the dispatcher: the timer runs while it is enabled at all (worker heartbeats
        or task events), since `control enable_events` (what Flower sends) only adds the
        `task` group to an enabled dispatcher, which no callback reports."""
        dispatcher = c.event_dispatcher
        enabled = dispatcher is not None and bool(dispatcher.enabled)
        self._follow_groups(dispatcher, enabled)
        if enabled and self._timer is None and self._hub is not None:
            self._timer = self._hub.call_repeatedly(EVENTS_FLUSH_S, self._flush, c)
        elif not enabled and self._timer is not None:
            self._timer.cancel()
            self._timer = None
            events.pending.clear()

    @staticmethod
    def _follow_groups(dispatcher: Any, enabled: bool) -> None:
        events.on = enabled and (not dispatcher.groups or "task" in dispatcher.groups)

    def _flush(self, c: Any) -> None:
        dispatcher = c.event_dispatcher
        if dispatcher is None:
            events.on = False
            events.pending.clear()
            return
        self._follow_groups(dispatcher, bool(dispatcher.enabled))
        pending = events.pending
        while pending:
            type_, fields = pending.popleft()
            dispatcher.send(type_, **fields)

    def stop(self, c: Any) -> None:
        self._flush(c)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def shutdown(self, c: Any) -> None:
        events.on = False
        self.stop(c)
