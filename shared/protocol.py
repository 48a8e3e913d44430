"""The websocket wire protocol (v1): typed frames, the parsers, and fast encoders.

Client -> server: ``chat``, ``cancel``, ``resume``, ``ping``, ``draft`` (pydantic models: every
frame a client sends is validated). A ``draft`` (issue 34) is the message a user is still typing:
the server prefills its prompt in the engine's prefix cache and never answers it (a malformed
one gets an ``invalid_draft`` error naming its id; nothing else ends). Server -> client:
``accepted``, ``token``, ``done``, ``error`` (shared/errors.py, next to its one translator),
``pong``, and the worker -> gateway pub/sub chunks. The server builds its frames, so they are
TypedDicts: a plain dict at run time (nothing is validated per token), checked by mypy where it
is built, and validated only where a client reads them (:func:`parse_server_frame`). All
frames are JSON text objects with a ``type`` field. This module does no I/O.

A chat whose worker died mid-answer and that another worker finished (shared/failover.py) ends
with a ``done`` holding ``"continued": true``; its ``token`` seqs stay contiguous across the
change of worker. A client needs to do nothing about it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Annotated, Any, Literal, NotRequired

import orjson
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    model_validator,
)
from typing_extensions import TypedDict  # pydantic validates only this one before 3.12

from shared.errors import ErrorFrame, InvalidDraft, InvalidRequest
from shared.tags import TagsField, UserField
from shared.tracing.context import (
    TRACEPARENT_FORMAT,
    TRACESTATE_MAX_CHARS,
    parse_traceparent,
    valid_tracestate,
)

PROTOCOL_VERSION = 1
ChatId = Annotated[str, Field(min_length=1, max_length=128)]


def _check_traceparent(value: str) -> str:
    if parse_traceparent(value) is None:
        raise ValueError(f"must be a W3C traceparent ({TRACEPARENT_FORMAT})")
    return value


def _check_tracestate(value: str) -> str:
    if not valid_tracestate(value):
        raise ValueError(
            f"must be a W3C tracestate: printable ASCII, at most {TRACESTATE_MAX_CHARS} chars"
        )
    return value


Traceparent = Annotated[str, AfterValidator(_check_traceparent)]
Tracestate = Annotated[str, AfterValidator(_check_tracestate)]


class _Frame(BaseModel):
    # strict: a JSON string is not a number ("5"), a number or a string is not a boolean
    # (1, "yes"), a boolean is not an integer (true); lax coercion would run a chat the client
    # did not ask for. An integer still passes for a float (temperature: 1), as JSON means it.
    # hide_input_in_errors: an error chained to a logged exception must not quote the text.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, hide_input_in_errors=True)


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
    # Ids are minted by the server (a hex uuid), so printable ASCII is all one can be; a NUL or
    # other control character would otherwise reach the database's lookup as is.
    conversation_id: str | None = Field(None, min_length=1, max_length=64, pattern=r"^[!-~]+$")
    # For the usage row only (shared/tags.py): the client's end user, and its labels.
    user: UserField | None = None
    tags: TagsField = None
    # W3C trace context (shared/tracing/): the chat's spans continue it, over the one of the
    # websocket's upgrade request. Unlike a malformed header (ignored, as the spec asks), a
    # malformed field is refused (invalid_request): a client that sets it means it.
    traceparent: Traceparent | None = None
    tracestate: Tracestate | None = None


# `model: "auto"` routes the chat to the small or the large model (workers/routing.py).
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


class DraftFrame(_Frame):
    """The message being typed (issue 34): `text` is what the `chat` frame's last user message
    would be now. Either `conversation_id` (a server-kept conversation, as the chat would
    continue it) or `messages` (the history the chat would send before that message; empty
    for a first message). `model` as the chat will ask, so the same engine is prefilled."""

    type: Literal["draft"]
    id: ChatId
    text: str = Field(min_length=1)
    conversation_id: str | None = Field(None, min_length=1, max_length=64, pattern=r"^[!-~]+$")
    messages: list[Message] | None = None
    model: str | None = Field(None, min_length=1, max_length=128)

    @model_validator(mode="after")
    def _one_history(self) -> DraftFrame:
        if (self.conversation_id is None) == (self.messages is None):
            raise ValueError(
                "send exactly one of conversation_id (a server-kept conversation) and messages"
                " (the history before the message being typed; [] for a first message)"
            )
        if self.conversation_id == NEW_CONVERSATION:
            raise ValueError(
                f'conversation_id "{NEW_CONVERSATION}" has no history yet: a draft of a new'
                " conversation sends messages: []"
            )
        return self


ClientFrame = Annotated[
    ChatFrame | CancelFrame | ResumeFrame | PingFrame | DraftFrame, Field(discriminator="type")
]
_CLIENT_FRAME: TypeAdapter[ClientFrame] = TypeAdapter(ClientFrame)
CLIENT_FRAME_TYPES = ("chat", "cancel", "resume", "ping", "draft")


_TYPE_ERRORS = frozenset({"int_type", "float_type", "bool_type", "string_type", "list_type"})
# The JSON name of what a client sent, for "…, not a string" in a type error.
_JSON_TYPES: dict[type, str] = {
    str: "a string",
    bool: "a boolean",
    int: "a number",
    float: "a decimal number",
    list: "an array",
    dict: "an object",
    type(None): "null",
}


def _describe(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        loc = ".".join(str(p) for p in err["loc"] if p not in CLIENT_FRAME_TYPES)
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "string_pattern_mismatch":  # conversation_id's, the one pattern
            msg = "must be an id the server returned (printable ASCII, no spaces)"
        elif err["type"] in _TYPE_ERRORS and type(err["input"]) in _JSON_TYPES:
            msg = f"{msg}, not {_JSON_TYPES[type(err['input'])]}"
        parts.append(f"{loc}: {msg}" if loc else msg)
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
) -> ChatFrame | CancelFrame | ResumeFrame | PingFrame | DraftFrame:
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
    # A bad draft ends nothing: its own code says so (shared/errors.py InvalidDraft).
    invalid = InvalidDraft if kind == "draft" else InvalidRequest
    if kind in ("chat", "draft") and isinstance(data.get("messages"), list):
        if len(data["messages"]) > max_messages:
            raise invalid(
                f"too many messages: {len(data['messages'])}; the limit is {max_messages}"
            )
    try:
        return _CLIENT_FRAME.validate_python(data)
    except ValidationError as exc:
        raise invalid(f"invalid {kind} frame: {_describe(exc)}") from exc


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


def dumps(value: Mapping[str, Any] | list[Any]) -> str:
    """Compact JSON, non-ASCII text as is, for frames and task messages (orjson: the fastest
    encoder measured for these small frames; see docs/benchmarks.md)."""
    return orjson.dumps(value).decode()


# --- server -> client frames ----------------------------------------------------------------


class AcceptedFrame(TypedDict):
    """The chat is queued (or a resume re-attached); `job_id` is what a resume names."""

    type: Literal["accepted"]
    id: str
    job_id: str
    conversation_id: NotRequired[str]  # a server-kept conversation (new or continued)


class TokenFrame(TypedDict):
    type: Literal["token"]
    id: str
    seq: int
    text: str


class PongFrame(TypedDict):
    type: Literal["pong"]
    id: str | None


class Usage(TypedDict):
    prompt_tokens: int
    completion_tokens: int
    # The engine's own prompt count (its chat template, its tokenizer), where it differs.
    engine_prompt_tokens: NotRequired[int]
    # Prompt tokens the engine found in its prefix cache (a draft prefilled them, issue 34, or
    # an earlier turn did), where the engine reports them.
    cached_prompt_tokens: NotRequired[int]


class PromptParts(TypedDict):
    """How the prompt was assembled from the conversation's history."""

    history_sent: int
    history_dropped: int
    summary_sent: bool


