"""A worker process's start and stop, as steps (workers/steps.py) with explicit requirements.

STEPS below: tracing, Redis (the pool and the pipelined writer), the database, the cancel
listener, the chat worker's start mark and cache stage, then, once ready, the heartbeat and the
loops a pool needs (a chat worker watches for dead gateways, a bulk worker sweeps lost usage
rows). A worker starts the steps its queues need, each after what it requires; stop is the
reverse, after the chats still running had their grace period (workers/chat/pool.py).

A chat worker heartbeats only once it has warmed up: a gateway counts it from then on, and
`/readyz` and the admission check (no chat worker: `overloaded`) mean a worker that takes a
chat at once, not one that is still loading its models and pools (a benchmark that trusted
`/readyz` otherwise sent its warm-up to the one worker that was up, and the others met their
first chats cold). Until then its start mark tells gateways it is on its way.

Celery's signals drive it (workers/app.py: `worker_init` starts it, `worker_shutdown` stops it,
after the pool has stopped); the chat bootstep warms and readies it in between. Tests drive the
same coroutines on their own loop.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Awaitable, Callable

from shared import tracing
from shared.keys import BULK_QUEUE, CHAT_QUEUE, SUMMARIZE_QUEUE, Keys
from shared.redis import scripts
from shared.redis.client import redis_client
from shared.redis.pipe import RedisPipe
from shared.settings import get_settings
from workers.bulk.sweep import UsageSweeper
from workers.cache.stage import close_stage
from workers.chat.failover import JobLeases
from workers.chat.load import Probe
from workers.chat.orphans import GatewayWatch
from workers.chat.usage import UsageBatcher
from workers.db import Database
from workers.resources import WorkerContext
from workers.runtime import LoopRunner, runner
from workers.steps import Phase, Step, phase_of, plan

log = logging.getLogger(__name__)

Warm = Callable[[WorkerContext], Awaitable[None]]


def open_context(name: str, queues: tuple[str, ...] = ()) -> WorkerContext:
    """The process's resources, not yet connected (the steps connect them)."""
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
        db=Database(settings.database_url),
        queues=queues,
    )


async def _start_tracing(ctx: WorkerContext) -> None:
    tracing.configure(ctx.settings, "firsttoken-worker", ctx.name)


async def _stop_tracing(ctx: WorkerContext) -> None:
    tracing.shutdown()


async def _stop_cache_stage(ctx: WorkerContext) -> None:
    # Before Redis closes: the stage's follower reads the context's Redis, and must not see
    # its connection closed under a blocking read.
    await close_stage(ctx)


async def _stop_cache_checker(ctx: WorkerContext) -> None:
    checker, ctx.cache_checker = ctx.cache_checker, None
    if checker is not None:
        await checker.close()


async def _stop_kb(ctx: WorkerContext) -> None:
    kb, ctx.kb = ctx.kb, None
    if kb is not None:
        await kb.close()


async def _start_gateway_watch(ctx: WorkerContext) -> None:
    s = ctx.settings
    watch = GatewayWatch(
        ctx.pipe, ctx.keys, ctx.running, s.gateway_heartbeat_s, s.gateway_dead_after_s
    )
    ctx.spawn("gateway-watch", watch.run())


async def _start_usage_sweep(ctx: WorkerContext) -> None:
    sweeper = UsageSweeper(ctx.pipe, ctx.keys, ctx.name, ctx.settings.usage_resend_after_s)
    ctx.spawn("usage-sweep", sweeper.run())


def _stop_task(name: str) -> Callable[[WorkerContext], Awaitable[None]]:
    async def stop(ctx: WorkerContext) -> None:
        await ctx.stop_task(name)

    return stop


POOLS = frozenset({CHAT_QUEUE, BULK_QUEUE, SUMMARIZE_QUEUE})
CHAT = frozenset({CHAT_QUEUE})

