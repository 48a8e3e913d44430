"""A small in-process cache for rows that change rarely and are read on every request.

Each key's value is loaded once, by one load, however many requests miss at the same moment
(they all await that load), and after `ttl_s` the old value keeps being served while one load
in the background refreshes it. So a chat never waits for the database once a key is warm, and
a burst of chats at the moment a value expires causes one query, not one per chat (which had
put a wave of queries, each a few ms of CPU, in front of that many first tokens).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class RefreshingCache(Generic[K, V]):
    def __init__(
        self,
        ttl_s: float,
        max_keys: int = 50_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl_s = ttl_s
        self.max_keys = max_keys
        self._clock = clock
        self._values: dict[K, tuple[float, V]] = {}  # key -> (fresh until, value)
        self._loads: dict[K, asyncio.Future[V]] = {}

    async def get(self, key: K, load: Callable[[], Awaitable[V]]) -> V:
        """The value of `key`, from `load()` the first time; see the module docstring."""
        hit = self.held(key, load)
        if hit is not None:
            return hit[0]
        # shield: a caller that is cancelled must not cancel the load the others await.
        return await asyncio.shield(self._load(key, load))

    def held(self, key: K, load: Callable[[], Awaitable[V]]) -> tuple[V] | None:
        """``(value,)`` when one is held, without waiting (a stale one starts its refresh in
        the background, as in :meth:`get`); None before the first load has finished."""
        held = self._values.get(key)
        if held is None:
            return None
        if held[0] <= self._clock() and key not in self._loads:
            self._load(key, load)  # refreshed in the background; this caller is not held up
        return (held[1],)

    def forget(self, key: K) -> None:
        """Drop the value of `key`: the next :meth:`get` loads it afresh (its change was
        announced; a load already running may still store the old value once)."""
        self._values.pop(key, None)

    def _load(self, key: K, load: Callable[[], Awaitable[V]]) -> asyncio.Future[V]:
        running = self._loads.get(key)
        if running is not None:
            return running
        future = asyncio.ensure_future(self._store(key, load))
        self._loads[key] = future
        future.add_done_callback(lambda done: self._settle(key, done))
        return future

    async def _store(self, key: K, load: Callable[[], Awaitable[V]]) -> V:
        value = await load()
        if len(self._values) >= self.max_keys and key not in self._values:
            self._values.clear()
        self._values[key] = (self._clock() + self.ttl_s, value)
        return value

    def _settle(self, key: K, done: asyncio.Future[V]) -> None:
        del self._loads[key]
        if done.cancelled() or done.exception() is None:
            return
        if key in self._values:
            # A failed refresh keeps serving the old value; the next request tries again.
            log.warning("refreshing %r failed (%s); serving the old value", key, done.exception())
