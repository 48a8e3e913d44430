"""One long-lived asyncio loop per worker process, and the resources that live on it.

A chat worker runs its chats on this loop directly: the chat queue's reader lives on it
(workers/chat/pool.py). Bulk and summarize tasks run on Celery's threads pool; each submits a
coroutine to this loop and waits for it (`run_coroutine_threadsafe(...).result()`). So one
process holds many concurrent generations and shares one Redis pool, one engine client and one
DB pool. Never `asyncio.run()` per task: that would rebuild every pool per chat.

The loop starts once, under a lock: lazy start-up from several pool threads at once races
(it was seen to stall for many seconds and lose messages). workers/lifecycle.py starts and
stops it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Awaitable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class LoopRunner:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._inflight: set[concurrent.futures.Future[Any]] = set()

    def loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                try:
                    import uvloop

                    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
                except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
                    loop = asyncio.new_event_loop()
                started = threading.Event()

                def _run() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(started.set)
                    loop.run_forever()

                self._thread = threading.Thread(target=_run, name="firsttoken-loop", daemon=True)
                self._thread.start()
                started.wait()
                self._loop = loop
            return self._loop

    @property
    def started(self) -> bool:
        return self._loop is not None

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run a coroutine on the process loop from a pool thread and wait for its result."""
        return self.submit(coro).result(timeout)

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Start a coroutine on the process loop; tracked so shutdown can wait for it."""
        future = asyncio.run_coroutine_threadsafe(coro, self.loop())
        with self._lock:
            self._inflight.add(future)
        future.add_done_callback(self._inflight.discard)
        return future

    def drain(self, timeout: float) -> int:
        """Wait up to `timeout` for submitted coroutines; returns how many are still running."""
        with self._lock:
            pending = list(self._inflight)
        _, not_done = concurrent.futures.wait(pending, timeout=timeout)
        return len(not_done)

    def stop(self, cleanup: Awaitable[Any] | None = None, timeout: float = 5.0) -> None:
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None:
            if asyncio.iscoroutine(cleanup):
                cleanup.close()  # never started: nothing to clean up
            return
        if cleanup is not None:

            async def _cleanup() -> None:
                await cleanup

            try:
                asyncio.run_coroutine_threadsafe(_cleanup(), loop).result(timeout)
            except Exception:  # noqa: BLE001 - best effort at shutdown
                pass
        loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            thread.join(timeout)


runner = LoopRunner()
