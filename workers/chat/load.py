"""A worker process's load, as its heartbeat reports it (workers/workerstatus.py).

Counters the chat path bumps (two integer additions per chat, in workers/chat/record.py) and a
probe of the pool's in-flight and capacity, read once per heartbeat: the chat pool's reader
(workers/chat/pool.py) or Celery's own bookkeeping for the thread pools (workers/app.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sized
from typing import Any, Protocol

from shared.errors import ErrorCode

# (in flight, capacity, done): what a pool says about itself at a beat; `done` None where the
# chats' own count (WorkerLoad.ended) is the one that counts.
Probe = Callable[[], tuple[int, int, int | None]]


class WorkerLoad:
    """One per process, on the worker's context (workers/resources.py)."""

    def __init__(self) -> None:
        self.done = 0
        self.engine_errors = 0
        self._probe: Probe | None = None
        self._last: tuple[int, int, int | None] = (0, 0, None)

    def ended(self, finish_reason: str) -> None:
        """A chat ended (its usage row was recorded) with this finish reason or error code."""
        self.done += 1
        if finish_reason == ErrorCode.ENGINE_ERROR:
            self.engine_errors += 1

    def watch(self, probe: Probe) -> None:
        """Read in-flight and capacity from `probe` at every beat from now on."""
        self._probe = probe

    def sample(self) -> tuple[int, int, int]:
        """(in flight, capacity, done) now. A probe that fails (a pool's structures changing
        under a read from another thread) repeats the last sample."""
        if self._probe is not None:
            try:
                self._last = self._probe()
            except RuntimeError:
                pass
        in_flight, capacity, done = self._last
        return in_flight, capacity, self.done if done is None else done


class ChatReader(Protocol):
    """The chat pool's reader (workers/chat/consumer.py QueueConsumer), as far as it is probed."""

    @property
    def running(self) -> Sized: ...

    @property
    def concurrency(self) -> int: ...


def chat_pool_probe(reader: ChatReader) -> Probe:
    """In-flight and capacity of the chat pool; its chats count themselves as they end."""
    return lambda: (len(reader.running), reader.concurrency, None)


def celery_pool_probe(worker: Any) -> Probe:
    """In-flight, capacity and tasks finished of a Celery worker's own pool (bulk, summarize),
    from the bookkeeping Celery keeps anyway (`celery.worker.state`; read, never written).

    The size is read at each beat, not once: the pool exists only after `worker_init`, and
    Celery resolves a concurrency of "auto" after it too."""
    from celery.worker import state

    def probe() -> tuple[int, int, int | None]:
        active = len(state.active_requests)
        pool = getattr(worker, "pool", None)
        size = getattr(pool, "num_processes", None) if pool is not None else None
        if not isinstance(size, int):
            size = worker.concurrency if isinstance(worker.concurrency, int) else 0
        # total_count counts tasks accepted: those finished are the ones no longer active.
        accepted = sum(list(state.total_count.values()))
        return active, size, max(0, accepted - active)

    return probe
