"""The chat worker's side of online verification (issue 45): sampling semantic hits, sending
them to be checked, and the threshold in force per tenant. One per cache stage.

A sampled semantic hit, once its replay ended (the chat is done; nothing on the user's path
waits for it), and every near miss, once its chat's answer is in, go as a `VerifyJob` to the
bulk queue's lowest-priority list: a bulk worker asks the engine and judges
(workers/cache/checker.py), so no engine call, judge or embedding of a verification runs in the
process that relays tokens. The job is queued on the worker's Redis pipe, like the chat's own
writes: no round trip, held through a Redis outage. Verdicts come back through Redis per
tenant (workers/cache/verdicts.py); the threshold in force per tenant is re-read every
``cache_verify_refresh_s``.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Protocol

from shared.keys import BULK_QUEUE, CACHE_VERIFY_TASK
from shared.metrics import recorder
from shared.tasks import ChatJob, VerifyJob, task_message
from workers.cache.online import JudgeErrors, Rule, threshold_in_force
from workers.cache.policy import Policy
from workers.cache.store import StoredAnswer
from workers.cache.verdicts import VerdictStore
from workers.embeddings.base import Embedder
from workers.resources import WorkerContext

log = logging.getLogger(__name__)

Send = Callable[[VerifyJob], None]


class VerifiedStage(Protocol):
    """What verification uses of its cache stage (workers/cache/stage.py's CacheStage, which
    creates the verifier: a protocol, so the two modules do not import each other)."""

    policy: Policy
    embedder: Embedder | None

    def background(self, coro: object) -> None: ...


# Checks kept waiting for a bulk worker at most: with none running, the oldest go first.
MAX_WAITING_CHECKS = 10_000


def enqueue(ctx: WorkerContext) -> Send:
    """Sending a check to the bulk pool, on the worker's pipe (a lost one is a lost sample)."""
    queue = ctx.keys.verify_list().encode()
    keep = b"%d" % (MAX_WAITING_CHECKS - 1)

    def send(check: VerifyJob) -> None:
        message = task_message(
            CACHE_VERIFY_TASK, {"check": check.model_dump()}, queue=BULK_QUEUE, origin=ctx.name
        )
        try:
            ctx.pipe.send((b"LPUSH", queue, message.encode()))
            # kombu pops from the tail: the trim drops the oldest (they would be stale anyway).
            ctx.pipe.send((b"LTRIM", queue, b"0", keep))
        except ConnectionError:
            log.warning("Redis unreachable: a cache verification was not sent")

    return send


class OnlineVerifier:
    def __init__(self, ctx: WorkerContext, stage: VerifiedStage, send: Send | None = None) -> None:
        s = ctx.settings
        self.ctx, self.stage, self.settings = ctx, stage, s
        # An operator's pinned threshold (cache_threshold) is never moved.
        self.enabled = (
            s.cache_threshold is None and s.cache_verify_rate > 0 and stage.embedder is not None
        )
        self.store = VerdictStore(ctx.redis, ctx.keys)
        self._send = send or enqueue(ctx)
        base = stage.policy.threshold
        self.rule = Rule(
            max_error_rate=s.cache_max_error_rate,
            base=base,
            min_verified=s.cache_verify_min,
            ceiling=max(1.0, base),
            errors=JudgeErrors(
                false_disagree=s.cache_verify_false_disagree,
                false_agree=s.cache_verify_false_agree,
            ),
        )
        self._thresholds: dict[str, tuple[float, float]] = {}
        self._refreshing: set[str] = set()
        self._sampled: dict[str, tuple[str, StoredAnswer, float]] = {}
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
        """A sampled hit's replay ended: its check goes to the bulk pool."""
        sampled = self._sampled.pop(job.job_id, None)
        if sampled is not None:
            model, hit, score = sampled
            question = job.messages[-1].content if job.messages else ""
            self._send(self._check(job, model, question, hit, score, fresh=None))

    def near_miss(
        self,
        job: ChatJob,
        model: str,
        question: str,
        near: StoredAnswer,
        score: float,
        answer: str,
    ) -> None:
        """A lookup just under the threshold whose chat the engine answered: the two answers
        are compared. Every one, where the judge costs no engine call; where it does (the
        LLM judge), a share as for hits, so that verification's spend follows its rate."""
        if not self.enabled:
            return
        if self.settings.cache_verify_judge == "llm" and (
            self._rng.random() >= self.settings.cache_verify_rate
        ):
            return
        self._send(self._check(job, model, question, near, score, fresh=answer))

    @staticmethod
    def _check(
        job: ChatJob,
        model: str,
        question: str,
        cached: StoredAnswer,
        score: float,
        fresh: str | None,
    ) -> VerifyJob:
        return VerifyJob(
            chat=job,
            model=model,
            question=question,
            score=score,
            entry_id=cached.entry_id,
            cached_answer=cached.answer,
            cached_model=cached.model,
            near=fresh is not None,
            fresh=fresh,
            sampled_at=time.time(),
        )
