"""The OpenAI door (`POST /v1/chat/completions`) against a real stack, with the official
`openai` SDK as the client: streamed and whole answers, sync and async, the same tokens as the
websocket, the usage chunk, every error status as the SDK's exception, disconnect -> abort, and
bad input refused with clean 400s."""

from __future__ import annotations

import asyncio
import gc
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from firsttoken.keyscli import create_key
from firsttoken.openaiclient import base_url, default_model
from shared.keys import CHAT_QUEUE, Keys
from shared.settings import load_settings
from tests.integration.conftest import Services, Stack, losing_stack

pytestmark = pytest.mark.integration

ABORTED = "firsttoken_sim_requests_aborted_total"


_OPEN: list[openai.OpenAI] = []


@pytest.fixture(autouse=True)
def _close_sync_clients() -> Iterator[None]:
    """Close the test's SDK clients: an unclosed connection is a ResourceWarning (an error
    here) in whichever later test the garbage collector happens to run."""
    yield
    while _OPEN:
        _OPEN.pop().close()


def sync_client(stack: Stack, key: str | None = None) -> openai.OpenAI:
    # No retries: each test asks for exactly one answer (or one refusal).
    client = openai.OpenAI(
        base_url=base_url(stack.http), api_key=key or stack.api_key, max_retries=0
    )
    _OPEN.append(client)
    return client


def async_client(stack: Stack, key: str | None = None) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=base_url(stack.http), api_key=key or stack.api_key, max_retries=0
    )


def model_of(stack: Stack) -> str:
    return default_model(sync_client(stack))


async def refused_503_then_504(
    stack: Stack, request: Callable[[str, bool], Awaitable[Any]]
) -> None:
    """With its only chat worker killed: ``request(text, stream)`` is refused 503 (Retry-After,
    `overloaded`) once the dead worker's heartbeat lapses; with a worker that looks alive and
    takes nothing, a streamed one gets 504 after the queue deadline."""
    wait = time.monotonic() + 15
    while True:  # until the dead worker's heartbeat has lapsed
        try:
            await request("x", False)
        except openai.InternalServerError as exc:
            if exc.status_code == 503:
                assert int(exc.response.headers["retry-after"]) >= 1
                assert exc.body["code"] == "overloaded"  # type: ignore[index]
                break
        assert time.monotonic() < wait, "never refused with 503"
        await asyncio.sleep(0.2)

    stack.redis().zadd(Keys(stack.prefix).worker_heartbeats(CHAT_QUEUE), {"ghost": 1e12})
    started = time.monotonic()
    with pytest.raises(openai.InternalServerError) as late:
        await request("y", True)
    assert late.value.status_code == 504
    assert 1.4 <= time.monotonic() - started < 5


def user(text: str) -> list[Any]:
    return [{"role": "user", "content": text}]


def test_streamed_answer_with_usage_chunk_sync(stack: Stack) -> None:
    client = sync_client(stack)
    model = model_of(stack)
    raw = client.chat.completions.with_raw_response.create(
        model=model,
        messages=user("openai door, streamed, sync"),
        stream=True,
        stream_options={"include_usage": True},
        max_completion_tokens=8,
    )
    assert float(raw.headers["x-firsttoken-ttft-ms"]) >= 0
    assert raw.headers["content-type"].startswith("text/event-stream")
    chunks = list(raw.parse())
    texts = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert texts and all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    ids = {c.id for c in chunks}
    assert len(ids) == 1 and ids.pop().startswith("chatcmpl-")
    final, usage = chunks[-2], chunks[-1]
    assert final.choices[0].finish_reason in ("stop", "length")
    extras = final.model_extra["x_firsttoken"]  # type: ignore[index]
    assert set(extras) >= {"cached", "route", "timings"} and extras["cached"] is False
    assert usage.choices == [] and usage.usage is not None
    assert usage.usage.completion_tokens > 0 and usage.usage.prompt_tokens > 0
    assert usage.usage.total_tokens == usage.usage.prompt_tokens + usage.usage.completion_tokens


