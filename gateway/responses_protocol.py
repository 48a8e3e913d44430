"""OpenAI Responses API shapes for the `/v1/responses` door (gateway/responses.py). Pure: no
I/O, no clock.

In: a `POST /v1/responses` body, validated as strictly as the Chat Completions door's
(gateway/openai_protocol.py: unknown fields and parameters this stack does not serve are refused
with a 400 naming them), and turned into the websocket's :class:`~shared.protocol.ChatFrame`.
A parameter sent at its no-op value (`tools: []`, `include: []`, `truncation: "disabled"`, a
plain-text `text.format`) asks for nothing, and is accepted: the Agents SDK sends those.
Out: the `response` object, its typed server-sent events with their `sequence_number`, and the
record a stored response is kept as.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson
from pydantic import Field, ValidationError

from gateway.openai_protocol import ErrorReply, extras
from gateway.openai_request import (
    InvalidParameter,
    Strict,
    describe,
    names,
    parse_json_object,
    parse_messages,
)
from shared.protocol import ChatFrame, Message
from shared.tags import MetadataField, UserField

# Refused whatever their value (besides null): each changes what the answer is or how it is run.
UNSUPPORTED_PARAMETERS = frozenset(
    {
        "background",
        "context_management",
        "conversation",
        "max_tool_calls",
        "prompt",
        "prompt_cache_key",
        "prompt_cache_options",
        "prompt_cache_retention",
        "reasoning",
        "service_tier",
        "stream_options",
        "top_logprobs",
        "top_p",
    }
)


def _is_noop(name: str, value: Any) -> bool:
    """A parameter sent at the value that asks for nothing (accepted, as if absent)."""
    if value is None:
        return True
    if name in ("tools", "include"):
        return bool(value == [])
    if name == "tool_choice":
        return value in ("auto", "none")
    if name == "parallel_tool_calls":
        return isinstance(value, bool)  # without tools it means nothing
    if name == "truncation":
        return bool(value == "disabled")
    if name == "text":
        return bool(value == {} or value == {"format": {"type": "text"}})
    return False


# Accepted at their no-op value only (see _is_noop).
NOOP_PARAMETERS = frozenset(
    {"include", "parallel_tool_calls", "text", "tool_choice", "tools", "truncation"}
)

# Text parts: what a client writes, and what an earlier response's output message holds.
_TEXT_PARTS = frozenset({"input_text", "output_text"})
_PART_FIELDS = frozenset({"type", "text", "annotations", "logprobs"})
# An earlier response's output message, sent back as input, carries these too.
_ITEM_FIELDS = frozenset({"type", "role", "content", "id", "status"})


class UnknownResponse(InvalidParameter):
    """No stored response by this id for this tenant: 404 (another tenant's reads the same)."""


class FirstTokenOptions(Strict):
    """firsttoken's own request fields (an SDK sends them with `extra_body`)."""

    cache: bool = True


class ResponsesRequest(Strict):
    model: str = Field(min_length=1, max_length=128)
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    previous_response_id: str | None = Field(None, min_length=1, max_length=64)
    stream: bool | None = None
    store: bool | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | int | None = Field(None, ge=0, le=2)
    user: UserField | None = None
    safety_identifier: UserField | None = None
    metadata: MetadataField = None
    x_firsttoken: FirstTokenOptions | None = None


@dataclass(slots=True)
class ParsedResponses:
    """A validated request: the turn's messages, and what the response object echoes."""

    model: str
    messages: list[Message]  # instructions (as system) first, then the input items
    stream: bool
    store: bool
    cache: bool
    previous_response_id: str | None
    instructions: str | None
    max_output_tokens: int | None
    temperature: float | None
    user: str | None
    metadata: dict[str, str] | None = field(default=None)


def _text(value: object, where: str) -> str:
    """An input item's content: a string, or a list of input_text/output_text parts (joined)."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise InvalidParameter(
            f"{where}.content must be a string or a list of text parts, not {type(value).__name__}",
            f"{where}.content",
        )
    texts = []
    for i, part in enumerate(value):
        kind = part.get("type") if isinstance(part, dict) else type(part).__name__
        if kind not in _TEXT_PARTS:
            raise InvalidParameter(
                f"{where}.content[{i}]: content of type {kind!r} is not supported; firsttoken "
                "reads text only (input_text, output_text)",
                f"{where}.content",
            )
        assert isinstance(part, dict)
        if set(part) - _PART_FIELDS or not isinstance(part.get("text"), str):
            raise InvalidParameter(
                f"{where}.content[{i}]: a text part is {{'type': {kind!r}, 'text': str}}",
                f"{where}.content",
            )
        texts.append(part["text"])
    return "".join(texts)


def input_messages(value: str | list[dict[str, Any]]) -> list[Message]:
    """`input` as chat messages: a string is one user message; a list holds message items."""
    if isinstance(value, str):
        return [Message(role="user", content=value)]
    if not value:
        raise InvalidParameter("input must hold at least one item", "input")
    for i, item in enumerate(value):
        kind = item.get("type", "message")
        if kind != "message":
            raise InvalidParameter(
                f"input[{i}]: items of type {kind!r} are not supported; firsttoken reads "
                "message items only (no tools, no reasoning items)",
                f"input[{i}].type",
            )
    return parse_messages(value, name="input", fields=_ITEM_FIELDS, content=_text)


def parse_responses_request(body: bytes, *, max_bytes: int, max_messages: int) -> ParsedResponses:
    """Validate a `POST /v1/responses` body, or raise InvalidParameter naming the parameter at
    fault."""
    data = parse_json_object(body, max_bytes=max_bytes)
    unsupported = [
        k
        for k, v in data.items()
        if (k in UNSUPPORTED_PARAMETERS and v is not None)
        or (k in NOOP_PARAMETERS and not _is_noop(k, v))
    ]
    if unsupported:
        raise InvalidParameter(
            f"unsupported parameter(s): {names(unsupported)}; firsttoken does not serve them",
            sorted(unsupported)[0],
        )
    known = ResponsesRequest.model_fields
    unknown = [
        k for k in data if k not in known and k not in UNSUPPORTED_PARAMETERS | NOOP_PARAMETERS
    ]
    if unknown:
        raise InvalidParameter(f"unknown parameter(s): {names(unknown)}", sorted(unknown)[0])
    fields = {k: v for k, v in data.items() if k in known}
    raw_input = fields.get("input")
    if isinstance(raw_input, list) and len(raw_input) > max_messages:
        raise InvalidParameter(
            f"too many input items: {len(raw_input)}; the limit is {max_messages}", "input"
        )
    try:
        req = ResponsesRequest.model_validate(fields)
    except ValidationError as exc:
        message, param = describe(exc)
        raise InvalidParameter(f"invalid request: {message}", param) from None
    store = True if req.store is None else req.store
    if req.previous_response_id is not None and not store:
        # The server-kept conversation records every turn it answers; a turn that is not
        # stored would still be in the history of the next.
        raise InvalidParameter(
            "store: false with previous_response_id is not supported: a continued "
            "conversation stores every turn",
            "store",
        )
    messages = input_messages(req.input)
    if req.instructions:
        messages.insert(0, Message(role="system", content=req.instructions))
    return ParsedResponses(
        model=req.model,
        messages=messages,
        stream=bool(req.stream),
        store=store,
        cache=(req.x_firsttoken or FirstTokenOptions()).cache,
        previous_response_id=req.previous_response_id,
        instructions=req.instructions,
        max_output_tokens=req.max_output_tokens,
        temperature=None if req.temperature is None else float(req.temperature),
        user=req.safety_identifier or req.user,
        metadata=req.metadata,
    )


def chat_frame(
    parsed: ParsedResponses, *, chat_id: str, conversation_id: str | None, cache: bool
) -> ChatFrame:
    """The turn as the websocket's chat frame (conversation: "new", a stored one's id, or
    none)."""
    try:
        return ChatFrame(
            type="chat",
            id=chat_id,
            messages=parsed.messages,
            model=parsed.model,
            max_tokens=parsed.max_output_tokens,
            temperature=parsed.temperature,
            cache=cache,
            conversation_id=conversation_id,
            user=parsed.user,
            tags=parsed.metadata,
        )
    except ValidationError as exc:
        message, param = describe(exc)
        raise InvalidParameter(f"invalid request: {message}", param) from None


# --- the response object --------------------------------------------------------------------


@dataclass(slots=True)
class ResponseHead:
    """What a response object says besides its output: fixed when the request is admitted."""

    id: str
    created_at: int
    model: str
    parsed: ParsedResponses
    item_id: str  # the output message's id


def usage(done: dict[str, Any]) -> dict[str, Any]:
    raw = done.get("usage") or {}
    prompt = int(raw.get("prompt_tokens", 0))
    completion = int(raw.get("completion_tokens", 0))
    return {
        "input_tokens": prompt,
        # cache_write_tokens: newer SDKs require it; the engines here do not report it.
        "input_tokens_details": {
            "cached_tokens": int(raw.get("cached_prompt_tokens", 0)),
            "cache_write_tokens": 0,
        },
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + completion,
    }


def status_of(done: dict[str, Any]) -> str:
    """`completed`, or `incomplete` where the answer stopped at max_output_tokens."""
    return "incomplete" if done.get("finish_reason") == "length" else "completed"


def _part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _message(head: ResponseHead, status: str, parts: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "id": head.item_id,
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": parts,
    }


# A response object's `error.code` is one of OpenAI's closed set; the `error` event before
# `response.failed` carries firsttoken's own code (shared/errors.py).
_RESPONSE_ERROR_CODES = {"rate_limited": "rate_limit_exceeded", "invalid_request": "invalid_prompt"}


def response_object(
    head: ResponseHead,
    status: str,
    *,
    text: str | None = None,
    done: dict[str, Any] | None = None,
    error: ErrorReply | None = None,
) -> dict[str, Any]:
    """The `response` object: in progress (no text), finished (text and `done`) or failed."""
    p = head.parsed
    output = [] if text is None else [_message(head, "completed", [_part(text)])]
    out: dict[str, Any] = {
        "id": head.id,
        "object": "response",
        "created_at": head.created_at,
        "status": status,
        "error": None,
        "incomplete_details": None,
        "instructions": p.instructions,
        "max_output_tokens": p.max_output_tokens,
        "model": str((done or {}).get("model") or head.model),
        "output": output,
        "parallel_tool_calls": False,
        "previous_response_id": p.previous_response_id,
        "store": p.store,
        "temperature": p.temperature,
        "text": {"format": {"type": "text"}},
        "tool_choice": "auto",
        "tools": [],
        "truncation": "disabled",
        "usage": None,
        "user": p.user,
        "metadata": p.metadata or {},
    }
    if status == "incomplete":
        out["incomplete_details"] = {"reason": "max_output_tokens"}
    if done is not None:
        out["usage"] = usage(done)
        out["x_firsttoken"] = extras(done)
    if error is not None:
        err = error.body["error"]
        code = _RESPONSE_ERROR_CODES.get(err["code"], "server_error")
        out["error"] = {"code": code, "message": err["message"]}
    return out


def stored_record(tenant_id: str, conversation_id: str | None, response: dict[str, Any]) -> bytes:
    """What Redis keeps of a stored response: its owner, its conversation and the object."""
    return orjson.dumps(
        {"tenant_id": tenant_id, "conversation_id": conversation_id, "response": response}
    )


@dataclass(slots=True)
class StoredResponse:
    tenant_id: str
    conversation_id: str | None
    response: dict[str, Any]


def load_record(raw: bytes | str | None) -> StoredResponse | None:
    """A stored record, or None (absent, or unreadable: treated as absent)."""
    if raw is None:
        return None
    try:
        data = orjson.loads(raw)
        return StoredResponse(
            str(data["tenant_id"]), data.get("conversation_id"), dict(data["response"])
        )
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return None


# --- server-sent events ---------------------------------------------------------------------


class EventEncoder:
    """One response's typed events, numbered in order. A delta's event is a fixed prefix, the
    JSON-encoded text and its sequence number: one small encode per token, no dict."""

    __slots__ = ("_delta_prefix", "_head", "seq", "texts")

    def __init__(self, head: ResponseHead) -> None:
        self._head = head
        self.seq = 0
        self.texts: list[str] = []
        data = {
            "type": "response.output_text.delta",
            "item_id": head.item_id,
            "output_index": 0,
            "content_index": 0,
            "logprobs": [],
        }
        self._delta_prefix = (
            b"event: response.output_text.delta\ndata: " + orjson.dumps(data)[:-1] + b',"delta":'
        )

    def _event(self, kind: str, **data: Any) -> bytes:
        body = orjson.dumps({"type": kind, **data, "sequence_number": self.seq})
        self.seq += 1
        return b"event: " + kind.encode() + b"\ndata: " + body + b"\n\n"

    def start(self) -> bytes:
        """created, in_progress, the message item and its text part added."""
        head = self._head
        response = response_object(head, "in_progress")
        where = {"item_id": head.item_id, "output_index": 0, "content_index": 0}
        return b"".join(
            (
                self._event("response.created", response=response),
                self._event("response.in_progress", response=response),
                self._event(
                    "response.output_item.added",
                    output_index=0,
                    item=_message(head, "in_progress", []),
                ),
                self._event("response.content_part.added", **where, part=_part("")),
            )
        )

    def delta(self, text: str) -> bytes:
        self.texts.append(text)
        body = self._delta_prefix + orjson.dumps(text) + b',"sequence_number":'
        body += str(self.seq).encode() + b"}\n\n"
        self.seq += 1
        return body

    def finish(self, response: dict[str, Any]) -> bytes:
        """The text, part and item done, then `response.completed` (or `.incomplete`)."""
        head = self._head
        text = "".join(self.texts)
        where = {"item_id": head.item_id, "output_index": 0, "content_index": 0}
        return b"".join(
            (
                self._event("response.output_text.done", **where, text=text, logprobs=[]),
                self._event("response.content_part.done", **where, part=_part(text)),
                self._event(
                    "response.output_item.done",
                    output_index=0,
                    item=_message(head, "completed", [_part(text)]),
                ),
                self._event(f"response.{response['status']}", response=response),
            )
        )

    def failed(self, reply: ErrorReply, response: dict[str, Any]) -> bytes:
        """A failure after the stream began: the `error` event, then `response.failed`."""
        err = reply.body["error"]
        return self._event(
            "error", code=err["code"], message=err["message"], param=err["param"]
        ) + self._event("response.failed", response=response)
