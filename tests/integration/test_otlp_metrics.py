"""The GenAI metrics leave a real stack by OTLP/HTTP: a gateway and a chat worker started with
FIRSTTOKEN_METRICS_OTLP_ENDPOINT post them to a receiver in this test, under the semantic
conventions' names."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import websockets

from tests.integration.conftest import Client, Services, make_stack
from tests.support import wait_until

pytestmark = pytest.mark.integration
metrics_service = pytest.importorskip(
    "opentelemetry.proto.collector.metrics.v1.metrics_service_pb2",
    reason="the otel extra (opentelemetry-exporter-otlp-proto-http) is not installed",
)

GENAI = {
    "gen_ai.server.time_to_first_token",
    "gen_ai.server.time_per_output_token",
    "gen_ai.server.request.duration",
    "gen_ai.client.token.usage",
}


class Receiver:
    """An OTLP/HTTP metrics endpoint: keeps every metric name it is sent, by service."""

    def __init__(self) -> None:
        self.names: dict[str, set[str]] = {}
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                request = metrics_service.ExportMetricsServiceRequest()
                request.ParseFromString(body)
                for resource in request.resource_metrics:
                    service = next(
                        a.value.string_value
                        for a in resource.resource.attributes
                        if a.key == "service.name"
                    )
                    names = receiver.names.setdefault(service, set())
                    for scope in resource.scope_metrics:
                        names.update(metric.name for metric in scope.metrics)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/v1/metrics"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    yield server
    server.close()


async def test_a_chat_reaches_the_otlp_endpoint_under_the_genai_names(
    services: Services,
    migrated: str,
    tmp_path: Path,
    receiver: Receiver,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "300")  # ms: the test waits on it
    with make_stack(
        services,
        migrated,
        tmp_path,
        bulk=False,
        metrics_otlp_endpoint=receiver.url,
    ) as stack:
        stack.wait_ready()
        headers = {"Authorization": f"Bearer {stack.api_key}"}
        async with websockets.connect(stack.ws_url, additional_headers=headers) as ws:
            client = Client(ws)
            for i in range(3):
                await client.chat(f"o{i}", f"otlp question {i}", cache=False)
                _, done = await client.until_end(f"o{i}")
                assert done["type"] == "done", done

        def exported() -> bool:
            gateway = receiver.names.get("firsttoken-gateway", set())
            worker = receiver.names.get("firsttoken-worker", set())
            return (
                "gen_ai.server.time_to_first_token" in gateway
                and GENAI - {"gen_ai.server.time_to_first_token"} <= worker
            )

        wait_until(exported, 30, what="the GenAI metrics at the receiver")
