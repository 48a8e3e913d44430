"""The gateway's own Prometheus series, and the queue depths it reads for each scrape of
GET /metrics (the chat series are shared/metrics/, written by gateway and workers alike)."""

from __future__ import annotations

import logging

import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry, Counter, Gauge

from shared.keys import QUEUES, Keys

log = logging.getLogger(__name__)


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        # Live gauges in multiprocess mode: summed over the gateway processes still running.
        self.connections = Gauge(
            "firsttoken_gateway_connections",
            "Open websocket connections.",
            registry=self.registry,
            multiprocess_mode="livesum",
        )
        self.chats = Counter(
            "firsttoken_gateway_chats_total", "Chats enqueued.", registry=self.registry
        )
        self.chunks = Counter(
            "firsttoken_gateway_frames_relayed_total",
            "Token, done and error frames relayed from workers to clients.",
            registry=self.registry,
        )
        # Frames relayed since the last `flush_frames` (the watchdog's tick, every scrape): a
        # multiprocess counter's inc (a pid check, a lock, an mmap write) per token cost as
        # much as the frame's own relay work (issue 43).
        self.frames_pending = 0
        self.errors = Counter(
            "firsttoken_gateway_errors_total",
            "Error frames sent, by code.",
            ["code"],
            registry=self.registry,
        )
        self.streams = Gauge(
            "firsttoken_gateway_streams",
            "Chats being relayed now.",
            registry=self.registry,
            multiprocess_mode="livesum",
        )

    def flush_frames(self) -> None:
        """Add the frames relayed since the last flush to their counter."""
        pending, self.frames_pending = self.frames_pending, 0
        if pending:
            self.chunks.inc(pending)


async def queue_depths(redis: aioredis.Redis, keys: Keys) -> dict[str, int] | None:
    """Messages waiting in each queue's list, in one round trip; None when Redis does not
    answer (the scrape still shows every other series). firsttoken enqueues at priority 0
    only, so a queue's first list holds all of its messages."""
    try:
        async with redis.pipeline(transaction=False) as pipe:
            for queue in QUEUES:
                pipe.llen(keys.queue_list(queue))
            lengths = await pipe.execute()
    except Exception as exc:  # noqa: BLE001 - a scrape never fails for the depths
        log.warning("queue depths not read for /metrics: %r", exc)
        return None
    return {queue: int(n) for queue, n in zip(QUEUES, lengths, strict=True)}
