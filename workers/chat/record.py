"""The end of every chat: its usage row (batched, see workers/chat/usage.py) and its text (where
stored) handed to the bulk queue, in Redis before the chat's `done` is sent."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from shared.keys import BULK_QUEUE, PERSIST_MESSAGES_TASK
from shared.metrics import recorder
from shared.tasks import ChatJob, MessagesRecord, task_message
from shared.timing import elapsed_ms
from shared.usage_row import usage_row

if TYPE_CHECKING:
    from workers.resources import WorkerContext

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a chat ended, as its usage row records it (shared/usage_row.py `Ending`), with the
    answer's text for the messages the bulk queue stores."""

    model: str
    finish_reason: str
    status: str  # ok | error | cancelled | timeout
    prompt_tokens: int = 0
    completion_tokens: int = 0
    answer: str = ""
    cached: bool = False
    conversation_id: str | None = None
    route: str = "default"
    cache_tier: str | None = None  # workers/cache/stage.py Lookup.tier
    cached_prompt_tokens: int | None = None  # the engine's prefix-cache hits, where reported


def record(ctx: WorkerContext, job: ChatJob, points: dict[str, float], outcome: Outcome) -> None:
    """Queue the usage row (workers/chat/usage.py's UsageBatcher) and the turn's text on the
    process's Redis pipe, and free the chat's stream slot; never fails the chat.

    Call it before the chat's last chunk (`done`, or the error) is published: both go on the
    same pipe, which Redis runs in order, so no client sees `done` for a row Redis does not
    hold (issue 29). A turn of a verified conversation is always stored: the client asked the
    server to keep its history (issue 5); other chats' text only with `store_text`.
    """
    now = time.time()
    usage = usage_row(
        ctx.models,
        job,
        outcome,
        queue_ms=elapsed_ms(points.get("worker_start"), job.enqueued_at),
        ttft_ms=elapsed_ms(points.get("first_chunk_published"), job.received_at),
        total_ms=elapsed_ms(now, job.received_at),
        now=now,
    )
    ctx.usage.add(usage)
    try:
        # The key's stream slot, freed here too and not only by the gateway as it relays the
        # end: a gateway killed just after that never would, and the slot would stay held
        # until its lease ran out (issue 29). Freeing it twice is a no-op.
        ctx.pipe.send((b"ZREM", ctx.keys.key_streams(job.key_id).encode(), job.job_id.encode()))
    except ConnectionError:
        pass  # the lease expires on its own
    ctx.load.ended(outcome.finish_reason)
    recorder.chat_ended(job, points, outcome, now)  # the same points, as metrics
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
        # On the pipe too: held through a Redis outage like the chat's chunks, and no round
        # trip in front of the `done` that follows.
        ctx.pipe.send((b"LPUSH", ctx.keys.queue_list(BULK_QUEUE).encode(), message.encode()))
    except ConnectionError:  # the chat is answered; say what was lost (never the text)
        log.error("could not enqueue the messages of %s", job.job_id)
