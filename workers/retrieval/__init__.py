"""The chat worker's retrieval stage: sources in parallel, then the budgeted prompt and route.

This package is the worker's side, with the I/O: ``sources`` (the tenant prompt, conversation,
knowledge-base and quota sources, read from the database, Redis and the embedder),
``assembly`` (prompt assembly: budget, routing, the built prompt; :func:`prepare` runs the
stage) and ``after`` (what runs after the answer: background sources settled, the turn written,
a summary queued). ``workers.retrieval.gather`` is the pure gather logic the sources run under
(deadlines, results, their summary for the `done` frame).

One chat: :func:`prepare` -> :func:`start_background` (once the engine request is out) ->
:func:`settle_background` -> :func:`after_answer` -> :func:`done_fields`. A worker's start-up
calls :func:`warm_up` (tokenizers) and :func:`warm_queries` (each source's query compiled).
"""

from workers.retrieval.after import after_answer, done_fields, settle_background, store_turn
from workers.retrieval.assembly import (
    BACKGROUND_SOURCES,
    Prepared,
    assemble,
    prepare,
    prompt_config,
    start_background,
    warm_up,
)
from workers.retrieval.sources import sources_for, warm_kb, warm_queries

__all__ = [
    "BACKGROUND_SOURCES",
    "Prepared",
    "after_answer",
    "assemble",
    "done_fields",
    "prepare",
    "prompt_config",
    "settle_background",
    "sources_for",
    "start_background",
    "store_turn",
    "warm_kb",
    "warm_queries",
    "warm_up",
]
