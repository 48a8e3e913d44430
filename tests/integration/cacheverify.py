"""A chat worker's cache stage and its online verifier on real Redis, without a worker process.

The stage is the worker's own (workers/cache/stage.py CacheStage, which creates the
OnlineVerifier), and its checks run through a bulk worker's own checker
(workers/cache/checker.py) in the same process instead of the bulk queue; what stands in is
the worker context around it (settings, keys, the Redis client and the engines: the engines
the settings name, or one given) and the embedding model
(a stand-in with the default model's name, so the shipped threshold applies, that never embeds
for real: the judges under test here do not use it).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import redis.asyncio as aioredis

from shared.keys import Keys
from shared.modeltable import ModelSpec, ModelTable, model_table
from shared.protocol import Message
from shared.settings import Settings
from shared.tasks import ChatJob, UsageRecord, VerifyJob
from workers.cache.checker import Checker
from workers.cache.stage import CacheStage
from workers.cache.store import NewEntry, StoredAnswer
from workers.engines.base import Engine
from workers.engines.factory import make_model_engine
from workers.resources import WorkerContext


class StandInEmbedder:
    name = "per-language"
    dim = 4

    def embed(self, texts: list[str]) -> np.ndarray:
        return np.tile(np.array([1.0, 0.0, 0.0, 0.0], dtype=np.float32), (len(texts), 1))

    def read_chars(self, text: str) -> int:
        return len(text)

    def close(self) -> None:
        pass


@dataclass
class UsageRows:
    """Where the worker's usage rows would go (its UsageBatcher): kept, to be read."""

    rows: list[UsageRecord] = field(default_factory=list)

    def add(self, usage: UsageRecord) -> None:
        self.rows.append(usage)


@dataclass
class VerifierContext:
    """The part of WorkerContext that the cache stage and its verifier use."""

    settings: Settings
    keys: Keys
    redis: aioredis.Redis
    engine: Engine | None = None  # every model's engine when given
    usage: UsageRows = field(default_factory=UsageRows)
    _engines: dict[tuple[str, str], Engine] = field(default_factory=dict)

    @property
    def models(self) -> ModelTable:
        return model_table(self.settings)

    def engine_for(self, spec: ModelSpec) -> Engine:
        if self.engine is not None:
            return self.engine
        if spec.engine_key not in self._engines:
            self._engines[spec.engine_key] = make_model_engine(spec, self.settings)
        return self._engines[spec.engine_key]


@asynccontextmanager
async def verifying_stage(
    redis_url: str, *, engine: Engine | None = None, **settings: Any
) -> AsyncIterator[CacheStage]:
    """A cache stage whose verifier is on (its own Redis prefix, removed afterwards);
    ``settings`` override the defaults (cache_verify_judge=..., ...). Leaving the block waits
    for the stage's background work (verifications, counters) to end."""
    prefix = f"ftcv{uuid.uuid4().hex[:8]}"
    values: dict[str, Any] = {
        "redis_url": redis_url,
        "redis_prefix": prefix,
        "engine": "sim",
        "cache_verify_rate": 1.0,
        # The judge these tests script or stand in for; the LLM judge's tests say so.
        "cache_verify_judge": "embedding",
        **settings,
    }
    redis = aioredis.from_url(redis_url, decode_responses=True)
    ctx = VerifierContext(Settings(**values), Keys(prefix), redis, engine)
    worker = cast(WorkerContext, ctx)
    checks: list[Checker] = []

    def send(check: VerifyJob) -> None:
        # In place of the bulk queue and a bulk worker's task (workers/bulk/verify.py): the
        # bulk worker's checker, run as the stage's background work, over the same JSON.
        stage.background(checks[0].check(VerifyJob.model_validate_json(check.model_dump_json())))

    stage = CacheStage(worker, cast(Any, StandInEmbedder()), send)
    checks.append(Checker(worker, stage.embed))
    assert stage.online.enabled
    try:
        yield stage
    finally:
        await stage.close()
        keys = [k async for k in ctx.redis.scan_iter(match=f"{prefix}:*")]
        if keys:
            await ctx.redis.delete(*keys)
        await ctx.redis.aclose()


async def put_answer(stage: CacheStage, tenant: str, question: str, answer: str) -> StoredAnswer:
    """A cached entry, stored as the worker stores one (for a verdict to drop)."""
    vector = stage.embedder.embed([question])[0] if stage.embedder else None
    assert vector is not None
    entry_id = await stage.store.put(
        NewEntry(
            tenant=tenant,
            partition="p",
            exact=uuid.uuid4().hex,
            question=question,
            context="",
            context_key="",
            vector=vector,
            context_vector=None,
            answer=answer,
            model="sim",
            prompt_tokens=5,
            completion_tokens=len(answer.split()),
        )
    )
    return StoredAnswer(entry_id, answer, "sim", 5, len(answer.split()))


def chat_job(tenant: str, question: str, **fields: Any) -> ChatJob:
    """A chat job as the gateway enqueues one; ``fields`` override (tenant_rpm=..., ...)."""
    return ChatJob(
        job_id=uuid.uuid4().hex,
        chat_id="c",
        tenant_id=tenant,
        key_id="k",
        messages=[Message(role="user", content=question)],
        max_tokens=16,
        **fields,
        received_at=time.time(),
        enqueued_at=time.time(),
        deadline_at=time.time() + 60,
    )


async def stats(stage: CacheStage, tenant: str) -> dict[str, str]:
    redis: Any = stage.store.redis
    return dict(await redis.hgetall(stage.store.keys.cache_stats(tenant)))
