"""The chat worker's cache stage: lookup before generation, replay on a hit, store after a clean
answer. Decisions come from workers.cache.policy; this module only moves data.

One :class:`CacheStage` per worker process (the embedder is loaded once, the index rebuilt once).
Embedding runs on one dedicated thread: ONNX releases the GIL, so the event loop keeps relaying
other chats' tokens meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import cast

from shared.metrics import recorder
from shared.settings import Settings
from shared.tasks import ChatJob
from workers.cache.calibrated import CALIBRATION, RISKS
from workers.cache.calibration import choose, threshold_for
from workers.cache.folds import shipped_threshold
from workers.cache.index import Vector
from workers.cache.policy import Policy, Query, judge, scored, servable, storable
from workers.cache.store import CacheStore, NewEntry, StoredAnswer
from workers.cache.verification import OnlineVerifier, Send
from workers.cache.verify import NAME as VERIFIER
from workers.cache.verify import dictionary, table_key
from workers.chat.publish import JobPublisher
from workers.embeddings.base import Embedder
from workers.embeddings.factory import make_embedder
from workers.resources import WorkerContext

log = logging.getLogger(__name__)

# Past this many characters a question's candidates are judged on the embedding thread (the
# guards read the whole text: about 1 ms per 1,000 characters).
JUDGE_OFF_LOOP_CHARS = 4096


@dataclass
class Lookup:
    """The outcome of one lookup; carries the request's vectors on to the store step."""

    query: Query | None = None
    hit: StoredAnswer | None = None
    tier: str = "miss"  # exact | semantic | miss | off
    vector: Vector | None = None
    context_vector: Vector | None = None
    reasons: list[str] = field(default_factory=list)
    score: float | None = None  # a semantic hit's score, as the threshold compared it
    # A near miss (workers/cache/online.py): the best candidate scored just under the
    # threshold; its answer is compared with the engine's once it comes.
    near: StoredAnswer | None = None
    near_score: float = 0.0


def policy_from(settings: Settings, embedder: str) -> Policy:
    """The cache policy of these settings for vectors of model ``embedder``: the threshold is
    the one set, else the one shipped for the operator's risk by the leave-one-fold-out
    calibration (workers/cache/folds.py, calibrated.RISKS), else (a table without folds) the
    one its calibration gives for that risk."""
    threshold, verifier = _static(settings, embedder)
    return Policy(
        threshold=threshold,
        context_threshold=settings.cache_context_threshold,
        context_messages=settings.cache_context_messages,
        max_temperature=settings.cache_max_temperature,
        store_truncated=settings.cache_store_truncated,
        verifier=verifier,
    )


def _static(settings: Settings, embedder: str) -> tuple[float, str]:
    threshold = settings.cache_threshold
    verifier = settings.cache_verifier
    if threshold is not None:
        return threshold, verifier
    shipped = shipped_threshold(RISKS, table_key(embedder, verifier), settings.cache_max_error_rate)
    if shipped is not None:
        return shipped, verifier
    table = CALIBRATION.get(table_key(embedder, verifier), ())
    if choose(table, settings.cache_max_error_rate) is None:
        # No calibrated verified threshold meets the risk: the plain cosine at its
        # strictest (a verified score is not on that scale).
        verifier = "none"
    return threshold_for(
        CALIBRATION, table_key(embedder, verifier), settings.cache_max_error_rate
    ), verifier


