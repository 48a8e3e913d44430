"""The wire protocol parser and encoders, without sockets."""

from __future__ import annotations

import json

import pytest

from shared.errors import InvalidRequest
from shared.protocol import (
    ChatFrame,
    TokenFrame,
    decode_chunk,
    encode_chunk,
    encode_token,
    frame_id,
    parse_client_frame,
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
    assert TokenFrame.model_validate_json(raw).text == 'he said "hi" 你好'
    assert decode_chunk(encode_chunk("T", raw, 3)) == ("T", 3, raw)
    assert decode_chunk(encode_chunk("D", "{}")) == ("D", None, "{}")
