"""Engine deltas -> coalesced token chunks, published in seq order (see shared/coalesce.py)."""

from __future__ import annotations

import asyncio
import time

from shared.coalesce import Coalescer
from workers.publish import JobPublisher


class TokenStream:
    """Buffers text per the coalescing rule; one lock keeps flushes (and so seq) in order."""

    def __init__(self, publisher: JobPublisher, coalescer: Coalescer) -> None:
        self.publisher = publisher
        self.coalescer = coalescer
        self.lock = asyncio.Lock()
        self.timer: asyncio.TimerHandle | None = None
        self.text: list[str] = []
        self.first_published: float | None = None
        self.pending: set[asyncio.Task[None]] = set()

    @property
    def answer(self) -> str:
        return "".join(self.text)

    async def flush(self) -> None:
        async with self.lock:
            now = time.time()
            text = self.coalescer.take(now)
            if text:
                if self.first_published is None:
                    self.first_published = now
                await self.publisher.token(text)

    def _flush_later(self) -> None:
        self.timer = None
        task = asyncio.ensure_future(self.flush())
        self.pending.add(task)
        task.add_done_callback(self.pending.discard)

    async def add(self, text: str) -> None:
        self.text.append(text)
        if self.coalescer.add(text, time.time()):
            if self.timer is not None:
                self.timer.cancel()
                self.timer = None
            await self.flush()
        elif self.timer is None:
            due = self.coalescer.flush_at()
            if due is not None:
                loop = asyncio.get_running_loop()
                self.timer = loop.call_later(max(0.0, due - time.time()), self._flush_later)

    async def close(self) -> None:
        """Flush what waits (the answer is complete)."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.pending:
            await asyncio.gather(*self.pending, return_exceptions=True)
        await self.flush()

    def stop(self) -> None:
        """Drop what waits (the chat ended early)."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        for pending in list(self.pending):
            pending.cancel()
