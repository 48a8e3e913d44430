"""What a request cost: a model's prices (per 1M tokens) applied to its token counts. Pure.

A model's ``prices`` live in its model table entry (``FIRSTTOKEN_MODELS``, see
``shared/modeltable.py``)::

    {"name": "large", ..., "prices": {"input": 0.6, "output": 2.4, "cached_input": 0.15}}

Prices are in whatever currency the operator bills in; the usage row keeps only the number. A
model without prices costs ``None`` (NULL in ``usage_events.cost``), never 0: "free" and "we do
not know" must not add up to the same total.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

PER_TOKENS = 1_000_000


class Prices(BaseModel):
    """A model's prices per 1M tokens; ``cached_input`` defaults to ``input``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input: float = Field(ge=0, description="per 1M prompt tokens")
    output: float = Field(ge=0, description="per 1M completion tokens")
    cached_input: float | None = Field(
        None, ge=0, description="per 1M prompt tokens the engine served from its prefix cache"
    )


def request_cost(
    prices: Prices | None,
    prompt_tokens: int,
    completion_tokens: int,
    cached_prompt_tokens: int | None = None,
) -> float | None:
    """The cost of one request, or None for a model without prices.

    ``cached_prompt_tokens`` are part of ``prompt_tokens`` (as OpenAI's
    ``prompt_tokens_details.cached_tokens`` are), billed at ``cached_input``; a count larger than
    the prompt (an engine counting differently) is capped at it.
    """
    if prices is None:
        return None
    cached = min(max(cached_prompt_tokens or 0, 0), prompt_tokens)
    cached_price = prices.input if prices.cached_input is None else prices.cached_input
    total = (
        (prompt_tokens - cached) * prices.input
        + cached * cached_price
        + completion_tokens * prices.output
    )
    return total / PER_TOKENS
