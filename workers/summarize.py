"""Conversation summaries, off the hot path: a low-priority task on its own `summarize` queue.

A chat turn past the history threshold queues this with the id of the last message to fold in
(``upto``). The task asks the small model to merge those messages into the running summary and
stores it on the conversation with ``summary_upto``; the next turn sends summary + recent
window instead of the old turns. Idempotent: the row is updated only forward (a redelivered or
late job that would move ``summary_upto`` back is a no-op).
"""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy import or_, select, update

from shared.db.models import Conversation, MessageRow
from shared.keys import SUMMARIZE_TASK
from shared.modeltable import ModelSpec, ModelTable
from shared.settings import Settings
from workers.app import app
from workers.conversation import StoredMessage, summary_prompt
from workers.engines.base import EngineRequest
from workers.lifecycle import lifecycle
from workers.resources import WorkerContext
from workers.runtime import runner

log = logging.getLogger(__name__)

SUMMARY_TIMEOUT_S = 60.0


def summary_model(models: ModelTable, settings: Settings) -> ModelSpec:
    """The configured summary model, else the first small model, else the default."""
    if settings.summary_model:
        return models.get(settings.summary_model)
    for spec in models:
        if spec.role == "small":
            return spec
    return models.get(None)


async def summarize_conversation(
    ctx: WorkerContext, conversation_id: str, tenant_id: str, upto: int
) -> bool:
    """Fold messages up to ``upto`` into the summary; False when there was nothing to do."""
    async with ctx.db.sessionmaker()() as session:
        conv = await session.get(Conversation, conversation_id)
        if conv is None or conv.tenant_id != tenant_id:
            return False
        if conv.summary_upto is not None and conv.summary_upto >= upto:
            return False
        stmt = select(MessageRow.id, MessageRow.role, MessageRow.content).where(
            MessageRow.conversation_id == conversation_id,
            MessageRow.id <= upto,
            MessageRow.role.in_(("user", "assistant")),
        )
        if conv.summary_upto is not None:
            stmt = stmt.where(MessageRow.id > conv.summary_upto)
        result = await session.execute(stmt.order_by(MessageRow.id))
        rows = [StoredMessage(int(r[0]), str(r[1]), str(r[2])) for r in result]
        previous = conv.summary
    if not rows:
        return False
    spec = summary_model(ctx.models, ctx.settings)
    max_words = ctx.settings.summary_max_words
    request = EngineRequest(
        messages=summary_prompt(previous, rows, max_words),
        model=spec.engine_model,
        max_tokens=max_words * 2,  # words -> tokens, with room for Chinese
        temperature=0.0,
    )
    parts: list[str] = []
    engine = ctx.engine_for(spec)
    async for delta in engine.stream(request, request_id=f"summary-{conversation_id}-{upto}"):
        parts.append(delta.text)
    text = "".join(parts).strip()
    if not text:
        return False
    async with ctx.db.sessionmaker().begin() as session:
        updated: Any = await session.execute(
            update(Conversation)
            .where(
                Conversation.id == conversation_id,
                or_(Conversation.summary_upto.is_(None), Conversation.summary_upto < upto),
            )
            .values(summary=text, summary_upto=upto)
        )
    await ctx.redis.delete(ctx.keys.summary_lock(conversation_id))
    return bool(updated.rowcount)


async def _run(conversation_id: str, tenant_id: str, upto: int) -> bool:
    ctx = await lifecycle.context()
    try:
        return await summarize_conversation(ctx, conversation_id, tenant_id, upto)
    finally:
        # Free the lock on failure too: the next turn past the threshold queues a new job.
        await ctx.redis.delete(ctx.keys.summary_lock(conversation_id))


@app.task(name=SUMMARIZE_TASK, ignore_result=True, acks_late=True)
def summarize(conversation_id: str, tenant_id: str, upto: int) -> bool:
    """Low priority and best effort: a failed summary is retried by a later turn, not here."""
    return runner.run(_run(conversation_id, tenant_id, upto), timeout=SUMMARY_TIMEOUT_S)
