"""A usage row, built in one place (shared/usage_row.py): the analysts' fields (cost at the
model's prices, user, tags, cache tier) for an answered, cached or lost chat alike."""

from __future__ import annotations

import pytest

from gateway.lostchats import LostChat
from shared.modeltable import ModelTable, parse_models
from shared.protocol import Message
from shared.tasks import ChatJob
from shared.usage_row import Ending, usage_row
from workers.chat.record import Outcome
from workers.engines.openai_engine import _cached_tokens

TABLE = parse_models(
    '[{"name": "priced", "engine": "sim", "prices": {"input": 1, "output": 4, "cached_input": 0}},'
    ' {"name": "free", "engine": "sim"}]'
)
JOB = ChatJob(
    job_id="j",
    chat_id="c",
    tenant_id="t",
    key_id="k",
    messages=[Message(role="user", content="hi")],
    max_tokens=8,
    conversation_id="conv-1",
    user="u-9",
    tags=["beta"],
    received_at=0.0,
    enqueued_at=0.0,
    deadline_at=1.0,
)


def analytics_fields(table: ModelTable, job: ChatJob, ending: Ending) -> dict[str, object]:
    row = usage_row(table, job, ending, queue_ms=None, ttft_ms=None, total_ms=None, now=0.0)
    keys = ("cost", "end_user", "tags", "conversation_id", "cache_tier", "cached_prompt_tokens")
    return {k: getattr(row, k) for k in keys}


def test_fields_carry_the_jobs_user_tags_conversation_and_the_outcomes_tier() -> None:
    """end_user, tags and conversation_id come from the job; tier and cached tokens from the
    outcome; cost is the priced model's tokens at its prices (cached prompt tokens free)."""
    outcome = Outcome(
        "priced", "stop", "ok", 1000, 100, cache_tier="miss", cached_prompt_tokens=200
    )
    fields = analytics_fields(TABLE, JOB, outcome)
    assert fields == {
        "cost": pytest.approx((800 * 1 + 100 * 4) / 1e6),
        "end_user": "u-9",
        "tags": ["beta"],
        "conversation_id": "conv-1",
        "cache_tier": "miss",
        "cached_prompt_tokens": 200,
    }


def test_an_unpriced_or_unknown_model_costs_null() -> None:
    """No prices (or a model the table does not hold, e.g. an unrouted `auto`): cost None."""
    for model in ("free", "auto"):
        assert analytics_fields(TABLE, JOB, Outcome(model, "stop", "ok", 10, 10))["cost"] is None


def test_an_answer_from_the_cache_costs_zero_of_a_priced_model() -> None:
    """A cache hit used no engine: 0 at the model's prices, not its tokens' price."""
    hit = Outcome("priced", "stop", "ok", 0, 50, cached=True, cache_tier="exact")
    assert analytics_fields(TABLE, JOB, hit)["cost"] == 0.0


def test_a_lost_chats_row_has_the_same_fields_as_a_workers() -> None:
    """The gateway's row of a chat whose worker died carries the job's user, tags and
    conversation and its cost, as a worker's row would (one builder for every ending)."""
    lost = LostChat(model="priced", prompt_tokens=1000, completion_tokens=100)
    row = usage_row(TABLE, JOB, lost, queue_ms=None, ttft_ms=1.0, total_ms=2.0, now=3.0)
    assert (row.status, row.finish_reason, row.cached) == ("error", "engine_error", False)
    assert (row.end_user, row.tags, row.conversation_id) == ("u-9", ["beta"], "conv-1")
    assert row.cost == pytest.approx((1000 * 1 + 100 * 4) / 1e6)
    assert (row.prompt_tokens, row.completion_tokens) == (1000, 100)


def test_the_row_names_the_door_the_chat_came_in_by() -> None:
    """websocket, openai or responses, as the gateway wrote it into the job."""
    job = JOB.model_copy(update={"door": "responses"})
    row = usage_row(TABLE, job, Outcome("free", "stop", "ok"), queue_ms=None, ttft_ms=None,
                    total_ms=None, now=0.0)  # fmt: skip
    assert row.door == "responses"


@pytest.mark.parametrize(
    ("usage", "cached"),
    [
        ({"prompt_tokens": 9, "prompt_tokens_details": {"cached_tokens": 4}}, 4),
        ({"prompt_tokens": 9, "prompt_tokens_details": None}, None),
        ({"prompt_tokens": 9}, None),
        ({"prompt_tokens_details": {"cached_tokens": True}}, None),
    ],
)
def test_the_openai_engine_reads_cached_tokens_only_where_reported(
    usage: dict[str, object], cached: int | None
) -> None:
    """usage.prompt_tokens_details.cached_tokens, else None (never a made-up 0)."""
    assert _cached_tokens(usage) == cached
