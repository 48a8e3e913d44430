"""The spans, on OpenTelemetry's SDK, exported by OTLP/HTTP. Imported only when tracing is on
(shared/tracing/__init__.py's :func:`enable`): nothing here runs, or is imported, otherwise.

One TracerProvider per process, not the global one: firsttoken's spans go where its settings
say, whatever else in the process does with OpenTelemetry. Its sampler is the SDK's default
(parent-based, always on; OTEL_TRACES_SAMPLER changes it), so a client's unsampled
`traceparent` (flags 00) records nothing and is passed on unsampled. Batches go out every
OTEL_BSP_SCHEDULE_DELAY ms (5000 unless set) from the SDK's export thread, never from the loop.

No span attribute holds prompt or answer text, nor an exception's message (an engine's may
quote the prompt): errors are recorded by their code or type.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Mapping
from types import TracebackType
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import (
    Span,
    SpanKind,
    Status,
    StatusCode,
    Tracer,
    set_span_in_context,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from shared.errors import FirstTokenError
from shared.tasks import ChatJob
from shared.tracing.context import TraceHeaders, format_traceparent

_provider: TracerProvider | None = None
_tracer: Tracer | None = None
_PROPAGATOR = TraceContextTextMapPropagator()
_KINDS = {"internal": SpanKind.INTERNAL, "client": SpanKind.CLIENT, "server": SpanKind.SERVER}


def setup(endpoint: str | None, service: str, instance: str) -> None:
    """This process's provider and exporter; `endpoint` None: the exporter's own variables."""
    global _provider, _tracer
    attributes: dict[str, str] = {"service.instance.id": instance}
    if not os.environ.get("OTEL_SERVICE_NAME"):
        attributes["service.name"] = service
    provider = TracerProvider(resource=Resource.create(attributes))
    exporter = OTLPSpanExporter(endpoint=endpoint) if endpoint else OTLPSpanExporter()
    provider.add_span_processor(BatchSpanProcessor(exporter))
    _provider, _tracer = provider, provider.get_tracer("firsttoken")


def shutdown() -> None:
    global _provider, _tracer
    provider, _provider, _tracer = _provider, None, None
    if provider is not None:
        provider.shutdown()  # flushes what the batch holds


def _ns(t: float) -> int:
    return int(t * 1e9)


def _tracer_() -> Tracer:
    assert _tracer is not None, "tracing is not set up"
    return _tracer


def _extract(traceparent: str | None, tracestate: str | None) -> otel_context.Context | None:
    if traceparent is None:
        return None
    carrier = {"traceparent": traceparent}
    if tracestate:
        carrier["tracestate"] = tracestate
    return _PROPAGATOR.extract(carrier)


def _carried(span: Span) -> tuple[str, str | None]:
    """The `traceparent` and `tracestate` that continue `span` elsewhere."""
    ctx = span.get_span_context()
    state = ctx.trace_state.to_header() if ctx.trace_state else ""
    return format_traceparent(ctx.trace_id, ctx.span_id, int(ctx.trace_flags)), state or None


def _record(span: Span, exc: BaseException | None) -> None:
    if exc is None:
        return
    if isinstance(exc, asyncio.CancelledError | GeneratorExit):
        span.set_attribute("firsttoken.cancelled", True)  # stopped, not failed
        return
    kind = exc.code.value if isinstance(exc, FirstTokenError) else type(exc).__name__
    span.set_attribute("error.type", kind)
    span.set_status(Status(StatusCode.ERROR, kind))


class LiveSpan:
    """A span started now under the current span (or continuing `client`); ends at
    :meth:`end` or at the end of a ``with`` block."""

    __slots__ = ("_span",)

    def __init__(
        self,
        name: str,
        attributes: Mapping[str, Any],
        kind: str = "internal",
        client: TraceHeaders | None = None,
    ) -> None:
        parent = None if client is None else _extract(client.traceparent, client.tracestate)
        self._span = _tracer_().start_span(
            name, context=parent, kind=_KINDS[kind], attributes=attributes
        )

    @property
    def traceparent(self) -> str | None:
        return _carried(self._span)[0]

    @property
    def tracestate(self) -> str | None:
        return _carried(self._span)[1]

    def set(self, key: str, value: str | int | float | bool) -> None:
        self._span.set_attribute(key, value)

    def end(self, exc: BaseException | None = None) -> None:
        _record(self._span, exc)
        self._span.end()

    def __enter__(self) -> LiveSpan:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.end(exc)


class ChatTraceImpl:
    """The gateway's spans of one chat: admission (received -> enqueued; its context goes
    into the task message) and, once the answer has been relayed, relay."""

    __slots__ = ("_span", "traceparent", "tracestate")

    def __init__(self, client: TraceHeaders | None, received: float, door: str) -> None:
        parent = None if client is None else _extract(client.traceparent, client.tracestate)
        self._span = _tracer_().start_span(
            "admission",
            context=parent,
            kind=SpanKind.SERVER,
            attributes={"firsttoken.door": door},
            start_time=_ns(received),
        )
        self.traceparent, self.tracestate = _carried(self._span)

    def admitted(self, job_id: str) -> None:
        self._span.set_attribute("firsttoken.job_id", job_id)
        self._span.end()

    def failed(self, exc: BaseException) -> None:
        _record(self._span, exc)
        self._span.end()

    def relayed(self, first_sent_at: float | None, chunks: int, ended: bool) -> None:
        """The relay span: from the first chunk sent (no chunk: now) to now."""
        now = time.time()
        span = _tracer_().start_span(
            "relay",
            context=set_span_in_context(self._span),
            attributes={"firsttoken.relay.chunks": chunks, "firsttoken.relay.ended": ended},
            start_time=_ns(first_sent_at if first_sent_at is not None else now),
        )
        span.end(end_time=_ns(now))


def queue_wait(job: ChatJob, started: float, worker: str, takeover: bool) -> object:
    span = _tracer_().start_span(
        "queue wait",
        context=_extract(job.traceparent, job.tracestate),
        kind=SpanKind.CONSUMER,
        attributes={
            "firsttoken.job_id": job.job_id,
            "firsttoken.worker": worker,
            "firsttoken.takeover": takeover,
        },
        start_time=_ns(job.enqueued_at),
    )
    span.end(end_time=_ns(started))
    return otel_context.attach(set_span_in_context(span))


def detach(token: object) -> None:
    otel_context.detach(token)  # type: ignore[arg-type]


def source_span(name: str, status: str, ms: float, error: str | None, cached: bool) -> None:
    end = time.time_ns()
    span = _tracer_().start_span(
        f"retrieval.{name}",
        attributes={
            "firsttoken.retrieval.source": name,
            "firsttoken.retrieval.status": status,
            "firsttoken.retrieval.cached": cached,
        },
        start_time=end - int(ms * 1e6),
    )
    if status != "ok":
        span.set_attribute("error.type", error or status)
        span.set_status(Status(StatusCode.ERROR, status))
    span.end(end_time=end)
