"""The retrieval stage's mechanics: concurrent sources, per-source deadlines, outcomes."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from shared import tracing

log = logging.getLogger(__name__)

Status = Literal["ok", "timeout", "error"]


@dataclass(frozen=True, slots=True)
class Query:
    """What every source gets: who asks, in which conversation, and what."""

    tenant_id: str
    question: str
    conversation_id: str | None = None
    key_id: str = ""


class Source(Protocol):
    """A source may also have ``cached(query) -> (value,) | None``: its answer when it has
    one without waiting (a row cached in the process, a question it need not look up), which
    :func:`gather_sources` then takes without starting a task for the source."""

    name: str
    deadline_s: float

    async def fetch(self, query: Query) -> Any: ...


@dataclass(frozen=True, slots=True)
class SourceResult:
    name: str
    status: Status
    ms: float
    value: Any = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"


async def run_source(source: Source, query: Query) -> SourceResult:
    """One source under its deadline; never raises (a failure is a result)."""
    start = time.perf_counter()
    try:
        # The timeout cancels the source at its deadline, so a hung DB query or embedding call
        # does not keep running (and holding a connection) after the chat moved on. (Not
        # wait_for: in 3.11 that wraps every source in one more task, on the hot path.)
        async with asyncio.timeout(source.deadline_s):
            value = await source.fetch(query)
        result = SourceResult(source.name, "ok", _since(start), value=value)
    except TimeoutError:
        result = SourceResult(source.name, "timeout", _since(start), error="deadline")
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure of a source degrades, never fails
        log.warning("retrieval source %s failed: %s", source.name, exc)
        result = SourceResult(source.name, "error", _since(start), error=type(exc).__name__)
    if tracing.on:
        tracing.source_span(result.name, result.status, result.ms, result.error, cached=False)
    return result


async def gather_sources(sources: Sequence[Source], query: Query) -> dict[str, SourceResult]:
    """Every source concurrently; the dict is in ``sources`` order.

    A source that answers from its cache is taken at once; when every source does, the stage
    never waits (each task would cost passes of a busy event loop before the first token)."""
    results: dict[str, SourceResult] = {}
    waiting: list[Source] = []
    for source in sources:
        answer = _answer_at_once(source, query)
        if answer is None:
            waiting.append(source)
        else:
            results[source.name] = answer
    if not waiting:
        return results
    for result in await asyncio.gather(*(run_source(s, query) for s in waiting)):
        results[result.name] = result
    return {s.name: results[s.name] for s in sources}


def _answer_at_once(source: Source, query: Query) -> SourceResult | None:
    cached = getattr(source, "cached", None)
    if cached is None:
        return None
    start = time.perf_counter()
    try:
        hit = cached(query)
    except Exception:  # a broken cache is only a miss: fetch decides
        log.warning("retrieval source %s: cache lookup failed", source.name, exc_info=True)
        return None
    if hit is None:
        return None
    result = SourceResult(source.name, "ok", _since(start), value=hit[0])
    if tracing.on:
        tracing.source_span(result.name, result.status, result.ms, None, cached=True)
    return result


async def run_serially(sources: Sequence[Source], query: Query) -> dict[str, SourceResult]:
    """One after the other (the naive stage); kept for the benchmark's comparison."""
    return {s.name: await run_source(s, query) for s in sources}


def summarize_results(results: dict[str, SourceResult]) -> dict[str, Any]:
    """The `done` frame's ``retrieval`` field: per-source status and ms, and what was skipped."""
    return {
        "sources": {
            name: {"status": r.status, "ms": r.ms} | ({"error": r.error} if r.error else {})
            for name, r in results.items()
        },
        "skipped": [name for name, r in results.items() if not r.ok],
    }


def _since(start: float) -> float:
    return round((time.perf_counter() - start) * 1000.0, 3)
