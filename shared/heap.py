"""Keep the garbage collector's full passes off the streaming path.

A warmed-up worker or gateway holds hundreds of thousands of long-lived objects (tokenizers,
the model table, SQLAlchemy and pydantic internals, the embedding model). Every full (gen 2)
collection walked all of them with the event loop stopped, long enough to become every
stream's p99 under load. Objects that exist when start-up is done live
until the process exits, so they are moved out of the collector's sight (`gc.freeze`, the
technique CPython documents for pre-fork servers); later collections only walk what was
created after it.
"""

from __future__ import annotations

import gc

# After this many requests (chats in a worker or a gateway), what they created on first use is
# frozen too.
FIRST_USE_REQUESTS = 64


def freeze_startup_objects() -> None:
    """Call once start-up (imports, pools, warm-up) is done, before serving."""
    gc.collect()
    gc.freeze()


def freeze_first_use_objects() -> None:
    """Call once more after the first requests: what they created on first use (the database
    engine, prompt and tokenizer caches) lives as long. No collection first: a full pass here
    would stop a serving loop for as long as the one being avoided."""
    gc.freeze()


class FirstUse:
    """Counts requests as they start and calls freeze_first_use_objects() once, at the
    FIRST_USE_REQUESTS-th (chats in a worker or in a gateway)."""

    def __init__(self, after: int = FIRST_USE_REQUESTS) -> None:
        self._left = after

    def started(self) -> None:
        if self._left > 0:
            self._left -= 1
            if self._left == 0:
                freeze_first_use_objects()
