"""The gateway's pub/sub: every job's chunks fanned out to the session relaying that job.

One subscriber connection per gateway process (shared/redis/pubsub.py): each session
subscribes its job's channel with its handler, which the connection calls inside the callback
that parsed the message. The gateway also listens on its own control channel.

Ordering is what keeps pub/sub (at-most-once) from losing a job's first token: the gateway
writes SUBSCRIBE on this connection before it enqueues the job on another one. Redis has
then read the SUBSCRIBE before the LPUSH that follows it, and a worker can publish only after
a BRPOP round trip and its own work; a token missed anyway shows up as a seq gap and is
repaired from the job's replay stream. After a reconnect `on_reconnect` lets the gateway
repair each job from its replay stream.
"""

from __future__ import annotations

from collections.abc import Callable

from shared.redis.pubsub import Subscriber


class Relay(Subscriber):
    """The gateway's subscriber: job channels to their sessions' handlers, plus the gateway's
    control channel, subscribed and confirmed by :meth:`start`."""

    def __init__(
        self,
        redis_url: str,
        control_channel: str,
        *,
        on_reconnect: Callable[[], None] | None = None,
        client_name: str = "firsttoken-relay",
    ) -> None:
        super().__init__(redis_url, on_reconnect=on_reconnect, client_name=client_name)
        self._control = control_channel

    async def start(self) -> None:
        """Connect and subscribe the control channel; raises ConnectionError when Redis
        refuses the connection, saying why."""
        await super().start()
        await self.subscribe_confirmed(self._control, lambda _msg: None)
