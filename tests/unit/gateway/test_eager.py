"""gateway/eager.py: a coroutine that needs no wait finishes inside start_eagerly; one that
waits is finished, in order and cancellable, by the task that awaits its rest."""

from __future__ import annotations

import asyncio

import pytest

from gateway.eager import start_eagerly


async def test_a_coroutine_that_never_waits_finishes_in_place() -> None:
    done: list[str] = []
    ready = asyncio.Event()
    ready.set()

    async def send() -> None:
        await ready.wait()  # set: no wait, as a websocket with room in its buffer
        done.append("sent")

    assert start_eagerly(send()) is None
    assert done == ["sent"]


async def test_a_coroutine_that_waits_is_finished_by_the_task_awaiting_its_rest() -> None:
    done: list[str] = []
    writable = asyncio.Event()

    async def send() -> None:
        done.append("started")
        await writable.wait()  # flow control
        await asyncio.sleep(0)
        done.append("sent")

    rest = start_eagerly(send())
    assert rest is not None and done == ["started"]
    task = asyncio.ensure_future(_await(rest))
    await asyncio.sleep(0.01)
    assert done == ["started"]
    writable.set()
    await asyncio.wait_for(task, 1)
    assert done == ["started", "sent"]


async def _await(rest: object) -> None:
    await rest  # type: ignore[misc]


async def test_cancelling_the_task_cancels_the_coroutine_and_errors_propagate() -> None:
    cleaned: list[str] = []
    never = asyncio.Event()

    async def send() -> None:
        try:
            await never.wait()
        finally:
            cleaned.append("finally")

    rest = start_eagerly(send())
    assert rest is not None
    task = asyncio.ensure_future(_await(rest))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cleaned == ["finally"]

    async def broken() -> None:
        raise ConnectionResetError("gone")

    with pytest.raises(ConnectionResetError):
        start_eagerly(broken())

    fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def fails_later() -> None:
        await fut

    later = start_eagerly(fails_later())
    assert later is not None
    fut.set_exception(OSError("reset"))
    with pytest.raises(OSError, match="reset"):
        await _await(later)
