"""A worker process's start and stop, in one explicit order.

Start: the process loop (workers/runtime.py), the Redis pool and pipelined writer, the cancel
listener, the heartbeat (a bulk or summarize worker at once), then, for a chat worker, its
warm-up and the announcement (the heartbeat from then on). Stop: the reverse, after the chats
still running had their grace period (workers/chat/pool.py).

A chat worker heartbeats only once it has warmed up: a gateway counts it from then on, and
`/readyz` and the admission check (no chat worker: `overloaded`) mean a worker that takes a
chat at once, not one that is still loading its models and pools (a benchmark that trusted
`/readyz` otherwise sent its warm-up to the one worker that was up, and the others met their
first chats cold).

Celery's signals drive it (workers/app.py: `worker_init` starts it, `worker_shutdown` stops it,
after the pool has stopped); the chat bootstep warms and announces in between. Tests drive the
same coroutines on their own loop.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Awaitable, Callable

from shared import tracing
from shared.keys import CHAT_QUEUE, Keys
from shared.redis import scripts
from shared.redis.client import redis_client
from shared.redis.pipe import RedisPipe
from shared.settings import get_settings
from workers.cache.stage import close_stage
from workers.chat.failover import JobLeases
from workers.chat.load import Probe
from workers.chat.usage import UsageBatcher
from workers.db import close_database
from workers.resources import WorkerContext
from workers.runtime import LoopRunner, runner

log = logging.getLogger(__name__)

Warm = Callable[[WorkerContext], Awaitable[None]]


def open_context(name: str) -> WorkerContext:
    """The process's resources, not yet connected (see :meth:`WorkerContext.open`)."""
    settings = get_settings()
    keys = Keys(settings.redis_prefix)
    redis = redis_client(settings.redis_url)
    pipe = RedisPipe(
        settings.redis_url,
        client_name=f"firsttoken-worker-{os.getpid()}",
        linger_s=settings.publish_linger_ms / 1000.0,
        # Chunks and usage rows are held through a Redis outage this long (issue 29).
        down_fail_s=settings.worker_redis_outage_s,
    )
    return WorkerContext(
        settings=settings,
        keys=keys,
        redis=redis,
        name=name,
        pipe=pipe,
        chunks=pipe.script(scripts.CHUNK_SEND),
        usage=UsageBatcher(
            pipe,
            keys,
            name,
            settings.usage_batch_ms / 1000.0,
            resend_after_s=settings.usage_resend_after_s,
        ),
        leases=JobLeases(pipe, keys.worker_jobs(name), settings.replay_ttl_s),
    )


class WorkerLifecycle:
    """One per process: what runs on the process loop, started and stopped in order."""

    def __init__(self, loop_runner: LoopRunner) -> None:
        self.runner = loop_runner
        self.name = f"worker@{socket.gethostname()}"
        self.queues: tuple[str, ...] = ()
        self._context: WorkerContext | None = None
        self._opening: asyncio.Lock | None = None
        # A thread pool's load (workers/chat/load.py), read by the heartbeat; a chat worker's comes
        # from its chat pool instead (workers/chat/pool.py).
        self._probe: Probe | None = None

    @property
    def chat(self) -> bool:
        """Whether this worker serves the chat queue (announced only after its warm-up)."""
        return CHAT_QUEUE in self.queues

    # -- on the process loop ------------------------------------------------------------

    async def open(self, name: str, queues: tuple[str, ...]) -> WorkerContext:
        """Redis, the cancel listener, and (not a chat worker) the heartbeat."""
        self.name, self.queues = name, queues
        tracing.configure(get_settings(), "firsttoken-worker", name)
        return await self.context()

    async def context(self) -> WorkerContext:
        """The open context. A task in a process that started no worker (a test, a one-off
        script) opens one on first use, under the default name and with no heartbeat."""
        if self._context is not None:
            return self._context
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:
            if self._context is None:
                ctx = open_context(self.name)
                await ctx.open()
                await ctx.start_cancel_listener()
                if self._probe is not None and not self.chat:
                    ctx.load.watch(self._probe)
                if not self.chat:
                    ctx.start_heartbeat(self.queues)
                elif self.queues:
                    # On its way, not yet taking chats: gateways keep the queued ones for it
                    # (Keys.worker_starting); its first heartbeat takes the mark down.
                    await ctx.announce_starting(self.queues)
                self._context = ctx
        return self._context

    async def ready(self, warm: Warm | None = None) -> None:
        """A chat worker's warm-up, then its announcement; a failed warm-up still announces
        (the worker serves chats, slower at first)."""
        ctx = await self.context()
        try:
            if warm is not None:
                await warm(ctx)
        except Exception:
            log.warning("warm-up failed; the first chats will be slower", exc_info=True)
        finally:
            ctx.start_heartbeat(self.queues)

    async def close(self) -> None:
        """The reverse of :meth:`open`. The cache stage's follower reads the context's Redis:
        stopped first, it does not see its connection closed under a blocking read."""
        await close_stage()
        ctx, self._context = self._context, None
        self._opening = None
        if ctx is not None:
            await ctx.close()
        await close_database()
        tracing.shutdown()

    # -- from a Celery thread -----------------------------------------------------------

    def start(
        self, name: str, queues: tuple[str, ...], probe: Probe | None = None
    ) -> WorkerContext:
        """Start the loop and :meth:`open` on it; returns once both are up. `probe`: the
        Celery pool's load, for the heartbeat of a worker without the chat queue."""
        self._probe = probe
        return self.runner.run(self.open(name, queues))

    def stop(self, grace_s: float) -> None:
        """Wait up to `grace_s` for what still runs on the loop, :meth:`close`, stop the loop."""
        left = self.runner.drain(timeout=grace_s)
        if left:
            log.warning("%d coroutines were still running at the end of the grace period", left)
        self.runner.stop(self.close())


lifecycle = WorkerLifecycle(runner)
