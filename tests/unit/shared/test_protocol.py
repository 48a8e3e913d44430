"""The wire protocol parser and encoders, without sockets."""

from __future__ import annotations

import json

import pytest

from shared.errors import InvalidRequest, RateLimited, error_frame
from shared.protocol import (
    ChatFrame,
    decode_chunk,
    done_chunk,
    done_frame,
    dumps,
    encode_accepted,
    encode_chunk,
    encode_pong,
    encode_started,
    encode_token,
    frame_id,
    parse_client_frame,
    parse_server_frame,
)


def parse(raw: str) -> object:
    return parse_client_frame(raw, max_bytes=4096, max_messages=4)


def test_valid_chat_frame_parses_with_defaults() -> None:
    """A minimal chat frame parses; cache defaults to true."""
    frame = parse('{"type":"chat","id":"a","messages":[{"role":"user","content":"hi"}]}')
    assert isinstance(frame, ChatFrame) and frame.cache is True and frame.max_tokens is None


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        ("{", "not valid JSON"),
        ("42", "JSON object"),
        ('{"type":"nope"}', "unknown frame type 'nope'"),
        ('{"id":"a"}', "unknown frame type None"),
        ('{"type":"chat","id":"a","messages":[]}', "messages"),
        ('{"type":"chat","id":"","messages":[{"role":"user","content":"x"}]}', "id"),
        ('{"type":"chat","id":"a","messages":[{"role":"robot","content":"x"}]}', "role"),
        ('{"type":"chat","id":"a","messages":[{"role":"user","content":"x"}],"extra":1}', "extra"),
        (
            '{"type":"chat","id":"a","messages":[{"role":"user","content":"x"}],"temperature":9}',
            "temperature",
        ),
        ('{"type":"resume","id":"a"}', "job_id"),
    ],
)
def test_bad_frames_raise_invalid_request_naming_the_problem(raw: str, needle: str) -> None:
    """Every malformed frame raises InvalidRequest whose message names what is wrong."""
    with pytest.raises(InvalidRequest) as info:
        parse(raw)
    assert needle in info.value.message


