"""A chat worker's warm-up (workers/chat/pool.py runs it before the pool reads the queue)."""

from __future__ import annotations

import asyncio
import logging

from workers import retrieval
from workers.cache import stage as cache_stage
from workers.resources import WorkerContext

log = logging.getLogger(__name__)


async def warm_chat_worker(ctx: WorkerContext) -> None:
    """Before the first chat: tokenizers, engine clients, the database pool, the embedding
    model and the cache index."""
    models = ctx.models
    retrieval.warm_up(ctx.settings, models)
    for spec in models:  # engine clients (and their connections) now, not on a first chat
        ctx.engine_for(spec).warm()
    try:
        async with asyncio.timeout(5):
            await ctx.db.warm()
            await retrieval.warm_queries(ctx.db)
    except Exception as exc:  # noqa: BLE001 - chats work without the database; it may be down
        log.warning("database not reachable at start-up (%s); chats go on without it", exc)
    try:
        await retrieval.warm_kb(ctx)
    except Exception:  # a chat loads it again (and goes without the kb meanwhile)
        log.warning("knowledge-base embedder not loaded at start-up", exc_info=True)
    await cache_stage.warm(ctx)
