"""Conversations on the real stack: server-side history, bounded context, summaries, bad ids."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import select

from shared.db.models import Conversation
from tests.integration.conftest import Services, Stack
from tests.integration.issue5 import ask, client, issue5_stack, new_tenant, scalar

pytestmark = pytest.mark.integration

BUDGET = 600
LONG_EN = "We discussed the migration plan, the budget of 40k, and who owns the rollout. " * 6
LONG_ZH = "我们讨论了迁移计划、四万的预算以及由谁负责上线。" * 8


@pytest.fixture(scope="module")
def conv_stack(
    services: Services, migrated: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    with issue5_stack(
        services,
        migrated,
        tmp_path_factory.mktemp("logs5c"),
        prompt_budget_tokens=str(BUDGET),
        context_summary_after_tokens="500",
        context_recent_messages="4",
    ) as s:
        yield s


async def test_long_conversation_stays_in_budget_and_summary_replaces_old_turns(
    conv_stack: Stack,
) -> None:
    """40+ turns in two languages: prompt_tokens never exceed the budget; once the summary is
    written the next turn sends it and only the recent window."""
    _, _, key = await new_tenant(conv_stack.services.database_url)
    c = await client(conv_stack, key)
    try:
        first = await ask(c, "t0", "Hello, let us plan the migration.", conversation_id="new")
        assert first["type"] == "done", first
        conv_id = first["conversation_id"]
        assert first["accepted"]["conversation_id"] == conv_id
        tokens = []
        for i in range(1, 42):
            done = await ask(c, f"t{i}", (LONG_EN if i % 2 else LONG_ZH) + f" turn {i}",
                             conversation_id=conv_id)  # fmt: skip
            assert done["type"] == "done", done
            tokens.append(done["usage"]["prompt_tokens"])
            assert done["usage"]["prompt_tokens"] <= BUDGET
        summary = None
        for _ in range(100):
            summary = await scalar(
                conv_stack.services.database_url,
                select(Conversation.summary).where(Conversation.id == conv_id),
            )
            if summary:
                break
            await asyncio.sleep(0.1)
        assert summary, "the summarize worker wrote no summary"
        done = await ask(c, "after", "What did we decide?", conversation_id=conv_id)
        assert done["prompt"]["summary_sent"] is True
        assert done["prompt"]["history_sent"] <= 4
        assert done["usage"]["prompt_tokens"] <= BUDGET
    finally:
        await c.ws.close()


async def test_unknown_conversation_is_invalid_request(conv_stack: Stack) -> None:
    """A conversation id nobody created gets invalid_request naming it; nothing is stored."""
    _, _, key = await new_tenant(conv_stack.services.database_url)
    c = await client(conv_stack, key)
    try:
        err = await ask(c, "u1", "hi", conversation_id="does-not-exist")
        assert err["type"] == "error" and err["code"] == "invalid_request", err
        assert "unknown conversation 'does-not-exist'" in err["message"]
        stored = await scalar(
            conv_stack.services.database_url,
            select(Conversation.id).where(Conversation.id == "does-not-exist"),
        )
        assert stored is None
    finally:
        await c.ws.close()


async def test_conversation_of_another_tenant_is_refused(conv_stack: Stack) -> None:
    """Tenant B naming tenant A's conversation gets the same error as for an unknown one."""
    db = conv_stack.services.database_url
    _, _, key_a = await new_tenant(db)
    _, _, key_b = await new_tenant(db)
    a = await client(conv_stack, key_a)
    b = await client(conv_stack, key_b)
    try:
        done = await ask(a, "a1", "secret plan: launch on Friday", conversation_id="new")
        conv_id = done["conversation_id"]
        err = await ask(b, "b1", "what was the plan?", conversation_id=conv_id)
        assert err["type"] == "error" and err["code"] == "invalid_request", err
        assert "unknown conversation" in err["message"]
        owner = await scalar(db, select(Conversation.tenant_id).where(Conversation.id == conv_id))
        assert owner is not None and owner != await _tenant_of(db, key_b)
    finally:
        await a.ws.close()
        await b.ws.close()


async def test_auto_routes_and_reports_route_and_reason(conv_stack: Stack) -> None:
    """model "auto": a plain question goes small, a reasoning one large; done says which, why."""
    _, _, key = await new_tenant(conv_stack.services.database_url)
    c = await client(conv_stack, key)
    try:
        plain: dict[str, Any] = await ask(c, "r1", "hello there", model="auto")
        hard: dict[str, Any] = await ask(c, "r2", "Explain step by step why TLS needs a handshake",
                                         model="auto")  # fmt: skip
        assert (plain["model"], plain["route"], plain["route_reason"]) == (
            "small",
            "small",
            "default",
        )
        assert (hard["model"], hard["route"], hard["route_reason"]) == (
            "large",
            "large",
            "reasoning",
        )
    finally:
        await c.ws.close()


async def _tenant_of(database_url: str, key: str) -> str | None:
    from shared.db.apikeys import hash_key
    from shared.db.models import ApiKey

    return await scalar(
        database_url, select(ApiKey.tenant_id).where(ApiKey.key_hash == hash_key(key))
    )  # type: ignore[no-any-return]
