"""Token coalescing decisions, with an explicit clock."""

from __future__ import annotations

from workers.chat.coalesce import Coalescer


def test_first_text_is_flushed_at_once() -> None:
    """The first token never waits."""
    c = Coalescer(interval_s=0.004, max_chars=100)
    assert c.add("Hello", now=10.0) is True
    assert c.take(10.0) == "Hello"


def test_fast_tokens_wait_for_the_interval_then_flush_together() -> None:
    """Tokens arriving within the interval are buffered and due at last_flush + interval."""
    c = Coalescer(interval_s=0.004, max_chars=100)
    c.add("a", 10.0)
    c.take(10.0)
    assert c.add("b", 10.001) is False
    assert c.add("c", 10.002) is False
    assert c.flush_at() == 10.004
    assert c.add("d", 10.0045) is True
    assert c.take(10.0045) == "bcd"


def test_slow_tokens_are_never_delayed() -> None:
    """A token arriving after the interval has passed is flushed immediately."""
    c = Coalescer(interval_s=0.004, max_chars=100)
    c.add("a", 10.0)
    c.take(10.0)
    assert c.add("b", 10.015) is True


def test_size_forces_a_flush() -> None:
    """max_chars waiting flushes even inside the interval."""
    c = Coalescer(interval_s=1.0, max_chars=5)
    c.add("a", 0.0)
    c.take(0.0)
    assert c.add("xxxx", 0.1) is False
    assert c.add("yy", 0.2) is True
    assert c.take(0.2) == "xxxxyy" and c.flush_at() is None
