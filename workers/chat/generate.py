"""The generation stage: stream one chat's answer, failing over between models before the
first token only.

The chat asks for a model; the model table gives it a chain (the model, then its fallbacks).
Each model gets ``first_token_deadline_s`` to send a first token. If it sends none in time, or
fails before it (unreachable, HTTP error, broken stream), its request is closed (so its server
aborts it) and the next model of the chain is tried. Nothing has reached the client yet, so
the switch is invisible except in the `done` frame's ``model``, which names the model that
answered.

After the first token the chat is bound to its model: a failure or a stall ends it with a
clean ``engine_error``. Switching then would splice two models' answers into one text.

The decisions are pure functions (:func:`next_step`, :func:`final_error`); :class:`Generation`
only drives the engines.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import Literal, Protocol

from shared import tracing
from shared.errors import DeadlineExceeded, EngineError, FirstTokenError
from shared.modeltable import ModelSpec, ModelTable
from shared.protocol import CHUNK_STARTED, Failover, encode_started
from shared.settings import Settings
from shared.tasks import ChatJob
from workers.chat.takeover import Takeover, continuation_request
from workers.engines.base import Delta, Engine, EngineRequest
from workers.engines.deadlines import EngineStalled, with_deadlines

log = logging.getLogger(__name__)


class Engines(Protocol):
    """Where the stage gets a model's engine (the worker context keeps one per server)."""

    def engine_for(self, spec: ModelSpec) -> Engine: ...


@dataclass(frozen=True, slots=True)
class Failure:
    """One model that gave no first token, and why."""

    model: str
    error: FirstTokenError


OnFailover = Callable[[Failure, ModelSpec], Awaitable[None]]


# --- pure decisions -------------------------------------------------------------------------


def next_step(
    error: FirstTokenError, *, first_token_seen: bool, models_left: int
) -> Literal["failover", "fail"]:
    """What to do when a model fails: try the next one only if the client has seen nothing."""
    if first_token_seen or models_left == 0:
        return "fail"
    if isinstance(error, EngineError | DeadlineExceeded):
        return "failover"
    return "fail"


def final_error(failures: Sequence[Failure]) -> FirstTokenError:
    """The error the client gets when no model of the chain answered.

    ``timeout`` if every model was merely too slow, else ``engine_error``; the message names
    each model tried and what it did.
    """
    if len(failures) == 1:
        return failures[0].error
    reasons = "; ".join(f"{f.model}: {f.error.message}" for f in failures)
    message = f"no model answered ({len(failures)} tried): {reasons}"
    if all(isinstance(f.error, DeadlineExceeded) for f in failures):
        return DeadlineExceeded(message)
    return EngineError(message)


def from_model(error: FirstTokenError, model: str) -> FirstTokenError:
    """An engine's own error as the client reads it: which model failed (engines name no
    server, and one server may serve several models). The deadline errors name it already."""
    if not isinstance(error, EngineError) or isinstance(error, EngineStalled):
        return error
    named = type(error)(f"model {model!r}: {error.message}", detail=error.detail)
    named.__cause__ = error
    return named


# --- the stage -----------------------------------------------------------------------------


