"""The verification's engine calls at a low priority on the engine (issue 45): the setting
reaches the engine request, and the OpenAI-compatible engine sends it as vLLM's `priority`
body field only when it is set (a vLLM not scheduling by priority may refuse any other than 0:
older vLLM did; tests/vllm/test_verify_priority.py runs a real one)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from types import SimpleNamespace
from typing import Any, cast

import pytest

from shared.modeltable import model_table
from shared.protocol import Message
from shared.settings import Settings
from workers.cache.charge import Answered
from workers.cache.checker import Checker
from workers.engines.base import Delta, EngineRequest
from workers.engines.openai_engine import request_body

REQUEST = EngineRequest(messages=[Message(role="user", content="q")], model="m", max_tokens=8)


def test_the_body_carries_a_priority_only_when_one_is_set() -> None:
    assert "priority" not in request_body(REQUEST)
    body = request_body(replace(REQUEST, priority=10))
    assert body["priority"] == 10
    assert request_body(replace(REQUEST, priority=0))["priority"] == 0
    # The rest of the body is the chat's, as before.
    assert {k: v for k, v in body.items() if k != "priority"} == request_body(REQUEST)


class Recording:
    name = "sim"

    def __init__(self) -> None:
        self.requests: list[EngineRequest] = []

    async def stream(self, request: EngineRequest, *, request_id: str) -> AsyncIterator[Delta]:
        self.requests.append(request)
        yield Delta("fresh", finish_reason="stop", prompt_tokens=3, completion_tokens=1)

    async def abort(self, request_id: str) -> None:
        pass

    async def aclose(self) -> None:
        pass


@pytest.mark.parametrize("priority", [None, 10])
def test_the_verifications_engine_request_has_the_settings_priority(priority: int | None) -> None:
    settings = Settings(engine="sim", cache_verify_priority=priority)
    engine = Recording()
    ctx = SimpleNamespace(
        settings=settings,
        redis=None,
        keys=None,
        models=model_table(settings),
        engine_for=lambda spec: engine,
    )
    checker = Checker(cast(Any, ctx))
    chat = SimpleNamespace(job_id="j")
    job = SimpleNamespace(chat=chat)
    engine_for_sim, request = checker._request("sim", REQUEST.messages, 8, None)
    answered = asyncio.run(checker._engine(cast(Any, job), "reask", engine_for_sim, request))
    assert answered == Answered("fresh", "stop", 3, 1, None)
    (sent,) = engine.requests
    assert sent.priority == priority
