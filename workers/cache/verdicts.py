"""Per-tenant verdicts and counters of the semantic cache in Redis (keys in shared/keys.py):
the I/O beside workers/cache/online.py, which decides from what this reads."""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis

from shared.keys import Keys
from shared.settings import Settings
from workers.cache.online import Estimate, Verdicts, bucket_of, estimate

TIERS = ("exact", "semantic", "miss")
SKIPPED = ("busy", "stale", "limit")  # why a sampled verification was not made


class VerdictStore:
    def __init__(self, redis: aioredis.Redis, keys: Keys) -> None:
        self.redis = redis
        self.keys = keys

    async def count_lookup(self, tenant: str, tier: str) -> None:
        stats = self.keys.cache_stats(tenant)
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hincrby(stats, "lookups", 1)
            if tier in TIERS:
                pipe.hincrby(stats, tier, 1)
            pipe.sadd(self.keys.cache_stats_tenants, tenant)
            await pipe.execute()

    async def record(self, tenant: str, score: float, agree: bool, *, near: bool) -> None:
        """One verdict, in the bucket of the lookup's score."""
        b = bucket_of(score)
        stats = self.keys.cache_stats(tenant)
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hincrby(self.keys.cache_verdicts(tenant), f"n:{b}", 1)
            pipe.hincrby(stats, "verified", 1)
            if near:
                pipe.hincrby(stats, "near_misses", 1)
            if not agree:
                pipe.hincrby(self.keys.cache_verdicts(tenant), f"d:{b}", 1)
                pipe.hincrby(stats, "disagreed", 1)
            pipe.sadd(self.keys.cache_stats_tenants, tenant)
            await pipe.execute()

    async def count_undecided(self, tenant: str) -> None:
        """A verification whose judge gave no verdict."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hincrby(self.keys.cache_stats(tenant), "undecided", 1)
            pipe.sadd(self.keys.cache_stats_tenants, tenant)
            await pipe.execute()

    async def count_skipped(self, tenant: str, reason: str) -> None:
        """A sampled verification not made: ``busy`` (every slot taken), ``stale`` (it waited
        too long in the bulk queue) or ``limit`` (the tenant's rate limits refused its engine
        call)."""
        stats = self.keys.cache_stats(tenant)
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hincrby(stats, "skipped", 1)
            pipe.hincrby(stats, f"skipped_{reason}", 1)
            pipe.sadd(self.keys.cache_stats_tenants, tenant)
            await pipe.execute()

    async def read(self, tenant: str) -> Verdicts:
        return parse_verdicts(await self.redis.hgetall(self.keys.cache_verdicts(tenant)))

    async def publish(self, tenant: str, est: Estimate) -> None:
        """The threshold in force and its estimate, for `firsttoken cache report`."""
        await self.redis.hset(
            self.keys.cache_stats(tenant),
            mapping={"threshold": est.threshold, "estimated": est.rate, "bound": est.upper},
        )


def parse_verdicts(raw: dict[Any, Any]) -> Verdicts:
    out: dict[int, list[int]] = {}
    for field, value in raw.items():
        name = field.decode() if isinstance(field, bytes) else str(field)
        kind, _, bucket = name.partition(":")
        if kind in ("n", "d") and bucket.isdigit():
            row = out.setdefault(int(bucket), [0, 0])
            row[0 if kind == "n" else 1] = int(value)
    return {b: (n, d) for b, (n, d) in out.items()}


async def read_report(settings: Settings) -> list[dict[str, Any]]:
    """Per tenant with counters: lookups, hits by tier, verified, disagreed, undecided (the
    judge gave no verdict), skipped (by reason: every slot busy, the tenant's limits), and the
    estimate at the threshold in force (as its workers last published it)."""
    keys = Keys(settings.redis_prefix)
    redis = aioredis.from_url(settings.redis_url, decode_responses=True)
    try:
        rows = []
        for member in sorted(await redis.smembers(keys.cache_stats_tenants)):
            tenant = str(member)
            stats = await redis.hgetall(keys.cache_stats(tenant))
            verdicts = parse_verdicts(await redis.hgetall(keys.cache_verdicts(tenant)))
            # None until a worker of the tenant published the threshold in force.
            threshold = float(stats["threshold"]) if "threshold" in stats else None
            est = estimate(verdicts, threshold) if threshold is not None else None
            rows.append(
                {
                    "tenant": tenant,
                    "lookups": int(stats.get("lookups", 0)),
                    **{tier: int(stats.get(tier, 0)) for tier in TIERS},
                    "verified": int(stats.get("verified", 0)),
                    "near_misses": int(stats.get("near_misses", 0)),
                    "disagreed": int(stats.get("disagreed", 0)),
                    "undecided": int(stats.get("undecided", 0)),
                    "skipped": int(stats.get("skipped", 0)),
                    **{f"skipped_{r}": int(stats.get(f"skipped_{r}", 0)) for r in SKIPPED},
                    "threshold": threshold,
                    "estimated": float(stats.get("estimated", est.rate)) if est else None,
                    "bound": float(stats.get("bound", est.upper)) if est else None,
                    "verified_at_threshold": est.verified if est else 0,
                }
            )
        return rows
    finally:
        await redis.aclose()
