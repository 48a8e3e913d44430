"""Whether a signal (traces, metrics) is exported by OTLP, and where: one reading of
firsttoken's own setting and OpenTelemetry's environment variables for both (pure)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

Signal = Literal["traces", "metrics"]


def otlp_endpoint(signal: Signal, configured: str | None, environ: Mapping[str, str]) -> str | None:
    """Where the signal goes: ``configured`` (FIRSTTOKEN_OTLP_TRACES_ENDPOINT or
    FIRSTTOKEN_METRICS_OTLP_ENDPOINT), else "" when OpenTelemetry's own variables name an
    endpoint (its exporter reads them), else None (off). OTEL_SDK_DISABLED=true, or an
    OTEL_<SIGNAL>_EXPORTER without `otlp` (`none`), turns it off."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    exporters = environ.get(f"OTEL_{signal.upper()}_EXPORTER")
    if exporters is not None and "otlp" not in {e.strip() for e in exporters.split(",")}:
        return None
    if configured:
        return configured
    if environ.get(f"OTEL_EXPORTER_OTLP_{signal.upper()}_ENDPOINT") or environ.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    ):
        return ""
    return None
