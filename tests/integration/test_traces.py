"""Traces across the queue (issue 32), on a real stack (sim-server, a chat worker, a gateway
as processes) exporting by OTLP/HTTP to the test's own receiver: one chat's span tree, from the
client's `traceparent` through the gateway, the task message and the worker to the engine,
which continues the trace (the sim-server, as vLLM does)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import websockets

from tests.integration.conftest import Client, Services, Stack, make_stack
from tests.support import wait_until

pytestmark = pytest.mark.integration

try:
    import opentelemetry.sdk  # noqa: F401
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2  # noqa: F401

    from tests.integration.otlp import ReceivedSpan, Receiver, otlp_receiver
except ImportError as exc:  # pragma: no cover - the `otel` extra is in the test extra
    pytest.skip(
        f"OpenTelemetry is not installed ({exc}): pip install 'firsttoken[otel]'",
        allow_module_level=True,
    )

WORKER_SPANS = {"queue wait", "cache lookup", "engine request"}
SOURCES = {"retrieval.user", "retrieval.conversation", "retrieval.kb", "retrieval.quota"}


@pytest.fixture(scope="module")
def traced(
    services: Services, migrated: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Stack, Receiver]]:
    """A stack whose processes (gateway, chat worker, sim-server) all export their spans to
    one receiver, in batches sent every 100 ms rather than 5 s."""
    with pytest.MonkeyPatch.context() as env, otlp_receiver() as receiver:
        env.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
        logs = tmp_path_factory.mktemp("trace-logs")
        with make_stack(
            services, migrated, logs, bulk=False, otlp_traces_endpoint=receiver.url
        ) as stack:
            stack.wait_ready()
            yield stack, receiver


def new_traceparent() -> tuple[str, str, str]:
    trace_id, span_id = uuid.uuid4().hex, uuid.uuid4().hex[:16]
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


def wait_spans(receiver: Receiver, trace_id: str, names: set[str]) -> dict[str, ReceivedSpan]:
    """The trace's spans by name, once every one of `names` has arrived."""

    def arrived() -> bool:
        return names <= {s.name for s in receiver.spans(trace_id)}

    try:
        wait_until(arrived, 30, what=f"spans {sorted(names)}")
    except TimeoutError:
        got = sorted((s.name, s.service) for s in receiver.spans(trace_id))
        raise AssertionError(f"trace {trace_id} has only {got}") from None
    spans = receiver.spans(trace_id)
    return {s.name: s for s in spans}


async def ws_chat(stack: Stack, headers: dict[str, str], **frame: Any) -> dict[str, Any]:
    ws = await websockets.connect(
        stack.ws_url, additional_headers={"Authorization": f"Bearer {stack.api_key}", **headers}
    )
    try:
        client = Client(ws)
        await client.chat("t1", f"trace me {uuid.uuid4().hex}", **frame)
        _, end = await client.until_end("t1")
        return end
    finally:
        await ws.close()


def test_one_chat_is_one_trace_from_the_clients_traceparent_to_the_engine(
    traced: tuple[Stack, Receiver],
) -> None:
    """admission -> queue wait -> cache lookup, each retrieval source, engine request ->
    the engine's own span; admission -> relay; all in the client's trace."""
    stack, receiver = traced
    traceparent, trace_id, client_span = new_traceparent()
    end = asyncio.run(ws_chat(stack, {"traceparent": traceparent, "tracestate": "client=1"}))
    assert end["type"] == "done", end
    spans = wait_spans(receiver, trace_id, {"admission", "relay", "llm_request"} | WORKER_SPANS)
    names = set(spans)
    assert SOURCES <= names, names

    admission, queue = spans["admission"], spans["queue wait"]
    assert admission.parent_id == client_span and admission.service == "firsttoken-gateway"
    assert admission.attributes["firsttoken.door"] == "websocket"
    assert queue.parent_id == admission.span_id and queue.service == "firsttoken-worker"
    assert queue.attributes["firsttoken.job_id"] == admission.attributes["firsttoken.job_id"]
    # Queue wait starts when the gateway enqueued, inside admission (which may end after the
    # worker took the job: the enqueue is in the admit script, before its reply).
    assert admission.start_ns <= queue.start_ns <= admission.end_ns
    assert queue.start_ns <= queue.end_ns
    for name in ("cache lookup", "engine request", *SOURCES):
        assert spans[name].parent_id == queue.span_id, name
        assert spans[name].service == "firsttoken-worker", name
        assert spans[name].start_ns >= queue.end_ns, name
    assert spans["cache lookup"].attributes["firsttoken.cache.tier"] == "miss"
    engine = spans["engine request"]
    assert engine.attributes["gen_ai.request.model"] == end["model"]
    # The engine got the engine request's traceparent header and continued the trace.
    llm = spans["llm_request"]
    assert llm.parent_id == engine.span_id and llm.service == "firsttoken-sim-server"
    relay = spans["relay"]
    assert relay.parent_id == admission.span_id and relay.service == "firsttoken-gateway"
    assert relay.attributes["firsttoken.relay.chunks"] >= 1
    assert relay.attributes["firsttoken.relay.ended"] is True
    assert not any(s.error for s in spans.values())


def test_the_frame_field_overrides_the_upgrade_header(traced: tuple[Stack, Receiver]) -> None:
    stack, receiver = traced
    header, header_trace, _ = new_traceparent()
    field, field_trace, field_span = new_traceparent()
    end = asyncio.run(ws_chat(stack, {"traceparent": header}, traceparent=field))
    assert end["type"] == "done", end
    spans = wait_spans(receiver, field_trace, {"admission", "relay", "llm_request"})
    assert spans["admission"].parent_id == field_span
    assert receiver.spans(header_trace) == []


def test_a_malformed_traceparent_field_is_refused_and_a_malformed_header_ignored(
    traced: tuple[Stack, Receiver],
) -> None:
    stack, _ = traced
    refused = asyncio.run(ws_chat(stack, {}, traceparent="00-not-a-trace-01"))
    assert refused["type"] == "error" and refused["code"] == "invalid_request"
    assert "traceparent" in refused["message"]
    # A mangled header starts a trace of the chat's own: the chat is answered.
    done = asyncio.run(ws_chat(stack, {"traceparent": "00-mangled"}))
    assert done["type"] == "done", done


def test_the_openai_door_continues_the_traceparent_header(
    traced: tuple[Stack, Receiver],
) -> None:
    stack, receiver = traced
    traceparent, trace_id, client_span = new_traceparent()
    body = {"model": "sim", "messages": [{"role": "user", "content": uuid.uuid4().hex}]}
    with httpx.Client(timeout=20) as http:
        models = http.get(
            f"{stack.http}/v1/models", headers={"Authorization": f"Bearer {stack.api_key}"}
        )
        body["model"] = models.json()["data"][0]["id"]
        reply = http.post(
            f"{stack.http}/v1/chat/completions",
            content=json.dumps(body),
            headers={"Authorization": f"Bearer {stack.api_key}", "traceparent": traceparent},
        )
    assert reply.status_code == 200, reply.text
    spans = wait_spans(receiver, trace_id, {"admission", "relay", "llm_request"} | WORKER_SPANS)
    assert spans["admission"].parent_id == client_span
    assert spans["admission"].attributes["firsttoken.door"] == "openai"
    assert spans["llm_request"].parent_id == spans["engine request"].span_id
