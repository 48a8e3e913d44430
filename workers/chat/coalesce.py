"""Token coalescing: when a worker flushes text to the client. Pure; no clock of its own.

Rule: the first text is flushed at once (time to first token is the product). After that, text
is flushed at once when at least ``interval_s`` has passed since the last flush, or when
``max_chars`` are waiting; otherwise it waits until ``last_flush + interval_s``. A slow stream
(tokens further apart than the interval) therefore gets no added delay, and a fast one (a GPU
emitting hundreds of tokens/s) is sent in a few larger messages instead of one per token.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class Coalescer:
    interval_s: float
    max_chars: int
    _buffer: list[str] = field(default_factory=list)
    _chars: int = 0
    _last_flush: float | None = None

    def add(self, text: str, now: float) -> bool:
        """Buffer text; True when the buffer should be flushed now."""
        if text:
            self._buffer.append(text)
            self._chars += len(text)
        return self._chars > 0 and (
            self._last_flush is None
            or self._chars >= self.max_chars
            or now - self._last_flush >= self.interval_s
        )

    def flush_at(self) -> float | None:
        """When the waiting text is due (None when nothing waits or nothing was flushed yet)."""
        if not self._chars or self._last_flush is None:
            return None
        return self._last_flush + self.interval_s

    def take(self, now: float) -> str:
        """Empty the buffer and return its text ('' when empty)."""
        text = "".join(self._buffer)
        self._buffer.clear()
        self._chars = 0
        if text:
            self._last_flush = now
        return text
