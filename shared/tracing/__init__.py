"""Traces of one chat across the queue (issue 32): W3C trace context in, OTLP spans out.

Off unless an OTLP traces endpoint is configured (:func:`traces_endpoint`); then each process
(gateway, chat worker, `firsttoken sim-server`) exports its spans with OpenTelemetry's SDK (the
`otel` extra). The path of one chat, span by span::

    client traceparent (websocket upgrade or HTTP header, or the chat frame's field)
    └─ admission                (gateway: received -> enqueued)
       ├─ queue wait            (chat worker: enqueued -> picked up; the task message carries
       │  │                      the admission span's traceparent)
       │  ├─ cache lookup
       │  ├─ retrieval.<source> (one per source: user, conversation, kb, quota, probe)
       │  └─ engine request     (one per model tried; the engine gets its `traceparent`
       │     └─ llm_request      header, which vLLM and the sim-server continue)
       └─ relay                 (gateway: first chunk sent -> done or error relayed)

Off, it costs nothing: OpenTelemetry is never imported, and every hook on the per-chat path
is behind the one boolean :data:`on` (``if tracing.on:``), or is :func:`span`, which returns a
shared no-op without allocating. This package's own modules are ``context`` (pure: the W3C
values checked) and ``otel`` (the SDK; imported only by :func:`enable`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

from shared.errors import ConfigError
from shared.otlp import otlp_endpoint
from shared.tracing.context import TraceHeaders

if TYPE_CHECKING:
    from shared.settings import Settings
    from shared.tasks import ChatJob

__all__ = [
    "ChatTrace",
    "Span",
    "TraceHeaders",
    "chat_trace",
    "configure",
    "detach",
    "enable",
    "engine_span",
    "queue_wait",
    "server_span",
    "shutdown",
    "source_span",
    "span",
    "traces_endpoint",
]

# The one switch. Read as `tracing.on` (a module attribute, so enabling it later is seen).
on = False
_impl: Any = None  # shared.tracing.otel once enabled


class Span(Protocol):
    """A span in progress, as the hooks use it (a no-op one while tracing is off)."""

    @property
    def traceparent(self) -> str | None: ...

    @property
    def tracestate(self) -> str | None: ...

    def set(self, key: str, value: str | int | float | bool) -> None: ...

    def end(self, exc: BaseException | None = None) -> None: ...

    def __enter__(self) -> Span: ...

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...


class ChatTrace(Protocol):
    """The gateway's side of one chat: its admission span, then its relay span."""

    traceparent: str
    tracestate: str | None

    def admitted(self, job_id: str) -> None: ...

    def failed(self, exc: BaseException) -> None: ...

    def relayed(self, first_sent_at: float | None, chunks: int, ended: bool) -> None: ...


class _NoSpan:
    """What :func:`span` returns while tracing is off: one shared object that does nothing."""

    __slots__ = ()
    traceparent = None
    tracestate = None

    def set(self, key: str, value: str | int | float | bool) -> None:
        pass

    def end(self, exc: BaseException | None = None) -> None:
        pass

    def __enter__(self) -> _NoSpan:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


NO_SPAN = _NoSpan()


def traces_endpoint(configured: str | None, environ: Mapping[str, str]) -> str | None:
    """Where spans go (shared/otlp.py): ``configured`` (FIRSTTOKEN_OTLP_TRACES_ENDPOINT), else
    "" when OpenTelemetry's own variables name an endpoint, else None (off)."""
    return otlp_endpoint("traces", configured, environ)


def enable(endpoint: str, service: str, instance: str) -> None:
    """Export this process's spans to ``endpoint`` ("" : OpenTelemetry's environment
    variables say where). Raises ConfigError where the `otel` extra is not installed."""
    global on, _impl
    try:
        from shared.tracing import otel
    except ImportError as exc:
        raise ConfigError(
            f"traces are configured but OpenTelemetry is not installed ({exc}); "
            "install it with `pip install 'firsttoken[otel]'`, or unset "
            "FIRSTTOKEN_OTLP_TRACES_ENDPOINT and OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT"
        ) from exc
    otel.setup(endpoint or None, service, instance)
    _impl, on = otel, True


def configure(settings: Settings, service: str, instance: str) -> bool:
    """A process's start-up: tracing on when configured; whether it is."""
    endpoint = traces_endpoint(settings.otlp_traces_endpoint, os.environ)
    if endpoint is not None and not on:
        enable(endpoint, service, instance)
    return on


def shutdown() -> None:
    """Export what is still held (a process's close). Tracing stays off afterwards."""
    global on, _impl
    if _impl is not None:
        impl, _impl, on = _impl, None, False
        impl.shutdown()


# --- hooks: call only when `on` (span() checks it itself) --------------------------------------


def chat_trace(client: TraceHeaders | None, received: float, door: str) -> ChatTrace:
    """The gateway starts a chat's admission span (continuing the client's context)."""
    trace: ChatTrace = _impl.ChatTraceImpl(client, received, door)
    return trace


def queue_wait(job: ChatJob, started: float, worker: str, takeover: bool) -> object:
    """The chat worker's queue wait span (enqueued -> `started`, continuing the task message's
    context), made the current span of the chat's task: its stages' spans hang under it.
    Returns what :func:`detach` takes."""
    return _impl.queue_wait(job, started, worker, takeover)


def detach(token: object) -> None:
    _impl.detach(token)


def span(name: str, **attributes: str | int | float | bool) -> Span:
    """A child of the current span, to use as ``with tracing.span(...) as s:``; a shared no-op
    while tracing is off."""
    if not on:
        return NO_SPAN
    result: Span = _impl.LiveSpan(name, attributes)
    return result


def engine_span(model: str) -> Span:
    """An engine request's span (a child of the current span); its `traceparent` goes to the
    engine with the request."""
    result: Span = _impl.LiveSpan("engine request", {"gen_ai.request.model": model}, "client")
    return result


def server_span(client: TraceHeaders | None, name: str, **attributes: str | int) -> Span:
    """A server's span continuing the caller's context (the sim-server's, as vLLM's)."""
    result: Span = _impl.LiveSpan(name, attributes, "server", client)
    return result


def source_span(name: str, status: str, ms: float, error: str | None, *, cached: bool) -> None:
    """One retrieval source's span (workers/retrieval's SourceResult), ending now and as long
    as the source took."""
    _impl.source_span(name, status, ms, error, cached)
