"""shared/redis/periodic.py: a background loop goes on past every failure; an unreachable
Redis is told as one outage, a bug with its traceback; only cancelling ends it."""

from __future__ import annotations

import asyncio
import logging

import pytest

from shared.redis.periodic import every


async def _run(steps: list[BaseException | None], *, at_once: bool) -> tuple[int, float]:
    """Run the loop over `steps` (None: a step that succeeds); returns how many steps ran and
    when the first one ran, relative to the start."""
    ran: list[float] = []
    loop = asyncio.get_running_loop()
    start = loop.time()
    done = asyncio.Event()

    async def step() -> None:
        ran.append(loop.time() - start)
        if len(ran) == len(steps):
            done.set()
        outcome = steps[len(ran) - 1] if len(ran) <= len(steps) else None
        if outcome is not None:
            raise outcome

    task = asyncio.create_task(
        every(0.05, step, logging.getLogger("t"), "test loop", at_once=at_once)
    )
    await asyncio.wait_for(done.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    return len(ran), ran[0]


async def test_an_outage_is_told_once_and_its_end_too(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    steps: list[BaseException | None] = [ConnectionError("refused")] * 3 + [None]
    count, _ = await _run(steps, at_once=False)
    assert count >= 4
    lines = [r.getMessage() for r in caplog.records]
    assert sum("unreachable" in line for line in lines) == 1, lines  # the second failure says it
    assert any("reachable again" in line for line in lines), lines
    assert not any(r.exc_info for r in caplog.records)  # an outage is no traceback


async def test_a_bug_keeps_its_traceback_and_the_loop_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    count, _ = await _run([ValueError("bug"), None], at_once=False)
    assert count >= 2
    (record,) = [r for r in caplog.records if "test loop failed" in r.getMessage()]
    assert record.exc_info is not None and record.exc_info[0] is ValueError


async def test_the_first_step_waits_an_interval_unless_at_once() -> None:
    _, first = await _run([None], at_once=True)
    assert first < 0.04
    _, first = await _run([None], at_once=False)
    assert first >= 0.04
