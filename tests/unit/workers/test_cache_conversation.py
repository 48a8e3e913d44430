"""A turn of a server-stored conversation is keyed on its history as a client-kept one is
(workers/cache/conversation.py, issue 45)."""

from __future__ import annotations

import pytest

from shared.protocol import Message
from shared.tasks import ChatJob
from workers.cache.conversation import stored_turn
from workers.cache.evaluate import SET_NAMES, as_stored, data_dir, load_set
from workers.cache.policy import Policy, Query
from workers.chat.cached import cacheable_at_once, keyed_on_history
from workers.chat.takeover import Takeover
from workers.conversation import StoredMessage, Window, WindowRules, select_window
from workers.prompt.template import summary_line

POLICY = Policy()


def _m(role: str, content: str) -> Message:
    return Message.model_validate({"role": role, "content": content})


def _query(messages: list[Message], tenant: str = "t") -> Query:
    return Query(
        POLICY, tenant=tenant, model="m", embedder="e", messages=messages, max_tokens=64,
        temperature=None,
    )  # fmt: skip


def _keys(q: Query) -> tuple[str, str, str, list[str]]:
    return q.exact, q.partition, q.context, q.embed_texts


SYSTEM = _m("system", "Be brief.")
ORDER = [_m("user", "I ordered a blue jacket, order 48213."), _m("assistant", "Found 48213.")]
OTHER = [_m("user", "I ordered running shoes, order 77120."), _m("assistant", "Found 77120.")]
ASK = _m("user", "Can you cancel it?")


def test_a_stored_turn_is_keyed_as_the_client_kept_turn_with_the_same_history() -> None:
    stored = _query(stored_turn([SYSTEM, ASK], ORDER, None))
    assert _keys(stored) == _keys(_query([SYSTEM, *ORDER, ASK]))
    # The turn's own earlier messages, if the client sends some, come after the stored ones,
    # as the prompt has them.
    more = [_m("user", "And the hat?"), _m("assistant", "Also found.")]
    assert _keys(_query(stored_turn([SYSTEM, *more, ASK], ORDER, None))) == _keys(
        _query([SYSTEM, *ORDER, *more, ASK])
    )


def test_another_history_or_none_is_another_key() -> None:
    stored = _query(stored_turn([ASK], ORDER, None))
    for history in (OTHER, ORDER[:1], []):
        other = _query(stored_turn([ASK], history, None))
        assert other.partition != stored.partition and other.exact != stored.exact
    assert _query(stored_turn([ASK], ORDER, None), tenant="u").exact != stored.exact


def test_a_summary_is_keyed_in_place_of_the_turns_it_replaced() -> None:
    window = ORDER
    with_summary = _query(stored_turn([ASK], window, "The user is Ana, in Lisbon."))
    assert with_summary.partition != _query(stored_turn([ASK], window, None)).partition
    other_summary = _query(stored_turn([ASK], window, "The user is Bo, in Oslo."))
    assert other_summary.partition != with_summary.partition
    # The same summary and window: the same text reached the model, the same key.
    again = _query(stored_turn([ASK], list(window), "The user is Ana, in Lisbon."))
    assert _keys(again) == _keys(with_summary)
    # The summary's line is the one the system message gives it.
    assert summary_line("x") in [m.content for m in stored_turn([ASK], window, "x")]


class _Words:
    name = "words"

    def count(self, text: str) -> int:
        return len(text.split())

    def at_most(self, text: str) -> int | None:
        return None


def test_past_the_window_only_what_is_sent_is_keyed() -> None:
    """Two long conversations that differ only in turns the window no longer sends (and no
    summary yet) send the model the same text: the same key. Differing in the window: not."""

    def rows(first: str) -> list[StoredMessage]:
        turns = [first] + [f"turn {i} " + "word " * 10 for i in range(1, 12)]
        return [
            StoredMessage(i, "user" if i % 2 == 0 else "assistant", text)
            for i, text in enumerate(turns)
        ]

    rules = WindowRules(threshold_tokens=50, recent_messages=4)

    def key(stored: list[StoredMessage], summary: str | None = None) -> str:
        window = select_window(stored, summary, None, rules, _Words())
        return _query(stored_turn([ASK], window.history, window.summary)).partition

    a, b = rows("my order is 48213"), rows("my order is 77120")
    assert key(a) == key(b)
    changed = [*a[:-1], StoredMessage(a[-1].id, a[-1].role, "another last turn")]
    assert key(changed) != key(a)
    assert key(a, "order 48213") != key(a)


def _data_sets() -> list[str]:
    return list(SET_NAMES) if data_dir() is not None else []


@pytest.mark.parametrize("name", _data_sets())
def test_every_conversation_pair_keys_alike_kept_by_the_client_or_stored(name: str) -> None:
    """The conversation sets as `firsttoken cache eval --mode stored` reads them: each side's
    earlier turns stored, its last message sent alone. Every key the judge reads is the
    client-kept one's, so the stored path serves exactly what the client-kept path does."""
    data = data_dir()
    assert data is not None
    pairs = load_set(data, name).files["conversations.jsonl"]
    assert pairs
    histories = 0
    for pair in pairs:
        for messages in (pair.a, pair.b):
            stored = as_stored(messages)
            histories += len(stored) > len([m for m in messages if m.role == "system"]) + 1
            kept = _query(messages)
            assert _keys(_query(stored)) == _keys(kept)
            assert _query(stored).raw_question == kept.raw_question
    assert histories > len(pairs)  # the sets are about follow-ups


def _job(**extra: object) -> ChatJob:
    fields: dict[str, object] = {
        "job_id": "j", "chat_id": "c", "tenant_id": "t", "key_id": "k",
        "messages": [{"role": "user", "content": "Can you cancel it?"}], "max_tokens": 16,
        "conversation_id": "conv", "received_at": 0.0, "enqueued_at": 0.0, "deadline_at": 1e12,
    }  # fmt: skip
    return ChatJob.model_validate(fields | extra)


class _Prepared:
    def __init__(self, ok: bool = True, window: object = True) -> None:
        self.conversation_ok = ok
        self.window = window


def _cacheable(job: ChatJob, prepared: object, takeover: Takeover | None = None) -> bool:
    return keyed_on_history(job, takeover, prepared) is not None  # type: ignore[arg-type]


def test_a_stored_turn_is_looked_up_once_its_history_was_read() -> None:
    window = Window(tuple(ORDER), "Ana, Lisbon.", None, 0)
    keyed = keyed_on_history(_job(), None, _Prepared(window=window))  # type: ignore[arg-type]
    assert keyed is not None and keyed.job_id == "j"
    assert keyed.messages == stored_turn(_job().messages, ORDER, "Ana, Lisbon.")
    assert not _cacheable(_job(cache=False), _Prepared(window=window))
    assert not _cacheable(_job(), _Prepared(ok=False, window=None))  # history not read
    assert not _cacheable(_job(), _Prepared(window=None))
    assert not _cacheable(_job(new_conversation=True), _Prepared(window=window))  # at once
    assert not _cacheable(_job(conversation_id=None), _Prepared(window=window))
    assert not _cacheable(_job(), _Prepared(window=window), Takeover("rerun"))
    # Those looked up at once, alongside retrieval: not a stored turn, nor a takeover.
    assert cacheable_at_once(_job(new_conversation=True), None)
    assert cacheable_at_once(_job(conversation_id=None), None)
    assert not cacheable_at_once(_job(), None)
    assert not cacheable_at_once(_job(conversation_id=None), Takeover("rerun"))
    assert not cacheable_at_once(_job(conversation_id=None, cache=False), None)
