"""Parallel retrieval: every source at once, each under its own deadline.

A source is anything with a ``name`` and an async ``fetch(query)``. :func:`gather_sources`
runs them with ``asyncio.gather``; a source that is late or fails is cancelled or caught, and
its result says so (``status``: ok | timeout | error), so the chat goes ahead without it and
the `done` frame shows what was skipped. The stage therefore takes about as long as its
slowest source within deadline, never the sum, and never longer than the longest deadline.
"""

from shared.retrieval.gather import (
    Query,
    Source,
    SourceResult,
    gather_sources,
    run_serially,
    run_source,
    summarize_results,
)

__all__ = [
    "Query",
    "Source",
    "SourceResult",
    "gather_sources",
    "run_serially",
    "run_source",
    "summarize_results",
]
