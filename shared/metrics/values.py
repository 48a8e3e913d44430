"""What one chat observes, from the timing points and the ending the worker and the gateway
already keep for the usage row and the `done` frame (shared/timing.py): nothing is measured
twice. Pure: no clock, no I/O."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol


class Ending(Protocol):
    """What this needs of how a chat ended (workers/chat/record.py's Outcome)."""

    @property
    def model(self) -> str: ...
    @property
    def status(self) -> str: ...
    @property
    def finish_reason(self) -> str: ...
    @property
    def cached(self) -> bool: ...
    @property
    def prompt_tokens(self) -> int: ...
    @property
    def completion_tokens(self) -> int: ...


def time_per_output_token(
    points: Mapping[str, float], completion_tokens: int, *, status: str, cached: bool
) -> float | None:
    """Seconds per output token after the first (the engine's decode rate as the worker saw
    it), of an answered engine chat of two tokens or more; None otherwise."""
    if status != "ok" or cached or completion_tokens < 2:
        return None
    first, finished = points.get("engine_first_token"), points.get("finished")
    if first is None or finished is None:
        return None
    return max(0.0, finished - first) / (completion_tokens - 1)


def engine_error_kind(status: str, code: str, points: Mapping[str, float]) -> str | None:
    """`engine_error` for a chat the engine failed, `timeout` for one whose engine request was
    out (retrieval done) when a deadline passed; None for every other ending (a queue
    deadline, a cancel, an internal error)."""
    if code == "engine_error":
        return "engine_error"
    if status == "timeout" and "retrieval_done" in points:
        return "timeout"
    return None


def cache_result(tier: str, refused: bool) -> str | None:
    """The `result` label of one lookup (workers/cache/stage.py Lookup.tier): None when no
    lookup was made (`off`)."""
    if tier == "exact":
        return "exact_hit"
    if tier == "semantic":
        return "semantic_hit"
    if tier == "miss":
        return "refused" if refused else "miss"
    return None


def seconds(ms: float | None) -> float | None:
    return None if ms is None else ms / 1000.0