# A worker process's life, in the order its steps start (workers/steps.py); each stops in
# reverse. A chat worker heartbeats only once warm (`ready`): a gateway counts it from then on,
# and until then its start is marked so that gateways keep the chats queued for it.
STEPS: tuple[Step[WorkerContext], ...] = (
    Step("tracing", _start_tracing, _stop_tracing),
    Step("redis", WorkerContext.open, WorkerContext.close, requires=("tracing",)),
    Step("database", None, WorkerContext.close_database, requires=("tracing",)),
    Step(
        "cancel-listener",
        WorkerContext.start_cancel_listener,
        _stop_task("cancel-listener"),
        requires=("redis",),
    ),
    Step("starting-mark", WorkerContext.announce_starting, None, ("redis",), CHAT),
    Step("cache-stage", None, _stop_cache_stage, ("redis",), CHAT),
    Step("kb", None, _stop_kb, ("database",), CHAT),
    Step("cache-checker", None, _stop_cache_checker, ("redis",), frozenset({BULK_QUEUE})),
    Step(
        "heartbeat",
        WorkerContext.start_heartbeat,
        WorkerContext.stop_heartbeat,
        ("redis",),
        POOLS,
        "ready",
    ),
    # Issue 29: a chat worker stops the chats of dead gateways; a bulk worker sends on usage
    # rows whose task was lost.
    Step(
        "gateway-watch",
        _start_gateway_watch,
        _stop_task("gateway-watch"),
        ("heartbeat",),
        CHAT,
        "ready",
    ),
    Step(
        "usage-sweep",
        _start_usage_sweep,
        _stop_task("usage-sweep"),
        ("heartbeat",),
        frozenset({BULK_QUEUE}),
        "ready",
    ),
)


class WorkerLifecycle:
    """One per process: the steps its queues need (STEPS), run on the process loop."""

    def __init__(self, loop_runner: LoopRunner) -> None:
        self.runner = loop_runner
        self.name = f"worker@{socket.gethostname()}"
        self.queues: tuple[str, ...] = ()
        self._context: WorkerContext | None = None
        self._opening: asyncio.Lock | None = None
        self._started: list[Step[WorkerContext]] = []
        # A thread pool's load (workers/chat/load.py), read by the heartbeat; a chat worker's comes
        # from its chat pool instead (workers/chat/pool.py).
        self._probe: Probe | None = None

    @property
    def chat(self) -> bool:
        """Whether this worker serves the chat queue (announced only after its warm-up)."""
        return CHAT_QUEUE in self.queues

    # -- on the process loop ------------------------------------------------------------

    async def open(self, name: str, queues: tuple[str, ...]) -> WorkerContext:
        """The open-phase steps; a pool without a warm-up (not a chat worker) is ready too."""
        self.name, self.queues = name, queues
        ctx = await self.context()
        if not self.chat:
            await self._run(ctx, "ready")
        return ctx

    async def context(self) -> WorkerContext:
        """The open context. A task in a process that started no worker (a test, a one-off
        script) opens one on first use, under the default name: no queues, so no heartbeat."""
        if self._context is not None:
            return self._context
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:
            if self._context is None:
                ctx = open_context(self.name, self.queues)
                if self._probe is not None and not self.chat:
                    ctx.load.watch(self._probe)
                await self._run(ctx, "open")
                self._context = ctx
        return self._context

    async def ready(self, warm: Warm | None = None) -> None:
        """A chat worker's warm-up, then its ready-phase steps (its heartbeat first); a failed
        warm-up still goes on (the worker serves chats, slower at first)."""
        ctx = await self.context()
        try:
            if warm is not None:
                await warm(ctx)
        except Exception:
            log.warning("warm-up failed; the first chats will be slower", exc_info=True)
        finally:
            await self._run(ctx, "ready")

    async def close(self) -> None:
        """Stop the steps started, in reverse."""
        ctx, self._context = self._context, None
        self._opening = None
        started, self._started = self._started, []
        if ctx is None:
            return
        for step in reversed(started):
            if step.stop is not None:
                try:
                    await step.stop(ctx)
                except Exception:
                    log.warning("stopping %s failed", step.name, exc_info=True)

    async def _run(self, ctx: WorkerContext, phase: Phase) -> None:
        done = {s.name for s in self._started}
        for step in phase_of(plan(STEPS, self.queues), phase):
            if step.name in done:
                continue
            if step.start is not None:
                await step.start(ctx)
            self._started.append(step)

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
