"""The sim server as a real subprocess, driven by the real openai client and raw HTTP."""

from __future__ import annotations

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.integration.simserver import metrics, wait_metrics

pytestmark = pytest.mark.integration

STARTED = "firsttoken_sim_requests_started_total"
FINISHED = "firsttoken_sim_requests_finished_total"
ABORTED = "firsttoken_sim_requests_aborted_total"
RUNNING = "firsttoken_sim_requests_running"
MESSAGES: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "Tell me about low latency serving."}
]


async def test_stream_matches_non_stream_with_usage(server: str) -> None:
    """Streaming gives the role chunk first, the same text as non-streaming, and usage last."""
    async with openai.AsyncOpenAI(base_url=f"{server}/v1", api_key="x", max_retries=0) as client:
        full = await client.chat.completions.create(model="sim", messages=MESSAGES)
        stream = await client.chat.completions.create(model="sim", messages=MESSAGES, stream=True)
        chunks = [chunk async for chunk in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text and text == full.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    finishes = [f for f in finishes if f]
    assert finishes == [full.choices[0].finish_reason] == ["stop"]
    # Usage comes even though include_usage was not asked for.
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens  # type: ignore[union-attr]
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens > 0  # type: ignore[union-attr]


async def test_include_usage_and_max_tokens(server: str) -> None:
    """With include_usage and a small max_tokens the answer stops at it with "length"."""
    async with openai.AsyncOpenAI(base_url=f"{server}/v1", api_key="x", max_retries=0) as client:
        stream = await client.chat.completions.create(
            model="sim",
            messages=MESSAGES,
            stream=True,
            max_tokens=3,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3


async def test_models_lists_served_model(server: str) -> None:
    """GET /v1/models lists the served model name."""
    async with openai.AsyncOpenAI(base_url=f"{server}/v1", api_key="x", max_retries=0) as client:
        models = await client.models.list()
    assert [m.id for m in models.data] == ["sim"]


async def test_metrics_count_finished_requests(server: str) -> None:
    """A completed request moves started and finished by one and leaves running at 0."""
    before = await metrics(server)
    async with httpx.AsyncClient() as http:
        r = await http.post(
            f"{server}/v1/chat/completions", json={"model": "sim", "messages": MESSAGES}
        )
    assert r.status_code == 200
    after = await metrics(server)
    assert after[STARTED] == before[STARTED] + 1
    assert after[FINISHED] == before[FINISHED] + 1
    assert after[RUNNING] == 0


async def test_client_disconnect_counts_as_abort(server: str) -> None:
    """Closing the connection mid-stream counts an abort on the server and frees the slot."""
    before = await metrics(server)
    async with openai.AsyncOpenAI(base_url=f"{server}/v1", api_key="x", max_retries=0) as client:
        stream = await client.chat.completions.create(model="sim", messages=MESSAGES, stream=True)
        got = 0
        async for chunk in stream:
            got += bool(chunk.choices and chunk.choices[0].delta.content)
            if got == 2:
                break
        assert (await metrics(server))[RUNNING] == 1
        await stream.close()
    after = await wait_metrics(server, lambda m: m[ABORTED] > before[ABORTED], 2.0)
    assert after[ABORTED] == before[ABORTED] + 1
    assert after[FINISHED] == before[FINISHED]
    assert after[RUNNING] == 0


async def test_bad_json_is_400(server: str) -> None:
    """A body that is not JSON, or has no messages, gets 400 with an OpenAI-style error."""
    async with httpx.AsyncClient() as http:
        bad = await http.post(f"{server}/v1/chat/completions", content=b"{not json")
        empty = await http.post(f"{server}/v1/chat/completions", json={"model": "sim"})
    for r in (bad, empty):
        assert r.status_code == 400
        error = r.json()["error"]
        assert error["type"] == "invalid_request_error" and error["code"] == 400
        assert error["message"]


async def test_unknown_model_is_404(server: str) -> None:
    """Asking for a model the server does not serve is a 404 the openai client understands."""
    async with openai.AsyncOpenAI(base_url=f"{server}/v1", api_key="x", max_retries=0) as client:
        with pytest.raises(openai.NotFoundError) as info:
            await client.chat.completions.create(model="gpt-nope", messages=MESSAGES)
    assert "gpt-nope" in str(info.value)


async def test_chat_path_takes_only_post(server: str) -> None:
    """The chat path is served outside Starlette's router, yet other methods still get 405."""
    async with httpx.AsyncClient() as http:
        r = await http.get(f"{server}/v1/chat/completions")
    assert r.status_code == 405


async def test_stream_is_chunked_server_sent_events(server: str) -> None:
    """The streamed answer's headers and framing, as vLLM's server sends them."""
    request = {"model": "sim", "messages": MESSAGES, "stream": True, "max_tokens": 2}
    async with httpx.AsyncClient() as http:
        async with http.stream("POST", f"{server}/v1/chat/completions", json=request) as r:
            body = b"".join([part async for part in r.aiter_raw()])
    assert r.status_code == 200
    assert r.headers["content-type"] == "text/event-stream; charset=utf-8"
    assert r.headers["cache-control"] == "no-cache"
    assert r.headers["transfer-encoding"] == "chunked"
    events = body.split(b"\n\n")
    assert events[-2:] == [b"data: [DONE]", b""]
    assert all(e.startswith(b"data: {") for e in events[:-2])
    # The role chunk, 2 tokens, the usage, [DONE], and nothing after the last blank line.
    assert len(events) == 6