class DoneExtras(TypedDict, total=False):
    """What the retrieval stage adds to `done` (workers/retrieve.py `done_fields`)."""

    chunk_ids: list[str]
    retrieval: dict[str, Any]
    prompt: PromptParts
    route: str
    route_reason: str
    conversation_id: str
    # The worker running the chat died mid-answer and another worker continued it from the
    # text already sent (shared/failover.py); absent when one worker answered it all.
    continued: bool


class _Done(DoneExtras):
    type: Literal["done"]
    id: str
    cached: bool
    model: str
    finish_reason: str
    usage: Usage


class DoneChunk(_Done):
    """`done` as the worker publishes it: the gateway turns it into a :class:`DoneFrame`."""

    chunks: int  # token chunks published, so the gateway knows none is missing
    points: dict[str, float]  # wall-clock stage points (shared/timing.py)


class DoneFrame(_Done):
    """The last frame of an answer."""

    timings: dict[str, float]  # ms per stage, the gateway's own points included


ServerFrame = Annotated[
    AcceptedFrame | TokenFrame | DoneFrame | ErrorFrame | PongFrame, Field(discriminator="type")
]
_SERVER_FRAME: TypeAdapter[ServerFrame] = TypeAdapter(ServerFrame)


def parse_server_frame(raw: str | bytes) -> ServerFrame:
    """Validate one frame from the gateway (for clients; the server never parses its own)."""
    try:
        return _SERVER_FRAME.validate_json(raw)
    except ValidationError as exc:
        raise ValueError(
            f"the gateway sent a frame this client does not understand ({exc.error_count()} "
            f"problems, first: {exc.errors()[0]['msg']}); upgrade firsttoken to the "
            "gateway's version"
        ) from exc


def encode_accepted(chat_id: str, job_id: str, conversation_id: str | None = None) -> str:
    frame: AcceptedFrame = {"type": "accepted", "id": chat_id, "job_id": job_id}
    if conversation_id is not None:
        frame["conversation_id"] = conversation_id
    return dumps(frame)


def encode_pong(ping_id: str | None) -> str:
    frame: PongFrame = {"type": "pong", "id": ping_id}
    return dumps(frame)


