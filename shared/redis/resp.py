"""Redis's wire format (RESP): commands packed to bytes, replies parsed by hiredis.

The connections of this package write packed commands straight to their sockets and parse
what comes back with one hiredis reader each. Error replies come back as redis-py's exception
classes (``ResponseError``, ``NoScriptError``, ``AuthenticationError``...), so a caller catches
the same errors whichever client ran its command.
"""

from __future__ import annotations

from collections.abc import Sequence

import hiredis
from redis.exceptions import (
    AuthenticationError,
    BusyLoadingError,
    ExecAbortError,
    InvalidResponse,
    NoPermissionError,
    NoScriptError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisError,
    ResponseError,
)
from redis.exceptions import ConnectionError as RedisConnectionError

# An error reply's first word -> the class redis-py raises for it; any other is a
# ResponseError with the whole message (e.g. "WRONGTYPE Operation against a key ...").
ERROR_CLASSES: dict[str, type[RedisError]] = {
    "ERR": ResponseError,
    "NOSCRIPT": NoScriptError,
    "WRONGPASS": AuthenticationError,
    "NOAUTH": AuthenticationError,
    "NOPERM": NoPermissionError,
    "READONLY": ReadOnlyError,
    "OOM": OutOfMemoryError,
    "LOADING": BusyLoadingError,
    "EXECABORT": ExecAbortError,
}
# The few "ERR ..." messages redis-py raises as another class.
ERR_CLASSES: dict[str, type[RedisError]] = {
    "max number of clients reached": RedisConnectionError,
    "invalid password": AuthenticationError,
}


def pack(args: Sequence[bytes]) -> bytes:
    """One RESP command (an array of bulk strings)."""
    return b"*%d\r\n" % len(args) + bulks(args)


def bulks(args: Sequence[bytes]) -> bytes:
    """Bulk strings one after another (a list, not a generator: it joins faster)."""
    return b"".join([b"$%d\r\n%s\r\n" % (len(arg), arg) for arg in args])


def parse_error(message: str) -> RedisError:
    """The exception for one error reply, as redis-py builds it: a known code picks the class
    and leaves the message without it."""
    code, _, rest = message.partition(" ")
    cls = ERROR_CLASSES.get(code)
    if cls is None:
        return ResponseError(message)
    if code == "ERR":
        cls = ERR_CLASSES.get(rest, cls)
    return cls(rest, status_code=code)


def error_text(error: Exception) -> str:
    """An error reply as Redis sent it, code included (``WRONGPASS invalid username...``)."""
    code = getattr(error, "status_code", None)
    return f"{code} {error}" if code else str(error)


def reply_parser(*, decode: bool = False) -> hiredis.Reader:
    """A hiredis reader for one connection's replies. An error reply is returned (an instance
    of the class :func:`parse_error` picks), not raised; ``decode`` returns strings as str
    (UTF-8, strict, as redis-py's ``decode_responses``) instead of bytes."""
    if decode:
        return hiredis.Reader(
            protocolError=InvalidResponse,
            replyError=parse_error,
            encoding="utf-8",
            errors="strict",
        )
    return hiredis.Reader(protocolError=InvalidResponse, replyError=parse_error)
