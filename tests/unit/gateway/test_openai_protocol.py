"""gateway/openai_protocol.py: the OpenAI request is validated strictly, answers and errors
come out in OpenAI's shapes."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.openai_protocol import (
    SSE_DONE,
    UNSUPPORTED_PARAMETERS,
    ChunkEncoder,
    InvalidParameter,
    ParsedRequest,
    UnknownModel,
    completion,
    exception_reply,
    frame_reply,
    parse_chat_request,
    sse_error,
)
from shared.errors import (
    DeadlineExceeded,
    EngineError,
    InvalidRequest,
    Overloaded,
    RateLimited,
    Unauthorized,
)

USER = {"role": "user", "content": "hi"}


def parse(body: Any, *, max_bytes: int = 64 * 1024, max_messages: int = 16) -> ParsedRequest:
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    return parse_chat_request(raw, chat_id="c", max_bytes=max_bytes, max_messages=max_messages)


def refused(body: Any, **kw: Any) -> InvalidParameter:
    with pytest.raises(InvalidParameter) as info:
        parse(body, **kw)
    return info.value


def test_a_plain_request_becomes_the_websocket_chat_frame() -> None:
    parsed = parse(
        {
            "model": "auto",
            "messages": [{"role": "developer", "content": "be brief"}, USER],
            "max_completion_tokens": 7,
            "temperature": 1,
            "n": 1,
            "user": "u-1",
        }
    )
    frame = parsed.frame
    assert (frame.id, frame.model, frame.max_tokens, frame.temperature) == ("c", "auto", 7, 1.0)
    assert [(m.role, m.content) for m in frame.messages] == [
        ("system", "be brief"),
        ("user", "hi"),
    ]
    assert frame.cache is True and frame.conversation_id is None
    assert (parsed.stream, parsed.include_usage) == (False, False)


def test_stream_options_and_firsttoken_extras() -> None:
    parsed = parse(
        {
            "model": "m",
            "messages": [USER],
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": 3,
            "x_firsttoken": {"cache": False, "conversation_id": "new"},
        }
    )
    assert (parsed.stream, parsed.include_usage) == (True, True)
    assert parsed.frame.max_tokens == 3
    assert parsed.frame.cache is False and parsed.frame.conversation_id == "new"


def test_text_parts_are_joined() -> None:
    content = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    parsed = parse({"model": "m", "messages": [{"role": "user", "content": content}]})
    assert parsed.frame.messages[0].content == "ab"


BAD_REQUESTS: list[tuple[Any, str | None, str]] = [
    (b"{", None, "not valid JSON"),
    (b"[1]", None, "JSON object"),
    (b'"\\ud800"', None, "JSON"),
    (b"[" * 60_000, None, "nested"),
    ({"messages": [USER]}, "model", "model"),
    ({"model": "m"}, "messages", "messages"),
    ({"model": "m", "messages": []}, "messages", "at least 1"),
    ({"model": 5, "messages": [USER]}, "model", "valid string"),
    ({"model": "m", "messages": [USER], "stream": "yes"}, "stream", "boolean"),
    ({"model": "m", "messages": [USER], "max_tokens": "5"}, "max_tokens", "integer"),
    ({"model": "m", "messages": [USER], "max_tokens": 0}, "max_tokens", "greater"),
    ({"model": "m", "messages": [USER], "temperature": 3}, "temperature", "less"),
    ({"model": "m", "messages": [USER], "temperature": True}, "temperature", "temperature"),
    ({"model": "m", "messages": [USER], "temperature": "0.5"}, "temperature", "number"),
    ({"model": "m", "messages": [USER], "max_tokens": True}, "max_tokens", "integer"),
    ({"model": "m", "messages": [USER], "max_tokens": 5.0}, "max_tokens", "integer"),
    (
        {"model": "m", "messages": [USER], "x_firsttoken": {"cache": "yes"}},
        "x_firsttoken.cache",
        "boolean",
    ),
    (
        {"model": "m", "messages": [USER], "x_firsttoken": {"cache": 1}},
        "x_firsttoken.cache",
        "boolean",
    ),
    ({"model": "m", "messages": [USER], "n": 2}, "n", "n"),
    ({"model": "m", "messages": [USER], "top_p": 0.5, "seed": 1}, "seed", "'top_p'"),
    ({"model": "m", "messages": [USER], "tools": []}, "tools", "unsupported"),
    ({"model": "m", "messages": [USER], "bogus": 1}, "bogus", "unknown parameter"),
    ({"model": "m", "messages": "hi"}, "messages", "valid list"),
    ({"model": "m", "messages": ["hi"]}, "messages.0", "dictionary"),
    (
        {"model": "m", "messages": [{"role": "tool", "content": "x"}]},
        "messages[0].role",
        "tool",
    ),
    ({"model": "m", "messages": [{"role": "user"}]}, "messages[0].content", "required"),
    (
        {"model": "m", "messages": [{"role": "user", "content": 5}]},
        "messages[0].content",
        "int",
    ),
    (
        {"model": "m", "messages": [{"role": "user", "content": "x", "name": "bob"}]},
        "messages[0]",
        "'name'",
    ),
    (
        {"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
        "messages[0].content",
        "image_url",
    ),
    (
        {"model": "m", "messages": [USER], "stream_options": {"include_usage": True}},
        "stream_options",
        "stream: true",
    ),
    (
        {"model": "m", "messages": [USER], "stream": True, "stream_options": {"x": 1}},
        "stream_options.x",
        "Extra inputs",
    ),
    (
        {"model": "m", "messages": [USER], "max_tokens": 2, "max_completion_tokens": 3},
        "max_completion_tokens",
        "differ",
    ),
    (
        {"model": "m", "messages": [USER], "x_firsttoken": {"cache": "no"}},
        "x_firsttoken.cache",
        "boolean",
    ),
]


@pytest.mark.parametrize(
    ("body", "param", "words"), BAD_REQUESTS, ids=[str(p) for _, p, _ in BAD_REQUESTS]
)
def test_bad_requests_are_refused_naming_the_parameter(
    body: Any, param: str | None, words: str
) -> None:
    exc = refused(body)
    assert exc.param == param
    assert words in exc.message
    reply = exception_reply(exc)
    assert reply.status == 400
    assert reply.body["error"]["param"] == param
    assert reply.body["error"]["type"] == "invalid_request_error"


def test_every_unsupported_parameter_is_named() -> None:
    for name in UNSUPPORTED_PARAMETERS:
        exc = refused({"model": "m", "messages": [USER], name: None})
        assert exc.param == name and "unsupported" in exc.message


def test_limits_on_size_and_message_count() -> None:
    big = {"model": "m", "messages": [{"role": "user", "content": "x" * 2000}]}
    assert "limit is 1024" in refused(big, max_bytes=1024).message
    many = {"model": "m", "messages": [USER] * 10_000}
    exc = refused(many, max_bytes=1 << 20)
    assert exc.param == "messages" and "10000" in exc.message


@pytest.mark.parametrize(
    ("exc", "status", "kind", "retry_after"),
    [
        (InvalidRequest("x"), 400, "invalid_request_error", None),
        (Unauthorized("x"), 401, "authentication_error", None),
        (UnknownModel("x"), 404, "invalid_request_error", None),
        (RateLimited("x", retry_after_ms=1500), 429, "rate_limit_error", 2),
        (Overloaded("x"), 503, "server_error", 1),
        (Overloaded("x", retry_after_ms=200), 503, "server_error", 1),
        (DeadlineExceeded("x"), 504, "server_error", None),
        (EngineError("x"), 502, "server_error", None),
        (RuntimeError("secret"), 500, "server_error", None),
    ],
)
def test_errors_map_to_openai_statuses(
    exc: BaseException, status: int, kind: str, retry_after: int | None
) -> None:
    reply = exception_reply(exc)
    assert (reply.status, reply.retry_after_s) == (status, retry_after)
    error = reply.body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == kind
    assert "secret" not in error["message"]
    if isinstance(exc, UnknownModel):
        assert error["code"] == "model_not_found"


def test_a_wire_error_frame_maps_like_the_exception() -> None:
    reply = frame_reply({"type": "error", "id": "c", "code": "timeout", "message": "late"})
    assert reply.status == 504 and reply.body["error"]["message"] == "late"
    event = sse_error(reply)
    assert event.startswith(b"data: ") and event.endswith(b"\n\n")
    assert orjson.loads(event[6:])["error"]["code"] == "timeout"


DONE = {
    "type": "done",
    "id": "c",
    "cached": True,
    "model": "small",
    "finish_reason": "length",
    "usage": {"prompt_tokens": 5, "completion_tokens": 3},
    "route": "small",
    "timings": {"ttft_ms": 1.5},
}


def events(data: bytes) -> list[Any]:
    out = []
    for event in data.split(b"\n\n")[:-1]:
        assert event.startswith(b"data: ")
        payload = event[6:]
        out.append(payload.decode() if payload == b"[DONE]" else orjson.loads(payload))
    return out


def test_chunks_are_openai_chunks() -> None:
    enc = ChunkEncoder("chatcmpl-j", 1700000000, "auto")
    stream = enc.token('he said "hi"\n', first=True) + enc.token("é")
    stream += enc.final(DONE) + enc.usage(DONE) + SSE_DONE
    first, second, final, usage, done = events(stream)
    for chunk in (first, second, final, usage):
        assert chunk["id"] == "chatcmpl-j" and chunk["object"] == "chat.completion.chunk"
        assert chunk["created"] == 1700000000
    assert first["choices"] == [
        {
            "index": 0,
            "delta": {"role": "assistant", "content": 'he said "hi"\n'},
            "finish_reason": None,
        }
    ]
    assert second["choices"][0]["delta"] == {"content": "é"}
    assert final["choices"] == [{"index": 0, "delta": {}, "finish_reason": "length"}]
    assert final["model"] == "small"
    assert final["x_firsttoken"] == {"cached": True, "route": "small", "timings": {"ttft_ms": 1.5}}
    assert usage["choices"] == []
    assert usage["usage"] == {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
    assert done == "[DONE]"


def test_an_answer_with_no_token_still_says_the_role() -> None:
    enc = ChunkEncoder("chatcmpl-j", 1, "m")
    (final,) = events(enc.final({**DONE, "finish_reason": "cancelled"}, first=True))
    assert final["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert final["choices"][0]["finish_reason"] == "stop"


def test_the_completion_object() -> None:
    body = completion("chatcmpl-j", 1, "auto", "hello", DONE)
    assert body["object"] == "chat.completion" and body["model"] == "small"
    assert body["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "hello"},
            "logprobs": None,
            "finish_reason": "length",
        }
    ]
    assert body["usage"]["total_tokens"] == 8
    assert body["x_firsttoken"]["cached"] is True


def test_user_and_metadata_become_the_frames_end_user_and_tags() -> None:
    """OpenAI's `user` and `metadata` reach the chat frame as `user` and `tags`."""
    frame = parse(
        {"model": "m", "messages": [USER], "user": "u-1", "metadata": {"team": "a"}}
    ).frame
    assert (frame.user, frame.tags) == ("u-1", {"team": "a"})


def test_bad_metadata_is_a_400_naming_metadata() -> None:
    """metadata must be an object of short strings, at most 16 pairs (as OpenAI's)."""
    error = refused({"model": "m", "messages": [USER], "metadata": ["a"]})
    assert error.param == "metadata" and "must be an object of strings" in error.message
    error = refused(
        {"model": "m", "messages": [USER], "metadata": {str(i): "v" for i in range(17)}}
    )
    assert error.param == "metadata" and "the limit is 16" in error.message
