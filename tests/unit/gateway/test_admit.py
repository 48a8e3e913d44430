"""The gateway's admission rules for a new chat, without sockets, Redis or settings files."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from gateway.admit import Admitted, admit_chat, check_new_chat
from gateway.rates import Limits, estimate_prompt_tokens
from shared.errors import InvalidRequest, Overloaded
from shared.modeltable import parse_models
from shared.protocol import ChatFrame

MODELS = parse_models(
    [{"name": "small", "engine": "sim", "role": "small"}, {"name": "large", "engine": "sim"}],
    default="large",
)


@dataclass(frozen=True)
class Rules:
    max_tokens_default: int = 100
    max_tokens_limit: int = 1000
    max_message_chars: int = 50
    max_streams_per_connection: int = 2


RULES = Rules()
NO_LIMITS = Limits()


def chat(**fields: Any) -> ChatFrame:
    data: dict[str, Any] = {
        "type": "chat",
        "id": "c1",
        "messages": [{"role": "user", "content": "hello"}],
        **fields,
    }
    return ChatFrame.model_validate(data)


def admit(
    frame: ChatFrame,
    *,
    running: tuple[str, ...] = (),
    rules: Rules = RULES,
    limits: Limits = NO_LIMITS,
) -> Admitted:
    return admit_chat(frame, running=running, rules=rules, models=MODELS, limits=limits)


def test_a_plain_chat_is_admitted_with_the_default_max_tokens_and_its_reservation() -> None:
    estimate = estimate_prompt_tokens(["hello"])
    assert admit(chat()) == Admitted(
        max_tokens=100,
        prompt_estimate=estimate,
        reserved=estimate + 100,
        new_conversation=False,
    )


def test_the_clients_max_tokens_is_kept_when_it_is_within_the_limit() -> None:
    assert admit(chat(max_tokens=1000)).max_tokens == 1000


def test_max_tokens_over_the_limit_is_refused_naming_the_limit() -> None:
    with pytest.raises(InvalidRequest, match="max_tokens 1001 is over the limit of 1000"):
        admit(chat(max_tokens=1001))


def test_a_default_max_tokens_over_the_limit_is_refused_too() -> None:
    with pytest.raises(InvalidRequest, match="max_tokens 100 is over the limit of 10"):
        admit(chat(), rules=Rules(max_tokens_limit=10))


def test_a_chat_whose_last_message_is_not_from_the_user_is_refused() -> None:
    frame = chat(
        messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    )
    with pytest.raises(InvalidRequest, match="last message must have role 'user'"):
        admit(frame)


def test_an_unknown_model_is_refused_listing_the_served_ones() -> None:
    with pytest.raises(InvalidRequest, match=r"unknown model 'huge'.*small, large"):
        admit(chat(model="huge"))


def test_a_known_model_no_model_and_auto_are_all_admitted() -> None:
    assert admit(chat(model="small")).max_tokens == 100
    assert admit(chat()).max_tokens == 100
    assert admit(chat(model="auto")).max_tokens == 100


def test_a_new_conversation_is_flagged_and_a_continued_one_is_not() -> None:
    assert admit(chat(conversation_id="new")).new_conversation is True
    assert admit(chat(conversation_id="abc123")).new_conversation is False


def test_a_message_longer_than_the_character_limit_is_refused_naming_it() -> None:
    frame = chat(
        messages=[{"role": "system", "content": "s" * 51}, {"role": "user", "content": "hi"}]
    )
    with pytest.raises(InvalidRequest, match=r"messages\[0\] has 51 characters; the limit is 50"):
        admit(frame)


def test_a_chat_that_can_never_fit_the_keys_tokens_per_minute_is_refused() -> None:
    reserved = estimate_prompt_tokens(["hello"]) + 100
    with pytest.raises(InvalidRequest, match=rf"needs up to {reserved} tokens.*lower max_tokens"):
        admit(chat(), limits=Limits(key_tpm=reserved - 1))


def test_a_chat_over_the_tenants_tokens_per_minute_is_refused_naming_that_limit() -> None:
    with pytest.raises(InvalidRequest, match="than the 50 tokens per minute"):
        admit(chat(), limits=Limits(key_tpm=10_000, tenant_tpm=50))


def test_a_chat_that_exactly_fits_the_tokens_per_minute_is_admitted() -> None:
    reserved = estimate_prompt_tokens(["hello"]) + 100
    assert admit(chat(), limits=Limits(key_tpm=reserved, tenant_tpm=reserved)).reserved == reserved


def test_a_chat_id_already_running_on_the_connection_is_refused() -> None:
    with pytest.raises(InvalidRequest, match="'c1' is already running on this connection"):
        admit(chat(), running=("c1",))


def test_a_connection_at_its_chat_limit_is_overloaded_and_told_to_wait() -> None:
    with pytest.raises(Overloaded, match="already runs 2 chats; wait for one to finish"):
        admit(chat(), running=("a", "b"))


def test_check_new_chat_admits_a_free_id_on_a_connection_with_room() -> None:
    check_new_chat("c", {"a"}, 2)


def test_the_first_broken_rule_is_the_one_reported() -> None:
    """A duplicate id is reported before a bad max_tokens, and that before a bad model."""
    with pytest.raises(InvalidRequest, match="already running"):
        admit(chat(max_tokens=5000, model="huge"), running=("c1",))
    with pytest.raises(InvalidRequest, match="max_tokens 5000"):
        admit(chat(max_tokens=5000, model="huge"))


@pytest.mark.parametrize("blank", ["", "   ", "\n\t ", "\u3000"])
def test_a_blank_last_user_message_is_refused_before_anything_is_enqueued(blank: str) -> None:
    frame = chat(
        messages=[{"role": "user", "content": "earlier"}, {"role": "user", "content": blank}]
    )
    with pytest.raises(InvalidRequest, match="the last user message is empty"):
        admit(frame)


def test_a_question_after_blank_earlier_messages_is_admitted() -> None:
    frame = chat(messages=[{"role": "system", "content": " "}, {"role": "user", "content": "hi"}])
    assert admit(frame).max_tokens == 100
