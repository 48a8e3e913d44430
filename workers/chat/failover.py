"""A chat worker's side of failover: the leases of its chats, and taking over the chats of a
worker that died (the design, and every decision, is shared/failover.py).

:class:`JobLeases` writes a chat's lease when it starts and drops it when it ends, each one
command queued on the process's Redis pipe (no round trip waited for, nothing per token).
:class:`LeaseKeeper` runs on the process loop beside the heartbeat, twice per beat: one read of
the chat workers' heartbeats, one of this worker's own leases; only when a worker is lost does
it claim (one Lua script, shared/redis/scripts/lease_claim.lua) and hand each claimed chat
to the chat runner.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol

import redis.asyncio as aioredis

from shared.keys import CHAT_QUEUE, Keys
from shared.redis import scripts
from shared.redis.periodic import every
from shared.redis.pipe import RedisPipe
from shared.settings import Settings
from shared.tasks import ChatJob
from workers.chat.takeover import Takeover, lost_workers, plan_takeover

log = logging.getLogger(__name__)


class _Chat(Protocol):
    def stand_down(self) -> None: ...


class _Context(Protocol):
    """What the keeper uses of the worker's context (workers/resources.py, which imports this
    module: the keeper sees only this shape of it)."""

    settings: Settings
    keys: Keys
    redis: aioredis.Redis
    name: str

    @property
    def running(self) -> Mapping[str, _Chat]: ...


Resume = Callable[[ChatJob, Takeover], Awaitable[None]]
Fail = Callable[[ChatJob, Takeover], Awaitable[None]]


class JobLeases:
    """This worker's leases: which chats it runs, with what it needs to run them again."""

    def __init__(self, pipe: RedisPipe, key: str, ttl_s: int) -> None:
        self._pipe = pipe
        self._hold = pipe.script(scripts.LEASE_HOLD)
        self.key = key
        self._ttl_s = ttl_s
        self.ttl_s = ttl_s
        # Job id -> (when its lease was written (monotonic), the job), for standing down or
        # writing the lease again (see LeaseKeeper).
        self.held: dict[str, tuple[float, ChatJob]] = {}
        # The fence (monotonic): this worker's chats publish only until then. The keeper moves
        # it to `worker_lost_s` past each beat that found every lease still ours, so a worker
        # that stalled (SIGSTOP, a blocked loop) longer than that, whose chats a survivor may
        # have claimed meanwhile, sends nothing more until its keeper has looked: it then
        # stands down what was taken. A survivor claims only `worker_lost_s` after the last
        # beat, so the two never speak for a chat at once. No keeper (a worker started some
        # other way, a test): always open.
        self.open_until = float("inf")
        self._moved = asyncio.Event()

    def move_fence(self, until: float) -> None:
        """Move the fence (the keeper, after a beat that found every lease ours)."""
        self.open_until = until
        self._moved.set()

    def closed(self) -> bool:
        """Whether this worker's chats must hold their chunks now (one clock read)."""
        return time.monotonic() >= self.open_until

    async def wait_open(self) -> None:
        """Until the fence opens (at once nearly always; a stalled worker's chats wait for
        its keeper's next look, or are stood down by it)."""
        while self.closed():
            self._moved.clear()
            await self._moved.wait()

    def hold(self, job: ChatJob) -> None:
        """Record the chat as this worker's (queued on the pipe, before its `started`)."""
        self.held[job.job_id] = (time.monotonic(), job)
        try:
            self._hold.send([self.key], [job.job_id, job.model_dump_json(), self._ttl_s])
        except ConnectionError:  # Redis is gone: the chat's own first write says so
            log.warning("could not record the lease of %s", job.job_id)

    def release(self, job_id: str) -> None:
        """The chat ended here (or was handed on): drop its lease."""
        self.held.pop(job_id, None)
        with contextlib.suppress(ConnectionError):
            self._pipe.send([b"HDEL", self.key.encode(), job_id.encode()])