def test_whole_answer_sync(stack: Stack) -> None:
    client = sync_client(stack)
    raw = client.chat.completions.with_raw_response.create(
        model=model_of(stack), messages=user("openai door, whole, sync"), max_tokens=6
    )
    assert float(raw.headers["x-firsttoken-ttft-ms"]) >= 0
    answer = raw.parse()
    assert answer.object == "chat.completion" and answer.id.startswith("chatcmpl-")
    assert answer.choices[0].message.role == "assistant"
    assert answer.choices[0].message.content
    assert answer.usage is not None and answer.usage.completion_tokens > 0
    assert answer.model_extra["x_firsttoken"]["cached"] is False  # type: ignore[index]


async def test_async_streamed_and_whole(stack: Stack) -> None:
    client = async_client(stack)
    model = model_of(stack)
    stream = await client.chat.completions.create(
        model=model, messages=user("openai door, async stream"), stream=True, max_tokens=6
    )
    texts = [c.choices[0].delta.content async for c in stream if c.choices[0].delta.content]
    assert texts
    whole, again = await asyncio.gather(
        client.chat.completions.create(
            model=model, messages=user("openai door, async whole"), max_tokens=6
        ),
        client.chat.completions.create(
            model=model, messages=user("openai door, async whole 2"), max_tokens=6
        ),
    )
    assert whole.choices[0].message.content and again.choices[0].message.content
    await client.close()


def _cache_entries(stack: Stack) -> int:
    client = stack.redis()
    return sum(int(client.zcard(k)) for k in client.scan_iter(f"{stack.prefix}:cache:lru:*"))


async def test_tokens_equal_the_websockets_for_a_cached_prompt(stack: Stack, connect: Any) -> None:
    question = f"what does the openai door return {uuid.uuid4().hex[:6]}?"
    model = model_of(stack)
    ws = await connect()
    before = _cache_entries(stack)
    await ws.chat("first", question, model=model)
    _, done = await ws.until_end("first")
    assert done["type"] == "done" and done["cached"] is False
    # The cache write is off the hot path (after `done`), then synced to the workers in 1 s;
    # the first write also loads the embedding model, slow on a loaded machine.
    wait = time.monotonic() + 60
    while _cache_entries(stack) <= before:
        assert time.monotonic() < wait, f"the answer was never cached: {done}"
        await asyncio.sleep(0.05)
    await asyncio.sleep(1.0)
    await ws.chat("second", question, model=model)
    tokens, done = await ws.until_end("second")
    assert done["cached"] is True, done
    ws_texts = [t["text"] for t in tokens]

    client = async_client(stack)
    stream = await client.chat.completions.create(model=model, messages=user(question), stream=True)
    chunks = [c async for c in stream]
    texts = [c.choices[0].delta.content for c in chunks if c.choices[0].delta.content]
    assert chunks[-1].model_extra["x_firsttoken"]["cached"] is True  # type: ignore[index]
    assert texts == ws_texts
    whole = await client.chat.completions.create(model=model, messages=user(question))
    assert whole.choices[0].message.content == "".join(ws_texts)
    assert whole.model_extra["x_firsttoken"]["cached"] is True  # type: ignore[index]
    await client.close()


def test_error_statuses_map_to_the_sdks_exceptions(stack: Stack) -> None:
    model = model_of(stack)
    with pytest.raises(openai.AuthenticationError) as info:
        sync_client(stack, key="ft-not-a-key").chat.completions.create(
            model=model, messages=user("x")
        )
    assert info.value.status_code == 401
    with pytest.raises(openai.NotFoundError) as not_found:
        sync_client(stack).chat.completions.create(model="no-such-model", messages=user("x"))
    assert not_found.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as bad:
        sync_client(stack).chat.completions.create(model=model, messages=user("x"), top_p=0.5)
    assert bad.value.param == "top_p" and "top_p" in bad.value.message


async def test_rate_limited_is_429_with_retry_after(stack: Stack) -> None:
    settings = load_settings(
        database_url=stack.services.database_url,
        redis_url=stack.services.redis_url,
        redis_prefix=stack.prefix,
    )
    # On a loop of its own, as the `migrated` fixture makes its key: the database engine lives
    # and dies with it.
    created = await asyncio.to_thread(
        asyncio.run, create_key(settings, f"oa-{uuid.uuid4().hex[:6]}", rpm=1)
    )
    client = async_client(stack, key=created.key)
    model = model_of(stack)
    await client.chat.completions.create(model=model, messages=user("one"), max_tokens=2)
    with pytest.raises(openai.RateLimitError) as info:
        await client.chat.completions.create(model=model, messages=user("two"), max_tokens=2)
    assert int(info.value.response.headers["retry-after"]) >= 1
    await client.close()
    gc.collect()  # anything this test left unclosed is reported here, not in a later test


