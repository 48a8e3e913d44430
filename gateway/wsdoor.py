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

from starlette.websockets import WebSocket, WebSocketDisconnect

from gateway.admit import check_new_chat
from gateway.auth import Principal
from gateway.eager import Rest, start_eagerly
from gateway.jobs import Job, JobOwner, SessionHost
from gateway.relaystate import RelayState
from shared import tracing
from shared.drafts import draft_scope
from shared.errors import Cancelled, DeadlineExceeded, FirstTokenError, InvalidRequest
from shared.protocol import (
    NEW_CONVERSATION,
    CancelFrame,
    ChatFrame,
    DraftFrame,
    PingFrame,
    ResumeFrame,
    encode_accepted,
    encode_pong,
    frame_id,
    parse_client_frame,
)
from shared.redis.client import unreachable_as_overloaded
from shared.tracing.context import from_headers

__all__ = ["Job", "Session", "SessionHost"]

log = logging.getLogger(__name__)


class Session(JobOwner):
    def __init__(self, gw: SessionHost, ws: WebSocket, principal: Principal) -> None:
        super().__init__(gw, principal)
        self.ws = ws
        # Frames for the writer task: text, the rest of a send that had to wait, or None (end).
        self._out: asyncio.Queue[str | Rest | None] = asyncio.Queue()
        self._writing = False  # the writer task is inside a send
        self.close_code: int | None = None  # set to close the socket once queued frames are out
        # Scope -> (fingerprint, text) of the last draft this socket sent in it (gateway/drafts.py).
        self._drafted: dict[str, tuple[int, str]] = {}
        if tracing.on:  # the upgrade request's trace context, for every chat of the socket
            self.client_trace = from_headers(ws.headers)

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
            # A disconnect gives up this socket's chats: each is cancelled unless another
            # socket of this process follows it (a resume), which then streams on.
            for job in list(self.jobs.values()):
                await self.stop_job(job, ended=False)
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
            elif isinstance(frame, DraftFrame):
                self.draft(frame)
        except FirstTokenError as exc:
            self.send_error(getattr(frame, "id", None), exc)
        except Exception as exc:
            log.exception("frame handling failed")
            self.send_error(getattr(frame, "id", None), exc)

    # --- chats ------------------------------------------------------------------------
    async def start_chat(self, frame: ChatFrame) -> None:
        if self._drafted:  # only a socket that sent drafts pays for this
            self._forget_drafts(frame.conversation_id)
        job, conversation_id = await self.open_job(frame)
        self.send(encode_accepted(frame.id, job.job_id, conversation_id))

    # --- drafts (issue 34): never answered, see shared/drafts.py --------------------------
    def draft(self, frame: DraftFrame) -> None:
        self.gw.drafts.submit(
            frame,
            tenant_id=self.principal.tenant_id,
            key_id=self.principal.key_id,
            connection=self.connection,
            chats_on_connection=len(self.jobs),
            sent=self._drafted,
        )

    def _forget_drafts(self, conversation_id: str | None) -> None:
        """The user pressed send: this conversation's drafts still queued are stale."""
        # A first message ("new", or no server history) was drafted in the socket's scope.
        if conversation_id == NEW_CONVERSATION:
            conversation_id = None
        scope = draft_scope(self.principal.key_id, conversation_id, self.connection)
        if self._drafted.pop(scope, None) is not None:
            self.gw.drafts.forget(scope)

    @property
    def connection(self) -> str:
        """This socket, among all gateways' (the scope of drafts without a conversation id)."""
        return f"{self.gw.name}:{id(self):x}"

    async def cancel_chat(self, chat_id: str) -> None:
        job = self.jobs.get(chat_id)
        if job is None:
            raise InvalidRequest(f"no running chat with id {chat_id!r} on this connection")
        await self.cancel(job)
        self.send_error(chat_id, Cancelled("the chat was cancelled by the client"))

    async def resume(self, frame: ResumeFrame) -> None:
        """Re-attach to a job started by the same API key, replaying from after_seq."""
        gw = self.gw
        check_new_chat(frame.id, self.jobs, gw.settings.max_streams_per_connection)
        with unreachable_as_overloaded("the job was not resumed"):
            owner = await gw.redis.get(gw.keys.job_owner(frame.job_id))
        if owner is None or owner != self.principal.key_id:
            raise InvalidRequest(f"no resumable job {frame.job_id!r} for this API key")
        state = RelayState(
            frame.id, time.time(), next_seq=frame.after_seq + 1, started=True, rename=True
        )
        state.last_seen = time.time()
        state.begin_repair()  # held until the replay stream is read: nothing lost between
        with unreachable_as_overloaded("the job was not resumed"):
            job = await self.follow(frame.id, frame.job_id, state)
        self.send(encode_accepted(frame.id, frame.job_id))
        await self._repair(job)
