"""OpenAI Chat Completions shapes for the HTTP door (gateway/openai.py). Pure: no I/O, no clock.

In: a request body, validated strictly (wrong types, unknown fields and the OpenAI parameters
this stack does not serve are refused with a 400 that names them, never ignored) and turned
into the websocket's :class:`~shared.protocol.ChatFrame`, so both doors run one chat path.
Out: `chat.completion.chunk` server-sent events, the `chat.completion` object, and errors as
``{"error": {"message", "type", "param", "code"}}`` with their HTTP status.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Literal

import orjson
from pydantic import Field, ValidationError

from gateway.openai_request import (
    InvalidParameter,
    Strict,
    describe,
    invalid,
    names,
    parse_json_object,
    parse_messages,
)
from shared.errors import ErrorCode, FirstTokenError, InvalidRequest
from shared.protocol import ChatFrame
from shared.tags import MetadataField, UserField

# OpenAI parameters a client may reasonably send that this stack cannot honour: refused by
# name, so a client never silently gets something other than what it asked for.
UNSUPPORTED_PARAMETERS = frozenset(
    {
        "audio",
        "frequency_penalty",
        "function_call",
        "functions",
        "logit_bias",
        "logprobs",
        "modalities",
        "parallel_tool_calls",
        "prediction",
        "presence_penalty",
        "reasoning_effort",
        "response_format",
        "seed",
        "service_tier",
        "stop",
        "store",
        "tool_choice",
        "tools",
        "top_logprobs",
        "top_p",
        "verbosity",
        "web_search_options",
    }
)

SSE_DONE = b"data: [DONE]\n\n"


class UnknownModel(InvalidRequest):
    """A model the table does not hold: 404 on the HTTP door (OpenAI's `model_not_found`)."""


class StreamOptions(Strict):
    include_usage: bool | None = None


class FirstTokenOptions(Strict):
    """firsttoken's own request fields (an SDK sends them with `extra_body`)."""

    cache: bool = True
    conversation_id: str | None = Field(None, min_length=1, max_length=64)


class ChatCompletionRequest(Strict):
    model: str = Field(min_length=1, max_length=128)
    messages: list[dict[str, Any]] = Field(min_length=1)
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    # strict mode refuses an int for a float; OpenAI clients send `temperature=1` freely.
    temperature: float | int | None = Field(None, ge=0, le=2)
    n: Literal[1] | None = None
    # Both land in the usage row only: `user` as its end_user, `metadata` as its tags.
    user: UserField | None = None
    metadata: MetadataField = None
    x_firsttoken: FirstTokenOptions | None = None


@dataclass(slots=True)
class ParsedRequest:
    frame: ChatFrame
    stream: bool
    include_usage: bool


def parse_chat_request(
    body: bytes, *, chat_id: str, max_bytes: int, max_messages: int
) -> ParsedRequest:
    """Validate a `POST /v1/chat/completions` body, or raise InvalidRequest naming the
    parameter at fault."""
    data = parse_json_object(body, max_bytes=max_bytes)
    unsupported = [k for k in data if k in UNSUPPORTED_PARAMETERS]
    if unsupported:
        raise invalid(
            f"unsupported parameter(s): {names(unsupported)}; firsttoken does not serve them",
            sorted(unsupported)[0],
        )
    unknown = [k for k in data if k not in ChatCompletionRequest.model_fields]
    if unknown:
        raise invalid(f"unknown parameter(s): {names(unknown)}", sorted(unknown)[0])
    messages = data.get("messages")
    if isinstance(messages, list) and len(messages) > max_messages:
        raise invalid(
            f"too many messages: {len(messages)}; the limit is {max_messages}", "messages"
        )
    try:
        req = ChatCompletionRequest.model_validate(data)
    except ValidationError as exc:
        message, param = describe(exc)
        raise invalid(f"invalid request: {message}", param) from None
    if req.max_tokens is not None and req.max_completion_tokens is not None:
        if req.max_tokens != req.max_completion_tokens:
            raise invalid(
                "max_tokens and max_completion_tokens differ; send one of them",
                "max_completion_tokens",
            )
    if req.stream_options is not None and not req.stream:
        raise invalid("stream_options is only allowed with stream: true", "stream_options")
    options = req.x_firsttoken or FirstTokenOptions(conversation_id=None)
    try:
        frame = ChatFrame(
            type="chat",
            id=chat_id,
            messages=parse_messages(req.messages),
            model=req.model,
            max_tokens=req.max_completion_tokens or req.max_tokens,
            temperature=None if req.temperature is None else float(req.temperature),
            cache=options.cache,
            conversation_id=options.conversation_id,
            user=req.user,
            tags=req.metadata,
        )
    except ValidationError as exc:
        message, param = describe(exc)
        raise invalid(f"invalid request: {message}", param) from None
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    return ParsedRequest(frame, bool(req.stream), include_usage)


# --- errors ---------------------------------------------------------------------------------

_STATUS = {
    ErrorCode.INVALID_REQUEST.value: 400,
    ErrorCode.INVALID_DRAFT.value: 400,
    ErrorCode.UNAUTHORIZED.value: 401,
    ErrorCode.RATE_LIMITED.value: 429,
    ErrorCode.OVERLOADED.value: 503,
    ErrorCode.TIMEOUT.value: 504,
    ErrorCode.ENGINE_ERROR.value: 502,
    # nginx's "client closed request": only a client that gave up can see it.
    ErrorCode.CANCELLED.value: 499,
    ErrorCode.INTERNAL.value: 500,
}
_TYPE = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    429: "rate_limit_error",
}
# Overloaded without a figure of its own: retry after a second.
DEFAULT_RETRY_AFTER_S = 1


