"""The model table: parsing, validation messages, defaults, lookups and fallback chains."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shared.errors import ConfigError, InvalidRequest
from shared.modeltable import default_table, load_models, parse_models
from shared.settings import load_settings

TWO = [
    {
        "name": "small",
        "engine": "openai",
        "url": "http://a:8100/v1",
        "served_model": "Qwen/Qwen3-1.7B",
        "role": "small",
        "fallbacks": ["large"],
    },
    {"name": "large", "engine": "openai", "url": "http://b:8100/v1", "role": "large"},
]


def test_parse_keeps_order_fields_and_first_is_default() -> None:
    """A JSON list becomes a table in order; the first model is the default."""
    table = parse_models(json.dumps(TWO))
    assert table.names == ["small", "large"] and table.default == "small"
    small = table.get("small")
    assert small.engine_model == "Qwen/Qwen3-1.7B" and small.role == "small"
    assert table.get("large").engine_model == "large"  # served name defaults to the name
    assert table.get(None) is small


def test_chain_is_the_model_then_its_own_fallbacks() -> None:
    """The chain is the asked model followed by its fallbacks, each once."""
    models = [
        {"name": "a", "engine": "sim", "fallbacks": ["b", "c", "b"]},
        {"name": "b", "engine": "sim", "fallbacks": ["c"]},
        {"name": "c", "engine": "sim"},
    ]
    table = parse_models(models)
    assert [m.name for m in table.chain("a")] == ["a", "b", "c"]
    assert [m.name for m in table.chain("b")] == ["b", "c"]
    assert [m.name for m in table.chain("c")] == ["c"]


def test_unknown_model_is_invalid_request_listing_known_models() -> None:
    """Asking for a model the table lacks is the client's error and names what exists."""
    table = parse_models(TWO)
    with pytest.raises(InvalidRequest) as err:
        table.get("gpt-9")
    assert "gpt-9" in err.value.message and "small, large" in err.value.message


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        ("not json", "not valid JSON"),
        ('{"name": "a"}', "must be a JSON list"),
        ("[]", "empty"),
        ('[{"name": "a", "engine": "openai"}]', "needs a url"),
        ('[{"name": "a", "engine": "vllm"}]', "needs a model_path"),
        ('[{"name": "a", "engine": "sim", "fallbacks": ["zz"]}]', "unknown model(s) zz"),
        ('[{"name": "a", "engine": "sim", "fallbacks": ["a"]}]', "itself"),
        ('[{"name": "a", "engine": "sim"}, {"name": "a", "engine": "sim"}]', "twice"),
        ('[{"name": "a", "engine": "sim", "role": "medium"}]', "role"),
        ('[{"name": "a", "engine": "sim", "colour": "red"}]', "colour"),
    ],
)
def test_bad_tables_fail_with_a_message_saying_what(raw: str, needle: str) -> None:
    """Each malformed table raises ConfigError that says what to fix."""
    with pytest.raises(ConfigError) as err:
        parse_models(raw)
    assert needle in str(err.value)


def test_default_table_is_one_model_from_the_engine_settings() -> None:
    """With no table configured, the FIRSTTOKEN_ENGINE* settings make one model."""
    settings = load_settings(
        engine="openai", engine_url="http://x:1/v1", engine_model="m", models=None
    )
    table = load_models(settings)
    assert len(table) == 1
    spec = table.get(None)
    assert (spec.name, spec.engine, spec.url, spec.engine_model) == (
        "m",
        "openai",
        "http://x:1/v1",
        "m",
    )
    assert default_table(settings).names == ["m"]


def test_settings_take_the_table_from_json_or_a_file(tmp_path: Path) -> None:
    """FIRSTTOKEN_MODELS wins; else FIRSTTOKEN_MODELS_FILE; DEFAULT_MODEL picks the default."""
    path = tmp_path / "models.json"
    path.write_text(json.dumps(TWO))
    from_file = load_models(load_settings(models_file=str(path), default_model="large"))
    assert from_file.names == ["small", "large"] and from_file.default == "large"
    inline = load_models(load_settings(models=json.dumps(TWO[1:]), models_file=str(path)))
    assert inline.names == ["large"]


def test_bad_table_stops_settings_at_start_up() -> None:
    """An invalid table, file or default model is a ConfigError when settings load."""
    with pytest.raises(ConfigError, match="FIRSTTOKEN_MODELS"):
        load_settings(models='[{"name": "a", "engine": "openai"}]')
    with pytest.raises(ConfigError, match="cannot read"):
        load_settings(models_file="/nonexistent/models.json")
    with pytest.raises(ConfigError, match="DEFAULT_MODEL"):
        load_settings(models=json.dumps(TWO), default_model="nope")


def test_public_listing_hides_urls_and_marks_the_default() -> None:
    """GET /v1/models data: names, roles, fallbacks, the default flag; no URLs or keys."""
    listing = parse_models(TWO).public()
    assert listing["object"] == "list"
    first = listing["data"][0]
    assert first["id"] == "small" and first["default"] is True
    assert first["fallbacks"] == ["large"] and first["role"] == "small"
    assert "url" not in json.dumps(listing) and "http://" not in json.dumps(listing)


def test_models_on_one_server_share_an_engine_key() -> None:
    """Entries on the same URL and key share one engine client; others do not."""
    table = parse_models(
        [
            {"name": "a", "url": "http://s/v1", "served_model": "x"},
            {"name": "b", "url": "http://s/v1", "served_model": "y"},
            {"name": "c", "url": "http://t/v1"},
        ]
    )
    a, b, c = (table.get(n) for n in ("a", "b", "c"))
    assert a.engine_key == b.engine_key != c.engine_key
