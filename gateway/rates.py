"""Rate-limit arithmetic, free of I/O: limits, token estimates, reservations and refunds.

The gateway enforces these in Redis with Lua (``gateway/ratelimit.py``) so they hold exactly
across any number of gateway processes. The window is a *sliding log*: a request counts against
a limit for exactly ``WINDOW_MS`` after its admission, never more and never less, so "100 requests
per minute" means at most 100 admissions in any 60 s interval (a fixed window would let 200 through
around a minute boundary; a token bucket refills within the minute).

:class:`SlidingWindow` is the reference model of what the Lua script does; unit tests pin the
arithmetic here and integration tests check the script agrees with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

# The window and the prompt estimate are shared with the chat worker, which charges the
# cache's background verifications to the tenant's window (workers/cache/charge.py).
from shared.ratewindow import CHARS_PER_TOKEN as CHARS_PER_TOKEN
from shared.ratewindow import TOKENS_PER_MESSAGE as TOKENS_PER_MESSAGE
from shared.ratewindow import WINDOW_MS as WINDOW_MS
from shared.ratewindow import estimate_prompt_tokens as estimate_prompt_tokens


@dataclass(frozen=True, slots=True)
class Limits:
    """What one key may do; 0 means no limit."""

    key_rpm: int = 0
    key_tpm: int = 0
    key_streams: int = 0
    tenant_rpm: int = 0
    tenant_tpm: int = 0


def resolve_limits(
    key: Sequence[int | None], tenant: Sequence[int | None], defaults: Limits
) -> Limits:
    """Per-key (rpm, tpm, streams) and per-tenant (rpm, tpm) values; None takes the default."""

    def pick(value: int | None, default: int) -> int:
        return default if value is None else value

    return Limits(
        key_rpm=pick(key[0], defaults.key_rpm),
        key_tpm=pick(key[1], defaults.key_tpm),
        key_streams=pick(key[2], defaults.key_streams),
        tenant_rpm=pick(tenant[0], defaults.tenant_rpm),
        tenant_tpm=pick(tenant[1], defaults.tenant_tpm),
    )


def reservation(prompt_estimate: int, max_tokens: int) -> int:
    """Tokens held at admission: the whole prompt plus the longest answer allowed."""
    return prompt_estimate + max_tokens


def tokens_over_limit(reserved: int, limits: Limits) -> int | None:
    """The tokens-per-minute limit a single request can never fit under, or None.

    Such a request would be refused forever, so it is an invalid request, not a rate limit.
    """
    for tpm in (limits.key_tpm, limits.tenant_tpm):
        if tpm and reserved > tpm:
            return tpm
    return None


def charged_without_usage(
    reserved: int, prompt_estimate: int, *, started: bool, frames: int
) -> int:
    """Tokens to keep charged when a chat ends without a `done` frame (cancel, error, disconnect).

    The gateway does not see the worker's exact count then. A chat that never started cost
    nothing. One that streamed keeps the prompt estimate plus one token per relayed token frame
    (every frame carries at least one token), never more than was reserved.
    """
    if not started:
        return 0
    return min(reserved, prompt_estimate + frames)


def settle(reserved: int, actual: int) -> int:
    """Change to apply to a reservation once the actual usage is known (negative: a refund).

    An estimate that was too low is charged up, so the window holds what was really used.
    """
    return max(0, actual) - reserved


@dataclass(frozen=True, slots=True)
class Decision:
    admitted: bool
    reason: str = ""  # "rpm" | "tpm" | "streams" when refused
    scope: str = ""  # "key" | "tenant"
    retry_after_ms: int = 0


def retry_after_rpm(times: Sequence[int], now: int, limit: int, window: int = WINDOW_MS) -> int:
    """Milliseconds until one more request fits under `limit` (times: admissions, oldest first)."""
    excess = len(times) - limit  # this many must leave the window before one more fits
    if excess < 0:
        return 0
    return max(1, times[excess] + window - now)


def retry_after_tpm(
    entries: Sequence[tuple[int, int]], now: int, limit: int, need: int, window: int = WINDOW_MS
) -> int:
    """Milliseconds until `need` more tokens fit under `limit`.

    entries: (admitted_at, tokens) oldest first. Refunds may make room sooner; this is the
    latest the client has to wait if nothing else changes.
    """
    used = sum(tokens for _, tokens in entries)
    for admitted_at, tokens in entries:
        if used + need <= limit:
            break
        used -= tokens
        if used + need <= limit:
            return max(1, admitted_at + window - now)
    return 0 if used + need <= limit else window


@dataclass(slots=True)
class SlidingWindow:
    """Reference model of one subject's window (a key or a tenant): the Lua script's semantics."""

    rpm: int
    tpm: int
    window: int = WINDOW_MS
    entries: dict[str, tuple[int, int]] = field(default_factory=dict)  # id -> (at, tokens)

    def evict(self, now: int) -> None:
        horizon = now - self.window
        for rid in [rid for rid, (at, _) in self.entries.items() if at <= horizon]:
            del self.entries[rid]

    def check(self, now: int, tokens: int) -> Decision:
        self.evict(now)
        ordered = sorted(self.entries.values())
        if self.rpm and len(ordered) >= self.rpm:
            times = [at for at, _ in ordered]
            return Decision(False, "rpm", "", retry_after_rpm(times, now, self.rpm, self.window))
        used = sum(t for _, t in ordered)
        if self.tpm and used + tokens > self.tpm:
            wait = retry_after_tpm(ordered, now, self.tpm, tokens, self.window)
            return Decision(False, "tpm", "", wait)
        return Decision(True)

    def add(self, rid: str, now: int, tokens: int) -> None:
        self.entries[rid] = (now, tokens)

    def adjust(self, rid: str, delta: int) -> None:
        """Apply a settlement; a request already out of the window is no longer counted."""
        if rid in self.entries:
            at, tokens = self.entries[rid]
            self.entries[rid] = (at, max(0, tokens + delta))

    @property
    def used(self) -> int:
        return sum(t for _, t in self.entries.values())
