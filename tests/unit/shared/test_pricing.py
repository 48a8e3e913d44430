"""Request cost from a model's prices per 1M tokens, and prices in the model table."""

from __future__ import annotations

import pytest

from shared.errors import ConfigError
from shared.modeltable import parse_models
from shared.pricing import Prices, request_cost

PRICES = Prices(input=2.0, output=8.0, cached_input=0.5)


def test_cost_is_prompt_and_completion_tokens_at_their_prices() -> None:
    """1M prompt tokens at 2 and 500k completion tokens at 8 cost 6."""
    assert request_cost(PRICES, 1_000_000, 500_000) == pytest.approx(6.0)


def test_cached_prompt_tokens_are_billed_at_the_cached_price() -> None:
    """Of 1000 prompt tokens, 400 cached: 600*2 + 400*0.5 + 100*8, per 1M."""
    assert request_cost(PRICES, 1000, 100, 400) == pytest.approx((1200 + 200 + 800) / 1e6)


def test_cached_price_defaults_to_the_input_price() -> None:
    """Without cached_input, cached tokens cost what other prompt tokens cost."""
    prices = Prices(input=2.0, output=8.0)
    assert request_cost(prices, 1000, 0, 400) == request_cost(prices, 1000, 0)


def test_a_cached_count_above_the_prompt_is_capped_at_the_prompt() -> None:
    """An engine reporting more cached tokens than prompt tokens bills the prompt as cached."""
    assert request_cost(PRICES, 100, 0, 500) == pytest.approx(100 * 0.5 / 1e6)


def test_a_model_without_prices_costs_none_not_zero() -> None:
    """No prices: the cost is unknown (NULL), never 0."""
    assert request_cost(None, 1000, 1000, 10) is None


def test_zero_tokens_at_known_prices_cost_zero() -> None:
    """A request that used no tokens of a priced model cost exactly 0."""
    assert request_cost(PRICES, 0, 0) == 0.0


def test_the_model_table_reads_optional_prices() -> None:
    """`prices` of a FIRSTTOKEN_MODELS entry become its Prices; an entry without has None."""
    table = parse_models(
        '[{"name": "a", "engine": "sim", "prices": {"input": 1, "output": 3}},'
        ' {"name": "b", "engine": "sim"}]'
    )
    assert table.get("a").prices == Prices(input=1.0, output=3.0)
    assert table.get("b").prices is None


@pytest.mark.parametrize(
    ("prices", "needle"),
    [
        ('{"input": -1, "output": 1}', "prices.input"),
        ('{"input": 1}', "prices.output"),
        ('{"input": 1, "output": 1, "cache": 1}', "prices.cache"),
        ('{"input": "1", "output": 1, "cached_input": "x"}', "prices.cached_input"),
    ],
)
def test_bad_prices_fail_naming_the_field(prices: str, needle: str) -> None:
    """A negative, missing, unknown or non-numeric price is a ConfigError naming the field."""
    with pytest.raises(ConfigError, match=needle):
        parse_models(f'[{{"name": "a", "engine": "sim", "prices": {prices}}}]')
