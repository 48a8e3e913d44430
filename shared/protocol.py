"""The websocket wire protocol (v1): typed frames, the parser, and fast encoders.

Client -> server: ``chat``, ``cancel``, ``resume``, ``ping``.
Server -> client: ``accepted``, ``token``, ``done``, ``error``, ``pong``.
All frames are JSON text objects with a ``type`` field. This module does no I/O.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from shared.errors import InvalidRequest

PROTOCOL_VERSION = 1
ChatId = Annotated[str, Field(min_length=1, max_length=128)]


class _Frame(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Message(_Frame):
    role: Literal["system", "user", "assistant"]
    content: str


class ChatFrame(_Frame):
    type: Literal["chat"]
    id: ChatId
    messages: list[Message] = Field(min_length=1)
    model: str | None = Field(None, min_length=1, max_length=128)
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    cache: bool = True
    # Server-kept history (issue 5): "new" starts a conversation (its id comes back in
    # `accepted` and `done`); an id continues one, and the client sends only the new message.
    conversation_id: str | None = Field(None, min_length=1, max_length=64)


# `model: "auto"` routes the chat to the small or the large model (shared/routing.py).
AUTO_MODEL = "auto"
NEW_CONVERSATION = "new"


class CancelFrame(_Frame):
    type: Literal["cancel"]
    id: ChatId


class ResumeFrame(_Frame):
    type: Literal["resume"]
    id: ChatId
    job_id: str = Field(min_length=1, max_length=64)
    after_seq: int = Field(-1, ge=-1)


class PingFrame(_Frame):
    type: Literal["ping"]
    id: str | None = None


ClientFrame = Annotated[
    ChatFrame | CancelFrame | ResumeFrame | PingFrame, Field(discriminator="type")
]
_CLIENT_FRAME: TypeAdapter[ClientFrame] = TypeAdapter(ClientFrame)
CLIENT_FRAME_TYPES = ("chat", "cancel", "resume", "ping")


class Usage(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0


class AcceptedFrame(BaseModel):
    type: Literal["accepted"] = "accepted"
    id: str
    job_id: str


class TokenFrame(BaseModel):
    type: Literal["token"] = "token"
    id: str
    seq: int
    text: str


class DoneFrame(BaseModel):
    type: Literal["done"] = "done"
    id: str
    cached: bool
    model: str
    finish_reason: str
    usage: Usage
    timings: dict[str, float]


class ErrorFrame(BaseModel):
    type: Literal["error"] = "error"
    id: str | None
    code: str
    message: str
    retry_after_ms: int | None = None


def _describe(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        loc = ".".join(str(p) for p in err["loc"] if p not in CLIENT_FRAME_TYPES)
        parts.append(f"{loc}: {err['msg']}" if loc else err["msg"])
    return "; ".join(parts)


# JSON may spell text as \\uXXXX escapes, and an escape of half a surrogate pair decodes to a
# string no UTF-8 encoder accepts; frames are only checked for that when they use escapes.
_LONE_SURROGATE_HINT = "\\u"


def _check_unicode(data: object) -> None:
    try:
        json.dumps(data, ensure_ascii=False).encode()
    except UnicodeEncodeError as exc:
        raise InvalidRequest(
            "frame contains text that is not valid UTF-8 (a lone surrogate)"
        ) from exc


def parse_client_frame(
    raw: str | bytes, *, max_bytes: int, max_messages: int
) -> ChatFrame | CancelFrame | ResumeFrame | PingFrame:
    """Validate one client frame or raise InvalidRequest saying exactly what is wrong."""
    size = len(raw.encode() if isinstance(raw, str) else raw)
    if size > max_bytes:
        raise InvalidRequest(f"frame is {size} bytes; the limit is {max_bytes}")
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"frame is not valid JSON: {exc}") from exc
    except RecursionError as exc:
        # A frame of nothing but "[[[[..." nests deeper than the decoder's stack.
        raise InvalidRequest("frame is nested too deeply") from exc
    if not isinstance(data, dict):
        raise InvalidRequest("frame must be a JSON object with a 'type' field")
    hint = _LONE_SURROGATE_HINT if isinstance(raw, str) else _LONE_SURROGATE_HINT.encode()
    if hint in raw:  # type: ignore[operator]
        _check_unicode(data)
    kind = data.get("type")
    if kind not in CLIENT_FRAME_TYPES:
        raise InvalidRequest(
            f"unknown frame type {kind!r}; expected one of {', '.join(CLIENT_FRAME_TYPES)}"
        )
    if kind == "chat" and isinstance(data.get("messages"), list):
        if len(data["messages"]) > max_messages:
            raise InvalidRequest(
                f"too many messages: {len(data['messages'])}; the limit is {max_messages}"
            )
    try:
        return _CLIENT_FRAME.validate_python(data)
    except ValidationError as exc:
        raise InvalidRequest(f"invalid {kind} frame: {_describe(exc)}") from exc


def frame_id(raw: str | bytes) -> str | None:
    """Best-effort chat id of a frame that failed validation, so the error names its chat."""
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    value = data.get("id") if isinstance(data, dict) else None
    if not isinstance(value, str) or len(value) > 128:
        return None
    try:
        value.encode()
    except UnicodeEncodeError:
        return None  # a lone surrogate: not something to echo back
    return value


def dumps(value: dict[str, Any] | list[Any]) -> str:
    """Compact JSON, non-ASCII text as is, for frames and task messages (orjson: a token frame
    in ~0.6 µs; the stdlib's encoder took 1.9-3.4, json.dumps with options 3.6)."""
    return orjson.dumps(value).decode()


def encode_token(chat_id: str, seq: int, text: str) -> str:
    """A `token` frame, on the hot path: one dumps, no model."""
    return dumps({"type": "token", "id": chat_id, "seq": seq, "text": text})


# --- worker -> gateway messages on the job's pub/sub channel ------------------------------
# One line header then the payload. Token frames travel ready to forward, so the gateway
# relays them without parsing JSON: "T<seq>\n<token frame>".
#   S\n{"t": worker_start}      the worker picked the job up
#   T<seq>\n<token frame json>  forward verbatim
#   D\n<done frame json>        the gateway adds its own timings, then forwards
#   E\n<error frame json>       forward; the job is over

CHUNK_STARTED = "S"
CHUNK_TOKEN = "T"
CHUNK_DONE = "D"
CHUNK_ERROR = "E"


def encode_chunk(kind: str, payload: str, seq: int | None = None) -> str:
    return f"{kind}{'' if seq is None else seq}\n{payload}"


def decode_chunk(message: str) -> tuple[str, int | None, str]:
    """Split a pub/sub message into (kind, seq, payload)."""
    header, _, payload = message.partition("\n")
    kind = header[:1]
    seq = int(header[1:]) if len(header) > 1 else None
    return kind, seq, payload
