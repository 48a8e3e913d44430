"""The path of one chat through the gateway, shared by every door (the websocket's
gateway/wsdoor.py and the OpenAI HTTP door's gateway/openai.py): admission, the workers-alive
check, subscribe before enqueue, the limiter's admit+enqueue script, the relay state and its
repair, settlement, cancellation and the watchdog's deadlines.

A door subclasses :class:`JobOwner` and says only how a frame reaches its client (`send`).

A job may be followed by several clients of one gateway process (the chat that started it and
any `resume` of it): one :class:`Feed` per job holds its channel, its followers (one
:class:`Job` each) and its rate-limit reservation. A client that goes away (disconnect,
deadline) stops only its own relay; the worker is told to stop when the last follower goes
(gateway/relaystate.py's ``Followers``). A client's `cancel` stops the job for all of them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Coroutine
from typing import Any, Protocol

from redis.asyncio import Redis

from gateway.admit import admit_chat
from gateway.auth import Principal
from gateway.drafts import Drafts
from gateway.lostchats import LostChat, record_lost_chat
from gateway.metrics import GatewayMetrics
from gateway.ratelimit import Admission, Enqueue, RateLimiter
from gateway.rates import charged_without_usage
from gateway.relay import Relay
from gateway.relaystate import Followers, RelayState, Step
from gateway.requeue import REQUEUE_GRACE_S, requeue_if_lost
from shared import tracing
from shared.errors import (
    Cancelled,
    DeadlineExceeded,
    EngineError,
    FirstTokenError,
    Overloaded,
    error_frame,
)
from shared.failover import TAKEOVER_GRACE_S, owner_verdict
from shared.keys import CHAT_QUEUE, CHAT_TASK, Keys
from shared.metrics.recorder import Recorder
from shared.modeltable import ModelTable
from shared.protocol import ChatFrame, dumps
from shared.redis.pubsub import Handler
from shared.settings import Settings
from shared.tasks import ChatJob, new_id, task_message
from shared.tracing.context import chosen

log = logging.getLogger(__name__)


class SessionHost(Protocol):
    """What a door uses of its gateway process (gateway/state.py's Gateway, which imports
    this module: the doors only see this shape of it)."""

    settings: Settings
    keys: Keys
    name: str
    redis: Redis
    # Every chat worker's last heartbeat, as of `beats_checked_at` (gateway/state.py).
    chat_beats: dict[str, float]
    beats_checked_at: float
    relay: Relay
    limiter: RateLimiter
    drafts: Drafts
    metrics: GatewayMetrics
    chat_metrics: Recorder
    feeds: dict[str, Feed]

    @property
    def models(self) -> ModelTable: ...

    def chat_started(self) -> None: ...

    def beats_trusted(self, now: float) -> bool: ...

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None: ...

    async def chat_workers_alive(self) -> bool: ...

    def chat_workers_gone(self, now: float) -> bool: ...

    async def cancel_job(self, job_id: str) -> None: ...

    async def follow_elsewhere(self, job_id: str) -> None: ...

    async def followed_elsewhere(self, job_id: str) -> bool: ...


class Feed:
    """One job's channel on this gateway process: the clients following it and the
    rate-limit reservation they share."""

    __slots__ = ("admission", "channel", "followers", "job_id", "lost", "model", "payload", "used")

    def __init__(self, job_id: str, channel: str) -> None:
        self.job_id = job_id
        self.channel = channel
        # The model asked for (for the usage row of a chat whose worker died), and whether
        # that row was written (once, however many clients here follow the job).
        self.model = ""
        self.lost = False
        # The job as enqueued (None on a resume of a job admitted elsewhere): its usage row,
        # should its worker die, is built from it as a worker would (shared/usage_row.py).
        self.payload: ChatJob | None = None
        self.followers: Followers[Job] = Followers()
        # Rate-limit reservation of the gateway that admitted the job (None on a resume of a
        # job admitted elsewhere), settled when the job ends; `used` is the worker's exact
        # token count once its `done` frame has been relayed.
        self.admission: Admission | None = None
        self.used: int | None = None

    def handler(self) -> Handler:
        """What the relay calls with each of the channel's messages."""
        members = self.followers.members
        # A lone follower (nearly every job) is called directly: no loop per token.
        if len(members) == 1:
            return members[0].on_message
        return self._fan_out

    def _fan_out(self, message: str) -> None:
        for job in list(self.followers.members):  # a copy: a follower may leave meanwhile
            job.on_message(message)

    def settle(self, limiter: RateLimiter, state: RelayState) -> None:
        """Give the reservation back: the exact usage when known, else what the relayed
        frames say was spent."""
        admission = self.admission
        if admission is None or admission.settled:
            return
        if self.used is not None:
            charged = self.used
        else:
            charged = charged_without_usage(
                admission.reserved,
                admission.prompt_estimate,
                started=state.started,
                frames=state.next_seq,
            )
        limiter.settle(admission, charged)


