"""Issue 42 ("first contact") against the real stack, the official `openai` SDK as the HTTP
client: OpenAI's error shape on every `/v1` route (401, 404, 405), `models.retrieve`, one model
name in every chunk of an `auto` stream, blank questions refused on both doors before anything
reaches the engine, an invalid UTF-8 websocket frame logged as one WARNING line, and the first
question after `firsttoken kb add` answered with the document within the kb's 150 ms."""

from __future__ import annotations

import asyncio
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import websockets

from firsttoken.openaiclient import base_url, default_model
from tests.integration.conftest import Services, Stack
from tests.integration.issue5 import ask, client, issue5_stack, new_tenant
from tests.support import child_env, python_cmd

pytestmark = pytest.mark.integration

STARTED = "firsttoken_sim_requests_started_total"
ERROR_FIELDS = {"message", "type", "param", "code"}


@pytest.fixture
def sdk(stack: Stack) -> Iterator[openai.OpenAI]:
    # No retries: each call is one answer or one refusal.
    client = openai.OpenAI(base_url=base_url(stack.http), api_key=stack.api_key, max_retries=0)
    yield client
    client.close()


def _error(resp: httpx.Response, status: int) -> dict[str, Any]:
    assert resp.status_code == status, (resp.status_code, resp.text[:300])
    assert resp.headers["content-type"].startswith("application/json"), resp.headers
    body = resp.json()
    assert set(body) == {"error"} and set(body["error"]) == ERROR_FIELDS, body
    return dict(body["error"])


def test_every_v1_route_refuses_in_openais_error_shape(stack: Stack) -> None:
    """401 without a key, 404 for an unknown route or model, 405 for a method a route does not
    take: `{"error": {message, type, param, code}}`; outside /v1 Starlette's plain text stays."""
    key = {"authorization": f"Bearer {stack.api_key}"}
    with httpx.Client(base_url=stack.http, timeout=10) as http:
        error = _error(http.get("/v1/models"), 401)
        assert (error["type"], error["code"]) == ("authentication_error", "unauthorized")
        error = _error(http.get("/v1/models", headers={"authorization": "Bearer nope"}), 401)
        assert error["code"] == "unauthorized"
        error = _error(http.get("/v1/models/sim"), 401)
        error = _error(http.get("/v1/models/no-such-model", headers=key), 404)
        assert (error["code"], error["param"]) == ("model_not_found", "model")
        error = _error(http.get("/v1/no-such-route", headers=key), 404)
        assert error["type"] == "invalid_request_error" and "/v1/no-such-route" in error["message"]
        for method in ("GET", "PUT", "DELETE"):
            resp = http.request(method, "/v1/chat/completions", headers=key)
            error = _error(resp, 405)
            assert error["type"] == "invalid_request_error" and method in error["message"]
            assert "POST" in resp.headers["allow"]
        plain = http.get("/no-such-page")
        assert plain.status_code == 404 and plain.headers["content-type"].startswith("text/plain")


def test_models_retrieve_through_the_sdk(stack: Stack, sdk: openai.OpenAI) -> None:
    model = default_model(sdk)
    found = sdk.models.retrieve(model)
    assert (found.id, found.object, found.owned_by) == (model, "model", "firsttoken")
    with pytest.raises(openai.NotFoundError) as missing:
        sdk.models.retrieve("no-such-model")
    assert missing.value.body["code"] == "model_not_found"  # type: ignore[index]


def test_an_auto_stream_names_the_answering_model_in_every_chunk(
    stack: Stack, sdk: openai.OpenAI
) -> None:
    """The role chunk is written before the worker's answer begins: it too names the model
    `auto` was routed to, as the final and usage chunks and the whole answer do."""
    question = f"first contact {uuid.uuid4().hex}"  # a cache miss: the engine answers
    chunks = list(
        sdk.chat.completions.create(
            model="auto",
            messages=[{"role": "user", "content": question}],
            stream=True,
            stream_options={"include_usage": True},
            max_tokens=8,
        )
    )
    models = {chunk.model for chunk in chunks}
    assert len(chunks) >= 3 and models == {default_model(sdk)}, [c.model for c in chunks]
    whole = sdk.chat.completions.create(
        model="auto", messages=[{"role": "user", "content": question + " again"}], max_tokens=4
    )
    assert whole.model == default_model(sdk)


async def test_blank_questions_are_refused_on_both_doors_before_the_engine(
    stack: Stack, connect: Any, sdk: openai.OpenAI
) -> None:
    started = stack.sim_metric(STARTED)
    client = await connect()
    for i, blank in enumerate(["", "   ", "\n\t"]):
        await client.chat(f"blank{i}", blank)
        _, end = await client.until_end(f"blank{i}", timeout=5)
        assert end["type"] == "error" and end["code"] == "invalid_request", end
        assert "empty" in end["message"]
    for blank in ["", "   "]:
        with pytest.raises(openai.BadRequestError) as refused:
            sdk.chat.completions.create(
                model="auto", messages=[{"role": "user", "content": blank}], stream=True
            )
        assert refused.value.body["code"] == "invalid_request"  # type: ignore[index]
        assert refused.value.body["type"] == "invalid_request_error"  # type: ignore[index]
    await asyncio.sleep(0.3)
    assert stack.sim_metric(STARTED) == started, "a blank question reached the engine"
    await client.chat("after", "a real question")
    assert (await client.until_end("after"))[1]["type"] == "done"