def status_for(code: str) -> int:
    """The HTTP status of a wire error code (shared/errors.py's ErrorCode values)."""
    return _STATUS.get(code, 500)


def error_type(status: int) -> str:
    return _TYPE.get(status, "server_error")


def retry_after_s(status: int, retry_after_ms: int | None) -> int | None:
    """The Retry-After header's seconds (rounded up), on 429 and 503 only."""
    if status not in (429, 503):
        return None
    if retry_after_ms is None:
        return DEFAULT_RETRY_AFTER_S
    return max(1, math.ceil(retry_after_ms / 1000))


@dataclass(slots=True)
class ErrorReply:
    status: int
    body: dict[str, Any]
    retry_after_s: int | None


def error_reply(
    code: str,
    message: str,
    *,
    retry_after_ms: int | None = None,
    param: str | None = None,
    status: int | None = None,
) -> ErrorReply:
    status = status or status_for(code)
    body = {"error": {"message": message, "type": error_type(status), "param": param, "code": code}}
    return ErrorReply(status, body, retry_after_s(status, retry_after_ms))


def exception_reply(exc: BaseException) -> ErrorReply:
    """Any exception as an OpenAI error; unknown ones say nothing of their internals."""
    if isinstance(exc, UnknownModel):
        return error_reply("model_not_found", exc.message, param="model", status=404)
    if isinstance(exc, FirstTokenError):
        return error_reply(
            exc.code.value,
            exc.message,
            retry_after_ms=exc.retry_after_ms,
            param=exc.param if isinstance(exc, InvalidParameter) else None,
        )
    return error_reply(
        ErrorCode.INTERNAL.value,
        "internal error; the request was not completed (see the server log)",
    )


def http_error_reply(status: int, method: str, path: str) -> ErrorReply:
    """Starlette's own refusals (no such route, a method the route does not take) on a `/v1`
    path, as OpenAI words them: the SDKs read the error from this shape."""
    if status == 404:
        return error_reply("not_found", f"Invalid URL ({method} {path[:200]})", status=404)
    if status == 405:
        message = f"method {method} is not allowed on {path[:200]}"
        return error_reply("method_not_allowed", message, status=405)
    return error_reply("invalid_request", HTTPStatus(status).phrase, status=status)


