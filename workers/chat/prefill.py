"""A draft's prefill (issue 34): the chat's prompt, built now, sent with ``max_tokens`` 1.

The chat pool reads drafts off the chat queue's lowest-priority list (only when no chat waits;
shared/drafts.py says why they never delay a chat) and runs :func:`prefill_call` on the loop,
in a chat slot. The prompt comes from the chat's own retrieval stage
(workers/retrieval: template, budget, history, knowledge base), so the engine's prefix cache
then holds what the chat will send, and the request goes to the engine the chat's model is
served by (the worker's one client per server). Its one generated token is dropped.

A prefill is aborted when a newer draft of its conversation is admitted (the gateway publishes
its job id on the cancel channel, which workers/resources.py's listener routes here). Each one
that reached the engine writes a usage row: route ``prefill``, no prompt or completion tokens
billed as a chat's, ``prefill_tokens`` the prompt's tokens and ``cached_prompt_tokens`` those
the engine already held (its cost, where the model has prices, is that prompt's).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from shared.drafts import draft_chat_job, prefill_verdict
from shared.keys import PREFILL_TASK
from shared.pricing import request_cost
from shared.redis import scripts
from shared.tasks import ChatJob, DraftJob, TaskCall, UsageRecord
from shared.timing import elapsed_ms
from shared.usage_row import prices_of
from workers import retrieval
from workers.engines.base import EngineRequest
from workers.lifecycle import lifecycle
from workers.resources import WorkerContext

log = logging.getLogger(__name__)

# How long the running-draft marker lives if its worker dies before clearing it.
RUNNING_TTL_S = 30


async def prefill_call(call: TaskCall) -> None:
    """The prefill task as the chat queue's reader runs it, on the process loop."""
    await run_prefill(await lifecycle.context(), DraftJob.model_validate(call.kwargs["draft"]))


HANDLERS = {PREFILL_TASK: prefill_call}


class PrefillRun:
    """One prefill in flight, as the cancel listener sees it."""

    def __init__(self, task: asyncio.Task[object] | None) -> None:
        self._task = task
        self.aborted = False

    def cancel(self) -> None:
        self.aborted = True
        if self._task is not None:
            self._task.cancel()

    def stand_down(self) -> None:
        self.cancel()


async def run_prefill(ctx: WorkerContext, draft: DraftJob) -> str:
    """Prefill the draft unless it is superseded, stale or the worker is busy; returns what
    happened ("prefilled", "aborted", "failed", or the verdict that dropped it)."""
    settings, keys = ctx.settings, ctx.keys
    latest = await ctx.redis.get(keys.draft_latest(draft.scope))
    now = time.time()
    verdict = prefill_verdict(
        job_id=draft.job_id,
        latest=_text(latest),
        now=now,
        enqueued_at=draft.enqueued_at,
        max_age_s=settings.draft_max_age_s,
        busy=len(ctx.running) + len(ctx.prefills),
        slots=settings.chat_concurrency,
        share=settings.draft_worker_share,
    )
    if verdict != "prefill":
        log.debug("draft %s dropped: %s", draft.job_id, verdict)
        return verdict
    run = PrefillRun(asyncio.current_task())
    ctx.prefills[draft.job_id] = run
    running = keys.draft_running(draft.scope)
    job = draft_chat_job(draft, now, settings.first_token_deadline_s)
    try:
        # Marked running, then the newest draft read again, in one transaction: a newer draft
        # admitted before the mark is seen here (superseded), one admitted after it finds the
        # mark and aborts this prefill; the read above alone leaves a gap between the two.
        async with ctx.redis.pipeline(transaction=True) as pipe:
            pipe.set(running, draft.job_id, ex=RUNNING_TTL_S)
            pipe.get(keys.draft_latest(draft.scope))
            _, latest = await pipe.execute()
        if _text(latest) != draft.job_id:
            log.debug("draft %s dropped: superseded", draft.job_id)
            return "superseded"
        return await _prefill(ctx, job, now)
    except asyncio.CancelledError:
        if not run.aborted:
            raise  # the worker is stopping
        return "aborted"
    except Exception as exc:  # noqa: BLE001 - a draft's failure is no one's error frame
        log.warning("draft %s not prefilled: %r", draft.job_id, exc)
        return "failed"
    finally:
        ctx.prefills.pop(draft.job_id, None)
        with contextlib.suppress(Exception):
            await scripts.run(ctx.redis, scripts.DRAFT_CLEAR_RUNNING, [running], [draft.job_id])


def _text(value: str | bytes | None) -> str | None:
    """A reply as text: the worker's client decodes; a raw one would not."""
    return value.decode() if isinstance(value, bytes) else value


async def _prefill(ctx: WorkerContext, job: ChatJob, started: float) -> str:
    prepared = await retrieval.prepare(ctx, job)
    spec = ctx.models.get(prepared.model)
    engine = ctx.engine_for(spec)
    request = EngineRequest(
        messages=prepared.job.messages, model=spec.engine_model, max_tokens=1, temperature=0.0
    )
    prompt_tokens = prepared.built.prompt_tokens
    cached: int | None = None
    try:
        async with asyncio.timeout(ctx.settings.first_token_deadline_s):
            async for delta in engine.stream(request, request_id=job.job_id):
                if delta.prompt_tokens is not None:
                    prompt_tokens = delta.prompt_tokens
                if delta.cached_prompt_tokens is not None:
                    cached = delta.cached_prompt_tokens
    except BaseException:
        with contextlib.suppress(Exception):
            await engine.abort(job.job_id)
        raise
    finished = time.time()
    ctx.usage.add(
        UsageRecord(
            request_id=job.job_id,
            tenant_id=job.tenant_id,
            key_id=job.key_id,
            model=prepared.model,
            route="prefill",
            queue_ms=elapsed_ms(started, job.enqueued_at),
            total_ms=elapsed_ms(finished, job.enqueued_at),
            finish_reason="prefill",
            status="ok",
            created_at=finished,
            cost=request_cost(prices_of(ctx.models, prepared.model), prompt_tokens, 0, cached),
            conversation_id=job.conversation_id,
            cached_prompt_tokens=cached,
            prefill_tokens=prompt_tokens,
        )
    )
    return "prefilled"
