"""What a cache verification's engine call is charged and billed (workers/cache/charge.py, issue
45): the pure parts (limits, reservation, settlement, the usage row)."""

from __future__ import annotations

import pytest

from shared.modeltable import parse_models
from shared.protocol import Message
from shared.ratewindow import estimate_prompt_tokens
from shared.settings import Settings
from shared.tasks import ChatJob
from workers.cache.charge import Answered, charged, request_id, reservation, tenant_limits
from workers.cache.charge import usage_row as verify_row

TABLE = parse_models(
    '[{"name": "priced", "engine": "sim", "prices": {"input": 1, "output": 4, "cached_input": 0}},'
    ' {"name": "free", "engine": "sim"}]'
)
MESSAGES = [Message(role="user", content="How do I reset my password?")]


def job(**fields: object) -> ChatJob:
    values: dict[str, object] = {
        "job_id": "j1",
        "chat_id": "c",
        "tenant_id": "t",
        "key_id": "k",
        "messages": MESSAGES,
        "max_tokens": 64,
        "conversation_id": "conv-1",
        "user": "u-9",
        "tags": ["beta"],
        "door": "openai",
        "received_at": 0.0,
        "enqueued_at": 0.0,
        "deadline_at": 1.0,
        **fields,
    }
    return ChatJob.model_validate(values)


def test_the_tenants_limits_are_the_gateways_else_the_deployments_defaults() -> None:
    settings = Settings(tenant_rpm_default=3000, tenant_tpm_default=1_000_000)
    assert tenant_limits(job(tenant_rpm=2, tenant_tpm=500), settings) == (2, 500)
    assert tenant_limits(job(tenant_rpm=0, tenant_tpm=0), settings) == (0, 0)  # none: unlimited
    assert tenant_limits(job(), settings) == (3000, 1_000_000)  # an older gateway's job


def test_a_call_reserves_what_the_gateway_reserves_for_a_chat() -> None:
    """The gateway's prompt estimate plus the longest answer allowed."""
    assert reservation(MESSAGES, 64) == estimate_prompt_tokens([MESSAGES[0].content]) + 64
    assert reservation(MESSAGES, 64) == 7 + 4 + 64


def test_a_call_keeps_charged_what_the_engine_counted_else_its_reservation() -> None:
    assert charged(Answered("x", "stop", prompt_tokens=12, completion_tokens=30), 75) == 42
    assert charged(Answered("x", "stop"), 75) == 75  # no usage reported: the stricter
    assert charged(Answered("x", "stop", prompt_tokens=12), 75) == 75


def test_each_call_of_a_job_has_its_own_id_apart_from_the_chats_row() -> None:
    ids = {request_id(job(), "reask"), request_id(job(), "judge"), "j1"}
    assert len(ids) == 3


def test_the_row_is_billed_to_the_chats_tenant_and_marked_door_verify() -> None:
    """Tokens and cost as the engine counted them; the chat's key, user, tags and
    conversation; door `verify` (its door is the chat's, not the client's), no cache tier."""
    answered = Answered(
        "fresh", "length", prompt_tokens=1000, completion_tokens=100, cached_prompt_tokens=200
    )
    row = verify_row(
        TABLE, job(), "reask", "priced", answered, prompt_estimate=11, started=10.0, finished=10.5
    )
    assert (row.request_id, row.tenant_id, row.key_id, row.model) == (
        "j1-reask",
        "t",
        "k",
        "priced",
    )
    assert (row.door, row.route, row.status, row.finish_reason) == (
        "verify",
        "verify",
        "ok",
        "length",
    )
    assert (row.prompt_tokens, row.completion_tokens, row.cached_prompt_tokens) == (1000, 100, 200)
    assert row.cost == pytest.approx((800 * 1 + 100 * 4) / 1e6)
    assert (row.end_user, row.tags, row.conversation_id) == ("u-9", ["beta"], "conv-1")
    assert row.cache_tier is None and row.cached is False
    assert row.total_ms == pytest.approx(500.0) and row.created_at == 10.5


def test_the_judges_row_has_its_own_route_and_an_estimate_where_the_engine_counted_none() -> None:
    row = verify_row(
        TABLE,
        job(),
        "judge",
        "free",
        Answered("Yes.", "stop"),
        prompt_estimate=90,
        started=0,
        finished=1,
    )
    assert (row.request_id, row.route, row.door) == ("j1-judge", "verify-judge", "verify")
    assert (row.prompt_tokens, row.completion_tokens, row.cost) == (90, 0, None)
