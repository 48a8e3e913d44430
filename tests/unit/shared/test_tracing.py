"""W3C trace context parsing, the chat frame's trace fields, and when tracing is on; no sockets
and no exporter."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from shared import tracing
from shared.errors import InvalidRequest
from shared.protocol import ChatFrame, Message, parse_client_frame
from shared.tasks import ChatJob
from shared.tracing.context import (
    TraceHeaders,
    chosen,
    format_traceparent,
    from_headers,
    parse_traceparent,
    valid_tracestate,
)
from workers.engines.base import EngineRequest, trace_header_lines, trace_headers

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN_ID = "00f067aa0ba902b7"
VALID = f"00-{TRACE_ID}-{SPAN_ID}-01"


def test_a_valid_traceparent_parses_into_its_numbers() -> None:
    parsed = parse_traceparent(VALID)
    assert parsed is not None
    assert parsed.trace_id == int(TRACE_ID, 16)
    assert parsed.span_id == int(SPAN_ID, 16)
    assert parsed.sampled
    assert format_traceparent(parsed.trace_id, parsed.span_id, parsed.flags) == VALID


def test_an_unsampled_traceparent_is_valid_and_says_so() -> None:
    parsed = parse_traceparent(f"00-{TRACE_ID}-{SPAN_ID}-00")
    assert parsed is not None and not parsed.sampled


@pytest.mark.parametrize(
    "value",
    [
        "",
        "garbage",
        f"00-{TRACE_ID}-{SPAN_ID}",  # no flags
        f"00-{TRACE_ID}-{SPAN_ID}-01-extra",  # version 00 has exactly four fields
        f"00-{TRACE_ID.upper()}-{SPAN_ID}-01",  # uppercase hex
        f"00-{'0' * 32}-{SPAN_ID}-01",  # all-zero trace id
        f"00-{TRACE_ID}-{'0' * 16}-01",  # all-zero parent id
        f"ff-{TRACE_ID}-{SPAN_ID}-01",  # the forbidden version
        f"00_{TRACE_ID}_{SPAN_ID}_01",  # wrong separators
        f"0g-{TRACE_ID}-{SPAN_ID}-01",  # not hex
        f"00-{TRACE_ID[:-1]}x-{SPAN_ID}-01",
        f"01-{TRACE_ID}-{SPAN_ID}-01x",  # a later version's extra fields follow a dash
    ],
)
def test_a_malformed_traceparent_is_rejected(value: str) -> None:
    assert parse_traceparent(value) is None


def test_a_later_version_with_more_fields_is_accepted() -> None:
    assert parse_traceparent(f"cc-{TRACE_ID}-{SPAN_ID}-01-what-the-future-adds") is not None


def test_tracestate_is_kept_when_printable_and_short() -> None:
    assert valid_tracestate("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE")
    assert not valid_tracestate("x=" + "a" * 600)
    assert not valid_tracestate("x=1\r\nInjected: yes")


def test_headers_give_the_context_and_a_malformed_traceparent_is_ignored() -> None:
    assert from_headers({"traceparent": VALID, "tracestate": "a=1"}) == TraceHeaders(VALID, "a=1")
    assert from_headers({"traceparent": VALID, "tracestate": "a=\n"}) == TraceHeaders(VALID)
    assert from_headers({"traceparent": "00-nonsense"}) is None
    assert from_headers({"tracestate": "a=1"}) is None
    assert from_headers({}) is None


def test_the_frame_field_wins_over_the_connection_header() -> None:
    connection = TraceHeaders(VALID)
    other = f"00-{'1' * 32}-{'2' * 16}-01"
    assert chosen(other, None, connection) == TraceHeaders(other)
    assert chosen(None, "ignored=1", connection) is connection
    assert chosen(None, None, None) is None


def parse(frame: dict[str, object]) -> object:
    return parse_client_frame(json.dumps(frame), max_bytes=4096, max_messages=4)


def chat(**extra: object) -> dict[str, object]:
    return {"type": "chat", "id": "c1", "messages": [{"role": "user", "content": "hi"}], **extra}


def test_a_chat_frame_carries_a_valid_traceparent_and_tracestate() -> None:
    frame = parse(chat(traceparent=VALID, tracestate="vendor=abc"))
    assert isinstance(frame, ChatFrame)
    assert frame.traceparent == VALID and frame.tracestate == "vendor=abc"
    assert isinstance(parse(chat()), ChatFrame)


def test_a_chat_frame_with_a_malformed_traceparent_is_refused_with_invalid_request() -> None:
    with pytest.raises(InvalidRequest) as info:
        parse(chat(traceparent=f"00-{'0' * 32}-{SPAN_ID}-01"))
    assert info.value.code.value == "invalid_request"
    assert "traceparent: must be a W3C traceparent" in info.value.message
    with pytest.raises(InvalidRequest, match="tracestate: must be a W3C tracestate"):
        parse(chat(traceparent=VALID, tracestate="x" * 513))
    with pytest.raises(InvalidRequest, match="traceparent"):
        parse(chat(traceparent=5))


def test_the_chat_job_carries_the_context_and_old_payloads_still_validate() -> None:
    base = {
        "job_id": "j", "chat_id": "c", "tenant_id": "t", "key_id": "k",
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
        "received_at": 1.0, "enqueued_at": 1.0, "deadline_at": 2.0,
    }  # fmt: skip
    assert ChatJob.model_validate(base).traceparent is None
    job = ChatJob.model_validate({**base, "traceparent": VALID, "tracestate": "a=1"})
    assert (job.traceparent, job.tracestate) == (VALID, "a=1")


def test_an_engine_request_sends_its_trace_headers_only_when_traced() -> None:
    plain = EngineRequest([Message(role="user", content="hi")], "m", 8)
    assert trace_headers(plain) == {} and trace_header_lines(plain) == b""
    traced = EngineRequest(plain.messages, "m", 8, traceparent=VALID, tracestate="a=1")
    assert trace_header_lines(traced) == f"traceparent: {VALID}\r\ntracestate: a=1\r\n".encode()


def test_tracing_is_on_only_with_an_endpoint_and_not_switched_off() -> None:
    url = "http://collector:4318/v1/traces"
    assert tracing.traces_endpoint(None, {}) is None
    assert tracing.traces_endpoint(url, {}) == url
    assert tracing.traces_endpoint(None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}) == ""
    assert tracing.traces_endpoint(None, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": url}) == ""
    assert tracing.traces_endpoint(url, {"OTEL_TRACES_EXPORTER": "none"}) is None
    assert tracing.traces_endpoint(url, {"OTEL_TRACES_EXPORTER": "console,otlp"}) == url
    assert tracing.traces_endpoint(url, {"OTEL_SDK_DISABLED": "true"}) is None


def test_off_a_span_is_one_shared_no_op() -> None:
    assert not tracing.on
    with tracing.span("cache lookup", x=1) as first:
        first.set("k", "v")
    assert first is tracing.span("other") is tracing.NO_SPAN
    assert first.traceparent is None


def test_off_the_chat_path_never_imports_opentelemetry_of_ours() -> None:
    """The gateway, the worker's chat path and the engines import no tracing SDK module of
    firsttoken's while tracing is off (redis-py may import OpenTelemetry's API on its own)."""
    code = (
        "import sys, gateway.app, workers.chat.run, firsttoken.simserver; "
        "print('shared.tracing.otel' in sys.modules, 'opentelemetry.sdk.trace' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