class Generation:
    """One chat's answer from the first model of ``chain`` that sends a first token in time.

    ``model`` names the model streaming now (after the stream: the one that answered).
    """

    def __init__(
        self,
        engines: Engines,
        models: ModelTable,
        request: EngineRequest,
        *,
        asked: str | None,
        request_id: str,
        first_token_s: float,
        idle_s: float,
        on_failover: OnFailover | None = None,
        bound: bool = False,
    ) -> None:
        """`bound`: the asked model only, no fallback (a continuation: another model would
        splice its text onto the first one's)."""
        self._engines = engines
        self._models = models
        # The model the client asked for (None: the default); request.model is replaced by
        # each model's served name.
        self._asked = asked
        self._request = request
        self._request_id = request_id
        self._first_token_s = first_token_s
        self._idle_s = idle_s
        self._on_failover = on_failover
        self._bound = bound
        self._current: tuple[Engine, str] | None = None
        self.model = asked or models.default
        self.failures: list[Failure] = []

    async def stream(self) -> AsyncGenerator[Delta, None]:
        """The answer's deltas; raises InvalidRequest for an unknown model (a chat enqueued
        past the gateway's check, or a table that differs between gateway and worker)."""
        chain = self._models.chain(self._asked)
        if self._bound:
            chain = chain[:1]
        for index, spec in enumerate(chain):
            self.model = spec.name
            engine = self._engines.engine_for(spec)
            # A fresh id per attempt: the failed attempt's id may still be winding down in a
            # shared engine (two table entries on one server), and ids must be unique there.
            request_id = self._request_id if index == 0 else f"{self._request_id}-{index}"
            self._current = (engine, request_id)
            request = dataclasses.replace(self._request, model=spec.engine_model)
            span = tracing.engine_span(spec.name) if tracing.on else None
            if span is not None:
                request = dataclasses.replace(
                    request, traceparent=span.traceparent, tracestate=span.tracestate
                )
            seen = False
            try:
                deltas = with_deadlines(
                    engine.stream(request, request_id=request_id),
                    first_token_s=self._first_token_s,
                    idle_s=self._idle_s,
                    model=spec.name,
                )
                async with aclosing(deltas):
                    async for delta in deltas:
                        seen = seen or bool(delta.text) or delta.finish_reason is not None
                        yield delta
                return
            except FirstTokenError as raised:
                exc = from_model(raised, spec.name)
                if span is not None:  # a failover's attempt too: its span says why
                    span.end(exc)
                    span = None
                left = len(chain) - index - 1
                if seen and exc is raised:
                    raise
                if seen:
                    raise exc from raised
                self.failures.append(Failure(spec.name, exc))
                if next_step(exc, first_token_seen=seen, models_left=left) == "fail":
                    raise final_error(self.failures) from raised
                nxt = chain[index + 1]
                log.warning(
                    "model %s failed before its first token (%s); trying %s",
                    spec.name,
                    exc.detail or exc.message,
                    nxt.name,
                )
                if self._on_failover is not None:
                    await self._on_failover(self.failures[-1], nxt)
            finally:
                self._current = None
                if span is not None:
                    span.end(sys.exc_info()[1])

    async def abort(self) -> None:
        """Abort the engine request in flight, if any (the stream's owner is going away)."""
        if self._current is not None:
            engine, request_id = self._current
            await engine.abort(request_id)


# --- the chat worker's entry ------------------------------------------------------------------


class _Publisher(Protocol):
    def control(self, kind: str, payload: str) -> None: ...


class _Context(Engines, Protocol):
    @property
    def models(self) -> ModelTable: ...

    @property
    def settings(self) -> Settings: ...


def job_generation(
    ctx: _Context, job: ChatJob, publisher: _Publisher, resume: Takeover | None = None
) -> Generation:
    """The generation of one chat job, with the worker's deadlines.

    On each failover the job's channel gets another `started` message: it tells the gateway
    the worker is alive, so its idle watchdog does not end a chat that is only changing models.
    `resume`: the chat was taken over from a dead worker with part of its answer sent; the
    engine continues that answer (shared/failover.py).
    """

    async def on_failover(failure: Failure, nxt: ModelSpec) -> None:
        failover: Failover = {"from": failure.model, "to": nxt.name}
        publisher.control(CHUNK_STARTED, encode_started(time.time(), failover))

    request = EngineRequest(
        messages=job.messages,
        model=job.model or ctx.models.default,
        max_tokens=job.max_tokens,
        temperature=job.temperature,
    )
    asked, bound = job.model, False
    if resume is not None and resume.kind == "continue":
        request = continuation_request(request, resume.text, resume.tokens)
        # The model that wrote the start writes the rest.
        asked, bound = resume.model or job.model, True
    return Generation(
        ctx,
        ctx.models,
        request,
        asked=asked,
        bound=bound,
        request_id=job.job_id,
        first_token_s=ctx.settings.first_token_deadline_s,
        idle_s=ctx.settings.engine_idle_timeout_s,
        on_failover=on_failover,
    )
