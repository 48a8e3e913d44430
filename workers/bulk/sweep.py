"""A bulk worker queues again the usage rows whose task never reached a write (issue 29).

Every usage row waits in the usage outbox (shared/usage_outbox.py) until a bulk worker has
written it. Once per SWEEP_INTERVAL_S every bulk worker claims the rows past their due time (a
chat worker that died before it queued them, a task lost on the way) and queues them as
ordinary batch tasks. The claim moves their due time on in the same script, so two bulk
workers do not both send them; if one's task is lost too, the next sweep sends them again.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from shared.keys import BULK_QUEUE, Keys
from shared.redis import scripts
from shared.redis.periodic import every
from shared.redis.pipe import RedisPipe
from shared.usage_outbox import CLAIM_ROWS, MAX_BACKLOG
from workers.chat.usage import usage_batch_message

log = logging.getLogger(__name__)

SWEEP_INTERVAL_S = 2.0


class UsageSweeper:
    """One per bulk worker process, on its loop; see the module docstring."""

    def __init__(
        self, pipe: RedisPipe, keys: Keys, origin: str, resend_after_s: float = 60.0
    ) -> None:
        self._keys, self._origin = keys, origin
        self._resend_after_ms = int(resend_after_s * 1000)
        self._claim = pipe.script(scripts.USAGE_CLAIM)
        self._queue = pipe.script(scripts.USAGE_QUEUE)
        self.sent = 0  # rows sent on, for the logs and tests

    async def run(self) -> None:
        await every(SWEEP_INTERVAL_S, self.sweep, log, "usage sweep")

    async def sweep(self) -> int:
        """Queue every row past its due time; returns how many were queued."""
        keys, sent = self._keys, 0
        queue = keys.queue_list(BULK_QUEUE)
        while True:
            claimed: Any = await self._claim(
                [keys.usage_due, keys.usage_rows, queue],
                [CLAIM_ROWS, self._resend_after_ms, MAX_BACKLOG],
            )
            if not claimed:
                break
            ids = [str(x) for x in claimed[0::2]]  # the pipe's replies are decoded: str
            rows = [json.loads(str(row)) for row in claimed[1::2]]
            message = usage_batch_message(rows, self._origin)
            await self._queue([queue, keys.usage_due], [message, self._resend_after_ms, *ids])
            log.warning("queued %d usage rows again: their task never reached a write", len(ids))
            sent += len(ids)
            if len(ids) < CLAIM_ROWS:
                break
        self.sent += sent
        return sent
