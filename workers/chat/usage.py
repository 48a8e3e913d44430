"""A chat worker's usage rows on their way to the bulk queue: batched, and in the usage outbox
(shared/usage_outbox.py) before each chat's `done` is sent (issue 29). workers/chat/record.py
builds the rows; workers/bulk/sweep.py sends on the rows whose task was lost;
workers/bulk/persist.py takes them out of the outbox once written."""

from __future__ import annotations

import asyncio
import logging

from shared.keys import BULK_QUEUE, PERSIST_USAGE_BATCH_TASK, Keys
from shared.protocol import dumps
from shared.redis import scripts
from shared.redis.pipe import RedisPipe
from shared.tasks import UsageRecord, task_message
from shared.usage_outbox import UNQUEUED_GRACE_MS

log = logging.getLogger(__name__)


class UsageBatcher:
    """The usage rows of chats that end within `window_s` of each other, as one bulk task.

    One Celery message and one transaction per batch instead of per chat: with many short
    answers the bulk worker's CPU went mostly to the per-message overhead, not the rows. The
    window opens with the first row and is flushed when it closes, at `max_rows`, and on
    `close()` (a stopping worker); a window of 0 sends each row at once.

    Durable from the first moment: each row goes into the usage outbox on the process's Redis
    pipe as it is added, ahead of the chat's `done` on the same pipe, and stays there until a
    bulk worker has written it. Every call goes on the pipe, so a Redis outage the pipe rides
    out delays rows but loses none.
    """

    def __init__(
        self,
        pipe: RedisPipe,
        keys: Keys,
        origin: str,
        window_s: float,
        max_rows: int = 200,
        resend_after_s: float = 60.0,
    ) -> None:
        self._origin = origin
        self._window_s, self._max_rows = window_s, max_rows
        self._add = pipe.script(scripts.USAGE_ADD).keyed((keys.usage_rows, keys.usage_due))
        self._queue = pipe.script(scripts.USAGE_QUEUE).keyed(
            (keys.queue_list(BULK_QUEUE), keys.usage_due)
        )
        self._unqueued_after = b"%d" % (int(window_s * 1000) + UNQUEUED_GRACE_MS)
        self._resend_after = b"%d" % int(resend_after_s * 1000)
        self._rows: list[UsageRecord] = []
        self._timer: asyncio.TimerHandle | None = None

    def add(self, usage: UsageRecord) -> None:
        row = dumps(usage.model_dump())
        try:
            self._add.send((self._unqueued_after, usage.request_id.encode(), row.encode()))
        except ConnectionError:  # Redis gone past the pipe's limit: say what was lost (no text)
            log.error("could not record a usage row: %s", row)
            return
        self._rows.append(usage)
        if self._window_s <= 0 or len(self._rows) >= self._max_rows:
            self.flush()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._window_s, self.flush)

    def flush(self) -> None:
        """Enqueue the rows held now as one task (queued on the pipe; see `close`)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        rows, self._rows = self._rows, []
        if not rows:
            return
        message = usage_batch_message([row.model_dump() for row in rows], self._origin)
        ids = (row.request_id.encode() for row in rows)
        try:
            self._queue.send((message.encode(), self._resend_after, *ids))
        except ConnectionError:
            # The rows are in the outbox already; try again with the next window.
            log.warning("could not enqueue %d usage rows yet; Redis is unreachable", len(rows))
            self._rows = rows + self._rows
            self._timer = asyncio.get_running_loop().call_later(
                max(self._window_s, 1.0), self.flush
            )

    async def close(self) -> None:
        """Send what is held (the pipe's close then gives the calls their time to go out)."""
        self.flush()


def usage_batch_message(rows: list[dict[str, object]], origin: str) -> str:
    """The bulk task for usage rows."""
    return task_message(
        PERSIST_USAGE_BATCH_TASK,
        {"usage": rows},
        queue=BULK_QUEUE,
        origin=origin,
    )
