"""The cache's Redis side and this process's copy of it.

Redis holds the truth: one hash per entry (with a TTL), an exact-key pointer, a per-tenant LRU
sorted set, and a stream of add/remove events. Every worker process keeps the vectors in a
:class:`CacheIndex` and follows the stream (XREAD, blocking 200 ms), so an entry written by one
process is searchable in all of them well within a second; a process that starts reads every live
entry back first. Answers and question text stay in Redis: a candidate is fetched (one round trip
for all candidates) only after the vector search.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import random
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import redis.asyncio as aioredis

from shared.keys import Keys
from shared.logs import OutageLog
from shared.redis.client import UNREACHABLE
from workers.cache.index import CacheIndex, Vector
from workers.cache.policy import Candidate

log = logging.getLogger(__name__)

EVENTS_MAXLEN = 100_000  # enough for any follower that is less than a second behind
_FOLLOW_BLOCK_MS = 200


def encode_vector(vector: Vector) -> str:
    return base64.b64encode(np.asarray(vector, dtype=np.float32).tobytes()).decode()


def decode_vector(text: str) -> Vector | None:
    if not text:
        return None
    return np.frombuffer(base64.b64decode(text), dtype=np.float32).copy()


@dataclass(frozen=True, slots=True)
class StoredAnswer:
    """What a hit replays."""

    entry_id: str
    answer: str
    model: str
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True, slots=True)
class NewEntry:
    tenant: str
    partition: str
    exact: str
    question: str
    context: str
    context_key: str
    vector: Vector
    context_vector: Vector | None
    answer: str
    model: str
    prompt_tokens: int
    completion_tokens: int


def _candidate(data: dict[str, str]) -> Candidate:
    return Candidate(
        question=data.get("q", ""),
        context=data.get("ctx", ""),
        context_key=data.get("ck", ""),
        context_vector=decode_vector(data.get("cv", "")),
        completion_tokens=int(data.get("ct", "0")),
    )


def _answer(entry_id: str, data: dict[str, str]) -> StoredAnswer:
    return StoredAnswer(
        entry_id=entry_id,
        answer=data["a"],
        model=data.get("m", ""),
        prompt_tokens=int(data.get("pt", "0")),
        completion_tokens=int(data.get("ct", "0")),
    )


class CacheStore:
    """One per process: Redis I/O plus the in-memory index kept in sync with it."""

    def __init__(
        self,
        redis: aioredis.Redis,
        keys: Keys,
        *,
        dim: int,
        ttl_s: int,
        max_entries: int,
        ann_min_entries: int,
    ) -> None:
        # Typed as Any: redis-py annotates replies as bytes | str whatever decode_responses says;
        # this client always decodes (the workers' pool sets decode_responses=True).
        self.redis: Any = redis
        self.keys = keys
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self.index = CacheIndex(dim, ann_min_entries)
        self._last_event = "0-0"
        self._follower: asyncio.Task[None] | None = None
        self.ready = asyncio.Event()

    # --- start-up and sync ----------------------------------------------------------------
    async def start(self) -> None:
        """Rebuild from Redis, then follow the event stream in the background."""
        # Remember where the stream is *before* reading the entries: events after this point are
        # re-applied (harmless: adds and removes are idempotent), none are lost.
        last = await self.redis.xrevrange(self.keys.cache_events, count=1)
        self._last_event = last[0][0] if last else "0-0"
        await self.rebuild()
        self._follower = asyncio.create_task(self._follow())
        self.ready.set()

    async def rebuild(self) -> int:
        now = time.time()
        loaded = 0
        for tenant in await self.redis.smembers(self.keys.cache_tenants):
            ids = await self.redis.zrange(self.keys.cache_lru(tenant), 0, -1)
            for start in range(0, len(ids), 1000):
                batch = ids[start : start + 1000]
                async with self.redis.pipeline(transaction=False) as pipe:
                    for entry_id in batch:
                        pipe.hmget(self.keys.cache_entry(entry_id), ["p", "v", "exp", "x"])
                    rows = await pipe.execute()
                for entry_id, (part, vec, exp, exact) in zip(batch, rows, strict=True):
                    vector = decode_vector(vec or "")
                    if part is None or vector is None or float(exp or 0) <= now:
                        continue
                    self.index.add(tenant, part, int(entry_id), vector, float(exp), exact or "")
                    loaded += 1
        return loaded

    async def _follow(self) -> None:
        outage = OutageLog(log, "cache follower")
        while True:
            try:
                reply = await self.redis.xread(
                    {self.keys.cache_events: self._last_event}, block=_FOLLOW_BLOCK_MS, count=1000
                )
            except asyncio.CancelledError:
                raise
            except UNREACHABLE as exc:
                outage.failed(exc)
                await asyncio.sleep(0.5)
                continue
            except Exception:
                log.warning("cache follower failed; retrying", exc_info=True)
                await asyncio.sleep(0.5)
                continue
            outage.ok()
            for _stream, events in reply or ():
                for event_id, fields in events:
                    self._apply(fields)
                    self._last_event = event_id

    def _apply(self, fields: dict[str, str]) -> None:
        key = int(fields["id"])
        if fields.get("op") == "del":
            self.index.remove(key)
            return
        vector = decode_vector(fields.get("v", ""))
        if vector is not None:
            self.index.add(
                fields["t"], fields["p"], key, vector, float(fields["exp"]), fields.get("x", "")
            )

    async def close(self) -> None:
        if self._follower is not None:
            self._follower.cancel()
            with contextlib.suppress(BaseException):
                await self._follower

    # --- lookups --------------------------------------------------------------------------
    async def get_exact(self, tenant: str, exact: str) -> StoredAnswer | None:
        known = self.index.exact(tenant, exact, time.time())
        if known is not None:
            entry_id = str(known)
        else:
            # Written by another process less than a sync interval ago, or never: ask Redis.
            entry_id = await self.redis.get(self.keys.cache_exact(tenant, exact))
            if entry_id is None:
                return None
        data = await self.redis.hgetall(self.keys.cache_entry(entry_id))
        if not data or data.get("t") != tenant:
            return None
        return _answer(entry_id, data)

    async def candidates(
        self, tenant: str, part: str, vector: Vector, *, k: int, min_score: float
    ) -> list[tuple[float, Candidate, StoredAnswer]]:
        """Nearest live entries of the partition, with what the judge needs, best first."""
        found = self.index.search(tenant, part, vector, k=k, min_score=min_score, now=time.time())
        if not found:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for key, _ in found:
                pipe.hgetall(self.keys.cache_entry(str(key)))
            rows: list[dict[str, str]] = await pipe.execute()
        out = []
        for (key, score), data in zip(found, rows, strict=True):
            if not data or data.get("t") != tenant:
                self.index.remove(key)  # expired or evicted in Redis: forget it here too
                continue
            out.append((score, _candidate(data), _answer(str(key), data)))
        return out

    async def touch(self, tenant: str, entry_id: str) -> None:
        """Mark an entry recently used (LRU); off the hot path, after the replay."""
        await self.redis.zadd(self.keys.cache_lru(tenant), {entry_id: time.time()}, xx=True)

    # --- writes ---------------------------------------------------------------------------
    async def put(self, entry: NewEntry) -> str:
        """Store an answer, announce it to every process, and evict past the tenant's cap."""
        entry_id = str(random.getrandbits(62) + 1)  # a usearch key as well as a Redis id
        now = time.time()
        expires = now + self.ttl_s
        vec = encode_vector(entry.vector)
        fields: dict[str, Any] = {
            "t": entry.tenant,
            "p": entry.partition,
            "x": entry.exact,
            "q": entry.question,
            "ctx": entry.context,
            "ck": entry.context_key,
            "v": vec,
            "cv": encode_vector(entry.context_vector) if entry.context_vector is not None else "",
            "a": entry.answer,
            "m": entry.model,
            "pt": entry.prompt_tokens,
            "ct": entry.completion_tokens,
            "exp": expires,
        }
        lru = self.keys.cache_lru(entry.tenant)
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hset(self.keys.cache_entry(entry_id), mapping=fields)
            pipe.expire(self.keys.cache_entry(entry_id), self.ttl_s)
            pipe.set(self.keys.cache_exact(entry.tenant, entry.exact), entry_id, ex=self.ttl_s)
            pipe.zadd(lru, {entry_id: now})
            pipe.sadd(self.keys.cache_tenants, entry.tenant)
            pipe.xadd(
                self.keys.cache_events,
                {"op": "add", "id": entry_id, "t": entry.tenant, "p": entry.partition,
                 "x": entry.exact, "v": vec, "exp": expires},
                maxlen=EVENTS_MAXLEN,
                approximate=True,
            )  # fmt: skip
            pipe.zcard(lru)
            results = await pipe.execute()
        self.index.add(
            entry.tenant, entry.partition, int(entry_id), entry.vector, expires, entry.exact
        )
        size = int(results[-1])
        if size > self.max_entries:
            await self.evict(entry.tenant, size - self.max_entries)
        return entry_id

    async def evict(self, tenant: str, count: int) -> list[str]:
        """Drop the tenant's ``count`` least recently used entries everywhere."""
        popped = await self.redis.zpopmin(self.keys.cache_lru(tenant), count)
        ids = [entry_id for entry_id, _ in popped]
        if not ids:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for entry_id in ids:
                pipe.delete(self.keys.cache_entry(entry_id))
                pipe.xadd(
                    self.keys.cache_events,
                    {"op": "del", "id": entry_id},
                    maxlen=EVENTS_MAXLEN,
                    approximate=True,
                )
            await pipe.execute()
        for entry_id in ids:
            self.index.remove(int(entry_id))
        return ids


async def drop_entry(redis: aioredis.Redis, keys: Keys, tenant: str, entry_id: str) -> None:
    """Drop one entry from Redis and tell every process's index (its events stream): what a
    process without an index of its own (a bulk worker's verification) can do."""
    async with redis.pipeline(transaction=False) as pipe:
        pipe.zrem(keys.cache_lru(tenant), entry_id)
        pipe.delete(keys.cache_entry(entry_id))
        pipe.xadd(
            keys.cache_events, {"op": "del", "id": entry_id}, maxlen=EVENTS_MAXLEN, approximate=True
        )
        await pipe.execute()
