"""API key lookups (issue 43): requests that miss the in-process cache at the same moment (a
burst of HTTP requests with one key) share one lookup; an invalidation while it is in flight
keeps its result out of the cache."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from gateway.auth import Authenticator, Principal
from shared.db.apikeys import hash_key
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
    try:
        await auth.authenticate("sk-1")
    except Exception as exc:  # noqa: BLE001
        assert type(exc).__name__ == "Unauthorized"
    else:
        raise AssertionError("a key revoked during a lookup was served from the cache")
    assert redis.gets == 2
