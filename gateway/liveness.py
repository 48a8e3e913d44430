"""The gateway says it is alive, so chat workers can stop the chats of one that died.

Every ``gateway_heartbeat_s`` the process sets its score in `Keys.gateways` to Redis's own
clock (workers compare against the same clock: no skew between machines), on its Redis pipe.
A chat worker cancels a running chat when none of the gateways in its followers set has beaten
lately (workers/chat/orphans.py). A gateway that stops cleanly leaves the set; its chats were
given up (and cancelled) by its sockets' ends already.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from shared.keys import Keys
from shared.redis import scripts
from shared.redis.pipe import RedisPipe

log = logging.getLogger(__name__)

# Members silent this long are dropped by the next beat (gateways that died long ago).
FORGET_MS = 3_600_000


class GatewayBeat:
    def __init__(self, pipe: RedisPipe, keys: Keys, name: str, interval_s: float) -> None:
        self._script = pipe.script(scripts.GATEWAY_BEAT)
        self._key, self._name, self._interval_s = keys.gateways, name, interval_s
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="gateway-beat")

    async def _run(self) -> None:
        while True:
            try:
                self._script.send([self._key], [self._name, FORGET_MS])
            except ConnectionError:
                pass  # Redis is down (the pipe logs it); beat again when it is back
            await asyncio.sleep(self._interval_s)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
        with contextlib.suppress(ConnectionError):
            self._script.send([self._key], [self._name, FORGET_MS, 1])
