"""W3C Trace Context (https://www.w3.org/TR/trace-context/): the `traceparent` and `tracestate`
values a client sends, checked. Pure: no I/O, no OpenTelemetry.

A `traceparent` is ``version-trace_id-parent_id-flags`` in lowercase hex (``00-`` then 32, 16
and 2 digits). Version ``ff``, an all-zero trace id and an all-zero parent id are invalid; a
later version may append ``-...`` fields, which are kept as they are (the spec's rule for a
version this parser does not know). A `tracestate` is passed on untouched when it is printable
ASCII of at most 512 characters (the spec's limit a vendor must propagate), else dropped.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

TRACEPARENT_HEADER = "traceparent"
TRACESTATE_HEADER = "tracestate"
TRACESTATE_MAX_CHARS = 512
_HEX = frozenset("0123456789abcdef")
_VERSION_00_CHARS = 55  # 2 + 1 + 32 + 1 + 16 + 1 + 2
TRACEPARENT_FORMAT = "00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>, lowercase"


@dataclass(frozen=True, slots=True)
class TraceParent:
    """A valid `traceparent`, as numbers (what OpenTelemetry's SpanContext takes)."""

    trace_id: int
    span_id: int
    flags: int

    @property
    def sampled(self) -> bool:
        return bool(self.flags & 0x01)


@dataclass(frozen=True, slots=True)
class TraceHeaders:
    """A client's trace context as received (valid values only): what the admission span
    continues."""

    traceparent: str
    tracestate: str | None = None


def _hex(text: str) -> bool:
    return bool(text) and all(c in _HEX for c in text)


def parse_traceparent(value: str) -> TraceParent | None:
    """The parsed `traceparent`, or None when it is not a valid one."""
    if len(value) < _VERSION_00_CHARS:
        return None
    version, trace_id, span_id, flags = (
        value[0:2], value[3:35], value[36:52], value[53:55]
    )  # fmt: skip
    if value[2] != "-" or value[35] != "-" or value[52] != "-":
        return None
    if not (_hex(version) and _hex(trace_id) and _hex(span_id) and _hex(flags)):
        return None
    if version == "ff":
        return None
    if version == "00" and len(value) != _VERSION_00_CHARS:
        return None
    if len(value) > _VERSION_00_CHARS and value[_VERSION_00_CHARS] != "-":
        return None
    parsed = TraceParent(int(trace_id, 16), int(span_id, 16), int(flags, 16))
    if parsed.trace_id == 0 or parsed.span_id == 0:
        return None
    return parsed


def valid_tracestate(value: str) -> bool:
    return len(value) <= TRACESTATE_MAX_CHARS and all(" " <= c <= "~" for c in value)


def format_traceparent(trace_id: int, span_id: int, flags: int) -> str:
    return f"00-{trace_id:032x}-{span_id:016x}-{flags:02x}"


def from_headers(headers: Mapping[str, str]) -> TraceHeaders | None:
    """The trace context of an HTTP request's headers (lowercase names, as Starlette's are).

    A malformed `traceparent` is ignored, as the spec asks of a server (a proxy on the way may
    have mangled it; the chat is not refused for it): the chat then starts a trace of its
    own. A `tracestate` counts only beside a valid `traceparent`."""
    traceparent = headers.get(TRACEPARENT_HEADER)
    if traceparent is None or parse_traceparent(traceparent.strip()) is None:
        return None
    tracestate = headers.get(TRACESTATE_HEADER)
    if tracestate is not None and not valid_tracestate(tracestate):
        tracestate = None
    return TraceHeaders(traceparent.strip(), tracestate)


def chosen(
    traceparent: str | None, tracestate: str | None, connection: TraceHeaders | None
) -> TraceHeaders | None:
    """The context a chat continues: its frame's fields (validated by the frame's parser)
    over its connection's headers."""
    if traceparent is not None:
        return TraceHeaders(traceparent, tracestate)
    return connection
