"""The chat measurements under OpenTelemetry's GenAI semantic-convention names, exported by
OTLP/HTTP (opentelemetry-sdk, the `otel` extra). Imported only when an endpoint is configured:
a process without one never loads the SDK.

Same points as the Prometheus series (shared/metrics/values.py): `gen_ai.server.time_to_first_token`
at the gateway (its first token written), the rest at the worker as the chat ends.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource

from shared.metrics.values import Ending, seconds, time_per_output_token

if TYPE_CHECKING:
    from shared.settings import Settings
    from shared.tasks import ChatJob

# The semantic conventions' advisory bucket boundaries (gen-ai-metrics.md).
TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0]  # fmt: skip
TPOT_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5]
DURATION_BUCKETS = [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48,
                    40.96, 81.92]  # fmt: skip
TOKEN_BUCKETS = [1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304]

PROVIDER = "firsttoken"


def exporting_reader(settings: Settings) -> MetricReader:
    """A periodic OTLP/HTTP exporter (interval: the SDK's OTEL_METRIC_EXPORT_INTERVAL)."""
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

    # With no endpoint given, the exporter reads the OTEL_ variables (and adds /v1/metrics).
    endpoint = settings.metrics_otlp_endpoint
    exporter = OTLPMetricExporter(endpoint=endpoint) if endpoint else OTLPMetricExporter()
    return PeriodicExportingMetricReader(exporter)


class GenAIMetrics:
    """The four GenAI instruments of one process, read by `reader`."""

    def __init__(self, reader: MetricReader, role: str) -> None:
        resource = Resource.create({"service.name": f"firsttoken-{role}"})
        self.provider = MeterProvider(metric_readers=[reader], resource=resource)
        meter = self.provider.get_meter("firsttoken")
        self.ttft = meter.create_histogram(
            "gen_ai.server.time_to_first_token",
            unit="s",
            description="Time to generate the first token, as the client is sent it.",
            explicit_bucket_boundaries_advisory=TTFT_BUCKETS,
        )
        self.tpot = meter.create_histogram(
            "gen_ai.server.time_per_output_token",
            unit="s",
            description="Time per output token after the first.",
            explicit_bucket_boundaries_advisory=TPOT_BUCKETS,
        )
        self.duration = meter.create_histogram(
            "gen_ai.server.request.duration",
            unit="s",
            description="From the chat's arrival to its end, every ending.",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )
        self.tokens = meter.create_histogram(
            "gen_ai.client.token.usage",
            unit="{token}",
            description="Input and output tokens of each chat.",
            explicit_bucket_boundaries_advisory=TOKEN_BUCKETS,
        )
        self._attrs: dict[tuple[str, str], dict[str, Any]] = {}

    def _attributes(self, model: str, token_type: str = "") -> dict[str, Any]:
        attrs = self._attrs.get((model, token_type))
        if attrs is None:
            attrs = {
                "gen_ai.operation.name": "chat",
                "gen_ai.provider.name": PROVIDER,
                "gen_ai.request.model": model,
            }
            if token_type:
                attrs["gen_ai.token.type"] = token_type
            self._attrs[(model, token_type)] = attrs
        return attrs

    def chat_done(self, timings: Mapping[str, float], model: str, cached: bool) -> None:
        ttft = seconds(timings.get("ttft_ms"))
        if ttft is not None:
            self.ttft.record(ttft, self._attributes(model))

    def chat_ended(
        self, job: ChatJob, points: Mapping[str, float], outcome: Ending, now: float
    ) -> None:
        model = outcome.model
        attrs = self._attributes(model)
        if outcome.status == "ok":
            self.duration.record(max(0.0, now - job.received_at), attrs)
        else:
            failed = {**attrs, "error.type": outcome.finish_reason}
            self.duration.record(max(0.0, now - job.received_at), failed)
        tpot = time_per_output_token(
            points, outcome.completion_tokens, status=outcome.status, cached=outcome.cached
        )
        if tpot is not None:
            self.tpot.record(tpot, attrs)
        if outcome.prompt_tokens:
            self.tokens.record(outcome.prompt_tokens, self._attributes(model, "input"))
        if outcome.completion_tokens:
            self.tokens.record(outcome.completion_tokens, self._attributes(model, "output"))

    def flush(self) -> None:
        """Export what is waiting now (the provider shuts itself down at interpreter exit)."""
        self.provider.force_flush(timeout_millis=5000)
