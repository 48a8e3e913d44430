"""Per-process resources of a worker, created once on the process loop.

One Redis pool, one engine client per model server, the cancel listener (job id -> running
task) and the heartbeat that tells gateways a worker for a queue is alive.

A chat worker heartbeats only once it has warmed up (:func:`announce`): a gateway counts it
from then on, and `/readyz` and the admission check (no chat worker: `overloaded`) mean a
worker that takes a chat at once, not one that is still loading its models and pools (0.2 s
on an idle machine, longer when several processes start at once: a benchmark that trusted
`/readyz` sent its warm-up to the one worker that was up, and the other met its first chats
cold, in the measured burst).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Protocol

import redis.asyncio as aioredis

from shared.engines.base import Engine
from shared.engines.factory import make_model_engine
from shared.keys import BULK_QUEUE, Keys
from shared.modeltable import ModelSpec, ModelTable, model_table
from shared.redis.client import redis_client
from shared.redis.pipe import PipeScript, RedisPipe
from shared.settings import Settings, get_settings
from workers.publish import SEND_LUA
from workers.record import UsageBatcher

log = logging.getLogger(__name__)


class Cancellable(Protocol):
    """A running chat the cancel listener can stop (workers.chat.ChatRun)."""

    def cancel(self) -> None: ...


@dataclass
class WorkerContext:
    settings: Settings
    keys: Keys
    redis: aioredis.Redis
    name: str
    # One pipelined Redis connection (shared/redis/pipe.py) for every job's chunks and the
    # chat path's small reads; started by start().
    pipe: RedisPipe
    chunks: PipeScript  # workers/publish.py's SEND_LUA on the pipe
    # Usage rows of chats ending close together, one bulk task per batch (workers/record.py).
    usage: UsageBatcher
    _engines: dict[tuple[str, str], Engine] = field(default_factory=dict)
    running: dict[str, Cancellable] = field(default_factory=dict)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _heartbeat_task: asyncio.Task[None] | None = None

    @property
    def models(self) -> ModelTable:
        return model_table(self.settings)

    def engine_for(self, spec: ModelSpec) -> Engine:
        """The engine serving ``spec``; models on the same server share one (one pool).

        Created on first use: a bulk worker never loads a model.
        """
        engine = self._engines.get(spec.engine_key)
        if engine is None:
            engine = self._engines[spec.engine_key] = make_model_engine(spec, self.settings)
        return engine

    @property
    def engine(self) -> Engine:
        """The default model's engine."""
        return self.engine_for(self.models.get(None))

    async def start(self) -> None:
        await self.pipe.start()
        pubsub = self.redis.pubsub(ignore_subscribe_messages=True)
        await pubsub.subscribe(self.keys.cancel_channel)
        self._tasks.append(asyncio.create_task(self._listen_cancels(pubsub)))

    def start_heartbeat(self, queues: tuple[str, ...]) -> None:
        """Tell gateways this worker takes jobs from ``queues`` (once; later calls do nothing)."""
        if queues and self._heartbeat_task is None:
            self._heartbeat_task = asyncio.create_task(self._heartbeat(queues))
            self._tasks.append(self._heartbeat_task)

    async def _listen_cancels(self, pubsub: aioredis.client.PubSub) -> None:
        while True:
            try:
                msg = await pubsub.get_message(timeout=None)
            except asyncio.CancelledError:
                await pubsub.aclose()
                raise
            except Exception:
                log.warning("cancel listener lost Redis; retrying", exc_info=True)
                await asyncio.sleep(0.5)
                continue
            if msg is None or msg.get("type") != "message":
                continue
            job_id = msg["data"]
            run = self.running.get(job_id)
            if run is not None:
                run.cancel()

    async def _heartbeat(self, queues: tuple[str, ...]) -> None:
        while True:
            try:
                async with self.redis.pipeline(transaction=False) as pipe:
                    now = time.time()
                    for queue in queues:
                        pipe.zadd(self.keys.worker_heartbeats(queue), {self.name: now})
                    await pipe.execute()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.warning("heartbeat failed", exc_info=True)
            await asyncio.sleep(self.settings.worker_heartbeat_s)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(BaseException):
                await task
        with contextlib.suppress(Exception):
            async with self.redis.pipeline(transaction=False) as pipe:
                for queue in ("chat", "bulk"):
                    pipe.zrem(self.keys.worker_heartbeats(queue), self.name)
                await pipe.execute()
        for engine in self._engines.values():
            with contextlib.suppress(Exception):
                await engine.aclose()
        await self.usage.close()
        await self.pipe.close()
        await self.redis.aclose()


_context: WorkerContext | None = None
_lock: asyncio.Lock | None = None
_queues: tuple[str, ...] = ()
_name: str = f"worker@{socket.gethostname()}"
_announce_at_start = True


def configure(name: str, queues: tuple[str, ...], *, announce_at_start: bool = True) -> None:
    """Called from `worker_init` (before any task runs) with this worker's name and queues.

    ``announce_at_start=False``: no heartbeat until :func:`announce` (a chat worker, after its
    warm-up)."""
    global _name, _queues, _announce_at_start
    _name, _queues, _announce_at_start = name, queues, announce_at_start


async def announce() -> None:
    """Start this worker's heartbeat for its queues (see the module docstring)."""
    (await get_context()).start_heartbeat(_queues)


async def get_context() -> WorkerContext:
    """The process's context, created on first use (on the process loop, under a lock)."""
    global _context, _lock
    if _context is not None:
        return _context
    if _lock is None:
        _lock = asyncio.Lock()
    async with _lock:
        if _context is None:
            settings = get_settings()
            keys = Keys(settings.redis_prefix)
            redis = redis_client(settings.redis_url)
            pipe = RedisPipe(
                settings.redis_url,
                client_name=f"firsttoken-worker-{os.getpid()}",
                linger_s=settings.publish_linger_ms / 1000.0,
            )
            ctx = WorkerContext(
                settings=settings,
                keys=keys,
                redis=redis,
                name=_name,
                pipe=pipe,
                chunks=pipe.script(SEND_LUA),
                usage=UsageBatcher(
                    redis,
                    keys.queue_list(BULK_QUEUE),
                    _name,
                    settings.usage_batch_ms / 1000.0,
                ),
            )
            await ctx.start()
            if _announce_at_start:
                ctx.start_heartbeat(_queues)
            _context = ctx
    return _context


async def close_context() -> None:
    global _context
    from workers.cache_stage import close_stage
    from workers.db import close_database

    # The cache stage's follower reads the context's Redis: stopped first, it does not see its
    # connection closed under a blocking read (a traceback on every clean stop).
    await close_stage()
    if _context is not None:
        ctx, _context = _context, None
        await ctx.close()
    await close_database()
