"""The chat task: deadline and cancel check -> cache lookup ‖ retrieval -> engine -> publish.

A chat worker is a Celery worker (`celery -A workers.app worker -Q chat`) whose chat queue is
read by workers/chat/pool.py's bootstep on the process loop (workers/runtime.py): each message
becomes a task on that loop that runs :func:`run_chat`, with no thread between the queue read
and the chat. `FIRSTTOKEN_CHAT_CONCURRENCY` slots bound the chats in flight; when all are
taken the reader stops reading, so queued chats go to other worker processes.

Nothing in front of the first token runs in series when it can run alongside: the cache
lookup (an embedding) races retrieval, and when retrieval is done first the engine request
starts while the lookup finishes. A hit then aborts the engine request (it has spent a little
prefill); a miss has cost nothing. A turn of a server-stored conversation looks up once retrieval
has read its history, which its key holds (workers/chat/cached.py), and races the engine from there.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncGenerator, Coroutine
from typing import Any, TypeVar, cast

from shared import tracing
from shared.errors import (
    Cancelled,
    DeadlineExceeded,
    EngineError,
    ErrorFrame,
    FirstTokenError,
    error_frame,
)
from shared.keys import CHAT_TASK
from shared.protocol import DoneChunk, Usage, done_chunk
from shared.tasks import ChatJob, TaskCall
from workers import retrieval
from workers.app import app
from workers.cache import stage as cache_stage
from workers.cache.policy import Query
from workers.cache.stage import CacheStage, Lookup
from workers.chat.cached import cacheable_at_once, keep_cached_turn, keyed_on_history
from workers.chat.coalesce import Coalescer
from workers.chat.deferred import deferred
from workers.chat.failover import LeaseKeeper
from workers.chat.generate import Generation, job_generation
from workers.chat.publish import JobPublisher
from workers.chat.record import Outcome, record
from workers.chat.started import ChatStart
from workers.chat.stream import TokenStream
from workers.chat.takeover import Takeover
from workers.engines.base import Delta
from workers.lifecycle import lifecycle
from workers.prompt import BuiltPrompt
from workers.resources import WorkerContext
from workers.runtime import runner

log = logging.getLogger(__name__)
T = TypeVar("T")


@app.task(name=CHAT_TASK, ignore_result=True, acks_late=False)
def chat(job: dict[str, Any]) -> None:
    """Interactive: acked on receipt, never retried (a late answer is a wrong answer).

    Registered so the gateway can enqueue it by name; a chat worker reads the chat queue
    itself (workers/chat/pool.py) and never receives it through kombu. A worker that does
    (one started on the queue some other way) runs it on the same loop, the same way."""
    runner.run(run_chat(ChatJob.model_validate(job)))


async def chat_call(call: TaskCall) -> None:
    """The chat task as the chat queue's reader runs it, on the process loop."""
    await run_chat(ChatJob.model_validate(call.kwargs["job"]))


HANDLERS = {CHAT_TASK: chat_call}


async def run_chat(job: ChatJob) -> None:
    await ChatRun(await lifecycle.context(), job).run()


async def resume_chat(ctx: WorkerContext, job: ChatJob, plan: Takeover) -> None:
    """A chat taken over from a dead worker (workers/chat/failover.py): run again from the start
    (no token was sent) or continued from the text sent."""
    await ChatRun(ctx, job, plan).run()


async def fail_takeover(ctx: WorkerContext, job: ChatJob, plan: Takeover) -> None:
    """A chat taken over that cannot be continued (shared/failover.py `plan_takeover`): its
    `engine_error` after the chunks sent, and its usage row with the tokens delivered."""
    run = ChatRun(ctx, job, plan)
    await run.fail(
        EngineError(
            "the worker answering this chat stopped and its answer cannot be continued;"
            " please retry"
        )
    )


def start_failover(ctx: WorkerContext) -> LeaseKeeper:
    """This chat worker's lease keeper (workers/chat/failover.py), running on the loop."""
    keeper = LeaseKeeper(
        ctx,
        ctx.leases,
        functools.partial(resume_chat, ctx),
        functools.partial(fail_takeover, ctx),
    )
    return keeper


