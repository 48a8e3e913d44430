"""API key -> principal, checked once per connection before anything is enqueued.

Lookups go to Redis (written by `firsttoken keys create` and filled from the database on a
miss), and are trusted in-process for `auth_cache_s` so a reconnect storm costs no round trips.
Requests that miss at the same moment (a burst of HTTP requests with one key: the HTTP door
checks the key per request, the websocket per connection) share one lookup, and the keys used
lately are read again in the background (`keep_fresh`: one MGET every half `auth_cache_s`), so
an HTTP request with a key in use finds it checked within `auth_cache_s` without a round trip
of its own. The bound is unchanged: a cached answer older than `auth_cache_s` is never used.

Redis is only a cache of the database here: with Redis down a key is looked up in the database
alone. With the database down too (or a key Redis does not hold), the client is told
`overloaded` with a retry hint; a key already in the in-process cache keeps working.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from starlette.requests import HTTPConnection

from gateway.rates import Limits, resolve_limits
from shared.db.apikeys import hash_key, lookup_key
from shared.errors import Overloaded, Unauthorized
from shared.keys import Keys
from shared.redis.client import UNREACHABLE

log = logging.getLogger(__name__)

# How long Redis keeps a key record filled from the database.
REDIS_KEY_TTL_S = 300
# A key used within this long is read again in the background before its cached answer ages
# out (`Authenticator.keep_fresh`); one idle longer is looked up by its next request.
KEEP_FRESH_AFTER_USE_S = 60.0
# At most this many keys per background read (the most recently used): the rest are looked up
# by their own requests, as before.
KEEP_FRESH_MAX_KEYS = 1000
# What a client is told to wait when the database cannot be reached to check its key: a
# restarting PostgreSQL takes seconds, not milliseconds.
DATABASE_RETRY_AFTER_MS = 2000


@dataclass(frozen=True, slots=True)
class Principal:
    tenant_id: str
    key_id: str
    scope: str
    limits: Limits = field(default_factory=Limits)


def key_from_request(conn: HTTPConnection) -> str | None:
    """The API key from `Authorization: Bearer KEY`, else the `api_key` query parameter (the
    query string is parsed only then: most clients send the header)."""
    auth = conn.headers.get("authorization", "")
    scheme, _, value = auth.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return conn.query_params.get("api_key") or None


class Authenticator:
    def __init__(
        self,
        redis: aioredis.Redis,
        keys: Keys,
        sessions: async_sessionmaker[AsyncSession],
        cache_s: float,
        defaults: Limits | None = None,
    ) -> None:
        self._redis = redis
        self._keys = keys
        self._sessions = sessions
        self._cache_s = cache_s
        self._defaults = defaults or Limits()
        self._cache: dict[str, tuple[float, Principal | None]] = {}
        # The lookup in flight per key, which every request missing meanwhile awaits.
        self._lookups: dict[str, asyncio.Task[Principal | None]] = {}
        self._used: dict[str, float] = {}  # key hash -> when a request last used it
        self._invalidations = 0  # a background read that spans one does not store its answers

    def invalidate(self, key_hash: str) -> None:
        """Forget a cached lookup (a key was revoked or changed on some gateway's CLI); a
        lookup in flight is not cached, and the next request looks the key up afresh."""
        self._invalidations += 1
        self._cache.pop(key_hash, None)
        self._lookups.pop(key_hash, None)

    def invalidate_all(self) -> None:
        self._invalidations += 1
        self._cache.clear()
        self._lookups.clear()

    async def keep_fresh(self) -> None:
        """Forever: every half `auth_cache_s`, read again the keys used lately (`refresh`)."""
        if self._cache_s <= 0:
            return  # nothing is cached
        interval = max(self._cache_s / 2, 0.05)
        while True:
            await asyncio.sleep(interval)
            try:
                await self.refresh()
            except Exception as exc:  # noqa: BLE001 - requests then look their keys up
                log.debug("could not refresh the API keys in use: %r", exc)

    async def refresh(self) -> None:
        """Read the records of the keys used within KEEP_FRESH_AFTER_USE_S again, in one round
        trip, and cache what they say as a request's lookup would. A key Redis does not hold
        (or a Redis that cannot be reached) is left to its next request's own lookup."""
        if self._cache_s <= 0:
            return
        now = time.monotonic()
        for digest in [d for d, at in self._used.items() if now - at > KEEP_FRESH_AFTER_USE_S]:
            del self._used[digest]
        digests = list(self._used)
        if not digests:
            return
        if len(digests) > KEEP_FRESH_MAX_KEYS:
            digests = sorted(digests, key=self._used.__getitem__)[-KEEP_FRESH_MAX_KEYS:]
        invalidations = self._invalidations
        try:
            raws = await self._redis.mget([self._keys.api_key(d) for d in digests])
        except UNREACHABLE:
            return
        if invalidations != self._invalidations:
            return  # a key changed while this read was in flight: its answer may be older
        for digest, raw in zip(digests, raws, strict=True):
            if raw is None or digest in self._lookups:
                continue
            self._cache[digest] = (now, self._principal(dict(json.loads(raw))))

    async def authenticate(self, key: str | None) -> Principal:
        if not key:
            raise Unauthorized(
                "missing API key: send 'Authorization: Bearer KEY' or the api_key query parameter"
            )
        digest = hash_key(key)
        now = time.monotonic()
        if digest in self._used or len(self._used) < 10_000:
            self._used[digest] = now
        hit = self._cache.get(digest)
        if hit is not None and now - hit[0] < self._cache_s:
            principal = hit[1]
        else:
            principal = await self._shared_lookup(digest, now)
        if principal is None:
            raise Unauthorized("invalid or revoked API key")
        return principal

    async def _shared_lookup(self, digest: str, now: float) -> Principal | None:
        """One lookup per key at a time: a request missing while one is in flight awaits it
        (shielded: a request that goes away does not cancel it for the others)."""
        task = self._lookups.get(digest)
        if task is None:
            task = asyncio.ensure_future(self._lookup(digest))
            self._lookups[digest] = task
            task.add_done_callback(lambda t: self._looked_up(digest, now, t))
        return await asyncio.shield(task)

    def _looked_up(self, digest: str, started: float, task: asyncio.Task[Principal | None]) -> None:
        """Cache a finished lookup, unless the key was invalidated while it was in flight."""
        if self._lookups.get(digest) is not task:
            return
        del self._lookups[digest]
        if task.cancelled() or task.exception() is not None:
            return
        if len(self._cache) > 10_000:
            self._cache.clear()
        self._cache[digest] = (started, task.result())

    async def _lookup(self, digest: str) -> Principal | None:
        record = await self._redis_record(digest)
        if record is None:
            record = await self._database_record(digest)
            if record is None:
                return None
            try:
                await self._redis.set(
                    self._keys.api_key(digest), json.dumps(record), ex=REDIS_KEY_TTL_S
                )
            except UNREACHABLE as exc:  # only a cache: the next miss reads the database again
                log.debug("could not cache an API key record in Redis: %r", exc)
        return self._principal(record)

    def _principal(self, record: dict[str, Any]) -> Principal | None:
        """A key record's principal; None for a revoked key."""
        if record.get("revoked"):
            return None
        raw_limits = record.get("limits") or [None] * 5
        limits = resolve_limits(raw_limits[:3], raw_limits[3:], self._defaults)
        return Principal(record["tenant_id"], record["key_id"], record.get("scope", "chat"), limits)

    async def _redis_record(self, digest: str) -> dict[str, Any] | None:
        """The key's record in Redis; None when Redis has none or cannot be reached (the
        database, which Redis only caches, then decides alone)."""
        try:
            raw = await self._redis.get(self._keys.api_key(digest))
        except UNREACHABLE as exc:
            log.warning("API key lookup without Redis (%r): asking the database", exc)
            return None
        return None if raw is None else dict(json.loads(raw))

    async def _database_record(self, digest: str) -> dict[str, Any] | None:
        try:
            async with self._sessions() as session:
                info = await lookup_key(session, digest)
        except (SQLAlchemyError, OSError) as exc:
            raise Overloaded(
                "the API key could not be checked: the database cannot be reached; retry shortly",
                retry_after_ms=DATABASE_RETRY_AFTER_MS,
            ) from exc
        if info is None:
            return None
        return {
            "tenant_id": info.tenant_id,
            "key_id": info.key_id,
            "scope": info.scope,
            "revoked": info.revoked,
            "limits": [info.rpm, info.tpm, info.max_streams, info.tenant_rpm, info.tenant_tpm],
        }