class CacheStage:
    def __init__(
        self, ctx: WorkerContext, embedder: Embedder | None, send_check: Send | None = None
    ) -> None:
        """``send_check`` takes the verifier's checks (default: to the bulk queue)."""
        settings = ctx.settings
        self.settings = settings
        self.embedder = embedder
        self.embedder_name = embedder.name if embedder else "none"
        self.policy = policy_from(settings, self.embedder_name)
        if self.policy.verifier == VERIFIER:
            dictionary()  # read once now (about 0.2 s), not on the first chat's lookup
        self.store = CacheStore(
            ctx.redis,
            ctx.keys,
            dim=embedder.dim if embedder and embedder.dim else 384,
            ttl_s=settings.cache_ttl_s,
            max_entries=settings.cache_max_entries,
            ann_min_entries=settings.cache_ann_min_entries,
        )
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="embed")
        self._pending: set[asyncio.Task[None]] = set()
        self.online = OnlineVerifier(ctx, self, send_check)

    async def embed(self, texts: list[str]) -> list[Vector]:
        assert self.embedder is not None
        loop = asyncio.get_running_loop()
        rows = await loop.run_in_executor(self._pool, self.embedder.embed, texts)
        return list(rows)

    def query(self, job: ChatJob, model: str) -> Query | None:
        """The request as the cache sees it; None when this chat is not served from cache."""
        if not job.cache or not servable(self.policy, job.temperature):
            return None
        return Query(
            self.policy,
            tenant=job.tenant_id,
            model=model,
            embedder=self.embedder_name,
            messages=job.messages,
            max_tokens=job.max_tokens,
            temperature=job.temperature,
        )

    def knows_exact(self, query: Query) -> bool:
        """Whether this process's index holds the exact request (no I/O): its answer is then
        one Redis read away."""
        return self.store.index.exact(query.tenant, query.exact, time.time()) is not None

    async def lookup(self, job: ChatJob, model: str, query: Query | None = None) -> Lookup:
        query = query or self.query(job, model)
        if query is None:
            return Lookup(tier="off")
        result = Lookup(query=query)
        texts = query.embed_texts
        embedding: asyncio.Future[list[Vector]] | None = None
        if self.embedder is not None and not self.knows_exact(query):
            # Embedding starts with the exact read, not after it: a semantic hit saves that
            # round trip. (An exact hit this process did not know of, written by another one
            # within the last second, wastes the embedding; that is rare.)
            embedding = asyncio.ensure_future(self.embed(texts))
        hit = await self.store.get_exact(job.tenant_id, query.exact)
        if hit is not None:
            if embedding is not None:
                embedding.cancel()
            result.hit, result.tier = hit, "exact"
            return result
        if self.embedder is None:
            return result
        vectors = await (embedding or self.embed(texts))
        result.vector = vectors[0]
        result.context_vector = vectors[1] if len(vectors) > 1 else None
        found = await self.store.candidates(
            job.tenant_id,
            query.partition,
            result.vector,
            k=self.settings.cache_candidates,
            min_score=self.online.min_score(job.tenant_id),
        )
        if not found:
            return result
        policy = self.online.policy_for(job.tenant_id)
        near_policy = self.online.near_policy(policy)
        # The query's count is asked once however many candidates there are (a long question
        # is tokenized for it).
        read_chars = functools.cache(self.embedder.read_chars)

        def first_hit() -> StoredAnswer | None:
            for score, candidate, answer in found:
                reason = judge(policy, query, candidate, score, result.context_vector, read_chars)
                if reason is None:
                    result.score = scored(policy, query, candidate, score)
                    return answer
                result.reasons.append(reason)
                if (
                    reason == "similarity"
                    and near_policy is not None
                    and result.near is None
                    and judge(
                        near_policy, query, candidate, score, result.context_vector, read_chars
                    )
                    is None
                ):
                    result.near = answer
                    result.near_score = scored(policy, query, candidate, score)
            return None

        if len(query.raw_question) > JUDGE_OFF_LOOP_CHARS:
            # Reading a long question's guards takes tens of milliseconds: off the event loop,
            # where the other chats' tokens are sent.
            loop = asyncio.get_running_loop()
            hit = await loop.run_in_executor(self._pool, first_hit)
        else:
            hit = first_hit()
        if hit is not None:
            result.hit, result.tier = hit, "semantic"
            self.online.hit(job, model, hit, result.score)
        return result

    def replay(
        self, job: ChatJob, publisher: JobPublisher, hit: StoredAnswer, points: dict[str, float]
    ) -> None:
        """Stream the stored answer as ordinary token chunks. The chat's end (its usage row,
        then `done` with cached=true) is the chat's own, as for every other ending
        (workers/chat/run.py `_end`)."""
        size = self.settings.cache_replay_chars
        text = hit.answer
        for start in range(0, len(text), size):
            publisher.token(text[start : start + size])
            if start == 0:
                points["first_chunk_published"] = time.time()
        points["finished"] = time.time()
        self._background(self.store.touch(job.tenant_id, hit.entry_id))
        self.online.replayed(job)

    def remember(
        self,
        job: ChatJob,
        lookup: Lookup,
        *,
        model: str,
        temperature: float | None,
        status: str,
        finish_reason: str,
        answer: str,
        prompt_tokens: int,
        completion_tokens: int,
    ) -> None:
        """Store a clean answer in the background (after `done` went out); a near miss's
        candidate is compared with it."""
        if lookup.near is not None and lookup.query is not None and status == "ok" and answer:
            self.online.near_miss(
                job,
                model,
                lookup.query.raw_question,
                lookup.near,
                lookup.near_score,
                answer,
            )
        if lookup.query is None or not storable(
            self.policy,
            status=status,
            finish_reason=finish_reason,
            temperature=temperature,
            answer=answer,
        ):
            return
        self._background(self._store(lookup, model, answer, prompt_tokens, completion_tokens))

    async def _store(
        self,
        lookup: Lookup,
        model: str,
        answer: str,
        prompt_tokens: int,
        completion_tokens: int,
    ) -> None:
        query = lookup.query
        assert query is not None
        vector, context_vector = lookup.vector, lookup.context_vector
        if vector is None and self.embedder is not None:
            # An exact-tier miss with the semantic tier off, or an embed that was skipped.
            rows = await self.embed(query.embed_texts)
            vector, context_vector = rows[0], (rows[1] if len(rows) > 1 else None)
        if vector is None:
            return
        await self.store.put(
            NewEntry(
                tenant=query.tenant,
                partition=query.partition,
                exact=query.exact,
                question=query.raw_question,
                context=query.turn.context_text,
                context_key=query.context,
                vector=vector,
                context_vector=context_vector,
                answer=answer,
                model=model,
                prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens,
            )
        )

    def background(self, coro: object) -> None:
        self._background(coro)

    def _background(self, coro: object) -> None:
        async def guarded() -> None:
            try:
                await coro  # type: ignore[misc]
            except Exception:
                log.warning("cache write failed", exc_info=True)

        task = asyncio.ensure_future(guarded())
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def close(self) -> None:
        for task in list(self._pending):
            with contextlib.suppress(BaseException):
                await task
        await self.store.close()
        self._pool.shutdown(wait=False)
        if self.embedder is not None:
            self.embedder.close()


