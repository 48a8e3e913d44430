"""One reading of OTLP's switches for traces and metrics (shared/otlp.py)."""

from __future__ import annotations

import pytest

from shared.otlp import otlp_endpoint

URL = "http://collector:4318"


@pytest.mark.parametrize("signal", ["traces", "metrics"])
def test_each_signal_reads_its_own_and_the_shared_variables(signal: str) -> None:
    own = f"OTEL_EXPORTER_OTLP_{signal.upper()}_ENDPOINT"
    assert otlp_endpoint(signal, None, {}) is None  # type: ignore[arg-type]
    assert otlp_endpoint(signal, URL, {}) == URL  # type: ignore[arg-type]
    assert otlp_endpoint(signal, None, {own: URL}) == ""  # type: ignore[arg-type]
    assert otlp_endpoint(signal, None, {"OTEL_EXPORTER_OTLP_ENDPOINT": URL}) == ""  # type: ignore[arg-type]
    off = {f"OTEL_{signal.upper()}_EXPORTER": "none"}
    assert otlp_endpoint(signal, URL, off) is None  # type: ignore[arg-type]
    assert otlp_endpoint(signal, URL, {"OTEL_SDK_DISABLED": "true"}) is None  # type: ignore[arg-type]


def test_one_signal_switched_off_leaves_the_other_on() -> None:
    environ = {"OTEL_EXPORTER_OTLP_ENDPOINT": URL, "OTEL_METRICS_EXPORTER": "none"}
    assert otlp_endpoint("metrics", None, environ) is None
    assert otlp_endpoint("traces", None, environ) == ""
