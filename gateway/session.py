"""One websocket connection: reads client frames, starts and cancels jobs, writes frames.

A frame is written from the call that sends it when nothing is queued or being written (the
common case: see gateway/eager.py); otherwise it waits in a queue for the writer task. So the
pub/sub reader that fans tokens out never waits on one slow client, and frames keep their order.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Coroutine
from typing import Any, Protocol

from redis.asyncio import Redis
from starlette.websockets import WebSocket, WebSocketDisconnect

from gateway.admit import admit_chat, check_new_chat
from gateway.auth import Principal
from gateway.eager import Rest, start_eagerly
from gateway.metrics import GatewayMetrics
from gateway.ratelimit import Admission, Enqueue, RateLimiter
from gateway.relay import Relay
from gateway.relaystate import RelayState, Step
from shared.errors import (
    Cancelled,
    DeadlineExceeded,
    EngineError,
    FirstTokenError,
    InvalidRequest,
    Overloaded,
    error_frame,
)
from shared.keys import CHAT_QUEUE, CHAT_TASK, Keys
from shared.limits import charged_without_usage
from shared.modeltable import ModelTable
from shared.protocol import (
    CancelFrame,
    ChatFrame,
    PingFrame,
    ResumeFrame,
    dumps,
    encode_accepted,
    encode_pong,
    frame_id,
    parse_client_frame,
)
from shared.settings import Settings
from shared.tasks import ChatJob, new_id, task_message

log = logging.getLogger(__name__)


class SessionHost(Protocol):
    """What a session uses of its gateway process (gateway/state.py's Gateway, which imports
    this module: the session only sees this shape of it)."""

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
    """A chat this connection is relaying."""

    __slots__ = ("admission", "channel", "deadline_at", "job_id", "session", "state", "used")

    def __init__(self, session: Session, job_id: str, state: RelayState, deadline_at: float):
        self.session = session
        self.job_id = job_id
        self.channel = session.gw.keys.job_channel(job_id)
        self.state = state
        self.deadline_at = deadline_at
        # Rate-limit reservation, settled when the job ends; `used` is the worker's exact
        # token count once its `done` frame has been relayed.
        self.admission: Admission | None = None
        self.used: int | None = None

    def on_message(self, message: str) -> None:
        self.session.apply(self, self.state.feed(message, time.time()))


class Session:
    def __init__(self, gw: SessionHost, ws: WebSocket, principal: Principal) -> None:
        self.gw = gw
        self.ws = ws
        self.principal = principal
        self.jobs: dict[str, Job] = {}
        # Frames for the writer task: text, the rest of a send that had to wait, or None (end).
        self._out: asyncio.Queue[str | Rest | None] = asyncio.Queue()
        self._writing = False  # the writer task is inside a send
        self.last_active = time.monotonic()
        self.close_code: int | None = None  # set to close the socket once queued frames are out

    # --- outbound ---------------------------------------------------------------------
    def send(self, text: str) -> None:
        """Write one frame now if the socket is free, else queue it behind the others."""
        if self._writing or not self._out.empty() or self.close_code is not None:
            self._out.put_nowait(text)
            return
        try:
            rest = start_eagerly(self.ws.send_text(text))
        except Exception as exc:  # noqa: BLE001 - the socket is gone; the reader ends the session
            log.debug("websocket send failed: %r", exc)
            return
        if rest is not None:  # flow control: the writer task finishes it before the next frame
            self._out.put_nowait(rest)

    def send_error(self, chat_id: str | None, exc: BaseException) -> None:
        frame = error_frame(chat_id, exc)
        self.gw.metrics.errors.labels(frame["code"]).inc()
        self.send(dumps(frame))

    async def _write(self) -> None:
        try:
            while True:
                item = await self._out.get()
                if item is None:
                    if self.close_code is not None:
                        with contextlib.suppress(Exception):
                            await self.ws.close(self.close_code)
                    return
                self._writing = True
                try:
                    if isinstance(item, Rest):
                        await item
                    else:
                        await self.ws.send_text(item)
                finally:
                    self._writing = False
        finally:
            while not self._out.empty():  # unsent when the connection ended
                item = self._out.get_nowait()
                if isinstance(item, Rest):
                    item.close()

    def close_with(self, exc: FirstTokenError, code: int) -> None:
        """End the connection from outside its reader (idle sweep, revoked key)."""
        if self.close_code is not None:
            return
        self.send_error(None, exc)
        self.close_code = code
        self._out.put_nowait(None)

    def close_idle(self) -> None:
        timeout = self.gw.settings.idle_timeout_s
        self.close_with(
            DeadlineExceeded(f"connection closed after {timeout:g}s without a frame"), 1001
        )

    # --- inbound ----------------------------------------------------------------------
    async def run(self) -> None:
        writer = asyncio.create_task(self._write())
        try:
            while True:
                msg = await self.ws.receive()
                if msg["type"] == "websocket.disconnect":
                    break
                self.last_active = time.monotonic()
                raw = msg.get("text")
                if raw is None:
                    raw = msg.get("bytes") or b""
                await self.handle(raw)
        except WebSocketDisconnect:
            pass
        finally:
            for job in list(self.jobs.values()):
                await self.stop_job(job, notify_worker=True)
            self._out.put_nowait(None)
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(writer, 1.0)
            writer.cancel()

    async def handle(self, raw: str | bytes) -> None:
        settings = self.gw.settings
        try:
            frame = parse_client_frame(
                raw, max_bytes=settings.max_frame_bytes, max_messages=settings.max_messages
            )
        except InvalidRequest as exc:
            self.send_error(frame_id(raw) if len(raw) <= settings.max_frame_bytes else None, exc)
            return
        try:
            if isinstance(frame, ChatFrame):
                await self.start_chat(frame)
            elif isinstance(frame, CancelFrame):
                await self.cancel_chat(frame.id)
            elif isinstance(frame, ResumeFrame):
                await self.resume(frame)
            elif isinstance(frame, PingFrame):
                self.send(encode_pong(frame.id))
        except FirstTokenError as exc:
            self.send_error(getattr(frame, "id", None), exc)
        except Exception as exc:
            log.exception("frame handling failed")
            self.send_error(getattr(frame, "id", None), exc)

    # --- chats ------------------------------------------------------------------------
    async def start_chat(self, frame: ChatFrame) -> None:
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
        self.send(encode_accepted(frame.id, job_id, conversation_id))

    async def cancel_chat(self, chat_id: str) -> None:
        job = self.jobs.get(chat_id)
        if job is None:
            raise InvalidRequest(f"no running chat with id {chat_id!r} on this connection")
        await self.stop_job(job, notify_worker=True)
        self.send_error(chat_id, Cancelled("the chat was cancelled by the client"))

    async def resume(self, frame: ResumeFrame) -> None:
        """Re-attach to a job started by the same API key, replaying from after_seq."""
        gw = self.gw
        check_new_chat(frame.id, self.jobs, gw.settings.max_streams_per_connection)
        owner = await gw.redis.get(gw.keys.job_owner(frame.job_id))
        if owner is None or owner != self.principal.key_id:
            raise InvalidRequest(f"no resumable job {frame.job_id!r} for this API key")
        state = RelayState(
            frame.id, time.time(), next_seq=frame.after_seq + 1, started=True, rename=True
        )
        state.last_seen = time.time()
        state.begin_repair()
        job = Job(self, frame.job_id, state, deadline_at=float("inf"))
        self.jobs[frame.id] = job
        gw.jobs[frame.job_id] = job
        await gw.relay.subscribe_confirmed(job.channel, job.on_message)
        self.send(encode_accepted(frame.id, frame.job_id))
        await self._repair(job)

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
