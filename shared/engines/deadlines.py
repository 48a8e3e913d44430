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

from shared.engines.base import Delta
from shared.errors import DeadlineExceeded, EngineError


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
    async with aclosing(stream):
        while True:
            limit = idle_s if started else first_token_s
            try:
                async with asyncio.timeout(limit):
                    delta = await anext(stream)
            except StopAsyncIteration:
                return
            except TimeoutError as exc:
                if not started:
                    raise FirstTokenTimeout(
                        f"model {model!r} sent no first token within {first_token_s:g}s"
                    ) from exc
                raise EngineStalled(
                    f"model {model!r} stalled: no token for {idle_s:g}s after {tokens} "
                    "token(s); the answer is incomplete, please retry"
                ) from exc
            if delta.text:
                tokens += 1
            if delta.text or delta.finish_reason is not None:
                started = True
            yield delta


async def _generator(deltas: AsyncIterator[Delta]) -> AsyncGenerator[Delta, None]:
    async for delta in deltas:
        yield delta
