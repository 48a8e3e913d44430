"""The GenAI metrics (shared/metrics/otel.py) read by the SDK's in-memory reader: the
semantic-convention names, units and attributes, from the same points as the Prometheus series."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed")

from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from shared.metrics.otel import GenAIMetrics
from tests.support import ROOT
from tests.unit.shared.test_metrics import JOB, POINTS, Ending


def _points(reader: InMemoryMetricReader) -> dict[str, list[Any]]:
    data = reader.get_metrics_data()
    assert data is not None
    out: dict[str, list[Any]] = {}
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                out[metric.name] = [(metric.unit, p) for p in metric.data.data_points]
    return out


def test_a_chat_is_recorded_under_the_genai_names_with_their_attributes() -> None:
    reader = InMemoryMetricReader()
    metrics = GenAIMetrics(reader, "worker")
    metrics.chat_done({"ttft_ms": 19.0, "queue_ms": 4.0}, "m", cached=False)
    metrics.chat_ended(JOB, POINTS, Ending(), now=100.12)
    metrics.chat_ended(JOB, POINTS, Ending(status="error", finish_reason="engine_error"), 100.5)
    got = _points(reader)

    ((unit, ttft),) = got["gen_ai.server.time_to_first_token"]
    assert unit == "s" and ttft.count == 1 and ttft.sum == pytest.approx(0.019)
    assert ttft.attributes["gen_ai.operation.name"] == "chat"
    assert ttft.attributes["gen_ai.request.model"] == "m"

    ((unit, tpot),) = got["gen_ai.server.time_per_output_token"]
    assert unit == "s" and tpot.count == 1 and tpot.sum == pytest.approx(0.01)

    durations = {
        p.attributes.get("error.type"): p for _, p in got["gen_ai.server.request.duration"]
    }
    assert durations[None].sum == pytest.approx(0.12)
    assert durations["engine_error"].sum == pytest.approx(0.5)

    tokens = {p.attributes["gen_ai.token.type"]: p for _, p in got["gen_ai.client.token.usage"]}
    assert tokens["input"].sum == 60 and tokens["input"].count == 2
    assert tokens["output"].sum == 20
    assert {u for u, _ in got["gen_ai.client.token.usage"]} == {"{token}"}


def test_without_an_otlp_endpoint_the_sdk_is_never_loaded() -> None:
    """Off and free: a process that starts its metrics with no endpoint imports no part of
    shared/metrics/otel.py (redis-py may load the OpenTelemetry API for its own reasons)."""
    code = (
        "import os, sys\n"
        "for k in ('OTEL_EXPORTER_OTLP_ENDPOINT', 'OTEL_EXPORTER_OTLP_METRICS_ENDPOINT'):\n"
        "    os.environ.pop(k, None)\n"
        "from shared.settings import load_settings\n"
        "from shared.metrics import start_process\n"
        "start_process(load_settings(), 'gateway')\n"
        "assert 'shared.metrics.otel' not in sys.modules\n"
        "assert 'opentelemetry.sdk.metrics' not in sys.modules, 'sdk loaded'\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env = {k: v for k, v in env.items() if not k.startswith(("FIRSTTOKEN_", "OTEL_"))}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env
    )
    assert proc.returncode == 0, proc.stderr
