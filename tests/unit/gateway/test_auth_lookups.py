"""API key lookups (issue 43): requests that miss the in-process cache at the same moment (a
burst of HTTP requests with one key) share one lookup; an invalidation while it is in flight
keeps its result out of the cache."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from gateway.auth import Authenticator, Principal
from shared.db.apikeys import hash_key
from shared.errors import Unauthorized
from shared.keys import Keys

RECORD = {"tenant_id": "t1", "key_id": "k1", "scope": "chat", "revoked": False}


class SlowRedis:
    """Answers GET after a pause, counting the calls."""

    def __init__(self, record: dict[str, Any] | None = RECORD) -> None:
        self.gets = 0
        self.record = record
        self.release = asyncio.Event()

    async def get(self, key: str) -> str | None:
        self.gets += 1
        await self.release.wait()
        return None if self.record is None else json.dumps(self.record)


def _auth(redis: SlowRedis, cache_s: float = 1.0) -> Authenticator:
    return Authenticator(redis, Keys("t:"), sessions=None, cache_s=cache_s)  # type: ignore[arg-type]


async def test_a_burst_of_misses_shares_one_lookup() -> None:
    redis = SlowRedis()
    auth = _auth(redis)
    calls = [asyncio.ensure_future(auth.authenticate("sk-1")) for _ in range(11)]
    await asyncio.sleep(0)
    redis.release.set()
    principals = await asyncio.gather(*calls)
    assert redis.gets == 1
    assert all(isinstance(p, Principal) and p.key_id == "k1" for p in principals)
    await auth.authenticate("sk-1")  # cached now
    assert redis.gets == 1


async def test_a_request_that_goes_away_does_not_cancel_the_others_lookup() -> None:
    redis = SlowRedis()
    auth = _auth(redis)
    first = asyncio.ensure_future(auth.authenticate("sk-1"))
    second = asyncio.ensure_future(auth.authenticate("sk-1"))
    await asyncio.sleep(0)
    first.cancel()
    redis.release.set()
    assert (await second).key_id == "k1"
    assert redis.gets == 1


async def test_an_invalidation_in_flight_keeps_the_answer_out_of_the_cache() -> None:
    redis = SlowRedis()
    auth = _auth(redis)
    call = asyncio.ensure_future(auth.authenticate("sk-1"))
    await asyncio.sleep(0)
    auth.invalidate(hash_key("sk-1"))  # revoked meanwhile: the next request asks again
    redis.release.set()
    await call
    redis.record = {**RECORD, "revoked": True}
    with pytest.raises(Unauthorized):  # not served from the cache
        await auth.authenticate("sk-1")
    assert redis.gets == 2


class Records:
    """GET and MGET over a dict of key records, counting the calls."""

    def __init__(self) -> None:
        self.records: dict[str, dict[str, Any]] = {}
        self.gets = self.mgets = 0
        self.during_mget: Any = None
        self.asked: list[str] = []

    async def get(self, key: str) -> str | None:
        self.gets += 1
        record = self.records.get(key)
        return None if record is None else json.dumps(record)

    async def mget(self, keys: list[str]) -> list[str | None]:
        self.mgets += 1
        self.asked.extend(keys)
        if self.during_mget is not None:
            self.during_mget()
        return [await self.get(k) for k in keys]


async def test_keys_in_use_are_read_again_in_the_background() -> None:
    redis = Records()
    keys = Keys("t:")
    redis.records[keys.api_key(hash_key("sk-1"))] = RECORD
    auth = Authenticator(redis, keys, sessions=None, cache_s=0.2)  # type: ignore[arg-type]
    await auth.authenticate("sk-1")
    assert redis.gets == 1
    await auth.refresh()
    assert redis.mgets == 1
    await asyncio.sleep(0.15)
    await auth.refresh()  # before the first answer ages out (0.2 s): kept fresh
    await asyncio.sleep(0.1)
    await auth.authenticate("sk-1")  # 0.25 s after its own lookup: no round trip of its own
    assert redis.gets == 1 + 2  # the two refreshes' reads
    # Revoked in Redis: the next refresh caches the refusal, as a lookup would.
    redis.records[keys.api_key(hash_key("sk-1"))] = {**RECORD, "revoked": True}
    await auth.refresh()
    with pytest.raises(Unauthorized):
        await auth.authenticate("sk-1")


async def test_a_refresh_spanning_an_invalidation_stores_nothing() -> None:
    redis = Records()
    keys = Keys("t:")
    digest = hash_key("sk-1")
    redis.records[keys.api_key(digest)] = RECORD
    auth = Authenticator(redis, keys, sessions=None, cache_s=1.0)  # type: ignore[arg-type]
    await auth.authenticate("sk-1")
    redis.during_mget = lambda: auth.invalidate(digest)
    await auth.refresh()
    redis.during_mget = None
    gets = redis.gets
    await auth.authenticate("sk-1")  # invalidated: looked up afresh
    assert redis.gets == gets + 1


async def test_nothing_is_refreshed_without_a_cache() -> None:
    redis = Records()
    auth = Authenticator(redis, Keys("t:"), sessions=None, cache_s=0.0)  # type: ignore[arg-type]
    await auth.keep_fresh()  # returns at once
    await auth.refresh()
    assert redis.mgets == 0


async def test_a_refresh_reads_at_most_the_most_recently_used_keys(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import gateway.auth as auth_module

    monkeypatch.setattr(auth_module, "KEEP_FRESH_MAX_KEYS", 2)
    redis = Records()
    keys = Keys("t:")
    auth = Authenticator(redis, keys, sessions=None, cache_s=1.0)  # type: ignore[arg-type]
    for name in ("sk-1", "sk-2", "sk-3"):
        redis.records[keys.api_key(hash_key(name))] = RECORD
        await auth.authenticate(name)
        await asyncio.sleep(0.001)
    await auth.refresh()
    assert sorted(redis.asked) == sorted(keys.api_key(hash_key(n)) for n in ("sk-2", "sk-3"))