class LeaseKeeper:
    """Looks for lost chat workers and takes their chats over; stands down a chat of this
    worker whose lease another worker took (this worker was taken for dead)."""

    def __init__(self, ctx: _Context, leases: JobLeases, resume: Resume, fail: Fail) -> None:
        self._ctx = ctx
        self._leases = leases
        self._resume = resume
        self._fail = fail
        self._beats_key = ctx.keys.worker_heartbeats(CHAT_QUEUE)
        self._tasks: set[asyncio.Task[None]] = set()
        self._missing: set[str] = set()  # leases found gone, with no claim marker, last tick
        self.taken_over = 0  # chats claimed so far (for logs and tests)

    async def run(self) -> None:
        # Twice per beat: a loss is seen within half a beat of the lease running out.
        interval = self._ctx.settings.worker_heartbeat_s / 2
        # Nobody can have claimed a chat of a worker that is only starting.
        self._leases.move_fence(time.monotonic() + self._ctx.settings.worker_lost_s)
        await every(interval, self.tick, log, "failover check", at_once=True)

    async def tick(self) -> None:
        ctx, settings = self._ctx, self._ctx.settings
        lost_s = settings.worker_lost_s
        sent_at, now = time.monotonic(), time.time()
        async with ctx.redis.pipeline(transaction=False) as pipe:
            pipe.zrange(self._beats_key, 0, -1, withscores=True)
            pipe.hkeys(self._leases.key)
            # The leases' own expiry (a dead worker's that nobody claims go), renewed here.
            pipe.expire(self._leases.key, self._leases.ttl_s)
            beats, mine, _ = await pipe.execute()
        beats = dict(beats)
        if await self._check_own(set(mine), lost_s):
            # What the read found is ours until `lost_s` past our last beat (a survivor claims
            # only then), and past the read itself at the latest. No beat: nobody can claim.
            own = beats.get(ctx.name)
            behind = 0.0 if own is None else max(0.0, now - float(own))
            self._leases.move_fence(sent_at - behind + lost_s)
        for lost in lost_workers(beats, now=now, lost_s=lost_s, me=ctx.name):
            room = settings.chat_concurrency - len(ctx.running) - len(self._tasks)
            if room <= 0:
                return
            claimed = await scripts.run(
                ctx.redis,
                scripts.LEASE_CLAIM,
                [self._beats_key, ctx.keys.worker_jobs(lost), self._leases.key],
                [lost, now - lost_s, settings.replay_ttl_s, room],
            )
            pairs = list(zip(claimed[::2], claimed[1::2], strict=True))
            if pairs:
                log.warning("worker %s lost; taking over %d of its chats", lost, len(pairs))
            if pairs:
                async with ctx.redis.pipeline(transaction=False) as pipe:
                    for job_id, _ in pairs:
                        taken = ctx.keys.job_taken(str(job_id))
                        pipe.set(taken, ctx.name, ex=settings.replay_ttl_s)
                    await pipe.execute()
            for job_id, payload in pairs:
                self.taken_over += 1
                task = asyncio.create_task(self._take_over(str(payload)), name=f"takeover:{job_id}")
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    async def _check_own(self, mine: set[str], lost_s: float) -> bool:
        """Our chats whose lease is gone from our hash: stop, silently, those another worker
        took over while we looked dead (it speaks for them now); write again the leases Redis
        lost with its data (a restart). A lease younger than `lost_s` may not have reached
        Redis when the hash was read: left alone. True when every chat still running here is
        ours (the fence may open)."""
        horizon = time.monotonic() - lost_s
        gone = [
            (job_id, job)
            for job_id, (since, job) in list(self._leases.held.items())
            if job_id not in mine and since <= horizon
        ]
        if not gone:
            return True
        ctx = self._ctx
        takers = await ctx.redis.mget([ctx.keys.job_taken(job_id) for job_id, _ in gone])
        missing, self._missing = self._missing, set()
        settled = True
        for (job_id, job), taker in zip(gone, takers, strict=True):
            if taker is None or taker == ctx.name:
                # Written again only when still unclaimed a tick later: a claim sets its
                # marker a round trip after it moved the lease.
                if job_id in missing:
                    self._leases.hold(job)
                else:
                    self._missing.add(job_id)
                    settled = False  # maybe a claim whose marker is a round trip away
                continue
            self._leases.held.pop(job_id, None)
            run = ctx.running.get(job_id)
            if run is not None:
                log.warning("chat %s was taken over by %s; standing down", job_id, taker)
                run.stand_down()
        return settled

    async def _take_over(self, payload: str) -> None:
        ctx = self._ctx
        try:
            job = ChatJob.model_validate_json(payload)
        except ValueError:
            log.error("dropped a lease this worker cannot read")
            return
        try:
            async with ctx.redis.pipeline(transaction=False) as pipe:
                pipe.exists(ctx.keys.cancel_flag(job.job_id))
                pipe.xrange(ctx.keys.replay_stream(job.job_id))
                cancelled, entries = await pipe.execute()
            if cancelled:
                # Given up by its gateway (which ended it and recorded its usage) or its client.
                return
            plan = plan_takeover(str(fields["m"]) for _, fields in entries if fields)
            log.warning(
                "chat %s taken over: %s after %d chunks", job.job_id, plan.kind, plan.next_seq
            )
            if plan.kind == "ended":
                return
            if plan.kind == "fail":
                await self._fail(job, plan)
                return
            await self._resume(job, plan)
        except Exception:  # a takeover never takes the worker down
            log.exception("taking over chat %s failed", job.job_id)
        finally:
            self._leases.release(job.job_id)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=5.0)
