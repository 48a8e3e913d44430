"""Every frame the real gateway sends matches the typed frames of shared/protocol.py, and the
CLI client (firsttoken/client.py) reads them."""

from __future__ import annotations

import asyncio
import io
import json
import time
from typing import Any

import pytest
import websockets

from firsttoken.client import ask
from shared.protocol import ServerFrame, parse_server_frame
from tests.integration.conftest import Stack

pytestmark = pytest.mark.integration


async def _frames_until(ws: Any, chat_id: str | None, last: set[str]) -> list[ServerFrame]:
    """Frames of one chat, each validated, up to the first whose type is in `last`."""
    frames: list[ServerFrame] = []
    deadline = time.monotonic() + 20
    while True:
        raw = await asyncio.wait_for(ws.recv(), max(0.01, deadline - time.monotonic()))
        frame = parse_server_frame(raw)
        if frame["id"] != chat_id:
            continue
        frames.append(frame)
        if frame["type"] in last:
            return frames


async def test_every_frame_of_a_chat_a_ping_and_an_error_is_a_valid_server_frame(
    stack: Stack,
) -> None:
    """accepted (with a new conversation id), tokens in order, done, pong and error all
    validate as the client parses them."""
    headers = {"Authorization": f"Bearer {stack.api_key}"}
    async with websockets.connect(stack.ws_url, additional_headers=headers) as ws:
        chat = {
            "type": "chat",
            "id": "f1",
            "messages": [{"role": "user", "content": "which frames does a chat get?"}],
            "conversation_id": "new",
        }
        await ws.send(json.dumps(chat))
        frames = await _frames_until(ws, "f1", {"done", "error"})
        accepted, *tokens, done = frames
        assert accepted["type"] == "accepted" and accepted["job_id"]
        assert "conversation_id" in accepted
        assert [t["type"] for t in tokens] == ["token"] * len(tokens) and tokens
        assert [t["seq"] for t in tokens if t["type"] == "token"] == list(range(len(tokens)))
        assert done["type"] == "done", done
        assert done["conversation_id"] == accepted["conversation_id"]
        assert "points" not in done and "chunks" not in done and done["timings"]

        await ws.send(json.dumps({"type": "ping", "id": "p1"}))
        assert await _frames_until(ws, "p1", {"pong"}) == [{"type": "pong", "id": "p1"}]

        await ws.send(json.dumps({"type": "cancel", "id": "nothing"}))
        (error,) = await _frames_until(ws, "nothing", {"error"})
        assert error["type"] == "error" and error["code"] == "invalid_request"


async def test_the_cli_client_prints_the_answer_and_returns_the_done_frame(stack: Stack) -> None:
    """`firsttoken chat`'s ask(): the tokens go to `out`, the typed `done` comes back."""
    out = io.StringIO()
    # A question of its own: the session's stack caches answers, and other tests ask theirs.
    question = "what does the command line client print?"
    result = await ask(question, url=stack.ws_url, api_key=stack.api_key, out=out)
    assert result["type"] == "done", result
    assert result["usage"]["completion_tokens"] > 0 and out.getvalue()


async def test_the_cli_client_returns_the_gateways_error_frame(stack: Stack) -> None:
    """A refused chat comes back as the gateway's `error` frame, code and message intact."""
    result = await ask(
        "hi", url=stack.ws_url, api_key=stack.api_key, model="no-such-model", out=io.StringIO()
    )
    assert result["type"] == "error" and result["code"] == "invalid_request", result
    assert "unknown model 'no-such-model'" in result["message"]