class ChatRun:
    """One chat job from pickup to its usage row."""

    def __init__(self, ctx: WorkerContext, job: ChatJob, takeover: Takeover | None = None) -> None:
        self.ctx = ctx
        self.job = job
        # Set when this worker took the chat over from a dead one (workers/chat/failover.py).
        self.takeover = takeover
        self.points: dict[str, float] = {
            "received": job.received_at,
            "enqueued": job.enqueued_at,
            "worker_start": time.time(),
        }
        self.publisher = JobPublisher(
            ctx.chunks,
            ctx.keys,
            job.job_id,
            job.chat_id,
            replay_maxlen=ctx.settings.replay_maxlen,
            replay_ttl_s=ctx.settings.replay_ttl_s,
        )
        self.stream = TokenStream(
            self.publisher,
            Coalescer(ctx.settings.flush_interval_ms / 1000.0, ctx.settings.flush_max_chars),
            ctx.leases,
        )
        self.model = job.model or ctx.models.default
        self.completion_tokens = 0
        # Tokens sent before this worker took the chat over, and whether it continues them.
        self._tokens_before = 0
        self.continued = takeover is not None and takeover.kind in ("continue", "fail")
        if takeover is not None and self.continued:
            # The answer goes on from the chunks sent: the next seq, the text, the count.
            self.publisher.next_seq = takeover.next_seq
            self.stream.text = [takeover.text]
            self.stream.tokens = self._tokens_before = self.completion_tokens = takeover.tokens
        self.cached_prompt_tokens: int | None = None  # the engine's, where it reports them
        self._built: BuiltPrompt | None = None
        self.generation: Generation | None = None
        self.cache: CacheStage | None = None
        self.lookup = Lookup(tier="off")
        # The job as the cache keys it (a stored conversation's turn: with its history).
        self.cache_job = job
        self._prepared: retrieval.Prepared | None = None
        self._helpers: list[asyncio.Future[Any]] = []
        self._task: asyncio.Task[Any] | None = None
        # The lease and `started`, whose reply says whether the client cancelled while queued.
        self.start = ChatStart(self._queue_start, self.cancel)
        # Set by cancel(). Task cancellation alone is not enough: a CancelledError raised
        # inside a Redis client call can come out as a timeout error, or be absorbed by an
        # awaited helper task, and the chat would then run on. The flag is checked at every
        # step that publishes.
        self.cancel_requested = False
        # Set by stand_down(): another worker took this chat over; nothing more is said here.
        self.superseded = False

    @property
    def prompt_tokens(self) -> int:
        """The prompt's tokens as sent to the engine (0 before the prompt is built)."""
        return 0 if self._built is None else self._built.prompt_tokens

    def cancel(self) -> None:
        """Stop this chat wherever it is (the client cancelled or went away)."""
        self.cancel_requested = True
        if self._task is not None:
            self._task.cancel()

    def stand_down(self) -> None:
        """Stop without publishing or recording anything: another worker claimed this chat
        (this worker was taken for dead) and answers it from now on."""
        self.superseded = True
        self.cancel()

    def _check_cancelled(self) -> None:
        if self.cancel_requested:
            raise asyncio.CancelledError

    # --- the run --------------------------------------------------------------------------
    async def run(self) -> None:
        job = self.job
        trace = None
        if tracing.on:  # the queue wait span, current for the chat's stages (their parent)
            trace = tracing.queue_wait(
                job, self.points["worker_start"], self.ctx.name, self.takeover is not None
            )
        if not await self._admit():
            return
        self._task = asyncio.current_task()
        self.ctx.running[self.job.job_id] = self
        try:
            await self._answer()
        except asyncio.CancelledError:
            await self._cancelled()
        except Exception as exc:  # noqa: BLE001 - every failure ends the chat with a frame
            if self.cancel_requested:
                await self._cancelled()
            else:
                await self._failed(exc)
        finally:
            self.start.drop()
            self.ctx.running.pop(self.job.job_id, None)
            self.ctx.leases.release(self.job.job_id)
            for helper in self._helpers:
                helper.cancel()
            if trace is not None:
                tracing.detach(trace)

    async def fail(self, exc: FirstTokenError) -> None:
        """End the chat with `exc` at once (a takeover that cannot continue it)."""
        await self._failed(exc)

    async def _admit(self) -> bool:
        """Drop a job found past its deadline or cancelled while queued."""
        job, now = self.job, self.points["worker_start"]
        # A chat taken over was picked up in time by the worker that died: no queue deadline.
        if self.takeover is None and now > job.deadline_at:
            await self._failed(
                DeadlineExceeded(
                    f"the chat waited {now - job.enqueued_at:.1f}s for a worker, past its "
                    "deadline; it was dropped, not run late. Add chat workers or lower the load."
                )
            )
            return False
        self.start.at_first_wait()
        return True

    def _queue_start(self) -> asyncio.Future[object]:
        job = self.job
        # The lease first, on the same pipe: whenever the gateway hears of this worker, a
        # survivor can take the chat over (workers/chat/failover.py).
        self.ctx.leases.hold(job)
        return self.publisher.start(
            self.points["worker_start"], self.ctx.keys.cancel_flag(job.job_id), worker=self.ctx.name
        )

    async def _check_queued_cancel(self) -> None:
        """Before anything is sent: stop a chat the client cancelled while it was queued."""
        if await self.start.cancelled_while_queued():
            self.cancel_requested = True
            raise asyncio.CancelledError

    async def _answer(self) -> None:
        lookup: asyncio.Future[Any] | None = None
        if cacheable_at_once(self.job, self.takeover):
            query, known = self._exact_known()
            lookup = self._spawn(self._lookup(query))
            if known:
                # This process's index holds the exact request: its answer is one Redis read
                # away, and retrieval would only compete with that read for the loop.
                await asyncio.wait({lookup})
                if await self._served_from_cache(lookup):
                    return
        else:
            self.points["cache_decided"] = self.points["worker_start"]
        if lookup is None:
            # Nothing to race: awaited in place (a task would cost two passes of the loop,
            # and with every source cached the stage does not wait at all).
            prepared = self._prepared = await retrieval.prepare(self.ctx, self.job)
            keyed = keyed_on_history(self.job, self.takeover, prepared)
            if keyed is not None:
                self.cache_job = keyed
                if (lookup := await self._lookup_with_history()) is None:
                    return  # served from the cache
        else:
            prepare = self._spawn(retrieval.prepare(self.ctx, self.job))
            await asyncio.wait({lookup, prepare}, return_when=asyncio.FIRST_COMPLETED)
            if await self._served_from_cache(lookup):
                return
            prepared = self._prepared = await prepare
            if await self._lookup_within_head_start(lookup):
                return
        self.points["retrieval_done"] = time.time()
        self.model = prepared.model
        self._built = prepared.built
        self.generation = job_generation(self.ctx, prepared.job, self.publisher, self.takeover)
        # Off the first token's path: these run once the engine request is out, and once no
        # other chat waits in the queue for its own (workers/chat/deferred.py). A first turn's
        # prompt may go out before its tokens are counted: see BuiltPrompt.
        deferred.later(functools.partial(retrieval.start_background, prepared))
        deferred.later(functools.partial(getattr, prepared.built, "prompt_tokens"))
        if lookup is None or lookup.done():
            # Nothing to race: this task sends the engine request itself, in this step, so
            # the request leaves ahead of whatever else waits on the loop (a new task would
            # start behind it all).
            result = await self._generate()
        else:
            # The engine starts now, while a semantic lookup may still be embedding; its
            # first token waits at `go` until the lookup has missed (or lost the race).
            first_ready, go = asyncio.Event(), asyncio.Event()
            generate = self._spawn(self._generate(first_ready, go))
            engine_first = self._spawn(first_ready.wait())
            await asyncio.wait(
                {lookup, engine_first, generate}, return_when=asyncio.FIRST_COMPLETED
            )
            if await self._served_from_cache(lookup):
                return
            await self._check_queued_cancel()
            go.set()
            result = await generate
        await self._finish(prepared, *result, lookup)

    # --- stages ---------------------------------------------------------------------------
    async def _lookup_with_history(self) -> asyncio.Task[Any] | None:
        """A stored conversation's lookup on ``cache_job``, started as other chats' is at once;
        None when the chat was served from the cache."""
        query, known = self._exact_known()
        lookup = self._spawn(self._lookup(query))
        if known:
            await asyncio.wait({lookup})
        if await self._served_from_cache(lookup) or await self._lookup_within_head_start(lookup):
            return None
        return lookup

    async def _lookup_within_head_start(self, lookup: asyncio.Future[Any]) -> bool:
        """With FIRSTTOKEN_CACHE_HEAD_START_MS, give the lookup that long (from the chat's start)
        before the engine request starts; True when it found a hit and the chat was served."""
        left = self.ctx.settings.cache_head_start_ms / 1000.0 - (
            time.time() - self.points["worker_start"]
        )
        if left <= 0 or lookup.done():
            return False
        await asyncio.wait({lookup}, timeout=left)
        return await self._served_from_cache(lookup)

    def _exact_known(self) -> tuple[Query | None, bool]:
        """The cache's view of this request (when the stage is up) and whether this process
        already knows an exact hit for it."""
        stage = cache_stage.current_stage(self.ctx)
        query = stage.query(self.cache_job, self.model) if stage is not None else None
        return query, stage is not None and query is not None and stage.knows_exact(query)

    async def _lookup(self, query: Query | None) -> tuple[CacheStage | None, Lookup]:
        with tracing.span("cache lookup") as span:
            result = await cache_stage.lookup(self.ctx, self.cache_job, self.model, query)
            span.set("firsttoken.cache.tier", result[1].tier)
        self.points["cache_decided"] = time.time()
        return result

    async def _served_from_cache(self, lookup: asyncio.Future[Any]) -> bool:
        """Once the lookup is done: replay a hit and end the chat (True), else remember it."""
        if not lookup.done():
            return False
        self.cache, self.lookup = lookup.result()
        hit = self.lookup.hit
        if self.cache is None or hit is None or self.cancel_requested:
            return False
        await self._check_queued_cancel()
        for helper in self._helpers:
            if helper is not lookup:
                helper.cancel()
        self.cache.replay(self.cache_job, self.publisher, hit, self.points)
        conversation = None
        if self.job.conversation_id is not None:  # written to it before `done`
            conversation = await keep_cached_turn(
                self.ctx, self.job, self._prepared, hit.answer, hit.model or self.model
            )
        outcome = Outcome(
            self.model,
            "stop",
            "ok",
            completion_tokens=hit.completion_tokens,
            answer=hit.answer,
            cached=True,
            conversation_id=conversation,
            cache_tier=self.lookup.tier,
        )
        usage: Usage = {"prompt_tokens": 0, "completion_tokens": hit.completion_tokens}
        extras = {} if conversation is None else {"conversation_id": conversation}
        self._end(outcome, self._done(True, "stop", usage, extras))
        return True

    async def _generate(
        self, first_ready: asyncio.Event | None = None, go: asyncio.Event | None = None
    ) -> tuple[str, int | None]:
        """Drive the whole engine stream from one task (its deadlines are asyncio timeouts,
        bound to the task that iterates). Nothing is published before the `started` chunk's
        reply has said the job was not cancelled while queued, nor, with `go`, before it is
        set (its caller checked that reply)."""
        assert self.generation is not None
        deltas = self.generation.stream()
        async with contextlib.aclosing(deltas):
            first = await _next(deltas)
            if go is None:
                await self._check_queued_cancel()
            else:
                assert first_ready is not None
                first_ready.set()
                await go.wait()
            return await self._stream_answer(first, deltas)

    async def _stream_answer(
        self, delta: Delta | None, deltas: AsyncGenerator[Delta, None]
    ) -> tuple[str, int | None]:
        """Stream the engine's deltas to the client; returns (finish_reason, engine's count)."""
        assert self.generation is not None
        finish_reason = "stop"
        engine_prompt_tokens: int | None = None
        while delta is not None:
            self._check_cancelled()
            self.model = self.generation.model
            if delta.text:
                if "engine_first_token" not in self.points:
                    self.points["engine_first_token"] = time.time()
                    # The first token chunk names the model that answers it.
                    self.publisher.name_model(self.model)
                self.completion_tokens += 1
                self.stream.add(delta.text)
            if delta.finish_reason is not None:
                finish_reason = delta.finish_reason
            if delta.prompt_tokens is not None:
                engine_prompt_tokens = delta.prompt_tokens
            if delta.completion_tokens is not None:
                # A continuation's engine counts only what it generated.
                self.completion_tokens = self._tokens_before + delta.completion_tokens
            if delta.cached_prompt_tokens is not None:
                self.cached_prompt_tokens = delta.cached_prompt_tokens
            delta = await _next(deltas)
        self._check_cancelled()
        await self.ctx.leases.wait_open()  # held text and `done` go out only while ours
        self._check_cancelled()
        self.stream.close()
        return finish_reason, engine_prompt_tokens

    async def _finish(
        self,
        prepared: retrieval.Prepared,
        finish_reason: str,
        engine_prompt_tokens: int | None,
        lookup: asyncio.Future[Any] | None,
    ) -> None:
        self._check_cancelled()
        points, answer = self.points, self.stream.answer
        if self.stream.first_published is not None:
            points["first_chunk_published"] = self.stream.first_published
        points["finished"] = time.time()
        # The answer's text, usage row and `done` go out only while the chat is still ours
        # (workers/chat/failover.py: a worker taken for dead is stood down here instead).
        await self.ctx.leases.wait_open()
        self._check_cancelled()
        await retrieval.settle_background(prepared)
        await retrieval.after_answer(self.ctx, self.job, prepared, answer, self.model)
        conversation = prepared.job.conversation_id if prepared.conversation_ok else None
        route = prepared.decision.route if prepared.decision is not None else "default"
        outcome = Outcome(
            self.model,
            finish_reason,
            "ok",
            # The usage row bills what the engine says it processed, when it says.
            self.prompt_tokens if engine_prompt_tokens is None else engine_prompt_tokens,
            self.completion_tokens,
            answer,
            conversation_id=conversation,
            route=route,
            cache_tier=self.lookup.tier,
            cached_prompt_tokens=self.cached_prompt_tokens,
        )
        usage: Usage = {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
        }
        if engine_prompt_tokens is not None and engine_prompt_tokens != self.prompt_tokens:
            # The engine's own count (its chat template, its tokenizer) where it differs.
            usage["engine_prompt_tokens"] = engine_prompt_tokens
        if self.cached_prompt_tokens is not None:
            usage["cached_prompt_tokens"] = self.cached_prompt_tokens
        extras = self._done_extras(prepared)
        self._end(outcome, self._done(False, finish_reason, usage, extras))
        if lookup is not None and not lookup.done():
            # The engine answered before the lookup finished; its vectors are still wanted
            # to store this answer.
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(lookup), 1.0)
            if lookup.done() and not lookup.cancelled():
                self.cache, self.lookup = lookup.result()
        if self.cache is not None:
            self.cache.remember(
                self.cache_job,
                self.lookup,
                model=self.model,
                temperature=self.job.temperature,
                status="ok",
                finish_reason=finish_reason,
                answer=answer,
                prompt_tokens=self.prompt_tokens,
                completion_tokens=self.completion_tokens,
            )

    def _done_extras(self, prepared: retrieval.Prepared) -> dict[str, Any]:
        extras: dict[str, Any] = dict(retrieval.done_fields(prepared))
        if self.continued:
            extras["continued"] = True
        return extras

    # --- endings --------------------------------------------------------------------------
    def _end(self, outcome: Outcome, last: DoneChunk | ErrorFrame) -> None:
        """The one place a chat ends, whichever way (answered, cached, cancelled, failed): its
        usage row goes on the pipe ahead of its last chunk, which Redis then runs in order, so
        no client sees the end of a chat whose row Redis does not hold (workers/chat/record.py).
        A chat whose worker died ends at the gateway instead (gateway/lostchats.py)."""
        record(self.ctx, self.job, self.points, outcome)
        if "code" not in last:
            self.publisher.done(last)
            return
        with contextlib.suppress(Exception):  # the chat is over either way
            self.publisher.error(cast(ErrorFrame, last))

    def _done(
        self, cached: bool, finish_reason: str, usage: Usage, extras: dict[str, Any] | None = None
    ) -> DoneChunk:
        return done_chunk(
            self.job.chat_id,
            cached=cached,
            model=self.model,
            finish_reason=finish_reason,
            usage=usage,
            chunks=self.publisher.next_seq,
            points=self.points,
            extras=extras or {},
        )

    async def _cancelled(self) -> None:
        self.stream.stop()
        if self.generation is not None:
            with contextlib.suppress(Exception):
                await self.generation.abort()
        if self.superseded:
            return  # the worker that took the chat over speaks and records for it
        outcome = Outcome(
            self.model,
            "cancelled",
            "cancelled",
            self.prompt_tokens,
            self.completion_tokens,
            self.stream.answer,
            cache_tier=self.lookup.tier,
            cached_prompt_tokens=self.cached_prompt_tokens,
        )
        self._end(outcome, error_frame(self.job.chat_id, Cancelled("the chat was cancelled")))

    async def _failed(self, exc: BaseException) -> None:
        if not isinstance(exc, FirstTokenError):
            log.exception("chat %s failed", self.job.job_id, exc_info=exc)
        elif exc.detail is not None:
            # What the client's message leaves out (the engine's address, the driver's error).
            log.warning("chat %s failed: %s", self.job.job_id, exc.detail)
        self.stream.stop()
        frame = error_frame(self.job.chat_id, exc)
        status = "timeout" if isinstance(exc, DeadlineExceeded) else "error"
        outcome = Outcome(
            self.model,
            frame["code"],
            status,
            completion_tokens=self.completion_tokens,
            cache_tier=self.lookup.tier,
            cached_prompt_tokens=self.cached_prompt_tokens,
        )
        self._end(outcome, frame)

    def _spawn(self, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        """A helper task of this chat, cancelled when the chat ends however it ends."""
        task = asyncio.ensure_future(coro)
        self._helpers.append(task)
        return task


async def _next(deltas: AsyncGenerator[Delta, None]) -> Delta | None:
    """The next delta, or None at the end of the stream."""
    try:
        return await anext(deltas)
    except StopAsyncIteration:
        return None
