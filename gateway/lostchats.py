"""The usage row of a chat whose worker died with no other worker to take it over.

Nobody else is left to write it: the gateway that admitted the chat (and ended it with
`engine_error`, gateway/jobs.py's watchdog) hands the row to the bulk queue itself, as a worker
would: into the usage outbox (shared/usage_outbox.py) and onto the bulk queue
(`persist_usage_batch`, idempotent on request_id: a worker that took the chat over after all
and recorded it too leaves one row). The tokens delivered come from the job's replay
stream: each token chunk's header carries the answer's count so far (shared/protocol.py).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import Protocol

from redis.asyncio import Redis

from shared.failover import delivered_tokens
from shared.keys import BULK_QUEUE, PERSIST_USAGE_BATCH_TASK, Keys
from shared.modeltable import ModelTable
from shared.protocol import dumps
from shared.redis import scripts
from shared.settings import Settings
from shared.tasks import ChatJob, task_message
from shared.timing import elapsed_ms
from shared.usage_outbox import UNQUEUED_GRACE_MS
from shared.usage_row import usage_row

log = logging.getLogger(__name__)


class LostChatHost(Protocol):
    """What this needs of the gateway process (gateway/state.py's Gateway)."""

    name: str
    redis: Redis
    keys: Keys
    settings: Settings

    @property
    def models(self) -> ModelTable: ...


@dataclass(frozen=True, slots=True)
class LostChat:
    """How a chat the gateway ends for a dead worker ended (shared/usage_row.py `Ending`)."""

    model: str
    prompt_tokens: int  # the admission's estimate: the worker's own count died with it
    completion_tokens: int = 0  # the tokens delivered, from the replay stream
    finish_reason: str = "engine_error"
    status: str = "error"
    route: str = "default"
    cached: bool = False
    cache_tier: str | None = None
    cached_prompt_tokens: int | None = None


async def record_lost_chat(
    gw: LostChatHost, job: ChatJob, chat: LostChat, first_sent_at: float | None
) -> None:
    """Enqueue the chat's usage row (status `error`, the tokens delivered); never raises."""
    now = time.time()
    redis, keys = gw.redis, gw.keys
    try:
        entries = await redis.xrange(keys.replay_stream(job.job_id))
        log_ = [str(fields["m"]) for _, fields in entries or [] if fields]
        chat = dataclasses.replace(chat, completion_tokens=delivered_tokens(log_))
        row = usage_row(
            gw.models,
            job,
            chat,
            queue_ms=None,
            ttft_ms=elapsed_ms(first_sent_at, job.received_at),
            total_ms=elapsed_ms(now, job.received_at),
            now=now,
        )
        message = task_message(
            PERSIST_USAGE_BATCH_TASK,
            {"usage": [row.model_dump()]},
            queue=BULK_QUEUE,
            origin=gw.name,
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
            [message, int(gw.settings.usage_resend_after_s * 1000), row.request_id],
        )
    except Exception:  # noqa: BLE001 - the client has its error; say what was lost
        log.error("could not record the usage of %s (its worker died)", job.job_id)
