"""The OpenAI door: `POST /v1/chat/completions`, for every client that speaks OpenAI's Chat
Completions API (the official SDKs, LiteLLM, `vllm bench serve`, ...).

A request is one chat on the path the websocket's chats take (gateway/jobs.py's JobOwner:
admission, the admit+enqueue script, the relay, settlement, the watchdog); this module only
turns the body into a chat frame (gateway/openai_protocol.py) and the relayed frames into
server-sent events or one `chat.completion`. The response starts when the first frame arrives,
so an error before the first token still gets its own status (504 for a queue timeout), and the
time to the first token is known for the `x-firsttoken-ttft-ms` header. A client that goes
away aborts the job and its engine request, as a websocket disconnect does.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any, cast

import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from gateway.auth import Principal, key_from_request
from gateway.eager import Rest, start_eagerly
from gateway.httpio import error_response, read_body
from gateway.jobs import Job, JobOwner, SessionHost
from gateway.openai_protocol import (
    SSE_DONE,
    ChunkEncoder,
    InvalidParameter,
    ParsedRequest,
    UnknownModel,
    completion,
    exception_reply,
    frame_reply,
    parse_chat_request,
    sse_error,
)
from gateway.state import Gateway
from shared import tracing
from shared.errors import FirstTokenError, InvalidRequest
from shared.protocol import AUTO_MODEL
from shared.tracing.context import from_headers

log = logging.getLogger(__name__)

# The request's one chat on its JobOwner (the id the relayed frames carry).
CHAT_ID = "c"


class HttpChat(JobOwner):
    """One HTTP request's chat: relayed frames wait in a queue for the response task; None in
    the queue means the client went away, a Rest the end of a write that had to wait.

    Once a stream has begun, a token frame is written as an event from the call that relays it
    when nothing is queued or being written (`eager`), as the websocket does (gateway/eager.py):
    no pass of the event loop per token."""

    door = "openai"

    def __init__(self, gw: SessionHost, principal: Principal) -> None:
        super().__init__(gw, principal)
        self.frames: asyncio.Queue[str | Rest | None] = asyncio.Queue()
        self.eager: Callable[[str], bool] | None = None

    def send(self, text: str) -> None:
        eager = self.eager
        if eager is None or not self.frames.empty() or not eager(text):
            self.frames.put_nowait(text)


async def chat_completions(request: Request) -> Response:
    received = time.time()  # the chat's first timing point: its body, key and checks count
    gw: Gateway = request.app.state.gateway
    settings = gw.settings
    try:
        # The body first, whatever comes next: a client still sending cannot read a reply.
        body, size = await read_body(request, settings.max_frame_bytes)
        principal = await gw.auth.authenticate(key_from_request(request))
        if size > settings.max_frame_bytes:
            raise InvalidParameter(
                f"the request body is {size} bytes; the limit is {settings.max_frame_bytes}"
            )
        parsed = parse_chat_request(
            body,
            chat_id=CHAT_ID,
            max_bytes=settings.max_frame_bytes,
            max_messages=settings.max_messages,
        )
        model = parsed.frame.model
        if model != AUTO_MODEL:
            try:
                gw.models.get(model)
            except InvalidRequest as exc:
                raise UnknownModel(exc.message) from None
        chat = HttpChat(gw, principal)
        if tracing.on:
            chat.client_trace = from_headers(request.headers)
        job, _ = await chat.open_job(parsed.frame, received)
    except ClientDisconnect:
        return Response(status_code=400)  # nobody is there to read it
    except FirstTokenError as exc:
        reply = exception_reply(exc)
        gw.metrics.errors.labels(str(reply.body["error"]["code"])).inc()
        return error_response(reply)
    return CompletionResponse(chat, job, parsed)


async def _watch_disconnect(receive: Receive, frames: asyncio.Queue[str | Rest | None]) -> None:
    while True:
        message: Message = await receive()
        if message["type"] == "http.disconnect":
            frames.put_nowait(None)
            return


class CompletionResponse(Response):
    """Relays one job's frames as a streamed or a whole answer."""

    def __init__(self, chat: HttpChat, job: Job, parsed: ParsedRequest) -> None:
        self.chat = chat
        self.job = job
        self.parsed = parsed
        self.completion_id = f"chatcmpl-{job.job_id}"
        self.created = int(time.time())
        self.model = parsed.frame.model or ""
        # Streaming state, shared by the response task and the eager writes.
        self._busy = False  # the response task is inside a write
        self._first = True  # the next event is the first (it names the role)
        self._started = False  # the stream's response has begun (headers sent)
        self._asgi_send: Send
        self._encoder: ChunkEncoder

    def _ttft_headers(self) -> list[tuple[bytes, bytes]]:
        state = self.job.state
        if state.first_sent_at is None:
            return []
        ms = (state.first_sent_at - state.received_at) * 1000
        return [(b"x-firsttoken-ttft-ms", f"{ms:.1f}".encode())]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        frames = self.chat.frames
        watcher = asyncio.create_task(_watch_disconnect(receive, frames))
        try:
            if self.parsed.stream:
                await self._stream(send)
            else:
                await self._whole(send)
        except OSError:
            pass  # the client went away mid-write; the job is aborted below
        finally:
            self.chat.eager = None
            watcher.cancel()
            while not frames.empty():  # unsent when the response ended
                item = frames.get_nowait()
                if isinstance(item, Rest):
                    item.close()
            if not self.job.state.finished:
                # The client gave up: stop the worker and abort the engine request, as on a
                # websocket disconnect (a spawned task: this one may be being cancelled).
                self.chat.gw.spawn(self.chat.stop_job(self.job, ended=False))

    async def _send_error(self, send: Send, frame: dict[str, Any]) -> None:
        reply = frame_reply(frame)
        body = orjson.dumps(reply.body)
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ]
        if reply.retry_after_s is not None:
            headers.append((b"retry-after", str(reply.retry_after_s).encode()))
        await send({"type": "http.response.start", "status": reply.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    def _write_now(self, text: str) -> bool:
        """Write a token frame's event now (the chat's `eager`); False: queue it instead."""
        if self._busy:
            return False
        frame = orjson.loads(text)
        if frame.get("type") != "token":
            return False  # the end of the answer: the response task writes it, in order
        return self._write_token(frame["text"])

    def _write_token(self, token: str) -> bool:
        """Write one token's event now (see _write_now)."""
        body = self._token(token)
        try:
            # Starlette's and uvicorn's `send` are coroutine functions.
            message = {"type": "http.response.body", "body": body, "more_body": True}
            rest = start_eagerly(cast(Coroutine[Any, Any, None], self._asgi_send(message)))
        except Exception:  # noqa: BLE001 - the client is gone; its disconnect ends the response
            return True
        if rest is not None:  # flow control: the response task finishes it before the next
            self.chat.frames.put_nowait(rest)
        return True

    def _token(self, text: str) -> bytes:
        body = self._encoder.token(text, first=self._first)
        self._first = False
        return body

    async def _end(self, frame: dict[str, Any]) -> bytes:
        """The events that end a stream: the final chunk (usage) and [DONE], or the error.
        A coroutine so that a door can store the answer first (gateway/responses.py)."""
        if frame.get("type") == "error":
            return sse_error(frame_reply(frame))
        events = [self._encoder.final(frame, first=self._first)]
        if self.parsed.include_usage:
            events.append(self._encoder.usage(frame))
        events.append(SSE_DONE)
        return b"".join(events)

    async def _write(self, send: Send, body: bytes, *, more: bool) -> None:
        self._busy = True
        try:
            await send({"type": "http.response.body", "body": body, "more_body": more})
        finally:
            self._busy = False

    def _begin(self, send: Send) -> Message:
        """The stream's start (its encoder, and the `http.response.start` to send)."""
        self._asgi_send = send
        self._started = True
        # The model that answers, as the worker's `started` named it before the first token
        # (`auto` routed): every chunk names that one (issue 42).
        model = self.job.state.model or self.model
        self._encoder = ChunkEncoder(self.completion_id, self.created, model)
        headers = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no"),
            *self._ttft_headers(),
        ]
        return {"type": "http.response.start", "status": 200, "headers": headers}

    def _start_now(self, text: str) -> bool:
        """The chat's `eager` before the stream has begun: the first token starts the response
        and is written from the call that relays it, as every later token is (issue 43: a
        pass of the event loop less before the client's first token, which in a burst waited
        behind every other ready callback). Anything else is queued (an error has its own
        status); so is the token when the start had to wait (then behind the start's rest)."""
        frame = orjson.loads(text)
        if frame.get("type") != "token":
            return False
        send = self._asgi_send
        start = self._begin(send)
        self.chat.eager = self._write_now
        try:
            rest = start_eagerly(cast(Coroutine[Any, Any, None], send(start)))
        except Exception:  # noqa: BLE001 - the client is gone; its disconnect ends the response
            return True
        if rest is not None:
            self.chat.frames.put_nowait(rest)
            return False
        return self._write_token(frame["text"])  # parsed once: the first token's path

    async def _stream(self, send: Send) -> None:
        frames = self.chat.frames
        self._asgi_send = send
        self.chat.eager = self._start_now
        item: str | Rest | None = await frames.get()
        frame: dict[str, Any] | None = None
        if not self._started:  # the first frame was queued: not a token written eagerly
            self.chat.eager = None
            if not isinstance(item, str):
                return
            frame = orjson.loads(item)
            assert frame is not None
            if frame.get("type") == "error":
                await self._send_error(send, frame)
                return
            await send(self._begin(send))
            item = None
        out: list[bytes] = []  # whatever arrived meanwhile goes out in one write
        taken = self._started and frame is None  # `item` is the next one, yet to be handled
        while True:
            if frame is not None:
                if frame.get("type") == "token":
                    out.append(self._token(frame["text"]))
                elif frame.get("type") in ("done", "error"):
                    self.chat.eager = None
                    out.append(await self._end(frame))
                    await self._write(send, b"".join(out), more=False)
                    return
                frame = None
            if taken:
                taken = False
            elif frames.empty():
                if out:
                    await self._write(send, b"".join(out), more=True)
                    out = []
                    if not frames.empty():
                        continue
                self.chat.eager = self._write_now
                item = await frames.get()
            else:
                item = frames.get_nowait()
            if item is None:
                return
            if isinstance(item, Rest):
                if out:
                    await self._write(send, b"".join(out), more=True)
                    out = []
                self._busy = True
                try:
                    await item
                finally:
                    self._busy = False
                frame = None
                continue
            frame = orjson.loads(item)

    async def _whole_body(self, text: str, frame: dict[str, Any]) -> bytes:
        """The body of a whole answer, from its text and `done` frame."""
        return orjson.dumps(completion(self.completion_id, self.created, self.model, text, frame))

    async def _whole(self, send: Send) -> None:
        frames = self.chat.frames
        texts: list[str] = []
        while True:
            text = await frames.get()
            if not isinstance(text, str):  # None: the client went away (no Rest: not eager)
                return
            frame = orjson.loads(text)
            kind = frame.get("type")
            if kind == "token":
                texts.append(frame["text"])
            elif kind == "error":
                await self._send_error(send, frame)
                return
            elif kind == "done":
                body = await self._whole_body("".join(texts), frame)
                headers = [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    *self._ttft_headers(),
                ]
                await send({"type": "http.response.start", "status": 200, "headers": headers})
                await send({"type": "http.response.body", "body": body})
                return
