"""The path of one chat through the gateway, shared by every door (the websocket's
gateway/session.py and the OpenAI HTTP door's gateway/openai.py): admission, the workers-alive
check, subscribe before enqueue, the limiter's admit+enqueue script, the relay state and its
repair, settlement, cancellation and the watchdog's deadlines.

A door subclasses :class:`JobOwner` and says only how a frame reaches its client (`send`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Coroutine
from typing import Any, Protocol

from redis.asyncio import Redis

from gateway.admit import admit_chat
from gateway.auth import Principal
from gateway.metrics import GatewayMetrics
from gateway.ratelimit import Admission, Enqueue, RateLimiter
from gateway.relay import Relay
from gateway.relaystate import RelayState, Step
from shared.errors import DeadlineExceeded, EngineError, FirstTokenError, Overloaded, error_frame
from shared.keys import CHAT_QUEUE, CHAT_TASK, Keys
from shared.limits import charged_without_usage
from shared.modeltable import ModelTable
from shared.protocol import ChatFrame, dumps
from shared.settings import Settings
from shared.tasks import ChatJob, new_id, task_message

log = logging.getLogger(__name__)


class SessionHost(Protocol):
    """What a door uses of its gateway process (gateway/state.py's Gateway, which imports
    this module: the doors only see this shape of it)."""

    settings: Settings
    keys: Keys
    name: str
    redis: Redis
    relay: Relay
    limiter: RateLimiter
    metrics: GatewayMetrics
    jobs: dict[str, Job]

    @property
    def models(self) -> ModelTable: ...

    def chat_started(self) -> None: ...

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None: ...

    async def chat_workers_alive(self) -> bool: ...

    async def cancel_job(self, job_id: str) -> None: ...


class Job:
    """A chat a door is relaying."""

    __slots__ = ("admission", "channel", "deadline_at", "job_id", "owner", "state", "used")

    def __init__(self, owner: JobOwner, job_id: str, state: RelayState, deadline_at: float):
        self.owner = owner
        self.job_id = job_id
        self.channel = owner.gw.keys.job_channel(job_id)
        self.state = state
        self.deadline_at = deadline_at
        # Rate-limit reservation, settled when the job ends; `used` is the worker's exact
        # token count once its `done` frame has been relayed.
        self.admission: Admission | None = None
        self.used: int | None = None

    def on_message(self, message: str) -> None:
        self.owner.apply(self, self.state.feed(message, time.time()))


class JobOwner:
    """One client's running chats (a websocket connection, or one HTTP request) and
    everything that happens to them between admission and settlement."""

    def __init__(self, gw: SessionHost, principal: Principal) -> None:
        self.gw = gw
        self.principal = principal
        self.jobs: dict[str, Job] = {}
        self.last_active = time.monotonic()

    # --- what a door provides ---------------------------------------------------------
    def send(self, text: str) -> None:
        """Deliver one wire frame (JSON text: token, done or error) to the client."""
        raise NotImplementedError

    def send_error(self, chat_id: str | None, exc: BaseException) -> None:
        frame = error_frame(chat_id, exc)
        self.gw.metrics.errors.labels(frame["code"]).inc()
        self.send(dumps(frame))

    # --- the chat path ----------------------------------------------------------------
    async def open_job(self, frame: ChatFrame) -> tuple[Job, str | None]:
        """Admit a chat and enqueue it: the job relaying it and its conversation id. Raises
        the first rule it breaks; a refused chat never reaches the queue."""
        gw, settings = self.gw, self.gw.settings
        received = time.time()
        limits = self.principal.limits
        admitted = admit_chat(
            frame, running=self.jobs, rules=settings, models=gw.models, limits=limits
        )
        max_tokens, reserved = admitted.max_tokens, admitted.reserved
        new_conversation = admitted.new_conversation
        conversation_id = new_id() if new_conversation else frame.conversation_id
        if not await gw.chat_workers_alive():
            raise Overloaded(
                "no chat worker is running; start one with `firsttoken worker --queues chat`"
            )
        job_id = new_id()
        job = Job(
            self, job_id, RelayState(frame.id, received), received + settings.queue_deadline_s
        )
        self.jobs[frame.id] = job
        admission = None
        try:
            gw.relay.subscribe(job.channel, job.on_message)
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
                received_at=received,
                enqueued_at=enqueued,
                deadline_at=job.deadline_at,
            )
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
                ),
            )
            job.admission = admission
        except BaseException:
            self.jobs.pop(frame.id, None)
            gw.relay.unsubscribe(job.channel)
            if admission is not None:
                gw.limiter.settle(admission, 0)
            raise
        gw.jobs[job_id] = job
        gw.chat_started()
        return job, conversation_id

    def apply(self, job: Job, step: Step) -> None:
        """Carry out what the relay state decided for one message."""
        for text in step.frames:
            self.send(text)
        self.gw.metrics.chunks.inc(len(step.frames))
        if step.repair:
            self.gw.spawn(self._repair(job))
        if step.finished:
            if job.admission is not None:
                job.used = step.used
            self.gw.spawn(self.stop_job(job, notify_worker=False))

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

    async def stop_job(self, job: Job, *, notify_worker: bool) -> None:
        """Forget a job; when the client gave it up, tell the worker to stop and abort."""
        if self.jobs.get(job.state.chat_id) is job:
            del self.jobs[job.state.chat_id]
        self.gw.jobs.pop(job.job_id, None)
        job.state.finished = True
        self.last_active = time.monotonic()  # idle time counts from the last chat's end too
        self.gw.relay.unsubscribe(job.channel)
        if notify_worker:
            await self.gw.cancel_job(job.job_id)
        admission = job.admission
        if admission is not None and not admission.settled:
            # Every end path passes here (done, error, cancel, disconnect, watchdog), so the
            # stream slot is freed and the unused tokens refunded exactly once.
            if job.used is not None:
                charged = job.used
            else:
                charged = charged_without_usage(
                    admission.reserved,
                    admission.prompt_estimate,
                    started=job.state.started,
                    frames=job.state.next_seq,
                )
            self.gw.limiter.settle(admission, charged)

    def expire(self, job: Job, now: float) -> None:
        """Called by the gateway's watchdog: end a job whose worker missed a deadline."""
        state = job.state
        if state.finished:
            return
        exc: FirstTokenError
        if not state.started:
            if now < job.deadline_at:
                return
            exc = DeadlineExceeded(
                f"no chat worker picked the chat up within {self.gw.settings.queue_deadline_s:g}s;"
                " the service is overloaded, retry later"
            )
        else:
            idle = self.gw.settings.stream_idle_timeout_s
            if now - state.last_seen < idle:
                return
            exc = EngineError(
                f"the worker stopped sending for {idle:g}s (it may have crashed); please retry"
            )
        state.finished = True
        self.send_error(state.chat_id, exc)
        self.gw.spawn(self.stop_job(job, notify_worker=True))