class Job:
    """A chat a door is relaying: one client following one job."""

    __slots__ = ("deadline_at", "feed", "message", "owner", "requeue_at", "state", "trace")

    def __init__(self, owner: JobOwner, feed: Feed, state: RelayState, deadline_at: float):
        self.owner = owner
        self.feed = feed
        self.state = state
        self.deadline_at = deadline_at
        self.trace: tracing.ChatTrace | None = None  # the chat's spans, while tracing is on
        # The task message this gateway enqueued, and when to check that a worker still has
        # it if the chat has not started (gateway/requeue.py); None on a resume.
        self.message: str | None = None
        self.requeue_at = 0.0

    @property
    def job_id(self) -> str:
        return self.feed.job_id

    def on_message(self, message: str) -> None:
        self.owner.apply(self, self.state.feed(message, time.time()))


class JobOwner:
    """One client's running chats (a websocket connection, or one HTTP request) and
    everything that happens to them between admission and settlement."""

    door = "websocket"  # which door its chats came in by (their traces say)

    def __init__(self, gw: SessionHost, principal: Principal) -> None:
        self.gw = gw
        self.principal = principal
        self.jobs: dict[str, Job] = {}
        self.last_active = time.monotonic()
        # The trace context of the client's request headers (set by a door, tracing on).
        self.client_trace: tracing.TraceHeaders | None = None

    # --- what a door provides ---------------------------------------------------------
    def send(self, text: str) -> None:
        """Deliver one wire frame (JSON text: token, done or error) to the client."""
        raise NotImplementedError

    def send_error(self, chat_id: str | None, exc: BaseException) -> None:
        frame = error_frame(chat_id, exc)
        self.gw.metrics.errors.labels(frame["code"]).inc()
        self.send(dumps(frame))

    # --- the chat path ----------------------------------------------------------------
    async def open_job(
        self, frame: ChatFrame, received_at: float | None = None
    ) -> tuple[Job, str | None]:
        """Admit a chat and enqueue it: the job relaying it and its conversation id. Raises
        the first rule it breaks; a refused chat never reaches the queue. `received_at`: when
        the door got the request (the HTTP door reads, authenticates and validates a body
        first: its `accept_ms` includes that), else now."""
        gw, settings = self.gw, self.gw.settings
        received = time.time() if received_at is None else received_at
        limits = self.principal.limits
        admitted = admit_chat(
            frame, running=self.jobs, rules=settings, models=gw.models, limits=limits
        )
        max_tokens, reserved = admitted.max_tokens, admitted.reserved
        new_conversation = admitted.new_conversation
        conversation_id = new_id() if new_conversation else frame.conversation_id
        if not await gw.chat_workers_alive():
            # A worker starting (or back after a Redis outage) is counted within a heartbeat.
            raise Overloaded(
                "no chat worker is running; start one with `firsttoken worker --queues chat`",
                retry_after_ms=self._no_worker_retry_ms(),
            )
        # From here on a refusal (the limiter's) is on the admission span; one before (the
        # frame's rules, no worker) has no span.
        trace = None
        if tracing.on:
            client = chosen(frame.traceparent, frame.tracestate, self.client_trace)
            trace = tracing.chat_trace(client, received, self.door)
        job_id = new_id()
        feed = Feed(job_id, gw.keys.job_channel(job_id))
        feed.model = frame.model or gw.models.default
        job = Job(self, feed, RelayState(frame.id, received), received + settings.queue_deadline_s)
        feed.followers.join(job)
        self.jobs[frame.id] = job
        admission = None
        try:
            gw.relay.subscribe(feed.channel, feed.handler())
            enqueued = time.time()
            job.state.enqueued_at = enqueued
            payload = ChatJob(
                job_id=job_id,
                chat_id=frame.id,
                tenant_id=self.principal.tenant_id,
                key_id=self.principal.key_id,
                messages=frame.messages,
                model=frame.model,
                max_tokens=max_tokens,
                temperature=frame.temperature,
                cache=frame.cache,
                conversation_id=conversation_id,
                new_conversation=new_conversation,
                user=frame.user,
                tags=frame.tags,
                door=self.door,
                tenant_rpm=limits.tenant_rpm,
                tenant_tpm=limits.tenant_tpm,
                received_at=received,
                enqueued_at=enqueued,
                deadline_at=job.deadline_at,
                traceparent=None if trace is None else trace.traceparent,
                tracestate=None if trace is None else trace.tracestate,
            )
            feed.payload = payload
            message = task_message(
                CHAT_TASK,
                {"job": payload.model_dump()},
                queue=CHAT_QUEUE,
                task_id=job_id,
                origin=gw.name,
            )
            # Every limit checked and charged, the job enqueued and its owner recorded: one
            # round trip. A refused chat never reaches the queue.
            admission = await gw.limiter.admit(
                job_id=job_id,
                key_id=self.principal.key_id,
                tenant_id=self.principal.tenant_id,
                limits=limits,
                tokens=reserved,
                prompt_estimate=admitted.prompt_estimate,
                enqueue=Enqueue(
                    gw.keys.queue_list(CHAT_QUEUE),
                    message,
                    gw.keys.job_owner(job_id),
                    settings.replay_ttl_s,
                    gw.keys.job_followers(job_id),
                    gw.name,
                ),
            )
            feed.admission = admission
        except BaseException as exc:
            if trace is not None:
                trace.failed(exc)
            self.jobs.pop(frame.id, None)
            gw.relay.unsubscribe(feed.channel)
            if admission is not None:
                gw.limiter.settle(admission, 0)
            raise
        gw.feeds[job_id] = feed
        job.message = message
        job.requeue_at = enqueued + settings.worker_lost_s + REQUEUE_GRACE_S
        gw.chat_started()
        if trace is not None:
            trace.admitted(job_id)
            job.trace = trace
        return job, conversation_id

    def apply(self, job: Job, step: Step) -> None:
        """Carry out what the relay state decided for one message."""
        for text in step.frames:
            self.send(text)
        self.gw.metrics.frames_pending += len(step.frames)  # counted at the watchdog's tick
        if step.repair:
            self.gw.spawn(self._repair(job))
        if step.finished:
            if step.timings is not None:
                self.gw.chat_metrics.chat_done(step.timings, step.model, step.cached)
            if step.used is not None:
                job.feed.used = step.used
            self.gw.spawn(self.stop_job(job, ended=True))

    def repair(self, job: Job) -> None:
        """Re-read a job's replay stream (after pub/sub reconnected): holds what arrives
        meanwhile, relays what was missed, drops what was already sent."""
        if job.state.finished:
            return
        job.state.begin_repair()
        self.gw.spawn(self._repair(job))

    async def _repair(self, job: Job) -> None:
        try:
            entries = await self.gw.redis.xrange(self.gw.keys.replay_stream(job.job_id))
        except Exception:  # noqa: BLE001
            entries = []
        stream = [str(fields["m"]) for _, fields in entries or [] if fields]
        self.apply(job, job.state.apply_repair(stream, time.time()))

    async def follow(self, chat_id: str, job_id: str, state: RelayState) -> Job:
        """Follow a job this client did not start (a `resume`): beside its other followers
        when this process relays it already, else on a channel subscribed and confirmed
        (the caller then reads the replay stream, and nothing published after is missed)."""
        gw = self.gw
        feed = gw.feeds.get(job_id)
        if feed is not None:
            job = Job(self, feed, state, deadline_at=float("inf"))
            feed.followers.join(job)
            gw.relay.reroute(feed.channel, feed.handler())
            self.jobs[chat_id] = job
            return job
        feed = Feed(job_id, gw.keys.job_channel(job_id))
        job = Job(self, feed, state, deadline_at=float("inf"))
        feed.followers.join(job)
        self.jobs[chat_id] = job
        gw.feeds[job_id] = feed
        try:
            await gw.relay.subscribe_confirmed(feed.channel, feed.handler())
        except BaseException:
            # Not followed after all; the job itself goes on (nothing is cancelled).
            del self.jobs[chat_id]
            feed.followers.members.remove(job)
            if not feed.followers.members and gw.feeds.get(job_id) is feed:
                del gw.feeds[job_id]
            raise
        # Not needed where this process follows the job already: it gives the job up only
        # when its last follower goes, and says so then.
        await gw.follow_elsewhere(job_id)
        return job

    async def stop_job(self, job: Job, *, ended: bool) -> None:
        """Stop relaying a job to this client. `ended`: its done or error was relayed; else the
        client gave it up, and the worker is told to stop unless another client of this
        process still follows the job."""
        if self.jobs.get(job.state.chat_id) is job:
            del self.jobs[job.state.chat_id]
        job.state.finished = True
        self.last_active = time.monotonic()  # idle time counts from the last chat's end too
        if job.trace is not None:  # once: every end path passes here, some twice
            job.trace.relayed(job.state.first_sent_at, job.state.next_seq, ended)
            job.trace = None
        feed, gw = job.feed, self.gw
        leave = feed.followers.leave(job, ended=ended)
        if leave is None:
            return  # stopped already
        if leave.unsubscribe:
            if gw.feeds.get(feed.job_id) is feed:
                del gw.feeds[feed.job_id]
            gw.relay.unsubscribe(feed.channel)
        else:
            gw.relay.reroute(feed.channel, feed.handler())
        if leave.settle:
            # Every end path passes here (done, error, cancel, disconnect, watchdog), and
            # Followers says yes once per job: the stream slot is freed and the unused tokens
            # refunded exactly once, however many clients followed it.
            feed.settle(gw.limiter, job.state)
        if leave.cancel and not await gw.followed_elsewhere(feed.job_id):
            await gw.cancel_job(feed.job_id)

    async def cancel(self, job: Job) -> None:
        """The client's `cancel`: the job stops for every client following it (a stop button
        means the answer is not wanted, wherever else it is shown): the others here are told
        `cancelled` now, and the worker is told to stop, whose `cancelled` ends the job for
        followers on other gateways."""
        for other in list(job.feed.followers.members):
            if other is not job and not other.state.finished:
                other.state.finished = True
                other.owner.send_error(
                    other.state.chat_id,
                    Cancelled("the chat was cancelled by another connection following it"),
                )
                await other.owner.stop_job(other, ended=False)
        # A cancel ends the job: no follower anywhere keeps it running.
        await self.stop_job(job, ended=True)
        await self.gw.cancel_job(job.job_id)

    def expire(self, job: Job, now: float) -> None:
        """Called by the gateway's watchdog: end a job whose worker missed a deadline."""
        state = job.state
        if state.finished:
            return
        exc: FirstTokenError
        if not state.started:
            if job.message is not None and now >= job.requeue_at:
                self._requeue_if_lost(job, job.message)
            if now >= job.deadline_at:
                exc = DeadlineExceeded(
                    "no chat worker picked the chat up within "
                    f"{self.gw.settings.queue_deadline_s:g}s; the service is overloaded, "
                    "retry later"
                )
            elif self.gw.chat_workers_gone(now):
                # Queued when the last worker died (or just before its death was seen): no one
                # will pick it up before its deadline, so say so now (issue 42). Cancelled
                # below, a worker started later drops it.
                exc = Overloaded(
                    "no chat worker is alive to answer this chat; retry later or start one "
                    "with `firsttoken worker --queues chat`",
                    retry_after_ms=self._no_worker_retry_ms(),
                )
            else:
                return
        else:
            settings = self.gw.settings
            idle = settings.stream_idle_timeout_s
            verdict = "alive"
            if state.worker is not None and self.gw.beats_trusted(now):
                verdict = owner_verdict(
                    state.worker,
                    self.gw.chat_beats,
                    checked_at=self.gw.beats_checked_at,
                    lost_s=settings.worker_lost_s,
                    quiet_s=now - state.last_seen,
                    min_quiet_s=settings.worker_heartbeat_s,
                )
                # Silence while a dead worker's chat changes hands is no stall: the idle
                # deadline waits out the loss and the takeover.
                idle = max(idle, settings.worker_lost_s + TAKEOVER_GRACE_S)
            if verdict == "wait":
                return
            if verdict == "give_up":
                exc = EngineError(
                    "the chat worker answering this chat stopped (no heartbeat for "
                    f"{settings.worker_lost_s:g}s) and no other worker took it over; please retry"
                )
                self._record_lost(job)
            elif now - state.last_seen < idle:
                return
            else:
                exc = EngineError(
                    f"the worker stopped sending for {idle:g}s (it may have crashed); please retry"
                )
        state.finished = True
        self.send_error(state.chat_id, exc)
        # Not ended: the job is cancelled, so a worker that claims it late drops it.
        self.gw.spawn(self.stop_job(job, ended=False))

    def _no_worker_retry_ms(self) -> int:
        # A worker starting now is counted within a heartbeat.
        return max(1000, int(self.gw.settings.worker_heartbeat_s * 1000))

    def _requeue_if_lost(self, job: Job, message: str) -> None:
        gw = self.gw
        job.requeue_at += gw.settings.worker_lost_s + REQUEUE_GRACE_S
        queue, replay = gw.keys.queue_list(CHAT_QUEUE), gw.keys.replay_stream(job.job_id)
        gw.spawn(requeue_if_lost(gw.redis, queue, replay, job.job_id, message))

    def _record_lost(self, job: Job) -> None:
        """The usage row of a chat whose worker died, by the gateway that admitted it."""
        feed = job.feed
        if feed.admission is None or feed.payload is None or feed.lost:
            return
        feed.lost = True
        chat = LostChat(model=feed.model, prompt_tokens=feed.admission.prompt_estimate)
        self.gw.spawn(record_lost_chat(self.gw, feed.payload, chat, job.state.first_sent_at))
