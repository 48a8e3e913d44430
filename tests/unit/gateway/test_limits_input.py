"""Input limits that need no socket: origins, characters per message, UTF-8 in frames."""

from __future__ import annotations

import pytest

from gateway.safety import ConnectionGuard, check_message_chars, origin_allowed, parse_origins
from shared.errors import InvalidRequest
from shared.protocol import Message, frame_id, parse_client_frame


def test_origin_check() -> None:
    """No Origin (not a browser) and same-origin pass; others only when listed or with `*`."""
    allowed = parse_origins("https://app.example.com/, https://B.example.com")
    assert origin_allowed(None, "gw:8000", allowed)
    assert origin_allowed("http://gw:8000", "gw:8000", frozenset())
    assert origin_allowed("https://app.example.com", "gw", allowed)
    assert origin_allowed("https://b.example.com", "gw", allowed)
    assert not origin_allowed("https://evil.example.com", "gw", allowed)
    assert not origin_allowed("null", "gw", allowed)
    assert origin_allowed("https://anything", "gw", parse_origins("*"))


def test_message_chars_limit() -> None:
    """A message over max_message_chars is refused and named; one at the limit passes."""
    ok = [Message(role="user", content="x" * 10)]
    check_message_chars(ok, 10)
    with pytest.raises(InvalidRequest, match=r"messages\[1\] has 11 characters"):
        check_message_chars([*ok, Message(role="user", content="y" * 11)], 10)


def test_connection_slots_are_counted() -> None:
    """max_connections slots, then refusals; a released slot can be taken again."""
    guard = ConnectionGuard(max_connections=2, idle_timeout_s=1, origins="")
    assert guard.try_open() and guard.try_open() and not guard.try_open()
    guard.release()
    assert guard.try_open()


class _Idle:
    def __init__(self, last_active: float, jobs: dict[str, object]) -> None:
        self.last_active = last_active
        self.jobs = jobs
        self.closed = False

    def close_idle(self) -> None:
        self.closed = True


def test_idle_sweep_closes_only_idle_connections_without_chats() -> None:
    """Idle past the timeout and no running chat: closed; a running chat keeps it open."""
    guard = ConnectionGuard(max_connections=9, idle_timeout_s=5, origins="")
    idle, busy, fresh = _Idle(0, {}), _Idle(0, {"c": object()}), _Idle(8, {})
    assert guard.sweep_once([idle, busy, fresh], now=10) == 1
    assert idle.closed and not busy.closed and not fresh.closed


@pytest.mark.parametrize(
    ("raw", "chat_id"),
    [
        ('{"type":"ping","id":"\\ud800"}', None),
        ('{"type":"chat","id":"x","messages":[{"role":"user","content":"a\\udfff"}]}', "x"),
        (b'{"type":"ping","id":"\xff"}', None),
        ("[" * 100_000, None),
    ],
)
def test_invalid_utf8_and_deep_nesting_are_invalid_requests(
    raw: str | bytes, chat_id: str | None
) -> None:
    """Lone surrogates, bytes that are not UTF-8 and absurd nesting: invalid_request, no crash.

    The error names the chat only when its id itself is valid text.
    """
    with pytest.raises(InvalidRequest):
        parse_client_frame(raw, max_bytes=1 << 20, max_messages=8)
    assert frame_id(raw) == chat_id


def test_escaped_surrogate_pairs_are_fine() -> None:
    """A proper surrogate pair (an emoji escaped by ensure_ascii) is valid text."""
    frame = parse_client_frame(
        '{"type":"chat","id":"e","messages":[{"role":"user","content":"\\ud83d\\ude00"}]}',
        max_bytes=1 << 20,
        max_messages=8,
    )
    assert frame.messages[0].content == "\U0001f600"  # type: ignore[union-attr]
