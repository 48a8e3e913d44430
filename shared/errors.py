"""The error tree, and the closed set of wire error codes.

    Exception
    ├── ConfigError                  bad settings; the process refuses to start
    └── FirstTokenError              anything a client may be told about (has a wire code)
        ├── InvalidRequest           invalid_request   malformed or out-of-bounds input
        │   └── InvalidDraft         invalid_draft     a malformed `draft` frame (no chat ends)
        ├── Unauthorized             unauthorized      missing, unknown or revoked API key
        ├── RateLimited              rate_limited      over a limit; carries retry_after_ms
        ├── Overloaded               overloaded        no capacity (no chat worker, too many chats)
        ├── DeadlineExceeded         timeout           a deadline passed (queue, first token, idle)
        ├── EngineError              engine_error      the model server failed or went away
        ├── Cancelled                cancelled         the client or the system cancelled the chat
        └── InternalError            internal          a bug; the message never leaks details

Boundaries (Redis, SQLAlchemy, engines) wrap their own exceptions into this tree with
``raise ... from exc``; :func:`error_frame` is the one translator to the wire.

A message is what the client reads: it names models, never an engine's URL, host or port, and
never quotes prompt or answer text. What only an operator needs (the engine's address, the
driver's own error) goes in ``detail``, which is logged and never sent.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal, NotRequired

from typing_extensions import TypedDict  # pydantic validates only this one before 3.12


class ErrorCode(StrEnum):
    INVALID_REQUEST = "invalid_request"
    # A `draft` frame (issue 34) that does not validate: its own code, so a client can tell
    # that nothing it is waiting for ended (a draft is never answered) without tracking ids.
    INVALID_DRAFT = "invalid_draft"
    UNAUTHORIZED = "unauthorized"
    RATE_LIMITED = "rate_limited"
    OVERLOADED = "overloaded"
    TIMEOUT = "timeout"
    ENGINE_ERROR = "engine_error"
    CANCELLED = "cancelled"
    INTERNAL = "internal"


class ConfigError(Exception):
    """Bad configuration; the message names the variable to fix."""


class FirstTokenError(Exception):
    code: ErrorCode = ErrorCode.INTERNAL

    def __init__(
        self, message: str, *, retry_after_ms: int | None = None, detail: str | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after_ms = retry_after_ms
        self.detail = detail  # for the log only (see the module docstring)


class InvalidRequest(FirstTokenError):
    code = ErrorCode.INVALID_REQUEST


class InvalidDraft(InvalidRequest):
    code = ErrorCode.INVALID_DRAFT


class Unauthorized(FirstTokenError):
    code = ErrorCode.UNAUTHORIZED


class RateLimited(FirstTokenError):
    code = ErrorCode.RATE_LIMITED


class Overloaded(FirstTokenError):
    code = ErrorCode.OVERLOADED


class DeadlineExceeded(FirstTokenError):
    code = ErrorCode.TIMEOUT


class EngineError(FirstTokenError):
    code = ErrorCode.ENGINE_ERROR


class Cancelled(FirstTokenError):
    code = ErrorCode.CANCELLED


class InternalError(FirstTokenError):
    code = ErrorCode.INTERNAL


class ErrorFrame(TypedDict):
    """The wire `error` frame (shared/protocol.py has the other server frames): it ends the
    chat it names, or the connection when `id` is None."""

    type: Literal["error"]
    id: str | None
    code: str  # an ErrorCode value
    message: str
    retry_after_ms: NotRequired[int]


def error_frame(chat_id: str | None, exc: BaseException) -> ErrorFrame:
    """The wire `error` frame for any exception; unknown exceptions become `internal`."""
    if isinstance(exc, FirstTokenError):
        frame: ErrorFrame = {
            "type": "error",
            "id": chat_id,
            "code": exc.code.value,
            "message": exc.message,
        }
        if exc.retry_after_ms is not None:
            frame["retry_after_ms"] = exc.retry_after_ms
        return frame
    return {
        "type": "error",
        "id": chat_id,
        "code": ErrorCode.INTERNAL.value,
        "message": "internal error; the request was not completed (see the server log)",
    }
