"""The usage row of a chat whose worker died with no other worker to take it over.

Nobody else is left to write it: the gateway that admitted the chat (and ended it with
`engine_error`, gateway/jobs.py's watchdog) hands the row to the bulk queue itself, as a worker
would: into the usage outbox (shared/usage_outbox.py) and onto the bulk queue
(`persist_usage_batch`, idempotent on request_id: a worker that took the chat over after all
and recorded it too leaves one row). The tokens delivered come from the job's replay
stream: each token chunk's header carries the answer's count so far (shared/protocol.py).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from redis.asyncio import Redis

from shared.failover import delivered_tokens
from shared.keys import BULK_QUEUE, PERSIST_USAGE_BATCH_TASK, Keys
from shared.protocol import dumps
from shared.redis import scripts
from shared.tasks import UsageRecord, task_message
from shared.timing import elapsed_ms
from shared.usage_outbox import UNQUEUED_GRACE_MS

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LostChat:
    """What the gateway knows of a chat it ends for a dead worker."""

    job_id: str
    tenant_id: str
    key_id: str
    model: str
    prompt_tokens: int  # the admission's estimate: the worker's own count died with it
    received_at: float
    first_sent_at: float | None


async def record_lost_chat(
    redis: Redis, keys: Keys, origin: str, chat: LostChat, resend_after_s: float
) -> None:
    """Enqueue the chat's usage row (status `error`, the tokens delivered); never raises."""
    now = time.time()
    try:
        entries = await redis.xrange(keys.replay_stream(chat.job_id))
        log_ = [str(fields["m"]) for _, fields in entries or [] if fields]
        row = UsageRecord(
            request_id=chat.job_id,
            tenant_id=chat.tenant_id,
            key_id=chat.key_id,
            model=chat.model,
            prompt_tokens=chat.prompt_tokens,
            completion_tokens=delivered_tokens(log_),
            ttft_ms=elapsed_ms(chat.first_sent_at, chat.received_at),
            total_ms=elapsed_ms(now, chat.received_at),
            finish_reason="engine_error",
            status="error",
            created_at=now,
        )
        message = task_message(
            PERSIST_USAGE_BATCH_TASK, {"usage": [row.model_dump()]}, queue=BULK_QUEUE, origin=origin
        )
        await scripts.run(
            redis,
            scripts.USAGE_ADD,
            [keys.usage_rows, keys.usage_due],
            [UNQUEUED_GRACE_MS, row.request_id, dumps(row.model_dump())],
        )
        await scripts.run(
            redis,
            scripts.USAGE_QUEUE,
            [keys.queue_list(BULK_QUEUE), keys.usage_due],
            [message, int(resend_after_s * 1000), row.request_id],
        )
    except Exception:  # noqa: BLE001 - the client has its error; say what was lost
        log.error("could not record the usage of %s (its worker died)", chat.job_id)
