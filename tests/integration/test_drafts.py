"""Drafts through the real gateway, chat worker and sim-server (issue 34): a draft's prefill
fills the engine's prefix cache for the chat that follows, a superseded draft is not prefilled
(or is aborted), a malformed draft gets `invalid_draft` and the socket goes on."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import websockets
from sqlalchemy import select

from shared.db.models import UsageEvent
from shared.db.session import make_engine, make_sessionmaker
from tests.integration.conftest import Client, Services, Stack, make_stack
from tests.support import wait_until

pytestmark = pytest.mark.integration

STARTED = "firsttoken_sim_requests_started_total"
FINISHED = "firsttoken_sim_requests_finished_total"
ABORTED = "firsttoken_sim_requests_aborted_total"
HISTORY = " ".join(f"word{i}" for i in range(300))


@pytest.fixture(scope="module")
def dstack(
    services: Services, migrated: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """One chat worker and a sim-server with a prefix cache and a visible prefill cost."""
    with make_stack(
        services,
        migrated,
        tmp_path_factory.mktemp("draftlogs"),
        # 300 words at 2 ms each: a prefill in flight long enough to be superseded.
        sim_args=(
            "--ttft-ms",
            "10",
            "--itl-ms",
            "2",
            "--max-tokens",
            "8",
            "--prefill-ms-per-token",
            "2",
            "--prefix-cache-tokens",
            "100000",
        ),
        # Drafts on a loaded 2-core machine may wait; the test is not about their age.
        draft_max_age_s="30",
    ) as s:
        s.wait_ready()
        yield s


async def _client(stack: Stack) -> Client:
    headers = {"Authorization": f"Bearer {stack.api_key}"}
    return Client(await websockets.connect(stack.ws_url, additional_headers=headers))


def _counts(stack: Stack) -> tuple[float, float, float]:
    return stack.sim_metric(STARTED), stack.sim_metric(FINISHED), stack.sim_metric(ABORTED)


def _draft(text: str, **extra: Any) -> dict[str, Any]:
    return {"type": "draft", "id": f"d-{uuid.uuid4().hex[:6]}", "text": text, **extra}


async def test_a_drafts_prefill_makes_the_chats_prompt_cached(dstack: Stack) -> None:
    """The chat after a draft finds most of its prompt in the engine's cache; a draft is
    never answered, and its prefill writes a `prefill` usage row."""
    client = await _client(dstack)
    try:
        _, finished, _ = _counts(dstack)
        await client.send(_draft(HISTORY + " and what", messages=[]))
        wait_until(lambda: _counts(dstack)[1] > finished, 20, what="the draft's prefill")
        await client.chat("c1", HISTORY + " and what about it", cache=False)
        tokens, done = await client.until_end("c1", timeout=30)
        assert done["type"] == "done", done
        assert tokens
        assert done["usage"]["cached_prompt_tokens"] >= 288  # 18 of the 19 whole blocks
        assert not client.frames.get(None)  # nothing answered the draft
    finally:
        await client.ws.close()


async def test_a_superseded_draft_is_not_prefilled_or_is_aborted(dstack: Stack) -> None:
    """Of two drafts of one conversation sent back to back only the newer is prefilled to the
    end; the older is dropped by the worker or its prefill aborted."""
    client = await _client(dstack)
    try:
        started, finished, aborted = _counts(dstack)
        await client.send(_draft("first " + HISTORY, messages=[]))
        await client.send(_draft("second " + HISTORY, messages=[]))

        def settled() -> bool:  # the newer one finished, and nothing is in flight
            s, f, a = _counts(dstack)
            return f > finished and s - started == (f - finished) + (a - aborted)

        wait_until(settled, 20, what="the newer draft's prefill")
        s2, f2, a2 = _counts(dstack)
        assert f2 - finished == 1  # only the newer draft's prefill ran to its end
        assert s2 - started == (f2 - finished) + (a2 - aborted)  # the older: never or aborted
    finally:
        await client.ws.close()


async def test_a_malformed_draft_gets_invalid_draft_and_the_socket_goes_on(
    dstack: Stack,
) -> None:
    client = await _client(dstack)
    try:
        await client.send({"type": "draft", "id": "bad", "text": "x"})
        error = await client.next_for("bad")
        assert (error["type"], error["code"]) == ("error", "invalid_draft")
        await client.chat("after", "still here?", cache=False)
        _, done = await client.until_end("after", timeout=30)
        assert done["type"] == "done"
    finally:
        await client.ws.close()


async def test_a_prefill_writes_a_prefill_usage_row(dstack: Stack) -> None:
    """Usage counts drafts' prefills apart: route `prefill`, `prefill_tokens` set."""
    client = await _client(dstack)
    try:
        _, finished, _ = _counts(dstack)
        await client.send(_draft("row " + HISTORY, messages=[]))
        wait_until(lambda: _counts(dstack)[1] > finished, 20, what="the draft's prefill")
    finally:
        await client.ws.close()
    engine = make_engine(dstack.services.database_url)
    try:
        rows: list[UsageEvent] = []
        for _ in range(75):
            async with make_sessionmaker(engine)() as session:
                rows = list(
                    (
                        await session.execute(
                            select(UsageEvent).where(
                                UsageEvent.route == "prefill", UsageEvent.prefill_tokens > 300
                            )
                        )
                    ).scalars()
                )
            if rows:
                break
            await asyncio.sleep(0.2)
    finally:
        await engine.dispose()
    assert rows, "no prefill usage row"
    row = rows[-1]
    assert (row.prompt_tokens, row.completion_tokens, row.status) == (0, 0, "ok")
    assert row.finish_reason == "prefill"
