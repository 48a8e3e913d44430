"""Per-process resources of a worker, created once on the process loop.

One Redis pool, one engine client per model server, the cancel listener (job id -> running
task) and the heartbeat that tells gateways a worker for a queue is alive. Who creates, starts
and closes them, and in which order, is workers/lifecycle.py's WorkerLifecycle.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Protocol

import redis.asyncio as aioredis

from shared.keys import Keys
from shared.logs import OutageLog
from shared.modeltable import ModelSpec, ModelTable, model_table
from shared.redis.client import UNREACHABLE
from shared.redis.pipe import PipeScript, RedisPipe
from shared.settings import Settings
from shared.tasks import UsageRecord
from workers.chat.failover import JobLeases
from workers.chat.load import WorkerLoad
from workers.db import Database
from workers.engines.base import Engine
from workers.engines.factory import make_model_engine
from workers.workerstatus import WorkerStatus

log = logging.getLogger(__name__)


class Cancellable(Protocol):
    """A running chat the cancel listener can stop (workers.chat.run.ChatRun)."""

    def cancel(self) -> None: ...

    def stand_down(self) -> None:
        """Stop without a word: another worker took the chat over (workers/chat/failover.py)."""


class Part(Protocol):
    """A piece of a worker built on first use that closes with it (the cache stage)."""

    async def close(self) -> None: ...


class UsageSink(Protocol):
    """Where a chat's usage row goes (workers.chat.usage.UsageBatcher)."""

    def add(self, usage: UsageRecord) -> None: ...

    async def close(self) -> None: ...


