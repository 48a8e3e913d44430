"""A chat worker's usage rows on their way to the bulk queue: batched, and in Redis before
each chat's `done` is sent (issue 29). workers/record.py builds the rows;
workers/usage_sweep.py sends on the rows of a process that died."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import uuid

from shared.keys import BULK_QUEUE, PERSIST_USAGE_BATCH_TASK, Keys
from shared.protocol import dumps
from shared.redis.pipe import RedisPipe
from shared.tasks import UsageRecord, task_message

log = logging.getLogger(__name__)

# KEYS: the process's pending list, the owners set.  ARGV: one usage row (JSON), the owner.
PENDING_LUA = """
redis.call('RPUSH', KEYS[1], ARGV[1])
local t = redis.call('TIME')
redis.call('ZADD', KEYS[2], tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000), ARGV[2])
return 1
"""

# KEYS: the bulk queue's list, a pending list.  ARGV: the batch's task message, then its rows.
# Rows leave the pending list by value, not by count: a batch sent twice (the pipe's resend
# after a lost connection, or a sweep of a list whose owner was only slow) is a duplicate task,
# which the idempotent write absorbs, and never a row dropped before its task was queued.
FLUSH_LUA = """
redis.call('LPUSH', KEYS[1], ARGV[1])
for i = 2, #ARGV do redis.call('LREM', KEYS[2], 1, ARGV[i]) end
return #ARGV - 1
"""

# KEYS: the owners set[, the pending list].  ARGV: the owner.  With the pending list: a
# stopping process leaves the set, unless rows are still pending (a bulk worker sends them).
BEAT_LUA = """
if KEYS[2] then
  if redis.call('LLEN', KEYS[2]) == 0 then redis.call('ZREM', KEYS[1], ARGV[1]) end
  return 0
end
local t = redis.call('TIME')
redis.call('ZADD', KEYS[1], tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000), ARGV[1])
return 1
"""

# How often a process with a pending list says it is alive; a bulk worker sends on the rows
# of one silent for USAGE_OWNER_DEAD_S (workers/usage_sweep.py). Longer than a Redis outage a
# worker rides out is not needed: a live owner's rows sent by a sweep too are duplicates only.
USAGE_BEAT_S = 1.0
USAGE_OWNER_DEAD_S = 5.0


class UsageBatcher:
    """The usage rows of chats that end within `window_s` of each other, as one bulk task.

    One Celery message and one transaction per batch instead of per chat: with many short
    answers the bulk worker's CPU went mostly to the per-message overhead, not the rows. The
    window opens with the first row and is flushed when it closes, at `max_rows`, and on
    `close()` (a stopping worker); a window of 0 sends each row at once.

    Durable from the first moment: each row is appended to this process's pending list in
    Redis (`Keys.usage_pending`) on the process's Redis pipe as it is added, ahead of the
    chat's `done` on the same pipe, and the batch's task message is pushed and its rows taken
    off that list in one script. A process killed with rows pending leaves them there; a bulk
    worker sends them on once the process stops beating (workers/usage_sweep.py). Every call
    goes on the pipe, so a Redis outage the pipe rides out delays rows but loses none.
    """

    def __init__(
        self,
        pipe: RedisPipe,
        keys: Keys,
        origin: str,
        window_s: float,
        max_rows: int = 200,
    ) -> None:
        # One pending list per process, never reused: a restarted worker of the same name does
        # not take its predecessor's rows for its own.
        self.owner = f"{origin}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._pipe, self._origin = pipe, origin
        self._queue_key = keys.queue_list(BULK_QUEUE)
        self._pending_key = keys.usage_pending(self.owner)
        self._owners_key = keys.usage_owners
        self._window_s, self._max_rows = window_s, max_rows
        self._add = pipe.script(PENDING_LUA).keyed((self._pending_key, self._owners_key))
        self._flush = pipe.script(FLUSH_LUA).keyed((self._queue_key, self._pending_key))
        self._beat = pipe.script(BEAT_LUA)
        self._rows: list[str] = []  # JSON, byte for byte as in the pending list
        self._timer: asyncio.TimerHandle | None = None
        self._beating: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Beat while the process lives (on the process loop)."""
        if self._beating is None:
            self._beating = asyncio.create_task(self._beat_loop(), name="usage-beat")

    def add(self, usage: UsageRecord) -> None:
        if self._beating is None:
            self.start()  # a process that never ends a chat never beats
        row = dumps(usage.model_dump())
        try:
            self._add.send((row.encode(), self.owner.encode()))
        except ConnectionError:  # Redis gone past the pipe's limit: say what was lost (no text)
            log.error("could not record a usage row: %s", row)
            return
        self._rows.append(row)
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
        message = usage_batch_message(rows, self._origin)
        try:
            self._flush.send((message.encode(), *(row.encode() for row in rows)))
        except ConnectionError:
            # The rows are in the pending list already; try again with the next window.
            log.warning("could not enqueue %d usage rows yet; Redis is unreachable", len(rows))
            self._rows = rows + self._rows
            self._timer = asyncio.get_running_loop().call_later(
                max(self._window_s, USAGE_BEAT_S), self.flush
            )

    async def _beat_loop(self) -> None:
        while True:
            try:
                self._beat.send((self._owners_key,), (self.owner,))
            except ConnectionError:
                pass  # Redis is down; the pipe says so, and the next beat goes when it is back
            await asyncio.sleep(USAGE_BEAT_S)

    async def close(self) -> None:
        """Send what is held and leave the owners set once nothing is pending (the pipe's
        close then gives the calls their time to go out)."""
        if self._beating is not None:
            self._beating.cancel()
            with contextlib.suppress(BaseException):
                await self._beating
            self._beating = None
        self.flush()
        with contextlib.suppress(ConnectionError):
            self._beat.send((self._owners_key, self._pending_key), (self.owner,))


def usage_batch_message(rows: list[str], origin: str) -> str:
    """The bulk task for usage rows (JSON each, as in a pending list)."""
    return task_message(
        PERSIST_USAGE_BATCH_TASK,
        {"usage": [json.loads(row) for row in rows]},
        queue=BULK_QUEUE,
        origin=origin,
    )
