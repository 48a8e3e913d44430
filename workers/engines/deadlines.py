"""Deadlines on any engine stream: one for the first token, one for each silence after it.

Applied around every engine (sim, openai, vllm) by the generation stage, so each behaves the
same when its server hangs. When a deadline passes, the pending read is cancelled, which
closes the engine's stream the way a disconnecting client would (the HTTP response is
closed, AsyncLLM.generate() aborts), so the engine stops spending on it.

- no first token within ``first_token_s``: :class:`FirstTokenTimeout` (a ``timeout``); the
  caller may fail over to another model, nothing has reached the client yet;
- no delta for ``idle_s`` after the first: :class:`EngineStalled` (an ``engine_error``): part
  of an answer has been sent, so the chat ends cleanly instead of silently switching models.

A delta "counts" as the first token if it carries text or ends the stream.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing

from shared.errors import DeadlineExceeded, EngineError
from workers.engines.base import Delta


class FirstTokenTimeout(DeadlineExceeded):
    """The engine sent no first token within the deadline."""


class EngineStalled(EngineError):
    """The engine went silent after its first token."""


async def with_deadlines(
    deltas: AsyncIterator[Delta], *, first_token_s: float, idle_s: float, model: str
) -> AsyncGenerator[Delta, None]:
    """``deltas``, failing with the errors above when a deadline passes; closes ``deltas``."""
    started = False
    tokens = 0
    stream = deltas if isinstance(deltas, AsyncGenerator) else _generator(deltas)
    watch = _Watchdog(first_token_s)
    async with aclosing(stream):
        try:
            while True:
                watch.waiting = True
                watch.since = watch.loop.time()
                try:
                    delta = await anext(stream)
                except StopAsyncIteration:
                    return
                except asyncio.CancelledError:
                    if not watch.expired():
                        raise
                    if not started:
                        raise FirstTokenTimeout(
                            f"model {model!r} sent no first token within {first_token_s:g}s"
                        ) from None
                    raise EngineStalled(
                        f"model {model!r} stalled: no token for {idle_s:g}s after {tokens} "
                        "token(s); the answer is incomplete, please retry"
                    ) from None
                watch.waiting = False
                if delta.text:
                    tokens += 1
                if not started and (delta.text or delta.finish_reason is not None):
                    started = True
                    watch.limit = idle_s
                yield delta
        finally:
            watch.close()


class _Watchdog:
    """One timer per stream instead of an ``asyncio.timeout`` per delta.

    Per delta the stream only notes when it started waiting (``since``); the timer fires at
    ``since + limit``, and if the stream has moved on since then it is set again for the
    current wait. Only a wait that really lasted ``limit`` cancels the task; a wait that is not
    in progress (the consumer holds the delta) never counts.
    """

    def __init__(self, limit: float) -> None:
        self.loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None, "with_deadlines runs inside a task"
        self.task = task
        self.limit = limit
        self.since = self.loop.time()
        self.waiting = False
        self._fired = False
        self._handle: asyncio.TimerHandle | None = self.loop.call_at(
            self.since + limit, self._check
        )

    def _check(self) -> None:
        now = self.loop.time()
        due = self.since + self.limit
        if not self.waiting:
            due = now + self.limit
        if now < due:
            self._handle = self.loop.call_at(due, self._check)
            return
        self._handle = None
        self._fired = True
        self.task.cancel()

    def expired(self) -> bool:
        """True when this watchdog cancelled the task (and nobody else did as well)."""
        return self._fired and self.task.uncancel() == 0

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


async def _generator(deltas: AsyncIterator[Delta]) -> AsyncGenerator[Delta, None]:
    async for delta in deltas:
        yield delta