def frame_reply(frame: dict[str, Any]) -> ErrorReply:
    """A wire `error` frame (from the worker or the watchdog) as an OpenAI error."""
    return error_reply(
        str(frame.get("code", ErrorCode.INTERNAL.value)),
        str(frame.get("message", "")),
        retry_after_ms=frame.get("retry_after_ms"),
    )


def sse_error(reply: ErrorReply) -> bytes:
    """A failure after the stream began: an event whose data is the error object (the
    official SDKs raise it as an APIError)."""
    return b"data: " + orjson.dumps(reply.body) + b"\n\n"


# --- answers --------------------------------------------------------------------------------

FINISH_REASONS = frozenset({"stop", "length", "content_filter", "tool_calls"})


def finish_reason(value: object) -> str:
    """The `done` frame's reason in OpenAI's closed set (anything else ended it: "stop")."""
    return value if isinstance(value, str) and value in FINISH_REASONS else "stop"


def usage(done: dict[str, Any]) -> dict[str, int]:
    raw = done.get("usage") or {}
    prompt = int(raw.get("prompt_tokens", 0))
    completion = int(raw.get("completion_tokens", 0))
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def extras(done: dict[str, Any]) -> dict[str, Any]:
    """What firsttoken adds to an answer (`x_firsttoken`): strict clients ignore the field."""
    out: dict[str, Any] = {
        "cached": bool(done.get("cached", False)),
        "route": done.get("route"),
        "timings": done.get("timings") or {},
    }
    if done.get("conversation_id"):
        out["conversation_id"] = done["conversation_id"]
    return out


class ChunkEncoder:
    """`chat.completion.chunk` events for one answer. A token's event is a fixed prefix, the
    JSON-encoded text and a fixed suffix: one small encode per token, no dict."""

    __slots__ = ("_created", "_id", "_model", "_prefix", "_role_prefix")

    _SUFFIX = b'},"finish_reason":null}]}\n\n'

    def __init__(self, completion_id: str, created: int, model: str) -> None:
        self._id = completion_id
        self._created = created
        self._model = model
        head = orjson.dumps(
            {"id": completion_id, "object": "chat.completion.chunk", "created": created}
        )[:-1]
        head += b',"model":' + orjson.dumps(model) + b',"choices":[{"index":0,"delta":{'
        self._prefix = b"data: " + head + b'"content":'
        self._role_prefix = b"data: " + head + b'"role":"assistant","content":'

    def token(self, text: str, *, first: bool = False) -> bytes:
        prefix = self._role_prefix if first else self._prefix
        return prefix + orjson.dumps(text) + self._SUFFIX

    def _event(self, model: str, choices: list[Any], **fields: Any) -> bytes:
        chunk = {
            "id": self._id,
            "object": "chat.completion.chunk",
            "created": self._created,
            "model": model,
            "choices": choices,
            **fields,
        }
        return b"data: " + orjson.dumps(chunk) + b"\n\n"

    def final(self, done: dict[str, Any], *, first: bool = False) -> bytes:
        """The last choice chunk: its finish_reason, and firsttoken's extras."""
        delta: dict[str, str] = {"role": "assistant", "content": ""} if first else {}
        choice = {
            "index": 0,
            "delta": delta,
            "finish_reason": finish_reason(done.get("finish_reason")),
        }
        return self._event(
            str(done.get("model") or self._model), [choice], x_firsttoken=extras(done)
        )

    def usage(self, done: dict[str, Any]) -> bytes:
        """`stream_options.include_usage`: the usage chunk, with no choices."""
        return self._event(str(done.get("model") or self._model), [], usage=usage(done))


def completion(
    completion_id: str, created: int, model: str, text: str, done: dict[str, Any]
) -> dict[str, Any]:
    """The `chat.completion` object of a non-streamed answer."""
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": str(done.get("model") or model),
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": finish_reason(done.get("finish_reason")),
            }
        ],
        "usage": usage(done),
        "x_firsttoken": extras(done),
    }
