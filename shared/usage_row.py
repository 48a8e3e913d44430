"""The analysts' fields of a chat's usage row (issue 32): cost, end user, tags, conversation,
cache tier and the engine's cached prompt tokens. `workers/chat/record.py` adds them to the row."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from shared.errors import InvalidRequest
from shared.pricing import Prices, request_cost
from shared.tasks import ChatJob

if TYPE_CHECKING:
    from shared.modeltable import ModelTable


class Ending(Protocol):
    """What this needs of how a chat ended (workers/chat/record.py's Outcome; a protocol, so the
    two modules do not import each other)."""

    @property
    def model(self) -> str: ...
    @property
    def prompt_tokens(self) -> int: ...
    @property
    def completion_tokens(self) -> int: ...
    @property
    def cached(self) -> bool: ...
    @property
    def cache_tier(self) -> str | None: ...
    @property
    def cached_prompt_tokens(self) -> int | None: ...


def prices_of(models: ModelTable, model: str) -> Prices | None:
    """The prices of `model`, None for one without prices or not in the table (a chat that
    failed before `auto` was routed still names `auto`)."""
    try:
        return models.get(model).prices
    except InvalidRequest:
        return None


def analytics_fields(models: ModelTable, job: ChatJob, outcome: Ending) -> dict[str, Any]:
    """The UsageRecord fields from the job (what the client sent) and how the chat ended.

    `cost` is what the engine work cost at the model's prices: an answer from firsttoken's own
    cache used no engine, so it costs 0 (of a priced model; still NULL of an unpriced one).
    """
    prices = prices_of(models, outcome.model)
    if outcome.cached:
        cost = request_cost(prices, 0, 0)
    else:
        cost = request_cost(
            prices, outcome.prompt_tokens, outcome.completion_tokens, outcome.cached_prompt_tokens
        )
    return {
        "cost": cost,
        "end_user": job.user,
        "tags": job.tags,
        "conversation_id": job.conversation_id,
        "cache_tier": outcome.cache_tier,
        "cached_prompt_tokens": outcome.cached_prompt_tokens,
    }
