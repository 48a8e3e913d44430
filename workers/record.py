"""The end of every chat: its usage row (batched, see UsageBatcher) and its text (where stored)
handed to the bulk queue."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from shared.keys import BULK_QUEUE, PERSIST_MESSAGES_TASK, PERSIST_USAGE_BATCH_TASK
from shared.tasks import ChatJob, MessagesRecord, UsageRecord, task_message
from workers.usage_row import analytics_fields

if TYPE_CHECKING:
    import redis.asyncio as aioredis

    from workers.context import WorkerContext

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a chat ended, as the usage row records it."""

    model: str
    finish_reason: str
    status: str  # ok | error | cancelled | timeout
    prompt_tokens: int = 0
    completion_tokens: int = 0
    answer: str = ""
    cached: bool = False
    conversation_id: str | None = None
    route: str = "default"
    cache_tier: str | None = None  # workers/cache_stage.py Lookup.tier
    cached_prompt_tokens: int | None = None  # the engine's prefix-cache hits, where reported


def _ms(end: float | None, start: float | None) -> float | None:
    if end is None or start is None:
        return None
    return round((end - start) * 1000.0, 3)


async def record(
    ctx: WorkerContext, job: ChatJob, points: dict[str, float], outcome: Outcome
) -> None:
    """Hand the usage row to the batcher and enqueue the turn's text on `bulk`; never fails
    the chat.

    A turn of a verified conversation is always stored: the client asked the server to keep
    its history (issue 5); other chats' text only with `store_text`.
    """
    now = time.time()
    usage = UsageRecord(
        request_id=job.job_id,
        tenant_id=job.tenant_id,
        key_id=job.key_id,
        model=outcome.model,
        route=outcome.route,
        cached=outcome.cached,
        prompt_tokens=outcome.prompt_tokens,
        completion_tokens=outcome.completion_tokens,
        queue_ms=_ms(points.get("worker_start"), job.enqueued_at),
        ttft_ms=_ms(points.get("first_chunk_published"), job.received_at),
        total_ms=_ms(now, job.received_at),
        finish_reason=outcome.finish_reason,
        status=outcome.status,
        created_at=now,
        **analytics_fields(ctx.models, job, outcome),
    )
    ctx.usage.add(usage)
    keep_text = ctx.settings.store_text or outcome.conversation_id is not None
    if not keep_text or outcome.status != "ok":
        return
    turn = MessagesRecord(
        request_id=job.job_id,
        tenant_id=job.tenant_id,
        conversation_id=outcome.conversation_id,
        messages=job.messages,
        answer=outcome.answer,
        model=outcome.model,
        created_at=now,
    )
    message = task_message(
        PERSIST_MESSAGES_TASK, {"messages": turn.model_dump()}, queue=BULK_QUEUE, origin=ctx.name
    )
    try:
        await ctx.redis.lpush(ctx.keys.queue_list(BULK_QUEUE), message)
    except Exception:  # noqa: BLE001 - the chat is answered; say what was lost (never the text)
        log.error("could not enqueue the messages of %s", job.job_id)


class UsageBatcher:
    """The usage rows of chats that end within `window_s` of each other, as one bulk task.

    One Celery message and one transaction per batch instead of per chat: with many short
    answers the bulk worker's CPU went mostly to the per-message overhead, not the rows. The
    window opens with the first row and is flushed when it closes, at `max_rows`, and on
    `close()` (a stopping worker); a window of 0 sends each row at once.
    """

    def __init__(
        self,
        redis: aioredis.Redis,
        queue_key: str,
        origin: str,
        window_s: float,
        max_rows: int = 200,
    ) -> None:
        self._redis, self._queue_key, self._origin = redis, queue_key, origin
        self._window_s, self._max_rows = window_s, max_rows
        self._rows: list[dict[str, Any]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._sending: set[asyncio.Task[None]] = set()

    def add(self, usage: UsageRecord) -> None:
        self._rows.append(usage.model_dump())
        if self._window_s <= 0 or len(self._rows) >= self._max_rows:
            self.flush()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._window_s, self.flush)

    def flush(self) -> None:
        """Enqueue the rows held now (in the background; see `close`)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        rows, self._rows = self._rows, []
        if not rows:
            return
        message = task_message(
            PERSIST_USAGE_BATCH_TASK, {"usage": rows}, queue=BULK_QUEUE, origin=self._origin
        )
        task = asyncio.create_task(self._send(message, rows))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _send(self, message: str, rows: list[dict[str, Any]]) -> None:
        try:
            await self._redis.lpush(self._queue_key, message)
        except Exception:  # noqa: BLE001 - the chats are answered; say what was lost (no text)
            log.error("could not enqueue %d usage rows: %s", len(rows), json.dumps(rows))

    async def close(self) -> None:
        """Send what is held and wait until every batch is enqueued."""
        self.flush()
        if self._sending:
            await asyncio.gather(*self._sending, return_exceptions=True)
