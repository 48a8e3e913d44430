"""A bulk worker sends on the usage rows a dead chat worker left in Redis (issue 29).

Each chat worker process appends its chats' usage rows to a pending list before their `done`
is sent and takes them off when their batch's task is queued (workers/usage.py). A process
killed in between leaves rows there and stops beating in `Keys.usage_owners`; every bulk worker
looks once per SWEEP_INTERVAL_S for owners silent longer than USAGE_OWNER_DEAD_S and queues
their rows as ordinary batch tasks, under a short lock so two bulk workers do not both send
them (if they did, the write's idempotence on request_id makes the second a no-op).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from shared.keys import BULK_QUEUE, Keys
from shared.redis.pipe import RedisPipe
from workers.usage import FLUSH_LUA, USAGE_OWNER_DEAD_S, usage_batch_message

log = logging.getLogger(__name__)

SWEEP_INTERVAL_S = 2.0
# Rows per task sent on (a batcher's own cap).
SWEEP_ROWS = 200
# A sweeper that died holding the lock lets another one try after this.
SWEEP_LOCK_MS = 30_000

# KEYS: the owners set.  ARGV: silence (ms) after which an owner is dead, how many to return.
DEAD_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[1]), 'LIMIT', 0,
  tonumber(ARGV[2]))
"""

# KEYS: the owners set, the sweep lock, the owner's pending list.
# ARGV: the owner, silence (ms), lock ms, rows.  Returns the rows to send (none: the owner is
# gone from the set), or nil where the owner beats again or another sweeper holds the lock.
CLAIM_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local beat = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not beat or tonumber(beat) > now - tonumber(ARGV[2]) then return false end
if not redis.call('SET', KEYS[2], '1', 'NX', 'PX', ARGV[3]) then return false end
local rows = redis.call('LRANGE', KEYS[3], 0, tonumber(ARGV[4]) - 1)
if #rows == 0 then
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('DEL', KEYS[2])
end
return rows
"""


class UsageSweeper:
    """One per bulk worker process, on its loop; see the module docstring."""

    def __init__(self, pipe: RedisPipe, keys: Keys, origin: str) -> None:
        self._pipe, self._keys, self._origin = pipe, keys, origin
        self._dead = pipe.script(DEAD_LUA)
        self._claim = pipe.script(CLAIM_LUA)
        self._flush = pipe.script(FLUSH_LUA)
        self.sent = 0  # rows sent on, for the logs and tests

    async def run(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_INTERVAL_S)
            try:
                await self.sweep()
            except Exception as exc:  # noqa: BLE001 - Redis down: the next sweep tries again
                log.debug("usage sweep failed: %r", exc)

    async def sweep(self) -> int:
        """Send on every dead owner's rows; returns how many rows were queued."""
        silence_ms = int(USAGE_OWNER_DEAD_S * 1000)
        owners: Any = await self._dead([self._keys.usage_owners], [silence_ms, 50])
        sent = 0
        for owner in owners or []:  # the pipe's replies are decoded: str
            sent += await self._sweep_owner(str(owner), silence_ms)
        self.sent += sent
        return sent

    async def _sweep_owner(self, owner: str, silence_ms: int) -> int:
        keys = self._keys
        pending, lock = keys.usage_pending(owner), keys.usage_sweep_lock(owner)
        sent = 0
        while True:
            rows: Any = await self._claim(
                [keys.usage_owners, lock, pending], [owner, silence_ms, SWEEP_LOCK_MS, SWEEP_ROWS]
            )
            if not rows:
                return sent
            texts = [str(row) for row in rows]
            message = usage_batch_message(texts, self._origin)
            await self._flush([keys.queue_list(BULK_QUEUE), pending], [message, *texts])
            await self._pipe.call("DEL", lock)
            log.warning("sent on %d usage rows of %s, which stopped", len(texts), owner)
            sent += len(texts)
