"""The Responses API door: `POST /v1/responses`, `GET` and `DELETE /v1/responses/{id}` (issue 44),
for clients that speak OpenAI's Responses API (the official SDKs' `client.responses`, the
OpenAI Agents SDK).

A request is one chat on the path every door takes (gateway/jobs.py), relayed by the Chat
Completions door's response machinery (gateway/openai.py: the response starts with the first
frame, eager token writes, a disconnect aborts the engine request); this module adds the
Responses shapes (gateway/responses_protocol.py) and the stored responses.

A stored response (`store`, the default) is a Redis record (`Keys.response`: its tenant, its
conversation and the response object) that expires after FIRSTTOKEN_RESPONSES_TTL_S. Its turn
is in the websocket's server-kept conversation (issue 5: stored turns, sliding window, summary),
so `previous_response_id` continues that conversation and the client sends only the new input.
A conversation is one line of turns, not a tree: only its latest response (`Keys.response_head`)
can be continued, claimed atomically when the next turn is admitted and given back if that turn
fails, so two continuations of one response never mix their histories.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from gateway.auth import Principal, key_from_request
from gateway.httpio import error_response, read_body
from gateway.jobs import Job, SessionHost
from gateway.openai import CHAT_ID, CompletionResponse, HttpChat
from gateway.openai_protocol import (
    ErrorReply,
    ParsedRequest,
    UnknownModel,
    error_reply,
    exception_reply,
    frame_reply,
)
from gateway.openai_request import InvalidParameter
from gateway.responses_protocol import (
    EventEncoder,
    ResponseHead,
    StoredResponse,
    UnknownResponse,
    chat_frame,
    load_record,
    parse_responses_request,
    response_object,
    status_of,
    stored_record,
)
from gateway.state import Gateway
from shared import tracing
from shared.errors import FirstTokenError, InvalidRequest
from shared.protocol import AUTO_MODEL, NEW_CONVERSATION
from shared.redis import scripts
from shared.redis.client import unreachable_as_overloaded
from shared.tasks import new_id
from shared.tracing.context import from_headers

log = logging.getLogger(__name__)


class ResponsesChat(HttpChat):
    door = "responses"


class ResponseStore:
    """The stored responses of one gateway process (Redis records, see the module's doc)."""

    def __init__(self, gw: SessionHost) -> None:
        self.redis = gw.redis
        self.keys = gw.keys
        self.ttl_s = gw.settings.responses_ttl_s

    async def load(self, response_id: str, tenant_id: str, param: str | None) -> StoredResponse:
        """The tenant's stored response, or UnknownResponse (another tenant's reads as absent:
        its existence is not disclosed)."""
        with unreachable_as_overloaded("the stored response was not read"):
            raw = await self.redis.get(self.keys.response(response_id))
        record = load_record(raw)
        if record is None or record.tenant_id != tenant_id:
            raise UnknownResponse(f"no response with id {response_id[:80]!r} was found", param)
        return record

    async def move_head(self, conversation_id: str, old: str, new: str) -> bool:
        with unreachable_as_overloaded("the conversation was not continued"):
            # shared/redis/scripts/response_move_head.lua: only while the head is still `old`.
            moved = await scripts.run(
                self.redis,
                scripts.RESPONSE_MOVE_HEAD,
                [self.keys.response_head(conversation_id)],
                [old, new, self.ttl_s],
            )
        return bool(moved)

    async def save(self, response_id: str, record: bytes, conversation_id: str | None) -> None:
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.set(self.keys.response(response_id), record, ex=self.ttl_s)
            if conversation_id is not None:
                pipe.set(self.keys.response_head(conversation_id), response_id, ex=self.ttl_s)
            await pipe.execute()

    async def delete(self, response_id: str) -> None:
        with unreachable_as_overloaded("the response was not deleted"):
            await self.redis.delete(self.keys.response(response_id))


def _reply_for(exc: FirstTokenError) -> ErrorReply:
    """The Chat Completions door's translation, plus 404 for a response not found."""
    if isinstance(exc, UnknownResponse):
        return error_reply("not_found", exc.message, param=exc.param, status=404)
    return exception_reply(exc)


async def _principal(gw: Gateway, request: Request) -> Principal:
    return await gw.auth.authenticate(key_from_request(request))


async def create_response(request: Request) -> Response:
    gw: Gateway = request.app.state.gateway
    settings = gw.settings
    store = ResponseStore(gw)
    claimed: tuple[str, str] | None = None  # (conversation, previous response) of a claim
    response_id = f"resp_{new_id()}"
    try:
        # The body first, whatever comes next: a client still sending cannot read a reply.
        body, size = await read_body(request, settings.max_frame_bytes)
        principal = await _principal(gw, request)
        if size > settings.max_frame_bytes:
            raise InvalidParameter(
                f"the request body is {size} bytes; the limit is {settings.max_frame_bytes}"
            )
        parsed = parse_responses_request(
            body, max_bytes=settings.max_frame_bytes, max_messages=settings.max_messages
        )
        if parsed.model != AUTO_MODEL:
            try:
                gw.models.get(parsed.model)
            except InvalidRequest as exc:
                raise UnknownModel(exc.message) from None
        conversation_id: str | None = None
        previous = parsed.previous_response_id
        if previous is not None:
            record = await store.load(previous, principal.tenant_id, "previous_response_id")
            conversation_id = record.conversation_id
            if conversation_id is None:
                raise InvalidParameter(
                    f"response {previous!r} has no server-kept conversation to continue",
                    "previous_response_id",
                )
            if not await store.move_head(conversation_id, previous, response_id):
                raise InvalidParameter(
                    f"response {previous!r} is not the latest of its conversation: firsttoken "
                    "continues a conversation from its latest response only",
                    "previous_response_id",
                )
            claimed = (conversation_id, previous)
        elif parsed.store:
            # A turn answered from the cache is written to the conversation as any other
            # (workers/chat/run.py), and `done` names the conversation.
            conversation_id = NEW_CONVERSATION
        frame = chat_frame(
            parsed, chat_id=CHAT_ID, conversation_id=conversation_id, cache=parsed.cache
        )
        chat = ResponsesChat(gw, principal)
        if tracing.on:
            chat.client_trace = from_headers(request.headers)
        job, _ = await chat.open_job(frame)
    except ClientDisconnect:
        await _give_back(store, claimed, response_id)
        return Response(status_code=400)  # nobody is there to read it
    except FirstTokenError as exc:
        await _give_back(store, claimed, response_id)
        reply = _reply_for(exc)
        gw.metrics.errors.labels(str(reply.body["error"]["code"])).inc()
        return error_response(reply)
    except BaseException:
        await _give_back(store, claimed, response_id)
        raise
    head = ResponseHead(response_id, int(time.time()), parsed.model, parsed, f"msg_{job.job_id}")
    return ResponsesResponse(
        chat, job, ParsedRequest(frame, parsed.stream, False), head, store, claimed
    )


async def _give_back(store: ResponseStore, claimed: tuple[str, str] | None, new: str) -> None:
    """A continuation that failed: its previous response is the conversation's latest again."""
    if claimed is None:
        return
    conversation_id, previous = claimed
    try:
        await store.move_head(conversation_id, new, previous)
    except FirstTokenError:
        log.warning("conversation %s keeps head %s (Redis down)", conversation_id, new)


class ResponsesResponse(CompletionResponse):
    """One response, streamed as typed events or whole as a `response` object; stored (when
    asked) before its last event or its body is written, so a client may continue it at once."""

    def __init__(
        self,
        chat: ResponsesChat,
        job: Job,
        request: ParsedRequest,
        head: ResponseHead,
        store: ResponseStore,
        claimed: tuple[str, str] | None,
    ) -> None:
        super().__init__(chat, job, request)
        self.completion_id = head.id
        self.head = head
        self.store = store
        self.claimed = claimed
        self.kept = False  # the response was stored (or needs not be)
        self.events = EventEncoder(head)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if not self.kept and self.claimed is not None:
                # A spawned task: this one may be being cancelled.
                self.chat.gw.spawn(_give_back(self.store, self.claimed, self.head.id))

    async def _keep(self, response: dict[str, Any], done: dict[str, Any]) -> None:
        """Store the finished response (when asked) and make it its conversation's latest."""
        self.kept = True
        if not self.head.parsed.store:
            return
        conversation_id = done.get("conversation_id")
        record = stored_record(self.chat.principal.tenant_id, conversation_id, response)
        try:
            await self.store.save(self.head.id, record, conversation_id)
        except Exception as exc:  # noqa: BLE001 - the answer still reaches the client
            log.warning("response %s was not stored: %s", self.head.id, exc)

    def _token(self, text: str) -> bytes:
        if self._first:
            self._first = False
            return self.events.start() + self.events.delta(text)
        return self.events.delta(text)

    async def _end(self, frame: dict[str, Any]) -> bytes:
        start = self.events.start() if self._first else b""
        self._first = False
        if frame.get("type") == "error":
            reply = frame_reply(frame)
            failed = response_object(self.head, "failed", error=reply)
            return start + self.events.failed(reply, failed)
        text = "".join(self.events.texts)
        response = response_object(self.head, status_of(frame), text=text, done=frame)
        await self._keep(response, frame)
        return start + self.events.finish(response)

    async def _whole_body(self, text: str, frame: dict[str, Any]) -> bytes:
        response = response_object(self.head, status_of(frame), text=text, done=frame)
        await self._keep(response, frame)
        return orjson.dumps(response)


async def response_item(request: Request) -> Response:
    """`GET /v1/responses/{id}` (the stored response object) and `DELETE` (it is gone)."""
    gw: Gateway = request.app.state.gateway
    response_id = request.path_params["response_id"]
    store = ResponseStore(gw)
    try:
        principal = await _principal(gw, request)
        record = await store.load(response_id, principal.tenant_id, None)
        if request.method == "DELETE":
            await store.delete(response_id)
            body = {"id": response_id, "object": "response", "deleted": True}
        else:
            body = record.response
    except FirstTokenError as exc:
        return error_response(_reply_for(exc))
    return Response(orjson.dumps(body), media_type="application/json")
