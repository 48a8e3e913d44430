"""Timing points of one chat, and the millisecond stage timings the `done` frame reports.

Points are unix seconds taken by different processes on (normally) the same host; the
gateway adds its own and turns them into durations here.
"""

from __future__ import annotations

# (name in `done.timings`, from point, to point)
STAGES: tuple[tuple[str, str, str], ...] = (
    ("accept_ms", "received", "enqueued"),
    ("queue_ms", "enqueued", "worker_start"),
    # The cache lookup and retrieval run side by side, both from the worker's start.
    ("cache_ms", "worker_start", "cache_decided"),
    ("retrieval_ms", "worker_start", "retrieval_done"),
    ("engine_ttft_ms", "retrieval_done", "engine_first_token"),
    ("publish_ms", "engine_first_token", "first_chunk_published"),
    ("relay_ms", "first_chunk_published", "first_chunk_sent"),
    ("ttft_ms", "received", "first_chunk_sent"),
    ("total_ms", "received", "done_sent"),
)


def elapsed_ms(end: float | None, start: float | None) -> float | None:
    """Milliseconds from `start` to `end` (wall-clock seconds), None when either is unknown."""
    if end is None or start is None:
        return None
    return round((end - start) * 1000.0, 3)


def stage_timings(points: dict[str, float]) -> dict[str, float]:
    """Durations in ms (3 decimals) for every stage whose two points are known."""
    out: dict[str, float] = {}
    for name, start, end in STAGES:
        if start in points and end in points:
            out[name] = round(max(0.0, points[end] - points[start]) * 1000.0, 3)
    return out
