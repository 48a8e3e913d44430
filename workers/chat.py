"""The chat task: deadline check -> (cache, retrieval: later issues) -> engine stream -> publish.

Runs on the `chat` queue with Celery's solo pool: the task hands the job to the process loop
(workers.runtime) and returns at once, so one process streams many chats at once with a single
thread hop between kombu and asyncio. A threads pool whose threads wait on the loop (the first
design) measured 1.5-5 ms more queue time per chat here: two hops, and every hop waits on the
GIL. `FIRSTTOKEN_CHAT_CONCURRENCY` slots bound the chats in flight; when all are taken the
consumer blocks, so queued chats go to other worker processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from typing import Any

from shared.coalesce import Coalescer
from shared.errors import Cancelled, DeadlineExceeded, FirstTokenError, error_frame
from shared.keys import BULK_QUEUE, CHAT_TASK, PERSIST_MESSAGES_TASK, PERSIST_USAGE_TASK
from shared.protocol import CHUNK_DONE, CHUNK_ERROR, dumps
from shared.settings import get_settings
from shared.tasks import ChatJob, MessagesRecord, UsageRecord, task_message
from workers import cache_stage, retrieve
from workers.app import app
from workers.context import WorkerContext, get_context
from workers.generate import job_generation
from workers.publish import JobPublisher
from workers.runtime import runner

log = logging.getLogger(__name__)


_slots: threading.BoundedSemaphore | None = None


@app.task(name=CHAT_TASK, ignore_result=True, acks_late=False)
def chat(job: dict[str, Any]) -> None:
    """Interactive: acked on receipt, never retried (a late answer is a wrong answer)."""
    global _slots
    if _slots is None:
        _slots = threading.BoundedSemaphore(get_settings().chat_concurrency)
    _slots.acquire()
    try:
        future = runner.submit(run_chat(ChatJob.model_validate(job)))
    except BaseException:
        _slots.release()
        raise
    future.add_done_callback(lambda _: _slots.release() if _slots is not None else None)


class _Stream:
    """Engine deltas -> coalesced token chunks, flushed in seq order by one lock."""

    def __init__(self, publisher: JobPublisher, coalescer: Coalescer) -> None:
        self.publisher = publisher
        self.coalescer = coalescer
        self.lock = asyncio.Lock()
        self.timer: asyncio.TimerHandle | None = None
        self.text: list[str] = []
        self.first_published: float | None = None
        self.pending: set[asyncio.Task[None]] = set()

    async def flush(self) -> None:
        async with self.lock:
            now = time.time()
            text = self.coalescer.take(now)
            if text:
                if self.first_published is None:
                    self.first_published = now
                await self.publisher.token(text)

    def _flush_later(self) -> None:
        self.timer = None
        task = asyncio.ensure_future(self.flush())
        self.pending.add(task)
        task.add_done_callback(self.pending.discard)

    async def add(self, text: str) -> None:
        self.text.append(text)
        if self.coalescer.add(text, time.time()):
            if self.timer is not None:
                self.timer.cancel()
                self.timer = None
            await self.flush()
        elif self.timer is None:
            due = self.coalescer.flush_at()
            if due is not None:
                loop = asyncio.get_running_loop()
                self.timer = loop.call_later(max(0.0, due - time.time()), self._flush_later)

    async def close(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.pending:
            await asyncio.gather(*self.pending, return_exceptions=True)
        await self.flush()


async def run_chat(job: ChatJob) -> None:
    ctx = await get_context()
    points: dict[str, float] = {"received": job.received_at, "enqueued": job.enqueued_at}
    points["worker_start"] = time.time()
    publisher = JobPublisher(
        ctx.redis,
        ctx.keys,
        job.job_id,
        job.chat_id,
        replay_maxlen=ctx.settings.replay_maxlen,
        replay_ttl_s=ctx.settings.replay_ttl_s,
    )
    model = job.model or ctx.models.default
    if points["worker_start"] > job.deadline_at:
        waited = points["worker_start"] - job.enqueued_at
        await _fail(
            ctx,
            publisher,
            job,
            model,
            points,
            DeadlineExceeded(
                f"the chat waited {waited:.1f}s for a worker, past its deadline; it was dropped, "
                "not run late. Add chat workers or lower the load."
            ),
        )
        return
    if await publisher.start(ctx.keys.cancel_flag(job.job_id), points["worker_start"]):
        await _record(ctx, job, model, points, 0, 0, "cancelled", "cancelled", "")
        return

    # Exact, then semantic lookup (workers/cache_stage.py); a hit replays and ends the chat.
    cache, lookup = await cache_stage.lookup(ctx, job, model)
    points["cache_decided"] = time.time()
    if cache is not None and lookup.hit is not None:
        await cache.replay(job, publisher, model, lookup.hit, points)
        await _record(
            ctx, job, model, points, 0, lookup.hit.completion_tokens, "stop", "ok",
            lookup.hit.answer, cached=True,
        )  # fmt: skip
        return

    task = asyncio.current_task()
    assert task is not None
    ctx.running[job.job_id] = task
    stream = _Stream(
        publisher, Coalescer(ctx.settings.flush_interval_ms / 1000.0, ctx.settings.flush_max_chars)
    )
    prompt_tokens = completion_tokens = 0
    engine_prompt_tokens: int | None = None
    finish_reason = "stop"
    generation = job_generation(ctx, job, publisher)
    try:
        # Retrieval (workers/retrieve.py): sources in parallel, each under its deadline, then
        # the budgeted prompt and, for model "auto", the route. prompt_tokens is the count of
        # the prompt built here, i.e. what the engine is sent.
        prepared = await retrieve.prepare(ctx, job)
        points["retrieval_done"] = time.time()
        model = prepared.model
        prompt_tokens = prepared.built.prompt_tokens
        generation = job_generation(ctx, prepared.job, publisher)
        # First-token failover across the model's fallbacks (workers/generate.py); `model`
        # follows it, so the done frame and the usage row name the model that answered.
        async for delta in generation.stream():
            model = generation.model
            if delta.text:
                if "engine_first_token" not in points:
                    points["engine_first_token"] = time.time()
                completion_tokens += 1
                await stream.add(delta.text)
            if delta.finish_reason is not None:
                finish_reason = delta.finish_reason
            if delta.prompt_tokens is not None:
                engine_prompt_tokens = delta.prompt_tokens
            if delta.completion_tokens is not None:
                completion_tokens = delta.completion_tokens
        await stream.close()
    except asyncio.CancelledError:
        await _stop_stream(stream)
        with contextlib.suppress(Exception):
            await generation.abort()
        await _record(
            ctx,
            job,
            model,
            points,
            prompt_tokens,
            completion_tokens,
            "cancelled",
            "cancelled",
            "".join(stream.text),
        )
        with contextlib.suppress(Exception):
            await publisher.control(
                CHUNK_ERROR, dumps(error_frame(job.chat_id, Cancelled("the chat was cancelled")))
            )
        return
    except Exception as exc:
        if not isinstance(exc, FirstTokenError):
            log.exception("chat %s failed", job.job_id)
        await _stop_stream(stream)
        await _fail(ctx, publisher, job, model, points, exc, completion_tokens)
        return
    finally:
        ctx.running.pop(job.job_id, None)

    if stream.first_published is not None:
        points["first_chunk_published"] = stream.first_published
    points["finished"] = time.time()
    answer = "".join(stream.text)
    await retrieve.after_answer(ctx, job, prepared, answer, model)
    usage: dict[str, int] = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens}
    if engine_prompt_tokens is not None and engine_prompt_tokens != prompt_tokens:
        # The engine's own count (its chat template, its tokenizer) where it differs.
        usage["engine_prompt_tokens"] = engine_prompt_tokens
    done = {
        "type": "done",
        "id": job.chat_id,
        "cached": False,
        "model": model,
        "finish_reason": finish_reason,
        "usage": usage,
        "chunks": publisher.next_seq,
        "points": points,
        **retrieve.done_fields(prepared),
    }
    await publisher.control(CHUNK_DONE, dumps(done))
    if cache is not None:
        cache.remember(
            lookup,
            model=model,
            temperature=job.temperature,
            status="ok",
            finish_reason=finish_reason,
            answer="".join(stream.text),
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
        )
    await _record(
        ctx,
        job,
        model,
        points,
        prompt_tokens,
        completion_tokens,
        finish_reason,
        "ok",
        "".join(stream.text),
        conversation_id=job.conversation_id if prepared.conversation_ok else None,
        route=prepared.decision.route if prepared.decision is not None else "default",
    )


async def _stop_stream(stream: _Stream) -> None:
    if stream.timer is not None:
        stream.timer.cancel()
    for pending in list(stream.pending):
        pending.cancel()


async def _fail(
    ctx: WorkerContext,
    publisher: JobPublisher,
    job: ChatJob,
    model: str,
    points: dict[str, float],
    exc: BaseException,
    completion_tokens: int = 0,
) -> None:
    frame = error_frame(job.chat_id, exc)
    with contextlib.suppress(Exception):
        await publisher.control(CHUNK_ERROR, dumps(frame))
    status = "timeout" if isinstance(exc, DeadlineExceeded) else "error"
    await _record(ctx, job, model, points, 0, completion_tokens, frame["code"], status, "")


async def _record(
    ctx: WorkerContext,
    job: ChatJob,
    model: str,
    points: dict[str, float],
    prompt_tokens: int,
    completion_tokens: int,
    finish_reason: str,
    status: str,
    answer: str,
    *,
    cached: bool = False,
    conversation_id: str | None = None,
    route: str = "default",
) -> None:
    """Hand the usage row (and the text, if stored) to the bulk queue; never fails the chat.

    A turn of a verified conversation is always stored: the client asked the server to keep
    its history (issue 5); other chats' text only with `store_text`.
    """
    now = time.time()
    first = points.get("first_chunk_published")
    usage = UsageRecord(
        request_id=job.job_id,
        tenant_id=job.tenant_id,
        key_id=job.key_id,
        model=model,
        route=route,
        cached=cached,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        queue_ms=_ms(points.get("worker_start"), job.enqueued_at),
        ttft_ms=_ms(first, job.received_at),
        total_ms=_ms(now, job.received_at),
        finish_reason=finish_reason,
        status=status,
        created_at=now,
    )
    messages = [
        task_message(
            PERSIST_USAGE_TASK, {"usage": usage.model_dump()}, queue=BULK_QUEUE, origin=ctx.name
        ),
    ]
    if (ctx.settings.store_text or conversation_id is not None) and status == "ok":
        record = MessagesRecord(
            request_id=job.job_id,
            tenant_id=job.tenant_id,
            conversation_id=conversation_id,
            messages=job.messages,
            answer=answer,
            model=model,
            created_at=now,
        )
        messages.append(
            task_message(
                PERSIST_MESSAGES_TASK,
                {"messages": record.model_dump()},
                queue=BULK_QUEUE,
                origin=ctx.name,
            )
        )
    try:
        await ctx.redis.lpush(ctx.keys.queue_list(BULK_QUEUE), *messages)
    except Exception:  # noqa: BLE001
        log.error("could not enqueue usage for %s: %s", job.job_id, json.dumps(usage.model_dump()))


def _ms(end: float | None, start: float | None) -> float | None:
    if end is None or start is None:
        return None
    return round((end - start) * 1000.0, 3)
