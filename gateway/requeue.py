"""A chat whose message a chat worker took off the queue and died with before it started is
queued again (issue 29).

A worker reads the chat queue with BRPOP: between the reply and the worker's first call on its
pipe (the job's lease and `started` marker, one write) the job exists only in that process. A
worker killed in that window leaves no trace of the job: no lease for a survivor to take over,
nothing queued. The gateway that admitted it still holds the task message. Once a chat has
gone unstarted for longer than a worker is given to start it (`FIRSTTOKEN_WORKER_LOST_AFTER_S`
and a grace), the gateway checks, in one script (shared/redis/scripts/chat_requeue.lua), that
the message is no longer queued and the job's replay log holds nothing (no worker announced
it), and pushes the same message back at the end the workers read next: a survivor runs it
from the start, with no error to the client. Checked again at the same interval while the
chat stays unstarted.
"""

from __future__ import annotations

import logging

from redis.asyncio import Redis

from shared.redis import scripts

log = logging.getLogger(__name__)

# Seconds, past a worker's loss: a live worker writes a job's `started` within milliseconds of
# taking it; a worker frozen that long has lost its chats to a takeover anyway.
REQUEUE_GRACE_S = 1.0
# A queue longer than this most likely still holds the message behind the others: no scan
# (LPOS is linear in the queue's length).
MAX_SCAN = 1_000


async def requeue_if_lost(
    redis: Redis, queue_list: str, replay_stream: str, job_id: str, message: str
) -> None:
    """Queue `message` again where no worker holds it; never raises (the queue deadline still
    ends the chat if this cannot run)."""
    try:
        pushed = await scripts.run(
            redis, scripts.CHAT_REQUEUE, [queue_list, replay_stream], [message, MAX_SCAN]
        )
    except Exception as exc:  # noqa: BLE001 - Redis down: the next check tries again
        log.debug("could not check whether chat %s is still queued: %r", job_id, exc)
        return
    if pushed:
        log.warning("chat %s was taken off the queue by a worker that died; queued again", job_id)
