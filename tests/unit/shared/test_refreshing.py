"""workers/refreshing.py: one load per key however many miss at once, stale values served while
one background load refreshes them, a failed refresh keeps the old value."""

from __future__ import annotations

import asyncio

import pytest

from workers.refreshing import RefreshingCache


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Loader:
    def __init__(self) -> None:
        self.calls = 0
        self.gate = asyncio.Event()
        self.fail = False

    async def __call__(self) -> int:
        self.calls += 1
        await self.gate.wait()
        if self.fail:
            raise ConnectionError("database down")
        return self.calls


async def test_concurrent_misses_share_one_load() -> None:
    cache: RefreshingCache[str, int] = RefreshingCache(5.0)
    load = Loader()
    waiting = [asyncio.create_task(cache.get("t", load)) for _ in range(20)]
    await asyncio.sleep(0)
    load.gate.set()
    assert await asyncio.gather(*waiting) == [1] * 20
    assert load.calls == 1


async def test_an_expired_value_is_served_while_one_load_refreshes_it() -> None:
    clock = Clock()
    cache: RefreshingCache[str, int] = RefreshingCache(5.0, clock=clock)
    load = Loader()
    load.gate.set()
    assert await cache.get("t", load) == 1
    clock.now = 4.9
    assert await cache.get("t", load) == 1 and load.calls == 1  # fresh: no load
    clock.now = 5.1
    load.gate.clear()
    # Expired: the old value at once, for every caller, and a single refresh behind them.
    assert [await cache.get("t", load) for _ in range(5)] == [1] * 5
    await asyncio.sleep(0)  # the refresh starts
    assert load.calls == 2
    load.gate.set()
    await asyncio.sleep(0.01)
    assert await cache.get("t", load) == 2


async def test_a_failed_refresh_keeps_the_old_value_and_a_failed_first_load_raises() -> None:
    clock = Clock()
    cache: RefreshingCache[str, int] = RefreshingCache(5.0, clock=clock)
    load = Loader()
    load.gate.set()
    assert await cache.get("t", load) == 1
    clock.now = 6.0
    load.fail = True
    assert await cache.get("t", load) == 1
    await asyncio.sleep(0.01)
    assert await cache.get("t", load) == 1  # still served; the next call tries again
    with pytest.raises(ConnectionError):
        await cache.get("other", load)


async def test_a_cancelled_caller_does_not_cancel_the_shared_load() -> None:
    cache: RefreshingCache[str, int] = RefreshingCache(5.0)
    load = Loader()
    first = asyncio.create_task(cache.get("t", load))
    second = asyncio.create_task(cache.get("t", load))
    await asyncio.sleep(0)
    first.cancel()
    load.gate.set()
    assert await second == 1
    assert load.calls == 1


async def test_held_answers_without_waiting_and_refreshes_a_stale_value() -> None:
    clock, load = Clock(), Loader()
    cache: RefreshingCache[str, int] = RefreshingCache(5.0, clock=clock)
    assert cache.held("k", load) is None  # nothing held yet, and held() starts no load
    assert load.calls == 0
    load.gate.set()
    assert await cache.get("k", load) == 1
    assert cache.held("k", load) == (1,)
    clock.now = 10.0  # stale: still served, and one refresh starts in the background
    assert cache.held("k", load) == (1,)
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert load.calls == 2
    assert cache.held("k", load) == (2,)


async def test_a_forgotten_key_is_loaded_afresh_before_its_ttl() -> None:
    """An announced change (`firsttoken kb add`): the next get waits for a new load instead of
    serving the value it held for another ttl."""
    cache: RefreshingCache[str, int] = RefreshingCache(60.0, clock=Clock())
    load = Loader()
    load.gate.set()
    assert await cache.get("t", load) == 1
    assert await cache.get("t", load) == 1  # held
    cache.forget("t")
    assert await cache.get("t", load) == 2
    cache.forget("absent")  # forgetting a key never held is a no-op
