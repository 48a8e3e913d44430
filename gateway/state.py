"""The gateway process: its Redis pool, pub/sub relay, authenticator and deadline watchdog."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Coroutine
from functools import cached_property
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.auth import Authenticator
from gateway.drafts import Drafts
from gateway.jobs import Feed
from gateway.liveness import GatewayBeat
from gateway.metrics import GatewayMetrics
from gateway.ratelimit import RateLimiter
from gateway.rates import Limits
from gateway.relay import Relay
from gateway.safety import ConnectionGuard
from gateway.wsdoor import Session
from shared import tracing
from shared.db.session import make_engine, make_sessionmaker
from shared.errors import Unauthorized
from shared.failover import STARTING_S
from shared.heap import FirstUse
from shared.keys import CHAT_QUEUE, Keys
from shared.metrics import start_process, stop_process
from shared.modeltable import ModelTable, model_table
from shared.redis.client import UNREACHABLE, redis_client, unreachable_as_overloaded
from shared.redis.pipe import RedisPipe
from shared.settings import Settings

log = logging.getLogger(__name__)

# The watchdog's tick: deadlines are enforced to within this.
WATCHDOG_INTERVAL_S = 0.1


class Gateway:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.keys = Keys(settings.redis_prefix)
        self.name = f"gateway@{socket.gethostname()}:{os.getpid()}"
        self.redis = redis_client(settings.redis_url)
        self.db: AsyncEngine = make_engine(settings.database_url)
        self.auth = Authenticator(
            self.redis,
            self.keys,
            make_sessionmaker(self.db),
            settings.auth_cache_s,
            Limits(
                key_rpm=settings.key_rpm_default,
                key_tpm=settings.key_tpm_default,
                key_streams=settings.key_max_streams_default,
                tenant_rpm=settings.tenant_rpm_default,
                tenant_tpm=settings.tenant_tpm_default,
            ),
        )
        # Admission and settlement scripts, pipelined on one connection (shared/redis/pipe.py).
        self.pipe = RedisPipe(settings.redis_url, client_name=f"firsttoken-gateway-{os.getpid()}")
        self.limiter = RateLimiter(self.pipe, self.keys, settings.stream_lease_s)
        self.drafts = Drafts(self.pipe, self.keys, settings, self.name)  # issue 34
        self.beat = GatewayBeat(self.pipe, self.keys, self.name, settings.gateway_heartbeat_s)
        self.guard = ConnectionGuard(
            max_connections=settings.max_connections,
            idle_timeout_s=settings.idle_timeout_s,
            origins=settings.allowed_origins,
        )
        self.relay = Relay(
            settings.redis_url,
            f"{settings.redis_prefix}:gw:{self.name}",
            on_reconnect=self._after_relay_reconnect,
            client_name=f"firsttoken-relay-{os.getpid()}",
        )
        # Before this process makes any series: multiprocess mode picks their storage.
        self.chat_metrics = start_process(settings, "gateway")
        self.metrics = GatewayMetrics()
        self.sessions: set[Session] = set()
        self.feeds: dict[str, Feed] = {}  # job id -> the clients here following it
        self._first_use = FirstUse()  # sessions, pools, caches made by the first chats live on
        self._workers_checked = 0.0
        self._workers_alive = 0
        self._workers_starting = 0  # chat workers started and warming, no heartbeat yet
        # Every chat worker's last heartbeat as of the last count (`beats_checked_at`): the
        # watchdog tells a running chat's dead worker from a live one by it (shared/failover.py).
        self.chat_beats: dict[str, float] = {}
        self.beats_checked_at = 0.0
        self._watchdog: asyncio.Task[None] | None = None
        self.redis_back_at = 0.0  # when pub/sub last reconnected (see beats_trusted)
        self._worker_count: asyncio.Task[None] | None = None
        self._auth_refresh: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[None]] = set()

    @cached_property
    def models(self) -> ModelTable:
        """The model table, read on first use (a bad models file fails the chats that need it,
        not the gateway's start) and then kept: looking it up per chat hashes the settings."""
        return model_table(self.settings)

    def chat_started(self) -> None:
        self.metrics.chats.inc()
        self._first_use.started()

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run a fire-and-forget coroutine, keeping a reference so it is not collected."""
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def start(self) -> None:
        tracing.configure(self.settings, "firsttoken-gateway", self.name)
        await self.pipe.start()
        await self.relay.start()
        await self.relay.subscribe_confirmed(self.keys.key_events, self._on_key_event)
        self.limiter.start()
        self.beat.start()
        self.guard.start(lambda: self.sessions)
        self._watchdog = asyncio.create_task(self._watch())
        self._worker_count = asyncio.create_task(self._keep_counting_chat_workers())
        # The keys in use, read again before their cached answers age out (gateway/auth.py):
        # the HTTP door checks its key per request, without a round trip of its own.
        self._auth_refresh = asyncio.create_task(self.auth.keep_fresh())
        try:
            self.chat_metrics.models_known(self.models.names)
        except Exception:  # a bad model table fails its chats, not the gateway's start
            log.debug("model table not read for the metrics at start-up", exc_info=True)

    def _on_key_event(self, message: str) -> None:
        """`revoked <hash> <key_id>` from `firsttoken keys revoke`: forget it, close its sockets."""
        action, _, rest = message.partition(" ")
        key_hash, _, key_id = rest.partition(" ")
        self.auth.invalidate(key_hash)
        if action == "revoked":
            for session in list(self.sessions):
                if session.principal.key_id == key_id:
                    session.close_with(Unauthorized("this API key has been revoked"), 1008)

    def _after_relay_reconnect(self) -> None:
        """Recover what was published while pub/sub was down: each job from its replay
        stream; a key revoked meanwhile by dropping every cached key."""
        self.auth.invalidate_all()
        for feed in list(self.feeds.values()):
            for job in list(feed.followers.members):
                job.owner.repair(job)

    async def close(self) -> None:
        await self.guard.close()
        await self.beat.close()
        await self.limiter.close()
        for task in (self._watchdog, self._worker_count, self._auth_refresh):
            if task is not None:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        await self.relay.close()
        await self.pipe.close()
        await self.redis.aclose()
        await self.db.dispose()
        tracing.shutdown()
        stop_process()

    async def chat_workers(self) -> int:
        """Chat workers with a fresh heartbeat, as counted within the last heartbeat interval
        (by the background count every half interval, so a chat does not wait for it). None
        counted is counted again at once: a chat is refused on a fresh count only."""
        stale = time.time() - self._workers_checked >= self.settings.worker_heartbeat_s
        if stale or not self._workers_alive:
            with unreachable_as_overloaded("the chat was not started"):
                await self._count_chat_workers()
        return self._workers_alive

    async def _count_chat_workers(self) -> None:
        now = time.time()
        # Alive as the watchdog sees it (shared/failover.py): a beat within `worker_lost_s`.
        # Three beats (3 s by default) kept a killed worker counted a second longer than
        # the watchdog, and the chats it accepted then waited out the queue deadline.
        horizon = now - self.settings.worker_lost_s
        # The whole set (one entry per chat worker: small), not a count: the watchdog needs
        # each worker's beat.
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.zrange(self.keys.worker_heartbeats(CHAT_QUEUE), 0, -1, withscores=True)
            pipe.zcount(self.keys.worker_starting(CHAT_QUEUE), now - STARTING_S, "+inf")
            beats, starting = await pipe.execute()
        self.chat_beats = {str(name): float(beat) for name, beat in beats}
        self.beats_checked_at = now
        self._workers_alive = sum(1 for beat in self.chat_beats.values() if beat >= horizon)
        self._workers_starting = int(starting)
        self._workers_checked = now

    async def _keep_counting_chat_workers(self) -> None:
        while True:
            try:
                await self._count_chat_workers()
            except Exception as exc:  # noqa: BLE001 - chats then count inline, and say why
                log.debug("could not count chat workers: %r", exc)
            await asyncio.sleep(self.settings.worker_heartbeat_s / 2)

    async def chat_workers_alive(self) -> bool:
        return await self.chat_workers() > 0

    def chat_workers_gone(self, now: float) -> bool:
        """Whether no chat worker is alive, as the background count (no round trip) says:
        a count taken within the last heartbeat interval, beats that can be trusted (not
        right after a Redis outage), none of them fresh, and none starting (a worker on its way,
        e.g. a restarted one warming up, answers the chat before its deadline)."""
        fresh = now - self._workers_checked < self.settings.worker_heartbeat_s
        none = self._workers_alive == 0 and self._workers_starting == 0
        return fresh and none and self.beats_trusted(now)

    async def follow_elsewhere(self, job_id: str) -> None:
        """Record that this process follows a job (a resume; the admission script records the
        admitting gateway): another gateway whose clients give the job up then leaves it
        running for this one (`followed_elsewhere`). A gateway that crashes stays recorded
        until the set expires: the job then runs to its end instead of being cancelled."""
        key = self.keys.job_followers(job_id)
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.sadd(key, self.name)
                pipe.expire(key, self.settings.replay_ttl_s)
                await pipe.execute()
        except UNREACHABLE as exc:  # the resume works; only another gateway may cancel it
            log.warning("could not record following %s: %r", job_id, exc)

    async def followed_elsewhere(self, job_id: str) -> bool:
        """This process no longer follows a job: whether another gateway process still does.
        Unknown (Redis down) counts as no, so a job nobody wants is still cancelled."""
        key = self.keys.job_followers(job_id)
        try:
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.srem(key, self.name)
                pipe.scard(key)
                _, left = await pipe.execute()
        except UNREACHABLE as exc:
            log.debug("could not read the followers of %s: %r", job_id, exc)
            return False
        return int(left) > 0

    async def cancel_job(self, job_id: str) -> None:
        """Set the cancel flag (for a job still queued) and tell running workers to stop it."""
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.set(self.keys.cancel_flag(job_id), "1", ex=self.settings.replay_ttl_s)
                pipe.publish(self.keys.cancel_channel, job_id)
                await pipe.execute()
        except Exception:
            log.warning("could not publish cancel for %s", job_id, exc_info=True)

    def beats_trusted(self, now: float) -> bool:
        """Whether the chat workers' heartbeats say who is alive: not right after this
        process's own Redis connection came back, when every beat is as old as the outage."""
        grace = self.settings.worker_lost_s + self.settings.worker_heartbeat_s
        return now - self.redis_back_at >= grace

    async def _watch(self) -> None:
        relay_was_down = False
        while True:
            await asyncio.sleep(WATCHDOG_INTERVAL_S)
            now = time.time()
            self.metrics.streams.set(len(self.feeds))
            self.metrics.flush_frames()
            if not self.relay.connected:
                # This process's own pub/sub is down (Redis restarting): the workers' silence
                # says nothing about them; they hold their chunks and resend them (issue 29).
                relay_was_down = True
                continue
            if relay_was_down:
                relay_was_down = False
                self._restart_idle_clocks(now)
            for feed in list(self.feeds.values()):
                for job in list(feed.followers.members):
                    job.owner.expire(job, now)

    def _restart_idle_clocks(self, now: float) -> None:
        """After pub/sub reconnected: every started chat's idle time counts from now (its
        worker needs its own reconnect to resend), a queued chat's deadline is unchanged, and
        the workers' heartbeats, as old as the outage, are not read as deaths until they have
        had the time to beat again (`beats_trusted`)."""
        self.redis_back_at = now
        for feed in self.feeds.values():
            for job in feed.followers.members:
                job.state.last_seen = max(job.state.last_seen, now)
