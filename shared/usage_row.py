"""A chat's usage row, built in one place however the chat ended: answered, served from the
cache, cancelled or failed (the chat worker, workers/chat/record.py) or lost with its worker
(the gateway that admitted it, gateway/lostchats.py). Pure: values in, a `UsageRecord` out."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from shared.errors import InvalidRequest
from shared.pricing import Prices, request_cost
from shared.tasks import ChatJob, UsageRecord

if TYPE_CHECKING:
    from shared.modeltable import ModelTable


class Ending(Protocol):
    """How a chat ended, as its usage row records it (workers/chat/record.py's Outcome,
    gateway/lostchats.py's LostChat)."""

    @property
    def model(self) -> str: ...
    @property
    def finish_reason(self) -> str: ...
    @property
    def status(self) -> str: ...  # ok | error | cancelled | timeout
    @property
    def route(self) -> str: ...
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


def usage_row(
    models: ModelTable,
    job: ChatJob,
    ending: Ending,
    *,
    queue_ms: float | None,
    ttft_ms: float | None,
    total_ms: float | None,
    now: float,
) -> UsageRecord:
    """The row of `job` (what the client sent) ended as `ending`.

    `cost` is what the engine work cost at the model's prices: an answer from firsttoken's own
    cache used no engine, so it costs 0 (of a priced model; still NULL of an unpriced one).
    """
    prices = prices_of(models, ending.model)
    if ending.cached:
        cost = request_cost(prices, 0, 0)
    else:
        cost = request_cost(
            prices, ending.prompt_tokens, ending.completion_tokens, ending.cached_prompt_tokens
        )
    return UsageRecord(
        request_id=job.job_id,
        tenant_id=job.tenant_id,
        key_id=job.key_id,
        model=ending.model,
        route=ending.route,
        cached=ending.cached,
        prompt_tokens=ending.prompt_tokens,
        completion_tokens=ending.completion_tokens,
        queue_ms=queue_ms,
        ttft_ms=ttft_ms,
        total_ms=total_ms,
        finish_reason=ending.finish_reason,
        status=ending.status,
        created_at=now,
        cost=cost,
        end_user=job.user,
        tags=job.tags,
        conversation_id=job.conversation_id,
        cache_tier=ending.cache_tier,
        cached_prompt_tokens=ending.cached_prompt_tokens,
        door=job.door,
    )