async def test_an_invalid_utf8_frame_is_one_warning_without_a_traceback(
    stack: Stack, connect: Any
) -> None:
    """RFC 6455 closes a connection that sends invalid UTF-8 in a text frame (1007): the
    gateway logs it as one WARNING line, no traceback, and its other connections go on."""
    log = stack.procs["gateway"]
    before = log.output()
    other = await connect()
    await other.chat("running", "a question answered while another socket misbehaves")
    headers = {"Authorization": f"Bearer {stack.api_key}"}
    bad = await websockets.connect(stack.ws_url, additional_headers=headers)
    # A text frame whose payload is not UTF-8: the client library will not build one, so the
    # frame is written to the socket by hand (FIN, opcode 1, masked, 2 bytes).
    mask = b"\x01\x02\x03\x04"
    payload = bytes(b ^ mask[i % 4] for i, b in enumerate(b"\xff\xfe"))
    bad.transport.write(b"\x81\x82" + mask + payload)
    with pytest.raises(websockets.ConnectionClosed) as closed:
        await asyncio.wait_for(bad.recv(), 5)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1007
    assert (await other.until_end("running"))[1]["type"] == "done"
    await other.chat("after", "still healthy")
    assert (await other.until_end("after"))[1]["type"] == "done"
    await asyncio.sleep(0.3)
    new = log.output()[len(before) :]
    assert "Traceback" not in new and "ERROR" not in new, new[-2000:]
    warnings = [line for line in new.splitlines() if "WARNING" in line and "UTF-8" in line]
    assert len(warnings) == 1, new[-2000:]


DOC = """# Heron runbook

## Restarting the heron relay

To restart the heron relay, run `heronctl bounce --drain 30` on the relay host, then check
that the relay dashboard shows every shard green.
"""


def test_the_first_question_after_kb_add_uses_the_document(
    services: Services, migrated: str, tmp_path: Path
) -> None:
    """The kb source at its shipped 150 ms deadline: the worker loaded the embedding model at
    its start, so the very first question after `kb add` gets the document."""
    with issue5_stack(services, migrated, tmp_path) as stack:
        name, _, key = asyncio.run(new_tenant(stack.services.database_url))
        doc = tmp_path / "heron.md"
        doc.write_text(DOC)
        env = child_env(
            database_url=stack.services.database_url, redis_url=stack.services.redis_url
        )
        added = subprocess.run(
            python_cmd("-m", "firsttoken", "kb", "add", "--tenant", name, str(doc)),
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert added.returncode == 0, added.stderr

        async def first_question() -> dict[str, Any]:
            c = await client(stack, key)
            try:
                return await ask(c, "q1", "How do I restart the heron relay?", cache=False)
            finally:
                await c.ws.close()

        done = asyncio.run(first_question())
        assert done["type"] == "done", done
        assert done["retrieval"]["sources"]["kb"]["status"] == "ok", done["retrieval"]
        assert done["chunk_ids"] and all(i.startswith("kb:") for i in done["chunk_ids"]), done


def test_kb_add_reaches_a_tenant_that_asked_just_before(
    services: Services, migrated: str, tmp_path: Path
) -> None:
    """A tenant whose knowledge-base version a worker holds (it asked a question a moment
    ago; held for FIRSTTOKEN_TENANT_CACHE_S, a minute here) gets the new document in its very
    next question: `kb add` announces the change on the tenant channel."""
    with issue5_stack(services, migrated, tmp_path, tenant_cache_s="60") as stack:
        name, _, key = asyncio.run(new_tenant(stack.services.database_url))

        async def question(chat_id: str) -> dict[str, Any]:
            c = await client(stack, key)
            try:
                return await ask(c, chat_id, "How do I restart the heron relay?", cache=False)
            finally:
                await c.ws.close()

        before = asyncio.run(question("q0"))
        assert before["type"] == "done" and not before.get("chunk_ids"), before
        doc = tmp_path / "heron.md"
        doc.write_text(DOC)
        added = subprocess.run(
            python_cmd("-m", "firsttoken", "kb", "add", "--tenant", name, str(doc)),
            env=stack.env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert added.returncode == 0, added.stderr
        assert "note:" not in added.stderr, added.stderr  # the workers were told
        done = asyncio.run(question("q1"))
        assert done["type"] == "done", done
        assert done["retrieval"]["sources"]["kb"]["status"] == "ok", done["retrieval"]
        assert done["chunk_ids"] and all(i.startswith("kb:") for i in done["chunk_ids"]), done
