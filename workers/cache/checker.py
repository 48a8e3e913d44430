"""A bulk worker's checks of the semantic cache's hits against the engine (issue 45): the I/O
around workers/cache/online.py's judges, off the chat workers.

A chat worker samples its semantic hits and near misses (workers/cache/verification.py) and
enqueues each as a `VerifyJob` on the bulk queue's lowest-priority list, behind every durable
write. Here, one job at a time per call: the hit's question is asked of the engine again (a
near miss carries the answer the engine gave its chat already), a judge says whether the
cached answer and the engine's agree, the verdict goes to Redis per tenant (the chat workers
re-read the threshold in force from there) and a served entry judged wrong is dropped
everywhere. Nothing of it runs in a process that relays tokens.

At most ``cache_verify_concurrency`` checks run at once in a process; a job that finds every
slot taken (``skipped_busy``), or that waited longer than ``MAX_WAIT_S`` in the queue
(``skipped_stale``), is skipped and counted, never queued again: verification never backs up
behind a busy engine or a backlog of writes. Each engine call (the re-ask, the LLM judge's
question) is charged to the tenant's rate limits before it is sent and billed once answered
(workers/cache/charge.py); one the limits refuse is skipped and counted (``skipped_limit``).
With ``cache_verify_priority`` set, the calls carry that vLLM request priority, so a vLLM
scheduling by priority runs the chats' requests (priority 0) ahead of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from shared.metrics import recorder
from shared.protocol import Message
from shared.tasks import VerifyJob
from workers.cache.charge import Answered, Call, Charges, charged, request_id, reservation
from workers.cache.index import Vector
from workers.cache.online import agrees, parse_score, parse_yes_no
from workers.cache.store import drop_entry
from workers.cache.verdicts import VerdictStore
from workers.engines.base import Engine, EngineRequest
from workers.resources import WorkerContext

log = logging.getLogger(__name__)

# A check that takes longer (its engine calls and judge together) is given up, its slot freed.
VERIFY_TIMEOUT_S = 120.0
# A job older than this when a bulk worker reads it is skipped: after a backlog (a database
# outage that held the bulk pool), a flood of stale checks would compete with the chats.
MAX_WAIT_S = 60.0
LLM_JUDGE_PROMPT = (
    "Question: {question}\n\nAnswer A: {a}\n\nAnswer B: {b}\n\n"
    "Do answers A and B give the same answer to the question? Reply with yes or no only."
)

Embed = Callable[[list[str]], Awaitable[list[Vector]]]


class Checker:
    """One per process. ``embed`` gives the answers' vectors for the embedding judge (None:
    the process's own embedder, loaded on the first check that needs it)."""

    def __init__(self, ctx: WorkerContext, embed: Embed | None = None) -> None:
        self.ctx = ctx
        self.settings = ctx.settings
        self.verdicts = VerdictStore(ctx.redis, ctx.keys)
        self.charges = Charges(ctx)
        self._embed = embed
        self._embedder: Any = None
        self._embedder_lock = asyncio.Lock()
        # One embedding at a time, off the loop, as in the chat worker's cache stage.
        self._embed_pool = ThreadPoolExecutor(1, thread_name_prefix="verify-embed")
        self._running: set[asyncio.Task[Any]] = set()
        self._closed = False

    async def check(self, job: VerifyJob) -> None:
        """Check one job; never raises (a failed check is logged, as a lost sample)."""
        task = asyncio.current_task()
        try:
            if self._closed:
                return
            if len(self._running) >= self.settings.cache_verify_concurrency:
                # Skipped, not queued: verification never backs up behind the engine.
                await self.verdicts.count_skipped(job.chat.tenant_id, "busy")
                return
            if time.time() - job.sampled_at > MAX_WAIT_S:
                await self.verdicts.count_skipped(job.chat.tenant_id, "stale")
                return
            if task is not None:
                self._running.add(task)
            async with asyncio.timeout(VERIFY_TIMEOUT_S):
                await self._check(job)
        except asyncio.CancelledError:
            if not self._closed:
                raise
        except TimeoutError:
            log.warning("a cache verification took over %gs and was given up", VERIFY_TIMEOUT_S)
        except Exception:
            log.warning("a cache verification failed", exc_info=True)
        finally:
            if task is not None:
                self._running.discard(task)

    async def _check(self, job: VerifyJob) -> None:
        fresh = job.fresh
        if fresh is None:
            chat = job.chat
            fresh = await self._ask(
                job, "reask", chat.messages, job.model, chat.max_tokens, chat.temperature
            )
            if fresh is None:
                return  # the tenant's limits refused it (counted)
        await self._compare(job, fresh)

    async def close(self) -> None:
        """Stop the checks still running (each is one sample fewer, nothing owed), then the
        embedder: a bulk worker's shutdown does not wait on the engine for them."""
        self._closed = True
        for task in list(self._running):
            task.cancel()
        for task in list(self._running):
            with contextlib.suppress(BaseException):
                await task
        async with self._embedder_lock:
            embedder, self._embedder = self._embedder, None
        if embedder is not None:
            embedder.close()
        self._embed_pool.shutdown(wait=False)

    # --- the engine's answer ------------------------------------------------------------
    async def _ask(
        self,
        job: VerifyJob,
        call: Call,
        messages: list[Message],
        model: str,
        max_tokens: int,
        temperature: float | None,
    ) -> str | None:
        """One engine call of a check, within the tenant's limits and billed; None when the
        limits refused it (counted as skipped)."""
        chat = job.chat
        reserved = reservation(messages, max_tokens)
        if not await self.charges.admit(chat, call, reserved):
            await self.verdicts.count_skipped(chat.tenant_id, "limit")
            return None
        started = time.time()
        engine, request = self._request(model, messages, max_tokens, temperature)
        answered = await self._engine(job, call, engine, request)
        await self.charges.settle(chat, call, charged(answered, reserved))
        self.charges.bill(
            chat, call, model, answered, prompt_estimate=reserved - max_tokens, started=started
        )
        return answered.text

    def _request(
        self, model: str, messages: list[Message], max_tokens: int, temperature: float | None
    ) -> tuple[Engine, EngineRequest]:
        """The engine serving ``model`` and the request a check sends it."""
        spec = self.ctx.models.get(model)
        request = EngineRequest(
            messages=messages,
            model=spec.engine_model,
            max_tokens=max_tokens,
            temperature=temperature,
            priority=self.settings.cache_verify_priority,  # behind the chats, where set
        )
        return self.ctx.engine_for(spec), request

    async def _engine(
        self, job: VerifyJob, call: Call, engine: Engine, request: EngineRequest
    ) -> Answered:
        parts: list[str] = []
        last = None
        async for delta in engine.stream(request, request_id=request_id(job.chat, call)):
            parts.append(delta.text)
            last = delta
        return Answered(
            text="".join(parts),
            finish_reason=(last.finish_reason if last else None) or "stop",
            prompt_tokens=last.prompt_tokens if last else None,
            completion_tokens=last.completion_tokens if last else None,
            cached_prompt_tokens=last.cached_prompt_tokens if last else None,
        )

    # --- the verdict --------------------------------------------------------------------
    async def _compare(self, job: VerifyJob, fresh: str) -> None:
        tenant = job.chat.tenant_id
        agree = await self._judge(job, fresh)
        if agree is None:
            # No verdict (an LLM reply that is neither yes nor no, no score URL, the judge's
            # call refused by the tenant's limits): counted, so that `firsttoken cache report`
            # shows a judge that never decides.
            await self.verdicts.count_undecided(tenant)
            return
        await self.verdicts.record(tenant, job.score, agree, near=job.near)
        recorder.cache_verification(agree)
        if not agree and not job.near:
            # Served and judged wrong: no one else gets it. (A near miss was not served; its
            # entry may be right for its own question.)
            await drop_entry(self.ctx.redis, self.ctx.keys, tenant, job.entry_id)

    async def _judge(self, job: VerifyJob, fresh: str) -> bool | None:
        cached = job.cached_answer
        if cached.strip() == fresh.strip():
            return True
        kind = self.settings.cache_verify_judge
        if kind == "llm":
            messages = judge_question(job.question, cached, fresh)
            model = job.cached_model or self.ctx.models.default
            reply = await self._ask(job, "judge", messages, model, 3, 0.0)
            return None if reply is None else parse_yes_no(reply)
        if kind == "score":
            return await self._score_judge(cached, fresh)
        vectors = await self._vectors([cached, fresh])
        return agrees(float(np.dot(vectors[0], vectors[1])), self.settings.cache_verify_cut)

    async def _vectors(self, texts: list[str]) -> list[Vector]:
        if self._embed is not None:
            return await self._embed(texts)
        loop = asyncio.get_running_loop()
        async with self._embedder_lock:
            if self._closed:
                raise ConnectionError("the checker is closing")
            if self._embedder is None:
                from workers.embeddings.factory import make_embedder

                # Off the loop: the model loads for seconds; the bulk worker's writes go on.
                self._embedder = await loop.run_in_executor(
                    self._embed_pool, make_embedder, self.settings
                )
            embedder = self._embedder
        return list(await loop.run_in_executor(self._embed_pool, embedder.embed, texts))

    async def _score_judge(self, cached: str, fresh: str) -> bool | None:
        url = self.settings.cache_verify_score_url
        if not url:
            return None
        score = await score_answers(url, cached, fresh)
        return None if score is None else score >= self.settings.cache_verify_score_cut


async def score_answers(url: str, cached: str, fresh: str, client: Any = None) -> float | None:
    """A scoring server's score of two answers: vLLM /score, or vLLM's or TEI's /rerank
    (``client``: an httpx.AsyncClient to reuse, else one for this call)."""
    import httpx

    body: dict[str, Any]
    if url.rstrip("/").endswith("/score"):
        body = {"text_1": cached, "text_2": fresh}
    else:  # /rerank: TEI takes texts, vLLM documents
        body = {"query": cached, "texts": [fresh], "documents": [fresh]}
    if client is None:
        async with httpx.AsyncClient(timeout=30) as own:
            return await score_answers(url, cached, fresh, own)
    reply = await client.post(url, json=body)
    reply.raise_for_status()
    return parse_score(reply.json())


def judge_question(question: str, cached: str, fresh: str) -> list[Message]:
    """The LLM judge's question about two answers."""
    prompt = LLM_JUDGE_PROMPT.format(question=question, a=cached, b=fresh)
    return [Message(role="user", content=prompt)]
