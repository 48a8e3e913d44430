"""Settings: traces and metrics (the log level stays with the settings object).

Fields only; the one object that reads them from the environment is shared/settings/__init__.py.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class ObservabilitySettings(BaseModel):
    """Traces and metrics (the log level stays with the settings object)."""

    # --- traces (issue 32; docs/operations.md "Traces") ---
    otlp_traces_endpoint: str | None = Field(
        None,
        description="OTLP/HTTP URL the spans of each chat go to (e.g. "
        "http://collector:4318/v1/traces). Unset: traces are on only when "
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT is set, else off "
        "(no OpenTelemetry import, no cost). Needs the `otel` extra.",
    )

    # --- metrics (issue 32; shared/metrics/) ---------------------------------------------
    metrics: Literal["on", "off"] = Field(
        "on",
        description="on: chat metrics (Prometheus series, and OpenTelemetry's GenAI ones when "
        "an OTLP endpoint is set); off: none of them are kept (the gateway's five connection "
        "and relay series stay).",
    )
    metrics_dir: str | None = Field(
        None,
        description="Directory of prometheus_client's multiprocess mode: every gateway and "
        "worker process of this host writes its series there, and any gateway's GET /metrics "
        "answers for all of them. `firsttoken up` and the bench set a fresh one; "
        "PROMETHEUS_MULTIPROC_DIR is used when unset; with neither, a gateway's /metrics covers "
        "its own process and workers keep no series.",
    )
    metrics_otlp_endpoint: str | None = Field(
        None,
        description="OTLP/HTTP metrics URL (e.g. http://collector:4318/v1/metrics) for the GenAI "
        "metrics; the SDK's OTEL_EXPORTER_OTLP_METRICS_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT "
        "also switch them on. Needs the `otel` extra.",
    )
