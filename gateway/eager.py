"""A coroutine's first step run in place, the rest (if it must wait) finished by a task.

A websocket send on an open socket with room in its buffer never waits: uvicorn writes the
frame to the transport and returns. Run through the session's writer task it would still cost
a pass of the event loop per frame, which on a busy gateway is a wait behind every other ready
callback. :func:`start_eagerly` runs the send inside the call that made it (the relay's read
callback) and hands back what is left only when it had to wait (flow control: the client
reads slower than it is sent to), for the writer task to finish in order.

(Python 3.12's eager task factory does this for whole tasks; this gateway runs on 3.11.)
"""

from __future__ import annotations

from collections.abc import Coroutine, Generator
from typing import Any


def start_eagerly(coro: Coroutine[Any, Any, None]) -> Rest | None:
    """Run `coro` until it first waits: None when it finished; else the :class:`Rest` to
    await from a task. An exception of the first step is raised here."""
    try:
        waiting = coro.send(None)
    except StopIteration:
        return None
    return Rest(coro, waiting)


class Rest:
    """The rest of a coroutine that stopped at `waiting`; awaiting it runs it to the end."""

    __slots__ = ("_coro", "_waiting")

    def __init__(self, coro: Coroutine[Any, Any, None], waiting: Any) -> None:
        self._coro = coro
        self._waiting = waiting

    def __await__(self) -> Generator[Any, None, None]:
        coro, waiting = self._coro, self._waiting
        while True:
            try:
                yield waiting  # to the task awaiting us, as `await` would have passed it up
            except BaseException as exc:  # noqa: BLE001 - cancellation or an error: into the coro
                try:
                    waiting = coro.throw(exc)
                except StopIteration:
                    return
            else:
                try:
                    waiting = coro.send(None)
                except StopIteration:
                    return

    def close(self) -> None:
        """Drop it unfinished (the connection is going away)."""
        self._coro.close()