async def test_client_disconnect_aborts_the_engine_request(stack: Stack) -> None:
    aborted = stack.sim_metric(ABORTED)
    client = async_client(stack)
    stream = await client.chat.completions.create(
        model=model_of(stack), messages=user("stream then vanish"), stream=True, max_tokens=32
    )
    async for _ in stream:
        break  # first chunk: the engine is generating
    await stream.close()
    wait = time.monotonic() + 5
    while stack.sim_metric(ABORTED) <= aborted:
        assert time.monotonic() < wait, "the engine never saw the abort"
        await asyncio.sleep(0.05)
    wait = time.monotonic() + 5
    while stack.sim_metric("firsttoken_sim_requests_running") != 0:
        assert time.monotonic() < wait
        await asyncio.sleep(0.05)
    await client.close()


def _post(stack: Stack, body: bytes | str, **headers: str) -> httpx.Response:
    return httpx.post(
        f"{stack.http}/v1/chat/completions",
        content=body,
        headers={
            "authorization": f"Bearer {stack.api_key}",
            "content-type": "application/json",
            **headers,
        },
        timeout=30,
    )


def test_bad_input_gets_clean_400s_and_the_gateway_is_unaffected(stack: Stack) -> None:
    model = model_of(stack)
    msg = '{"role": "user", "content": "x"}'
    cases: dict[str, bytes | str] = {
        "malformed": '{"model": "m", "messages": [',
        "not an object": "[1, 2]",
        "wrong type": f'{{"model": "{model}", "messages": [{msg}], "max_tokens": "many"}}',
        "wrong stream": f'{{"model": "{model}", "messages": [{msg}], "stream": 1}}',
        "unknown field": f'{{"model": "{model}", "messages": [{msg}], "colour": "red"}}',
        "10 MB": f'{{"model": "{model}", "messages": [{{"role": "user", "content": "'
        + "x" * (10 << 20)
        + '"}]}',
        "10,000 messages": f'{{"model": "{model}", "messages": [{", ".join([msg] * 10_000)}]}}',
        "too many messages": f'{{"model": "{model}", "messages": [{", ".join([msg] * 17)}]}}',
        "not utf-8": b'{"model": "\xff"}',
    }
    for name, body in cases.items():
        resp = _post(stack, body)
        assert resp.status_code == 400, (name, resp.status_code, resp.text[:300])
        error = resp.json()["error"]
        assert set(error) >= {"message", "type", "code"}, name
        assert error["type"] == "invalid_request_error", name
    assert stack.get("/healthz")[0] == 200
    answer = sync_client(stack).chat.completions.create(
        model=model, messages=user("still here?"), max_tokens=3
    )
    assert answer.choices[0].message.content


async def test_worker_loss_503_504_and_a_mid_stream_error_event(
    services: Services, migrated: str, tmp_path: Path
) -> None:
    """A worker killed mid-answer: an error event the SDK raises; no worker: 503 with
    Retry-After; a worker that looks alive but takes nothing: 504 after the queue deadline."""
    # A 1.5 s queue deadline for the 504.
    with losing_stack(services, migrated, tmp_path, queue_deadline_s="1.5") as stack:
        client = async_client(stack)
        model = model_of(stack)
        stream = await client.chat.completions.create(
            model=model, messages=user("long answer"), stream=True, max_tokens=64
        )
        killed = False
        with pytest.raises(openai.APIError) as failed:
            async for _ in stream:
                if not killed:  # the first chunk: the worker is answering
                    stack.procs["chat0"].kill()
                    killed = True
        assert killed and "worker" in failed.value.message
        assert failed.value.body["code"] == "engine_error"  # type: ignore[index]

        async def ask(text: str, stream: bool) -> Any:
            return await client.chat.completions.create(
                model=model, messages=user(text), stream=stream
            )

        await refused_503_then_504(stack, ask)
        await client.close()
