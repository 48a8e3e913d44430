"""Drafts (issue 34): the frame's validation, the coalescing and load decisions, the job."""

from __future__ import annotations

import json

import pytest

from shared.drafts import (
    draft_chat_job,
    draft_fingerprint,
    draft_messages,
    draft_scope,
    gateway_drops,
    grew_enough,
    prefill_verdict,
)
from shared.errors import ErrorCode, InvalidDraft, InvalidRequest, error_frame
from shared.keys import Keys
from shared.protocol import DraftFrame, Message, frame_id, parse_client_frame
from shared.tasks import DraftJob
from workers.chat.consumer import priority_lists


def parse(frame: dict[str, object]) -> object:
    return parse_client_frame(json.dumps(frame), max_bytes=4096, max_messages=4)


def test_a_draft_of_a_server_kept_conversation_parses() -> None:
    frame = parse({"type": "draft", "id": "d1", "conversation_id": "abc", "text": "how do"})
    assert isinstance(frame, DraftFrame)
    assert (frame.conversation_id, frame.messages, frame.text) == ("abc", None, "how do")


def test_a_draft_of_a_first_message_sends_empty_messages() -> None:
    frame = parse({"type": "draft", "id": "d1", "messages": [], "text": "hi", "model": "sim"})
    assert isinstance(frame, DraftFrame)
    assert draft_messages(frame) == [Message(role="user", content="hi")]


def test_a_draft_with_history_puts_the_typed_text_last() -> None:
    frame = parse(
        {
            "type": "draft",
            "id": "d1",
            "messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}],
            "text": "c",
        }
    )
    assert isinstance(frame, DraftFrame)
    assert [m.content for m in draft_messages(frame)] == ["a", "b", "c"]


@pytest.mark.parametrize(
    ("frame", "says"),
    [
        ({"type": "draft", "id": "d", "text": "x"}, "exactly one of conversation_id"),
        (
            {"type": "draft", "id": "d", "text": "x", "messages": [], "conversation_id": "c"},
            "exactly one of conversation_id",
        ),
        ({"type": "draft", "id": "d", "text": "x", "conversation_id": "new"}, "messages: []"),
        ({"type": "draft", "id": "d", "text": "", "messages": []}, "text"),
        ({"type": "draft", "id": "d", "text": 5, "messages": []}, "not a number"),
        ({"type": "draft", "id": "d", "text": "x", "messages": [], "max_tokens": 5}, "max_tokens"),
    ],
)
def test_a_malformed_draft_is_an_invalid_draft_naming_its_id(
    frame: dict[str, object], says: str
) -> None:
    with pytest.raises(InvalidDraft) as info:
        parse(frame)
    assert says in info.value.message
    wire = error_frame(frame_id(json.dumps(frame)), info.value)
    assert (wire["id"], wire["code"]) == ("d", ErrorCode.INVALID_DRAFT.value)
    assert wire["code"] == "invalid_draft"


def test_a_draft_with_too_many_messages_is_an_invalid_draft() -> None:
    many = [{"role": "user", "content": "a"}] * 5
    with pytest.raises(InvalidDraft, match="too many messages"):
        parse({"type": "draft", "id": "d", "text": "x", "messages": many})


def test_a_malformed_chat_is_still_an_invalid_request_not_a_draft_error() -> None:
    with pytest.raises(InvalidRequest) as info:
        parse({"type": "chat", "id": "c", "messages": []})
    assert not isinstance(info.value, InvalidDraft)


def test_drafts_coalesce_per_conversation_under_their_key() -> None:
    assert draft_scope("k1", "conv", "gw:1") == draft_scope("k1", "conv", "gw:2")
    assert draft_scope("k1", "conv", "gw:1") != draft_scope("k2", "conv", "gw:1")
    # Without a server-kept conversation, a socket is one typing user.
    assert draft_scope("k1", None, "gw:1") != draft_scope("k1", None, "gw:2")


def test_a_draft_is_sent_on_only_once_it_adds_enough_to_the_last_one_sent() -> None:
    assert grew_enough(None, (1, "hello"), 48)  # the first: it prefills the history
    assert not grew_enough((1, "hello"), (1, "hello world"), 48)  # a word more: nothing kept
    assert grew_enough((1, "hello"), (1, "hello " + "x" * 48), 48)
    assert grew_enough((1, "hello there"), (1, "hello"), 48)  # deleted: not an extension
    assert grew_enough((1, "hello"), (2, "hello world"), 48)  # another history
    assert grew_enough((1, "hello"), (1, "hello world"), 0)  # 0: every draft


def test_a_drafts_fingerprint_is_its_history() -> None:
    def frame(**kw: object) -> DraftFrame:
        parsed = parse({"type": "draft", "id": "d", "text": "t", **kw})
        assert isinstance(parsed, DraftFrame)
        return parsed

    one = [{"role": "user", "content": "a"}]
    assert draft_fingerprint(frame(messages=one)) == draft_fingerprint(frame(messages=one))
    assert draft_fingerprint(frame(messages=one)) != draft_fingerprint(frame(messages=[]))
    assert draft_fingerprint(frame(conversation_id="a")) != draft_fingerprint(
        frame(conversation_id="b")
    )


def test_the_gateway_drops_drafts_while_off_or_while_the_connection_streams_a_chat() -> None:
    assert not gateway_drops(enabled=True, chats_on_connection=0)
    assert gateway_drops(enabled=False, chats_on_connection=0)
    assert gateway_drops(enabled=True, chats_on_connection=1)


VERDICT = {
    "job_id": "j1",
    "latest": "j1",
    "now": 100.0,
    "enqueued_at": 99.5,
    "max_age_s": 2.0,
    "busy": 0,
    "slots": 8,
    "share": 0.5,
}


def test_a_worker_prefills_the_newest_fresh_draft_when_it_has_room() -> None:
    assert prefill_verdict(**VERDICT) == "prefill"  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("change", "verdict"),
    [
        ({"latest": "j2"}, "superseded"),
        ({"latest": None}, "superseded"),  # the chat was sent: the gateway forgot the drafts
        ({"enqueued_at": 97.0}, "stale"),
        ({"busy": 4}, "busy"),
        ({"busy": 1, "slots": 1}, "busy"),
    ],
)
def test_a_worker_drops_a_superseded_stale_or_busy_draft(
    change: dict[str, object], verdict: str
) -> None:
    assert prefill_verdict(**{**VERDICT, **change}) == verdict  # type: ignore[arg-type]


def test_the_prefill_job_is_the_chat_the_draft_would_be_with_one_token() -> None:
    draft = DraftJob(
        job_id="j",
        draft_id="d",
        scope="s",
        tenant_id="t",
        key_id="k",
        messages=[Message(role="user", content="hi")],
        model="auto",
        conversation_id="c",
        enqueued_at=5.0,
    )
    job = draft_chat_job(draft, now=6.0, deadline_s=3.0)
    assert (job.max_tokens, job.cache, job.model, job.conversation_id) == (1, False, "auto", "c")
    assert (job.messages, job.deadline_at, job.new_conversation) == (draft.messages, 9.0, False)


def test_drafts_wait_on_the_chat_queues_lowest_priority_list() -> None:
    keys = Keys("ft")
    lists = priority_lists(keys.queue_list("chat"))
    assert lists[-1] == keys.draft_list()  # read last: after every chat list
    assert lists[0] != keys.draft_list()
