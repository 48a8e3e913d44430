"""The chat worker's online verification of semantic hits (issue 45): the I/O around
workers/cache/online.py. One per cache stage.

A sampled semantic hit is asked of the engine again *after* its replay ended (the chat is
done; nothing on the user's path waits for it), on this process's loop, at most
``cache_verify_concurrency`` at once: a sample that finds every slot busy is skipped, so
verification never queues up behind a busy engine. A near miss's candidate is compared with the
answer the engine gave anyway. Verdicts go to Redis per tenant (workers/cache/verdicts.py); the
threshold in force per tenant is re-read every ``cache_verify_refresh_s``.

Each engine call a verification makes (the re-ask, the LLM judge's question) is charged to the
tenant's rate limits before it is sent and billed once answered (workers/cache/charge.py says
how and why); one the tenant's limits refuse is skipped, as is a sample that finds every slot
busy, and both are counted per tenant (`firsttoken cache report`). The sample rate, the
concurrency cap and the tenant's own limits bound what verification costs.

With ``cache_verify_priority`` set, the engine calls carry that vLLM request priority, so a
vLLM scheduling by priority runs the chats' requests (priority 0) ahead of them; unset (the
default, for an engine that schedules first come, first served), they compete as equals once
sent.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from dataclasses import replace
from typing import Any, Protocol

import numpy as np

from shared.metrics import recorder
from shared.protocol import Message
from shared.tasks import ChatJob
from workers.cache.charge import Answered, Call, Charges, charged, request_id, reservation
from workers.cache.index import Vector
from workers.cache.online import Rule, agrees, parse_score, parse_yes_no, threshold_in_force
from workers.cache.policy import Policy
from workers.cache.store import CacheStore, StoredAnswer
from workers.cache.verdicts import VerdictStore
from workers.embeddings.base import Embedder
from workers.engines.base import EngineRequest
from workers.resources import WorkerContext


class VerifiedStage(Protocol):
    """What verification uses of its cache stage (workers/cache/stage.py's CacheStage, which
    creates the verifier: a protocol, so the two modules do not import each other)."""

    policy: Policy
    store: CacheStore
    embedder: Embedder | None

    def background(self, coro: object) -> None: ...

    async def embed(self, texts: list[str]) -> list[Vector]: ...


log = logging.getLogger(__name__)

VERIFY_TIMEOUT_S = 120.0
LLM_JUDGE_PROMPT = (
    "Question: {question}\n\nAnswer A: {a}\n\nAnswer B: {b}\n\n"
    "Do answers A and B give the same answer to the question? Reply with yes or no only."
)


class OnlineVerifier:
    def __init__(self, ctx: WorkerContext, stage: VerifiedStage) -> None:
        s = ctx.settings
        self.ctx, self.stage, self.settings = ctx, stage, s
        # An operator's pinned threshold (cache_threshold) is never moved.
        self.enabled = (
            s.cache_threshold is None and s.cache_verify_rate > 0 and stage.embedder is not None
        )
        self.store = VerdictStore(ctx.redis, ctx.keys)
        self.charges = Charges(ctx)
        base = stage.policy.threshold
        self.rule = Rule(
            max_error_rate=s.cache_max_error_rate,
            base=base,
            min_verified=s.cache_verify_min,
            ceiling=max(1.0, base),
        )
        self._thresholds: dict[str, tuple[float, float]] = {}
        self._refreshing: set[str] = set()
        self._sampled: dict[str, tuple[str, StoredAnswer, float]] = {}
        self._busy = 0
        self._rng = random.Random()

    # --- the threshold in force ---------------------------------------------------------
    def policy_for(self, tenant: str) -> Policy:
        policy = self.stage.policy
        if not self.enabled:
            return policy
        known = self._thresholds.get(tenant)
        if known is None or time.monotonic() - known[1] > self.settings.cache_verify_refresh_s:
            self._refresh(tenant)
        if known is None or known[0] == policy.threshold:
            return policy
        return replace(policy, threshold=known[0])

    def near_policy(self, policy: Policy) -> Policy | None:
        if not self.enabled or self.settings.cache_verify_band <= 0:
            return None
        return replace(policy, threshold=policy.threshold - self.settings.cache_verify_band)

    def min_score(self, tenant: str) -> float:
        policy = self.policy_for(tenant)
        return (self.near_policy(policy) or policy).min_score

    def _refresh(self, tenant: str) -> None:
        if tenant in self._refreshing:
            return
        self._refreshing.add(tenant)

        async def refresh() -> None:
            try:
                est = threshold_in_force(await self.store.read(tenant), self.rule)
                self._thresholds[tenant] = (est.threshold, time.monotonic())
                recorder.cache_wrong_rate(tenant, est.rate, est.upper)
                await self.store.publish(tenant, est)
            finally:
                self._refreshing.discard(tenant)

        self.stage.background(refresh())

    # --- counting and sampling ----------------------------------------------------------
    def count(self, tenant: str, tier: str) -> None:
        if self.enabled and tier != "off":
            self.stage.background(self.store.count_lookup(tenant, tier))

    def hit(self, job: ChatJob, model: str, hit: StoredAnswer, score: float | None) -> None:
        """A semantic hit found: sampled for verification (run once its replay ended)."""
        if not self.enabled or score is None:
            return
        if self._rng.random() < self.settings.cache_verify_rate:
            if len(self._sampled) > 1024:  # hits never replayed (cancelled chats)
                self._sampled.clear()
            self._sampled[job.job_id] = (model, hit, score)

    def replayed(self, job: ChatJob) -> None:
        sampled = self._sampled.pop(job.job_id, None)
        if sampled is None:
            return
        if self._busy >= self.settings.cache_verify_concurrency:
            # Skipped, not queued: verification never backs up behind the engine.
            self.stage.background(self.store.count_skipped(job.tenant_id, "busy"))
            return
        self._busy += 1
        self.stage.background(self._verify(job, *sampled))

    def near_miss(
        self, job: ChatJob, question: str, near: StoredAnswer, score: float, answer: str
    ) -> None:
        if self.enabled:
            self.stage.background(self._compare(job, question, near, score, answer, True))

    # --- verification -------------------------------------------------------------------
    async def _verify(self, job: ChatJob, model: str, hit: StoredAnswer, score: float) -> None:
        try:
            fresh = await asyncio.wait_for(
                self._ask(job, "reask", job.messages, model, job.max_tokens, job.temperature),
                VERIFY_TIMEOUT_S,
            )
            if fresh is None:
                return  # the tenant's limits refused it (counted)
            question = job.messages[-1].content if job.messages else ""
            await self._compare(job, question, hit, score, fresh, False)
        finally:
            self._busy -= 1

    async def _ask(
        self,
        job: ChatJob,
        call: Call,
        messages: list[Message],
        model: str,
        max_tokens: int,
        temperature: float | None,
    ) -> str | None:
        """One engine call of a verification, within the tenant's limits and billed; None when
        the limits refused it (counted as skipped)."""
        reserved = reservation(messages, max_tokens)
        if not await self.charges.admit(job, call, reserved):
            await self.store.count_skipped(job.tenant_id, "limit")
            return None
        started = time.time()
        answered = await self._engine(messages, model, max_tokens, temperature, job, call)
        await self.charges.settle(job, call, charged(answered, reserved))
        self.charges.bill(
            job, call, model, answered, prompt_estimate=reserved - max_tokens, started=started
        )
        return answered.text

    async def _engine(
        self,
        messages: list[Message],
        model: str,
        max_tokens: int,
        temperature: float | None,
        job: ChatJob,
        call: Call,
    ) -> Answered:
        spec = self.ctx.models.get(model)
        engine = self.ctx.engine_for(spec)
        request = EngineRequest(
            messages=messages,
            model=spec.engine_model,
            max_tokens=max_tokens,
            temperature=temperature,
            priority=self.settings.cache_verify_priority,  # behind the chats, where set
        )
        parts: list[str] = []
        last = None
        async for delta in engine.stream(request, request_id=request_id(job, call)):
            parts.append(delta.text)
            last = delta
        return Answered(
            text="".join(parts),
            finish_reason=(last.finish_reason if last else None) or "stop",
            prompt_tokens=last.prompt_tokens if last else None,
            completion_tokens=last.completion_tokens if last else None,
            cached_prompt_tokens=last.cached_prompt_tokens if last else None,
        )

    async def _compare(
        self,
        job: ChatJob,
        question: str,
        cached: StoredAnswer,
        score: float,
        fresh: str,
        near: bool,
    ) -> None:
        tenant = job.tenant_id
        agree = await self._judge(job, question, cached.answer, fresh, cached.model)
        if agree is None:
            # No verdict (an LLM reply that is neither yes nor no, no score URL, the judge's
            # call refused by the tenant's limits): counted, so that `firsttoken cache report`
            # shows a judge that never decides.
            await self.store.count_undecided(tenant)
            return
        await self.store.record(tenant, score, agree, near=near)
        recorder.cache_verification(agree)
        if not agree and not near:
            # Served and judged wrong: no one else gets it. (A near miss was not served; its
            # entry may be right for its own question.)
            await self.stage.store.drop(tenant, cached.entry_id)

    async def _judge(
        self, job: ChatJob, question: str, cached: str, fresh: str, model: str
    ) -> bool | None:
        if cached.strip() == fresh.strip():
            return True
        kind = self.settings.cache_verify_judge
        if kind == "llm":
            prompt = LLM_JUDGE_PROMPT.format(question=question, a=cached, b=fresh)
            messages = [Message(role="user", content=prompt)]
            model = model or self.ctx.models.default
            reply = await self._ask(job, "judge", messages, model, 3, 0.0)
            return None if reply is None else parse_yes_no(reply)
        if kind == "score":
            return await self._score_judge(cached, fresh)
        vectors = await self.stage.embed([cached, fresh])
        return agrees(float(np.dot(vectors[0], vectors[1])), self.settings.cache_verify_cut)

    async def _score_judge(self, cached: str, fresh: str) -> bool | None:
        import httpx

        url = self.settings.cache_verify_score_url
        if not url:
            return None
        body: dict[str, Any]
        if url.rstrip("/").endswith("/score"):
            body = {"text_1": cached, "text_2": fresh}
        else:  # /rerank: TEI takes texts, vLLM documents
            body = {"query": cached, "texts": [fresh], "documents": [fresh]}
        async with httpx.AsyncClient(timeout=30) as client:
            reply = await client.post(url, json=body)
            reply.raise_for_status()
        score = parse_score(reply.json())
        return None if score is None else score >= self.settings.cache_verify_score_cut
