"""The answer's text on its way out of the worker: engine deltas -> coalesced token chunks,
published on the chat's channel in seq order (the rule is workers/chat/coalesce.py; the gateway's
relay, gateway/relay.py, takes them from there to the socket).

Publishing only queues a chunk on the process's Redis pipe, so every method here is a
plain function: a flush cannot interleave with another, and seq order is the call order.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

from workers.chat.coalesce import Coalescer
from workers.chat.publish import JobPublisher

# How soon text held at a closed fence is offered again (the keeper's look is a round trip).
FENCE_RETRY_S = 0.02


class Fence(Protocol):
    """Whether the worker may publish now (workers/chat/failover.py JobLeases)."""

    def closed(self) -> bool: ...


class TokenStream:
    """Buffers text per the coalescing rule; a timer flushes what waits past the interval."""

    def __init__(
        self, publisher: JobPublisher, coalescer: Coalescer, fence: Fence | None = None
    ) -> None:
        self.publisher = publisher
        self.coalescer = coalescer
        self.fence = fence
        self.timer: asyncio.TimerHandle | None = None
        self.text: list[str] = []
        self.first_published: float | None = None
        # Deltas added so far (a continued chat starts at the count already sent): each chunk
        # carries it, so a worker taking the chat over knows how many tokens were sent.
        self.tokens = 0

    @property
    def answer(self) -> str:
        return "".join(self.text)

    def flush(self) -> None:
        if self.fence is not None and self.fence.closed():
            # This worker may have been taken for dead: the text waits for its keeper (one
            # clock read per chunk, nothing per token). The chat's end waits for it too.
            if self.timer is None:
                self.timer = asyncio.get_running_loop().call_later(FENCE_RETRY_S, self._flush_later)
            return
        now = time.time()
        text = self.coalescer.take(now)
        if text:
            if self.first_published is None:
                self.first_published = now
            self.publisher.token(text, self.tokens)

    def _flush_later(self) -> None:
        self.timer = None
        self.flush()

    def add(self, text: str) -> None:
        self.text.append(text)
        self.tokens += 1
        if self.coalescer.add(text, time.time()):
            self._cancel_timer()
            self.flush()
        elif self.timer is None:
            due = self.coalescer.flush_at()
            if due is not None:
                loop = asyncio.get_running_loop()
                self.timer = loop.call_later(max(0.0, due - time.time()), self._flush_later)

    def close(self) -> None:
        """Flush what waits (the answer is complete)."""
        self._cancel_timer()
        self.flush()

    def stop(self) -> None:
        """Drop what waits (the chat ended early)."""
        self._cancel_timer()

    def _cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