@dataclass
class WorkerContext:
    settings: Settings
    keys: Keys
    redis: aioredis.Redis
    name: str
    # One pipelined Redis connection (shared/redis/pipe.py) for every job's chunks and the
    # chat path's small reads; started by start().
    pipe: RedisPipe
    chunks: PipeScript  # shared/redis/scripts/chunk_send.lua on the pipe (workers/chat/publish.py)
    # Usage rows of chats ending close together, one bulk task per batch (workers/chat/usage.py).
    usage: UsageSink
    # The owner leases of this worker's chats (workers/chat/failover.py), on the same pipe.
    leases: JobLeases
    # The process's database pool (workers/db.py), opened on first use.
    db: Database
    # The queues this worker reads (none: a process that runs no worker, e.g. a test).
    queues: tuple[str, ...] = ()
    _engines: dict[tuple[str, str], Engine] = field(default_factory=dict)
    running: dict[str, Cancellable] = field(default_factory=dict)
    # Drafts being prefilled (workers/chat/prefill.py): cancellable like chats, but no chat's lease,
    # follower check or takeover applies to them.
    prefills: dict[str, Cancellable] = field(default_factory=dict)
    # Called with a tenant id when `firsttoken kb add` (or another edit of a tenant's rarely
    # changing rows) announces it on `Keys.tenant_changed_channel` (workers/retrieval/sources.py).
    tenant_listeners: list[Callable[[str], None]] = field(default_factory=list)
    # What each heartbeat reports besides the time (`firsttoken workers`).
    load: WorkerLoad = field(default_factory=WorkerLoad)
    started_at: float = field(default_factory=time.time)
    # The cache stage (workers/cache/stage.py): built by the first lookup or the warm-up,
    # under its lock, closed by the lifecycle's cache-stage step.
    cache_stage: Part | None = None
    # A bulk worker's checks of cache hits (workers/cache/checker.py), made by the first one.
    cache_checker: Part | None = None
    # The knowledge base's embedder and indexes (workers/retrieval/sources.py KbState).
    kb: Part | None = None
    cache_stage_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # The process's background loops by name (the steps that start them stop them).
    _tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    _heartbeat_queues: tuple[str, ...] = ()
    _starting_queues: tuple[str, ...] = ()

    @cached_property
    def models(self) -> ModelTable:
        """The model table, read on first use and then kept: looking it up per chat (several
        times a chat) hashes and compares the whole settings."""
        return model_table(self.settings)

    def engine_for(self, spec: ModelSpec) -> Engine:
        """The engine serving ``spec``; models on the same server share one (one pool).

        Created on first use: a bulk worker has one only once it verifies a cache hit.
        """
        engine = self._engines.get(spec.engine_key)
        if engine is None:
            engine = self._engines[spec.engine_key] = make_model_engine(spec, self.settings)
        return engine

    @property
    def engine(self) -> Engine:
        """The default model's engine."""
        return self.engine_for(self.models.get(None))

    async def open(self) -> None:
        """Connect the pipelined writer (the Redis pool connects on first use)."""
        await self.pipe.start()

    def spawn(self, name: str, coro: Coroutine[Any, Any, None]) -> None:
        """Run a background loop of this process until :meth:`stop_task` (or close)."""
        self._tasks[name] = asyncio.create_task(coro, name=name)

    async def stop_task(self, name: str) -> None:
        task = self._tasks.pop(name, None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task

    async def start_cancel_listener(self) -> None:
        """Subscribe to the cancel channel (a job cancelled from now on stops here) and the
        tenant channel (a tenant's rows changed: `tenant_listeners` forget them)."""
        pubsub = self.redis.pubsub(ignore_subscribe_messages=True)
        await pubsub.subscribe(self.keys.cancel_channel, self.keys.tenant_changed_channel)
        self.spawn("cancel-listener", self._listen_cancels(pubsub))

    async def announce_starting(self) -> None:
        """Say this worker is starting for `queues` (best effort: without it a gateway may end
        a queued chat for want of a worker a few seconds before this one could answer it)."""
        now, queues = time.time(), self.queues
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                for queue in queues:
                    pipe.zadd(self.keys.worker_starting(queue), {self.name: now})
                await pipe.execute()
            self._starting_queues = queues
        except UNREACHABLE as exc:
            log.warning("could not announce this worker's start: %s", exc)

    async def start_heartbeat(self) -> None:
        """Tell gateways this worker takes jobs from its queues, once a beat from now on."""
        if self.queues and "heartbeat" not in self._tasks:
            self._heartbeat_queues = self.queues
            self.spawn("heartbeat", self._heartbeat(self.queues))

    async def stop_heartbeat(self) -> None:
        """Stop beating and drop this worker from its queues' counts and the status list (a
        worker stopped in order is no longer listed)."""
        await self.stop_task("heartbeat")
        queues, self._heartbeat_queues = self._heartbeat_queues, ()
        with contextlib.suppress(Exception):
            async with self.redis.pipeline(transaction=False) as pipe:
                for queue in queues:
                    pipe.zrem(self.keys.worker_heartbeats(queue), self.name)
                if queues:
                    pipe.delete(self.keys.worker_status(self.name))
                    pipe.zrem(self.keys.worker_statuses, self.name)
                await pipe.execute()

    async def _listen_cancels(self, pubsub: aioredis.client.PubSub) -> None:
        outage = OutageLog(log, "cancel listener")
        while True:
            try:
                msg = await pubsub.get_message(timeout=None)
            except asyncio.CancelledError:
                await pubsub.aclose()
                raise
            except UNREACHABLE as exc:
                outage.failed(exc)
                await asyncio.sleep(0.5)
                continue
            except Exception:
                log.warning("cancel listener failed; retrying", exc_info=True)
                await asyncio.sleep(0.5)
                continue
            outage.ok()
            if msg is None or msg.get("type") != "message":
                continue
            if msg.get("channel") == self.keys.tenant_changed_channel:  # decoded: str
                for forget in self.tenant_listeners:
                    forget(str(msg["data"]))
                continue
            job_id = msg["data"]
            run = self.running.get(job_id) or self.prefills.get(job_id)
            if run is not None:
                run.cancel()

    async def _heartbeat(self, queues: tuple[str, ...]) -> None:
        host, pid = socket.gethostname(), os.getpid()
        ttl_ms = int(self.settings.worker_status_ttl_s * 1000)
        outage = OutageLog(log, "heartbeat")
        while True:
            try:
                async with self.redis.pipeline(transaction=False) as pipe:
                    now = time.time()
                    for queue in queues:
                        pipe.zadd(self.keys.worker_heartbeats(queue), {self.name: now})
                    # The same beat carries the load (one round trip, once a beat): the status
                    # record, its index entry, and the index trimmed of records long expired.
                    in_flight, capacity, done = self.load.sample()
                    status = WorkerStatus(
                        name=self.name,
                        queues=queues,
                        host=host,
                        pid=pid,
                        in_flight=in_flight,
                        capacity=capacity,
                        done=done,
                        engine_errors=self.load.engine_errors,
                        started_at=self.started_at,
                        beat_at=now,
                    )
                    pipe.set(self.keys.worker_status(self.name), status.encode(), px=ttl_ms)
                    pipe.zadd(self.keys.worker_statuses, {self.name: now})
                    pipe.zremrangebyscore(
                        self.keys.worker_statuses, "-inf", now - self.settings.worker_status_ttl_s
                    )
                    for queue in self._starting_queues:  # started: counted by its beats now
                        pipe.zrem(self.keys.worker_starting(queue), self.name)
                    await pipe.execute()
                self._starting_queues = ()
                outage.ok()
            except asyncio.CancelledError:
                raise
            except UNREACHABLE as exc:
                outage.failed(exc)
            except Exception:
                log.warning("heartbeat failed", exc_info=True)
            await asyncio.sleep(self.settings.worker_heartbeat_s)

    async def close_database(self) -> None:
        await self.db.close()

    async def close(self) -> None:
        """Stop whatever loop still runs, take down the start mark, then close the engines,
        the usage batcher, the writer and the pool."""
        for name in list(self._tasks):
            await self.stop_task(name)
        with contextlib.suppress(Exception):
            async with self.redis.pipeline(transaction=False) as pipe:
                for queue in self._starting_queues:
                    pipe.zrem(self.keys.worker_starting(queue), self.name)
                await pipe.execute()
        for engine in self._engines.values():
            with contextlib.suppress(Exception):
                await engine.aclose()
        await self.usage.close()
        await self.pipe.close()
        await self.redis.aclose()