def encode_token(chat_id: str, seq: int, text: str) -> str:
    """A `token` frame, on the hot path: one dumps, no model, no validation."""
    frame: TokenFrame = {"type": "token", "id": chat_id, "seq": seq, "text": text}
    return dumps(frame)


_NO_EXTRAS: DoneExtras = {}


def done_chunk(
    chat_id: str,
    *,
    cached: bool,
    model: str,
    finish_reason: str,
    usage: Usage,
    chunks: int,
    points: dict[str, float],
    extras: Mapping[str, Any] = _NO_EXTRAS,
) -> DoneChunk:
    """The worker's `done`, the one place it is built (an answer from the engine or the cache).

    `extras` are the retrieval stage's fields (:class:`DoneExtras`)."""
    chunk: DoneChunk = {
        "type": "done",
        "id": chat_id,
        "cached": cached,
        "model": model,
        "finish_reason": finish_reason,
        "usage": usage,
        "chunks": chunks,
        "points": points,
        **extras,  # type: ignore[typeddict-item]  # DoneExtras, as retrieve.done_fields says
    }
    return chunk


def done_frame(chunk: DoneChunk, chat_id: str, timings: dict[str, float]) -> DoneFrame:
    """The wire `done` from the worker's chunk: the connection's chat id, and the stage timings
    in place of the raw points and the chunk count. Reuses the chunk's dict (freshly decoded)."""
    frame: dict[str, Any] = chunk  # type: ignore[assignment]
    frame.pop("points", None)
    frame.pop("chunks", None)
    frame["id"] = chat_id
    frame["timings"] = timings
    return frame  # type: ignore[return-value]


# --- worker -> gateway messages on the job's pub/sub channel ------------------------------
# One line header then the payload. Token frames travel ready to forward, so the gateway
# relays them without parsing JSON: "T<seq>\n<token frame>".
#   S\n<started chunk json>     the worker picked the job up (again on each model failover)
#   T<seq>\n<token frame json>  forward verbatim
#   T<seq>:<n>\n<token frame>   the same; n: the answer's tokens up to and including this chunk,
#                               what a worker taking the chat over continues from (a cache
#                               replay's chunks carry none: it cannot be continued)
#   T<seq>:<n>:<model>\n<frame> the same; the first token chunk a worker sends for a job also
#                               names the model that answers (JSON-encoded: `auto` routed, or
#                               a failover's), for a door whose every chunk names it (OpenAI's)
#   D\n<done chunk json>        the gateway turns it into the `done` frame, then forwards
#   E\n<error frame json>       forward; the job is over

CHUNK_STARTED = "S"
CHUNK_TOKEN = "T"
CHUNK_DONE = "D"
CHUNK_ERROR = "E"

Failover = TypedDict("Failover", {"from": str, "to": str})


class StartedChunk(TypedDict):
    t: float  # when the worker started the job (wall clock)
    failover: NotRequired[Failover]  # the model it moved to after the first one failed
    # The chat worker running the job (its heartbeat name): the gateway watches its heartbeat,
    # and a worker taking the job over sends its own `started`.
    worker: NotRequired[str]
    # The model that answers: a worker of an earlier release sent it here before the first
    # token; a worker now names it in its first token chunk's header (below).
    model: NotRequired[str]


def encode_started(
    started_at: float,
    failover: Failover | None = None,
    worker: str | None = None,
    model: str | None = None,
) -> str:
    chunk: StartedChunk = {"t": started_at}
    if failover is not None:
        chunk["failover"] = failover
    if worker is not None:
        chunk["worker"] = worker
    if model is not None:
        chunk["model"] = model
    return dumps(chunk)


def encode_chunk(
    kind: str,
    payload: str,
    seq: int | None = None,
    tokens: int | None = None,
    model: str | None = None,
) -> str:
    """One pub/sub message; `model` (with `tokens`) only on a worker's first token chunk."""
    if seq is None:
        return f"{kind}\n{payload}"
    if tokens is None:
        return f"{kind}{seq}\n{payload}"
    if model is None:
        return f"{kind}{seq}:{tokens}\n{payload}"
    return f"{kind}{seq}:{tokens}:{orjson.dumps(model).decode()}\n{payload}"


def decode_chunk(message: str) -> tuple[str, int | None, str]:
    """Split a pub/sub message into (kind, seq, payload)."""
    header, _, payload = message.partition("\n")
    kind = header[:1]
    seq = int(header[1:].partition(":")[0]) if len(header) > 1 else None
    return kind, seq, payload


def chunk_tokens(message: str) -> int | None:
    """The answer's tokens up to a token chunk (its header's count), None where it has none."""
    header = message.partition("\n")[0]
    count = header.partition(":")[2].partition(":")[0]
    return int(count) if count else None


def chunk_model(message: str) -> str | None:
    """The answering model a token chunk's header names (a worker's first), None elsewhere."""
    header = message.partition("\n")[0]
    named = header.partition(":")[2].partition(":")[2]
    if not named:
        return None
    model = orjson.loads(named)
    return model if isinstance(model, str) else None
