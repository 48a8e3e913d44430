"""Prometheus metrics of one gateway process (text format at GET /metrics)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.connections = Gauge(
            "firsttoken_gateway_connections",
            "Open websocket connections.",
            registry=self.registry,
        )
        self.chats = Counter(
            "firsttoken_gateway_chats_total", "Chats enqueued.", registry=self.registry
        )
        self.chunks = Counter(
            "firsttoken_gateway_frames_relayed_total",
            "Token, done and error frames relayed from workers to clients.",
            registry=self.registry,
        )
        self.errors = Counter(
            "firsttoken_gateway_errors_total",
            "Error frames sent, by code.",
            ["code"],
            registry=self.registry,
        )
        self.streams = Gauge(
            "firsttoken_gateway_streams", "Chats being relayed now.", registry=self.registry
        )
