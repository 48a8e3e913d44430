"""Work off the first token's path, held while the chat queue has a backlog.

Right after its engine request is out a chat starts two things no token waits for: its
background retrieval sources (only the `done` frame reports them) and the count of its prompt's
tokens (for the usage row). When chats arrive in a burst, that work competes for the worker's
CPU with the chats still waiting in the queue, each of which waits for its engine request (a
burst's first moments are where that CPU shows; docs/benchmarks.md has the burst figures). So
the queue consumer holds it while its reads come back full (more chats are waiting) and runs
it, in order, as soon as a read comes back short (the backlog is gone), or once the oldest has
waited ``max_hold_s``.

Without the consumer (the Celery pool), nothing is held: the work runs on the loop's next turn.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable

log = logging.getLogger(__name__)

# Held work runs at the latest this long after the first of it was held: a chat's background
# sources then still report in its `done` frame (settling waits for them at the answer's end).
MAX_HOLD_S = 0.1


class DeferredWork:
    """Callbacks to run when the worker has no chat waiting for its engine request."""

    def __init__(self, max_hold_s: float = MAX_HOLD_S) -> None:
        self.max_hold_s = max_hold_s
        self.holding = False  # set by the consumer while its reads come back full
        self._calls: deque[Callable[[], object]] = deque()
        self._deadline: asyncio.TimerHandle | None = None

    @property
    def held(self) -> int:
        return len(self._calls)

    def later(self, call: Callable[[], object]) -> None:
        """Run `call` soon: on the loop's next turn, or once the backlog is gone."""
        loop = asyncio.get_running_loop()
        if not self.holding:
            loop.call_soon(call)
            return
        self._calls.append(call)
        if self._deadline is None:
            self._deadline = loop.call_later(self.max_hold_s, self.release)

    def after_read(self, full: bool) -> None:
        """The consumer's report after a read's chats took their first steps: hold while
        reads come back full, release everything when one does not."""
        self.holding = full
        if not full:
            self.release()

    def release(self) -> None:
        """Run everything held, in the order it was deferred."""
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        calls = self._calls
        while calls:
            call = calls.popleft()
            try:
                call()
            except Exception:  # one failing callback must not drop the rest
                log.exception("deferred work failed")


deferred = DeferredWork()
