"""A chat worker stops the chats no live gateway follows any more (issue 29).

A gateway that is killed cannot cancel its chats: their engine requests would run on to the
end and their stream slots stay held until their leases expire. Every gateway beats in
`Keys.gateways` (gateway/liveness.py); once a second (not per token) a chat worker sends one
script (shared/redis/scripts/orphans.lua) with the followers sets of all its running chats
(`Keys.job_followers`: the admitting gateway and any that resumed the job). A chat whose set
names gateways none of which has beaten within `FIRSTTOKEN_GATEWAY_DEAD_AFTER_S` is
cancelled here (its engine request aborted, as a client's cancel does) and its stream slot
freed in the same script. A chat with no followers set (it expired, or every gateway gave it
up and cancelled it already) is left alone.

Right after the worker's own connection to Redis comes back, the check waits: the gateways'
beats may not have reached Redis yet, and an outage the chats ride out must not end them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any, Protocol

from shared.keys import Keys
from shared.redis import scripts
from shared.redis.periodic import every
from shared.redis.pipe import RedisPipe

log = logging.getLogger(__name__)

CHECK_INTERVAL_S = 1.0
DEAD_AFTER_BEATS = 3


class _ChatJob(Protocol):
    key_id: str


class FollowedChat(Protocol):
    """A running chat as the check sees it (workers.chat.run.ChatRun)."""

    @property
    def job(self) -> _ChatJob: ...

    def cancel(self) -> None: ...


class GatewayWatch:
    """One per chat worker process, on its loop; see the module docstring."""

    def __init__(
        self,
        pipe: RedisPipe,
        keys: Keys,
        running: Mapping[str, Any],
        gateway_heartbeat_s: float,
        dead_after_s: float,
    ) -> None:
        self._pipe, self._keys, self._running = pipe, keys, running
        self._silence_ms = int(dead_after_s * 1000)
        # Gateways beat again within this of Redis coming back (their own reconnect included).
        self._grace_s = max(3.0, 2 * DEAD_AFTER_BEATS * gateway_heartbeat_s)
        self._script = pipe.script(scripts.ORPHANS)
        self.aborted = 0

    async def run(self) -> None:
        await every(CHECK_INTERVAL_S, self.check, log, "gateway liveness check")

    async def check(self) -> list[str]:
        """Cancel the running chats no live gateway follows; returns their job ids."""
        pipe = self._pipe
        if not pipe.connected or time.monotonic() - pipe.up_since < self._grace_s:
            return []
        runs: list[tuple[str, FollowedChat]] = list(self._running.items())
        if not runs:
            return []
        keys = self._keys
        script_keys = [keys.gateways]
        for job_id, run in runs:
            script_keys += [keys.job_followers(job_id), keys.key_streams(run.job.key_id)]
        async with asyncio.timeout(CHECK_INTERVAL_S * 2):
            orphans: Any = await self._script(
                script_keys, [self._silence_ms, *(job_id for job_id, _ in runs)]
            )
        ended = [str(job_id) for job_id in orphans or []]
        for job_id in ended:
            chat: FollowedChat | None = self._running.get(job_id)
            if chat is not None:
                log.warning("no live gateway follows %s any more; stopping it", job_id)
                chat.cancel()
        self.aborted += len(ended)
        return ended
