"""workers/chat/deferred.py: work off the first token's path waits while the queue has a backlog,
and runs, in order, once it is gone or after the longest hold."""

from __future__ import annotations

import asyncio
import logging

import pytest

from workers.chat.deferred import DeferredWork


async def test_without_a_backlog_it_runs_on_the_next_turn_of_the_loop() -> None:
    work, ran = DeferredWork(), []
    work.later(lambda: ran.append("a"))
    assert ran == []  # not inside the call that deferred it
    await asyncio.sleep(0)
    assert ran == ["a"]


async def test_held_while_reads_come_back_full_then_run_in_order() -> None:
    work, ran = DeferredWork(max_hold_s=60), []
    work.after_read(True)
    work.later(lambda: ran.append("a"))
    work.later(lambda: ran.append("b"))
    work.after_read(True)
    await asyncio.sleep(0)
    assert ran == [] and work.held == 2
    work.after_read(False)  # a short read: the backlog is gone
    assert ran == ["a", "b"] and work.held == 0
    work.later(lambda: ran.append("c"))  # no longer holding
    await asyncio.sleep(0)
    assert ran == ["a", "b", "c"]


async def test_held_work_runs_after_the_longest_hold_even_under_a_lasting_backlog() -> None:
    work, ran = DeferredWork(max_hold_s=0.2), []
    work.after_read(True)
    work.later(lambda: ran.append("a"))
    await asyncio.sleep(0)
    work.after_read(True)
    assert ran == []
    await asyncio.sleep(0.3)
    assert ran == ["a"]
    work.later(lambda: ran.append("b"))  # still holding: a new hold starts
    await asyncio.sleep(0)
    assert ran == ["a"]
    await asyncio.sleep(0.3)
    assert ran == ["a", "b"]


async def test_a_failing_callback_is_logged_and_the_rest_still_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    work, ran = DeferredWork(max_hold_s=60), []

    def boom() -> None:
        raise RuntimeError("boom")

    work.after_read(True)
    work.later(boom)
    work.later(lambda: ran.append("after"))
    with caplog.at_level(logging.ERROR, logger="workers.chat.deferred"):
        work.after_read(False)
    assert ran == ["after"]
    assert any("deferred work failed" in r.getMessage() for r in caplog.records)


async def test_background_sources_still_held_at_the_answers_end_are_reported_skipped() -> None:
    from workers import retrieval

    class Quota:
        name = "quota"

    prepared = retrieval.Prepared(
        job=None,  # type: ignore[arg-type]
        model="m",
        built=None,  # type: ignore[arg-type]
        decision=None,
        window=None,
        conversation_ok=False,
        retrieval={"sources": {}, "skipped": []},
        deferred=[(Quota(), None)],  # type: ignore[list-item]
    )
    await retrieval.settle_background(prepared)
    assert prepared.retrieval["skipped"] == ["quota"]
    retrieval.start_background(prepared)  # the held call, run after the answer: starts nothing
    assert prepared.background == {}
