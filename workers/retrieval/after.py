"""What runs after the answer: the background sources' results, the `done` frame's retrieval
fields, the conversation turn's write and its summary job."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from shared.keys import SUMMARIZE_QUEUE, SUMMARIZE_TASK
from shared.tasks import ChatJob, task_message
from workers.resources import WorkerContext
from workers.retrieval.assembly import Prepared
from workers.retrieval.gather import summarize_results

log = logging.getLogger(__name__)


async def settle_background(prepared: Prepared, wait_s: float = 0.05) -> None:
    """Add the background sources' results to ``prepared.retrieval`` (waiting at most
    ``wait_s``: by the end of an answer they are long done); one still running is dropped."""
    if prepared.deferred:  # still held back (workers/chat/deferred.py): reported as skipped
        prepared.retrieval["skipped"].extend(source.name for source, _ in prepared.deferred)
        prepared.deferred.clear()
    tasks = prepared.background
    if not tasks:
        return
    await asyncio.wait(tasks.values(), timeout=wait_s)
    done = {}
    for name, task in tasks.items():
        if task.done() and not task.cancelled():
            done[name] = task.result()
        else:
            task.cancel()
    summary = summarize_results(done)
    prepared.retrieval["sources"].update(summary["sources"])
    prepared.retrieval["skipped"].extend(summary["skipped"])
    tasks.clear()


def done_fields(prepared: Prepared) -> dict[str, Any]:
    """What the stage adds to the `done` frame."""
    out: dict[str, Any] = {
        "chunk_ids": list(prepared.built.chunk_ids),
        "retrieval": prepared.retrieval,
        "prompt": {
            "history_sent": prepared.built.history_sent,
            "history_dropped": prepared.built.history_dropped,
            "summary_sent": prepared.built.summary_sent,
        },
    }
    if prepared.decision is not None:
        out["route"] = prepared.decision.route
        out["route_reason"] = prepared.decision.reason
    if prepared.job.conversation_id is not None:
        out["conversation_id"] = prepared.job.conversation_id
    return out


async def after_answer(
    ctx: WorkerContext, original: ChatJob, prepared: Prepared, answer: str, model: str
) -> None:
    """Store a conversation turn before `done`, so the next turn reads it; queue a summary."""
    job = prepared.job
    if not prepared.conversation_ok or job.conversation_id is None:
        return
    await store_turn(ctx, original, job.conversation_id, answer, model)
    window = prepared.window
    if window is None or window.summarize_upto is None:
        return
    # One summary job per conversation at a time: every turn past the threshold would
    # otherwise queue another until the first one lands.
    lock = ctx.keys.summary_lock(job.conversation_id)
    if await ctx.redis.set(lock, job.job_id, nx=True, ex=120):
        message = task_message(
            SUMMARIZE_TASK,
            {
                "conversation_id": job.conversation_id,
                "tenant_id": job.tenant_id,
                "upto": window.summarize_upto,
            },
            queue=SUMMARIZE_QUEUE,
            origin=ctx.name,
        )
        await ctx.redis.lpush(ctx.keys.queue_list(SUMMARIZE_QUEUE), message)


async def store_turn(
    ctx: WorkerContext, original: ChatJob, conversation_id: str, answer: str, model: str
) -> None:
    """Write a verified conversation's turn (the client's messages and the answer) now.

    The direct write (one short transaction; it delays `done`, never the first token) is what
    makes "send the next message as soon as `done` arrives" see this turn. The bulk queue gets
    the same idempotent write too (workers/chat/record.py), so a failure here only delays it.
    An answer replayed from the cache is written the same way: it is the conversation's turn.
    """
    from shared.db.writes import insert_messages
    from shared.tasks import MessagesRecord

    record = MessagesRecord(
        request_id=original.job_id,
        tenant_id=original.tenant_id,
        conversation_id=conversation_id,
        # The client's messages as sent, like the bulk write: both key rows on
        # (request_id, position), so the second of the two writes adds nothing.
        messages=list(original.messages),
        answer=answer,
        model=model,
        created_at=time.time(),
    )
    try:
        async with asyncio.timeout(1.0), ctx.db.sessionmaker().begin() as session:
            await insert_messages(session, record)
    except Exception as exc:  # noqa: BLE001 - the bulk path retries it
        log.warning(
            "direct write of turn %s failed (%s); the bulk queue has it", original.job_id, exc
        )