CHAT = {"type": "chat", "id": "a", "messages": [{"role": "user", "content": "x"}]}
COERCIBLE = [
    ({"max_tokens": "5"}, "max_tokens: Input should be a valid integer, not a string"),
    ({"max_tokens": True}, "max_tokens: Input should be a valid integer, not a boolean"),
    ({"max_tokens": 5.0}, "max_tokens: Input should be a valid integer, not a decimal number"),
    ({"cache": "yes"}, "cache: Input should be a valid boolean, not a string"),
    ({"cache": 1}, "cache: Input should be a valid boolean, not a number"),
    ({"temperature": "0.5"}, "temperature: Input should be a valid number, not a string"),
    ({"temperature": True}, "temperature: Input should be a valid number, not a boolean"),
    ({"model": 5}, "model: Input should be a valid string, not a number"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages.0.content"),
    ({"conversation_id": "c\x00"}, "conversation_id: must be an id the server returned"),
]


@pytest.mark.parametrize(("extra", "needle"), COERCIBLE, ids=[str(e) for e, _ in COERCIBLE])
def test_wire_types_are_strict_and_the_error_names_the_field(
    extra: dict[str, object], needle: str
) -> None:
    """A string is not a number, a number or string is not a boolean, a boolean is not an
    integer: refused as invalid_request naming the field, never coerced."""
    with pytest.raises(InvalidRequest) as info:
        parse(json.dumps({**CHAT, **extra}))
    assert info.value.code.value == "invalid_request"
    assert needle in info.value.message


def test_an_integer_is_still_a_valid_float_and_after_seq_must_be_a_number() -> None:
    """temperature: 1 is a number as JSON means it; a resume's after_seq "3" is refused."""
    frame = parse(json.dumps({**CHAT, "temperature": 1, "max_tokens": 5, "cache": False}))
    assert isinstance(frame, ChatFrame)
    assert (frame.temperature, frame.max_tokens, frame.cache) == (1.0, 5, False)
    with pytest.raises(InvalidRequest, match=r"after_seq: .* not a string"):
        parse('{"type":"resume","id":"a","job_id":"j","after_seq":"3"}')


def test_size_and_message_count_limits() -> None:
    """Frames over the byte limit or with too many messages are refused before validation."""
    with pytest.raises(InvalidRequest, match="limit is 4096"):
        parse('{"type":"ping","id":"' + "x" * 5000 + '"}')
    msgs = json.dumps([{"role": "user", "content": "x"}] * 5)
    with pytest.raises(InvalidRequest, match="too many messages: 5"):
        parse('{"type":"chat","id":"a","messages":' + msgs + "}")


def test_frame_id_is_recovered_from_invalid_frames() -> None:
    """The error for a bad frame names its chat when the id is readable."""
    assert frame_id('{"type":"chat","id":"c7"}') == "c7"
    assert frame_id("not json") is None
    assert frame_id('{"id": 5}') is None


def test_token_encoding_matches_the_schema_and_chunks_round_trip() -> None:
    """encode_token produces a valid TokenFrame; chunk headers carry kind and seq."""
    raw = encode_token("c", 3, 'he said "hi" 你好')
    assert parse_server_frame(raw) == {
        "type": "token",
        "id": "c",
        "seq": 3,
        "text": 'he said "hi" 你好',
    }
    assert decode_chunk(encode_chunk("T", raw, 3)) == ("T", 3, raw)
    assert decode_chunk(encode_chunk("D", "{}")) == ("D", None, "{}")


def test_accepted_and_pong_frames_parse_back_as_the_client_reads_them() -> None:
    """`accepted` names the job (and the conversation when there is one); `pong` echoes the id."""
    assert parse_server_frame(encode_accepted("c", "j1")) == {
        "type": "accepted",
        "id": "c",
        "job_id": "j1",
    }
    assert parse_server_frame(encode_accepted("c", "j1", "conv9")) == {
        "type": "accepted",
        "id": "c",
        "job_id": "j1",
        "conversation_id": "conv9",
    }
    assert parse_server_frame(encode_pong(None)) == {"type": "pong", "id": None}
    assert parse_server_frame(encode_pong("p1")) == {"type": "pong", "id": "p1"}


def test_error_frames_from_the_translator_parse_back_with_their_retry_hint() -> None:
    """error_frame's output is a valid `error` frame; retry_after_ms travels only when set."""
    frame = error_frame("c", RateLimited("slow down", retry_after_ms=250))
    assert parse_server_frame(dumps(frame)) == {
        "type": "error",
        "id": "c",
        "code": "rate_limited",
        "message": "slow down",
        "retry_after_ms": 250,
    }
    assert "retry_after_ms" not in parse_server_frame(dumps(error_frame(None, ValueError("x"))))


def test_done_chunk_becomes_the_wire_done_frame_with_timings_instead_of_points() -> None:
    """The worker's `done` keeps its fields and extras; the gateway's drops points and chunks,
    takes the connection's chat id and adds timings, and a client validates it."""
    usage = {"prompt_tokens": 3, "completion_tokens": 2}
    chunk = done_chunk(
        "old",
        cached=False,
        model="m",
        finish_reason="stop",
        usage={"prompt_tokens": 3, "completion_tokens": 2},
        chunks=2,
        points={"enqueued": 1.0},
        extras={"route": "small", "conversation_id": "conv"},
    )
    assert json.loads(dumps(chunk)) == {
        "type": "done",
        "id": "old",
        "cached": False,
        "model": "m",
        "finish_reason": "stop",
        "usage": usage,
        "chunks": 2,
        "points": {"enqueued": 1.0},
        "route": "small",
        "conversation_id": "conv",
    }
    wire = parse_server_frame(dumps(done_frame(chunk, "new", {"queue": 1.5})))
    assert wire == {
        "type": "done",
        "id": "new",
        "cached": False,
        "model": "m",
        "finish_reason": "stop",
        "usage": usage,
        "route": "small",
        "conversation_id": "conv",
        "timings": {"queue": 1.5},
    }


def test_started_chunk_carries_the_start_time_and_a_failover_only_when_there_is_one() -> None:
    """`started` is {"t": ...}, plus {"failover": {"from", "to"}} when the model changed."""
    assert json.loads(encode_started(1.5)) == {"t": 1.5}
    assert json.loads(encode_started(2.0, {"from": "a", "to": "b"})) == {
        "t": 2.0,
        "failover": {"from": "a", "to": "b"},
    }


def test_a_server_frame_the_client_does_not_know_is_refused_with_what_to_do() -> None:
    """An unknown or malformed server frame raises ValueError telling the user to upgrade."""
    with pytest.raises(ValueError, match="upgrade firsttoken"):
        parse_server_frame('{"type": "telemetry", "id": "c"}')
    with pytest.raises(ValueError, match="upgrade firsttoken"):
        parse_server_frame('{"type": "token", "id": "c", "seq": "x", "text": 1}')


def test_chat_frame_carries_the_end_user_and_tags_for_the_usage_row() -> None:
    """`user` and `tags` (an object of strings or an array of labels) parse as sent."""
    frame = parse(json.dumps({**CHAT, "user": "u-42", "tags": {"team": "search", "exp": ""}}))
    assert isinstance(frame, ChatFrame)
    assert (frame.user, frame.tags) == ("u-42", {"team": "search", "exp": ""})
    frame = parse(json.dumps({**CHAT, "tags": ["beta", "mobile"]}))
    assert isinstance(frame, ChatFrame) and frame.tags == ["beta", "mobile"]


BAD_TAGS = [
    ({"user": 7}, "user: Input should be a valid string, not a number"),
    ({"user": ""}, "user: must not be empty"),
    ({"user": "u" * 257}, "user: is 257 characters; the limit is 256"),
    ({"user": "a\nb"}, "user: must not contain control characters"),
    ({"tags": "beta"}, "tags: must be an object of strings or an array of strings, not a string"),
    ({"tags": {"n": 1}}, "tags: 'n' must be a string, not a number"),
    ({"tags": [1]}, "tags: entry 0 must be a string, not a number"),
    ({"tags": [""]}, "tags: entry 0 must not be empty"),
    ({"tags": ["x" * 65]}, "tags: entry 0 is 65 characters; the limit is 64"),
    ({"tags": {"k" * 65: "v"}}, "tags: a key is 65 characters; the limit is 64"),
    ({"tags": {"k": "v" * 513}}, "tags: 'k' is 513 characters; the limit is 512"),
    ({"tags": [str(i) for i in range(17)]}, "tags: has 17 entries; the limit is 16"),
    ({"tags": {"a\x00": "v"}}, "tags: a key must not contain control characters"),
]


@pytest.mark.parametrize(("extra", "needle"), BAD_TAGS, ids=[str(e)[:40] for e, _ in BAD_TAGS])
def test_bad_user_or_tags_are_invalid_request_saying_what_is_wrong(
    extra: dict[str, object], needle: str
) -> None:
    """A user or tags of the wrong type, too long, too many or with control characters is
    refused as invalid_request with a message naming the field and the limit."""
    with pytest.raises(InvalidRequest) as info:
        parse_client_frame(json.dumps({**CHAT, **extra}), max_bytes=65536, max_messages=4)
    assert info.value.code.value == "invalid_request"
    assert needle in info.value.message
