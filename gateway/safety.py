"""Input safety at the edge: origins, connections per process, idle connections, message size.

Frame size, message count, JSON shape and UTF-8 validity are the parser's job
(``shared/protocol.py``); what needs the gateway's settings or its set of sessions lives here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol
from urllib.parse import urlsplit

from shared.errors import InvalidRequest
from shared.protocol import Message

log = logging.getLogger(__name__)

# How often idle connections are looked for: the idle timeout holds to within this.
SWEEP_INTERVAL_S = 1.0


def parse_origins(value: str) -> frozenset[str]:
    """The allowed-origins setting as a set of normalised origins (`*` kept as is)."""
    return frozenset(part.strip().rstrip("/").lower() for part in value.split(",") if part.strip())


def origin_allowed(origin: str | None, host: str | None, allowed: frozenset[str]) -> bool:
    """Whether a websocket with this Origin header may connect.

    Browsers always send Origin; other clients usually do not, and an origin check protects
    nothing against them (they can send any header), so a missing Origin is allowed. A page
    served by the gateway itself (same host and port) is always allowed.
    """
    if origin is None:
        return True
    origin = origin.strip().rstrip("/").lower()
    if "*" in allowed or origin in allowed:
        return True
    netloc = urlsplit(origin).netloc
    return bool(host) and netloc == (host or "").strip().lower()


def check_message_chars(messages: Sequence[Message], max_chars: int) -> None:
    """Refuse a chat with any message longer than `max_chars` characters."""
    for i, message in enumerate(messages):
        if len(message.content) > max_chars:
            raise InvalidRequest(
                f"messages[{i}] has {len(message.content)} characters; the limit is {max_chars}"
            )


class Closable(Protocol):
    """What the idle sweep needs from a session."""

    @property
    def last_active(self) -> float: ...

    @property
    def jobs(self) -> Mapping[str, object]: ...

    def close_idle(self) -> None: ...


class ConnectionGuard:
    """Counts this process's connections and closes the ones that went idle."""

    def __init__(self, *, max_connections: int, idle_timeout_s: float, origins: str) -> None:
        self.max_connections = max_connections
        self.idle_timeout_s = idle_timeout_s
        self.origins = parse_origins(origins)
        self.open = 0
        self._sweeper: asyncio.Task[None] | None = None

    def try_open(self) -> bool:
        """Take a connection slot; False when the process is full. Pair with :meth:`release`."""
        if self.open >= self.max_connections:
            return False
        self.open += 1
        return True

    def release(self) -> None:
        self.open -= 1

    def origin_ok(self, origin: str | None, host: str | None) -> bool:
        return origin_allowed(origin, host, self.origins)

    def start(self, sessions: Callable[[], Iterable[Closable]]) -> None:
        self._sweeper = asyncio.create_task(self._sweep(sessions))

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(BaseException):
                await self._sweeper

    def sweep_once(self, sessions: Iterable[Closable], now: float) -> int:
        """Close every session idle past the timeout; returns how many."""
        closed = 0
        for session in list(sessions):
            if not session.jobs and now - session.last_active >= self.idle_timeout_s:
                session.close_idle()
                closed += 1
        return closed

    async def _sweep(self, sessions: Callable[[], Iterable[Closable]]) -> None:
        interval = min(SWEEP_INTERVAL_S, self.idle_timeout_s / 2)
        while True:
            await asyncio.sleep(interval)
            try:
                self.sweep_once(sessions(), time.monotonic())
            except Exception:
                log.warning("idle sweep failed", exc_info=True)