async def get_stage(ctx: WorkerContext) -> CacheStage | None:
    """The worker's cache stage (on its context), built on first use under a lock; None when
    the cache is off or cannot start (the chat then runs uncached, and the reason is logged)."""
    if not ctx.settings.cache_enabled:
        return None
    if ctx.cache_stage is not None:
        return current_stage(ctx)
    async with ctx.cache_stage_lock:
        if ctx.cache_stage is None:
            embedder: Embedder | None = None
            if ctx.settings.cache_semantic:
                try:
                    # Off the loop: loading the model takes long enough that other chats would
                    # stall; on a thread they keep flowing.
                    embedder = await asyncio.to_thread(make_embedder, ctx.settings)
                except Exception:
                    log.error("semantic cache disabled: embedder failed to load", exc_info=True)
            stage = CacheStage(ctx, embedder)
            await stage.store.start()
            ctx.cache_stage = stage
    return current_stage(ctx)


def current_stage(ctx: WorkerContext) -> CacheStage | None:
    """The worker's cache stage if it is built already (never waits for it)."""
    return cast(CacheStage | None, ctx.cache_stage)


async def lookup(
    ctx: WorkerContext, job: ChatJob, model: str, query: Query | None = None
) -> tuple[CacheStage | None, Lookup]:
    """Never raises: a cache failure is a miss."""
    try:
        stage = await get_stage(ctx)
        if stage is None:
            return None, Lookup(tier="off")
        result = await stage.lookup(job, model, query)
        recorder.cache_lookup(result.tier, bool(result.reasons))
        stage.online.count(job.tenant_id, result.tier)
        return stage, result
    except Exception:
        log.warning("cache lookup failed; answering uncached", exc_info=True)
        recorder.cache_lookup("miss", False)
        return None, Lookup(tier="off")


async def warm(ctx: WorkerContext) -> None:
    """Load the embedding model and rebuild the index now (a worker's start-up)."""
    try:
        stage = await get_stage(ctx)
        if stage is not None and stage.embedder is not None:
            # onnxruntime's first run allocates and plans (several times a normal query):
            # spent here, not racing a first chat's engine.
            await stage.embed(["warm up"])
    except Exception:
        log.warning("cache warm-up failed; the first chat will retry", exc_info=True)


async def close_stage(ctx: WorkerContext) -> None:
    stage, ctx.cache_stage = ctx.cache_stage, None
    if stage is not None:
        await stage.close()
