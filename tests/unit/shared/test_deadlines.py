"""Deadlines around an engine stream (workers/engines/deadlines.py): one timer per stream."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import pytest

from workers.engines.base import Delta
from workers.engines.deadlines import EngineStalled, FirstTokenTimeout, with_deadlines


async def _deltas(gaps: list[float]) -> AsyncGenerator[Delta, None]:
    for gap in gaps:
        await asyncio.sleep(gap)
        yield Delta("x")
    yield Delta(finish_reason="stop")


async def _collect(gaps: list[float], *, first: float = 0.2, idle: float = 0.1) -> int:
    n = 0
    async for _ in with_deadlines(_deltas(gaps), first_token_s=first, idle_s=idle, model="m"):
        n += 1
    return n


async def test_steady_stream_passes() -> None:
    assert await _collect([0.15] + [0.05] * 10) == 12


async def test_no_first_token_in_time() -> None:
    with pytest.raises(FirstTokenTimeout, match=r"no first token within 0\.2s"):
        await _collect([0.4])


async def test_silence_after_the_first_token() -> None:
    with pytest.raises(EngineStalled, match="after 2 token"):
        await _collect([0.0, 0.05, 0.3])


async def test_time_the_consumer_holds_a_delta_does_not_count() -> None:
    """Only waiting on the engine counts: a consumer slower than the idle deadline is fine."""
    n = 0
    async for _ in with_deadlines(_deltas([0.0] * 3), first_token_s=0.2, idle_s=0.05, model="m"):
        await asyncio.sleep(0.12)
        n += 1
    assert n == 4


async def test_a_cancel_from_outside_stays_a_cancel() -> None:
    task = asyncio.create_task(_collect([0.0, 10.0], idle=5.0))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
