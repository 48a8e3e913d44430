"""shared/redis/resp.py: commands as RESP bytes, replies parsed as redis-py returns them."""

from __future__ import annotations

import pytest
from redis.exceptions import (
    AuthenticationError,
    BusyLoadingError,
    InvalidResponse,
    NoScriptError,
    RedisError,
    ResponseError,
)
from redis.exceptions import ConnectionError as RedisConnectionError

from shared.redis.resp import bulks, error_text, pack, parse_error, reply_parser


def test_pack_is_resp() -> None:
    assert pack((b"PING",)) == b"*1\r\n$4\r\nPING\r\n"
    assert pack((b"ECHO", b"a\r\nb")) == b"*2\r\n$4\r\nECHO\r\n$4\r\na\r\nb\r\n"
    assert pack((b"GET", b"")) == b"*2\r\n$3\r\nGET\r\n$0\r\n\r\n"
    assert b"*3\r\n" + bulks((b"SET", b"k", b"v")) == pack((b"SET", b"k", b"v"))


@pytest.mark.parametrize(
    ("reply", "cls", "text"),
    [
        ("NOSCRIPT No matching script.", NoScriptError, "No matching script."),
        ("WRONGPASS invalid username-password pair", AuthenticationError, "invalid username-"),
        ("NOAUTH Authentication required.", AuthenticationError, "Authentication required."),
        ("LOADING Redis is loading", BusyLoadingError, "Redis is loading"),
        ("ERR unknown command 'X'", ResponseError, "unknown command 'X'"),
        ("ERR max number of clients reached", RedisConnectionError, "max number of clients"),
        ("WRONGTYPE Operation against a key", ResponseError, "WRONGTYPE Operation against"),
    ],
)
def test_error_replies_become_redis_pys_exception_classes(
    reply: str, cls: type[RedisError], text: str
) -> None:
    error = parse_error(reply)
    assert type(error) is cls and str(error).startswith(text)
    assert error_text(error) == reply  # the code is kept for messages


def test_the_parser_returns_replies_and_errors_in_order() -> None:
    raw = reply_parser()
    raw.feed(b"+OK\r\n:42\r\n$2\r\n\xc3\xa9\r\n-NOSCRIPT gone\r\n*2\r\n$1\r\na\r\n$-1\r\n")
    assert raw.gets() == b"OK"
    assert raw.gets() == 42
    assert raw.gets() == "é".encode()
    assert isinstance(raw.gets(), NoScriptError)  # returned, not raised
    assert raw.gets() == [b"a", None]
    assert raw.gets() is False  # nothing more buffered

    decoded = reply_parser(decode=True)
    decoded.feed(b"$2\r\n\xc3\xa9\r\n*1\r\n$1\r\nb\r\n")
    assert decoded.gets() == "é"
    assert decoded.gets() == ["b"]


def test_a_broken_stream_raises_redis_pys_protocol_error() -> None:
    parser = reply_parser()
    parser.feed(b"?what\r\n")
    with pytest.raises(InvalidResponse):
        parser.gets()
