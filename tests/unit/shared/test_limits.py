"""Rate-limit arithmetic: estimates, reservations, refunds, the sliding window and retry-after."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gateway.rates import (
    WINDOW_MS,
    Limits,
    SlidingWindow,
    charged_without_usage,
    estimate_prompt_tokens,
    reservation,
    resolve_limits,
    retry_after_rpm,
    retry_after_tpm,
    settle,
    tokens_over_limit,
)


def test_prompt_estimate_rounds_up_and_counts_each_message() -> None:
    """~4 characters per token, rounded up, plus 4 tokens of template per message."""
    assert estimate_prompt_tokens([]) == 0
    assert estimate_prompt_tokens(["abcd"]) == 1 + 4
    assert estimate_prompt_tokens(["abcde"]) == 2 + 4
    assert estimate_prompt_tokens(["", "x" * 400]) == 4 + 100 + 4


def test_reservation_is_prompt_plus_max_tokens() -> None:
    """Admission holds the whole prompt and the longest answer allowed."""
    assert reservation(25, 256) == 281


def test_settle_refunds_the_unused_part_and_charges_an_underestimate() -> None:
    """The delta turns the reservation into the actual usage, in either direction."""
    assert settle(281, 60) == -221
    assert settle(100, 130) == 30
    assert settle(100, -5) == -100


def test_end_without_done_charges_prompt_plus_frames_capped_at_reservation() -> None:
    """Never started: nothing. Streamed: prompt estimate + one per frame, at most reserved."""
    assert charged_without_usage(300, 40, started=False, frames=0) == 0
    assert charged_without_usage(300, 40, started=True, frames=7) == 47
    assert charged_without_usage(50, 40, started=True, frames=70) == 50


def test_a_request_larger_than_a_tpm_limit_is_named() -> None:
    """A reservation over the key's or tenant's tpm can never be admitted."""
    assert tokens_over_limit(100, Limits(key_tpm=100)) is None
    assert tokens_over_limit(101, Limits(key_tpm=100)) == 100
    assert tokens_over_limit(101, Limits(tenant_tpm=50)) == 50
    assert tokens_over_limit(10**9, Limits()) is None


def test_resolve_limits_takes_defaults_for_none_and_keeps_zero() -> None:
    """None means "the configured default"; 0 is an explicit "no limit"."""
    defaults = Limits(key_rpm=600, key_tpm=1000, key_streams=8, tenant_rpm=5, tenant_tpm=6)
    got = resolve_limits([None, 0, 3], [None, 9], defaults)
    assert got == Limits(key_rpm=600, key_tpm=0, key_streams=3, tenant_rpm=5, tenant_tpm=9)


def test_retry_after_rpm_waits_for_the_oldest_blocking_request() -> None:
    """With the window full, the wait ends when the oldest admission leaves it."""
    times = [1000, 2000, 3000]
    assert retry_after_rpm(times, now=10_000, limit=3) == 1000 + WINDOW_MS - 10_000
    assert retry_after_rpm(times, now=10_000, limit=2) == 2000 + WINDOW_MS - 10_000
    assert retry_after_rpm(times, now=10_000, limit=4) == 0


def test_retry_after_tpm_waits_until_enough_tokens_leave() -> None:
    """Oldest entries leave first; the wait is for the one that makes room."""
    entries = [(0, 50), (1000, 30), (2000, 20)]
    assert retry_after_tpm(entries, now=5000, limit=100, need=40) == 0 + WINDOW_MS - 5000
    assert retry_after_tpm(entries, now=5000, limit=100, need=60) == 1000 + WINDOW_MS - 5000
    assert retry_after_tpm(entries, now=5000, limit=100, need=0) == 0
    assert retry_after_tpm(entries, now=5000, limit=100, need=90) == 2000 + WINDOW_MS - 5000


def test_window_admits_exactly_rpm_then_refuses_until_the_first_leaves() -> None:
    """100 rpm: 100 admitted in a burst, the 101st refused, admitted again a window later."""
    w = SlidingWindow(rpm=100, tpm=0)
    admitted = 0
    for i in range(300):
        if w.check(i, 1).admitted:
            w.add(f"r{i}", i, 1)
            admitted += 1
    assert admitted == 100
    refused = w.check(300, 1)
    assert not refused.admitted and refused.reason == "rpm"
    assert refused.retry_after_ms == WINDOW_MS - 300
    assert w.check(WINDOW_MS, 1).admitted


def test_refund_makes_room_for_more_tokens_in_the_same_window() -> None:
    """A reservation settled down frees tokens at once for the next request."""
    w = SlidingWindow(rpm=0, tpm=1000)
    w.add("a", 0, 800)
    assert not w.check(1, 300).admitted
    w.adjust("a", settle(800, 100))
    assert w.used == 100 and w.check(2, 300).admitted


@given(
    st.lists(
        st.tuples(st.integers(0, 3 * WINDOW_MS), st.integers(1, 500), st.integers(0, 500)),
        max_size=200,
    )
)
def test_window_never_holds_more_than_its_limits(ops: list[tuple[int, int, int]]) -> None:
    """Whatever the arrivals and refunds, any window holds at most rpm requests and tpm tokens."""
    w = SlidingWindow(rpm=20, tpm=2000)
    admitted: list[tuple[int, str]] = []
    for i, (at, tokens, actual) in enumerate(sorted(ops)):
        if w.check(at, tokens).admitted:
            w.add(f"r{i}", at, tokens)
            admitted.append((at, f"r{i}"))
            assert len(w.entries) <= 20 and w.used <= 2000
            # Refunds only here: an under-estimate charged up may exceed tpm after the fact.
            w.adjust(f"r{i}", settle(tokens, min(actual, tokens)))
    for at, _ in admitted:
        in_window = [a for a, _ in admitted if at - WINDOW_MS < a <= at]
        assert len(in_window) <= 20
