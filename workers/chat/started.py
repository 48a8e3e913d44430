"""A chat's start as the rest of the system sees it: its lease, from which a survivor can take
the chat over (workers/chat/failover.py), and its `started` chunk, whose reply says whether the
client cancelled while the job was queued.

Both are queued on the process's Redis pipe at the chat's first wait, which on a plain chat is
once its engine request is written: the lease serialises the whole job, and the first token
does not wait for it. Nothing of the answer goes out before :meth:`ChatStart.cancelled_while_queued`
has read the reply, which arrives long before a first token does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

# The `started` chunk's reply normally arrives in a round trip; this long without it, Redis is
# gone and the chat ends with an error instead of waiting.
QUEUED_CANCEL_WAIT_S = 5.0


class ChatStart:
    """`queue` queues the lease and `started` and returns the reply's future (1: cancelled
    while queued); `on_cancelled` stops the chat, wherever it is, when that reply says so."""

    def __init__(
        self, queue: Callable[[], asyncio.Future[object]], on_cancelled: Callable[[], None]
    ) -> None:
        self._queue = queue
        self._on_cancelled = on_cancelled
        self._pending: asyncio.Handle | None = None
        self._reply: asyncio.Future[object] | None = None

    def at_first_wait(self) -> None:
        """Queue them when the chat first yields to the loop."""
        self._pending = asyncio.get_running_loop().call_soon(self.now)

    def now(self) -> None:
        """Queue them now, unless they are already (or the chat never scheduled them)."""
        if self._pending is None:
            return
        self.drop()
        try:
            reply = self._queue()
        except ConnectionError as exc:  # Redis is gone: the chat's next step says so
            reply = asyncio.get_running_loop().create_future()
            reply.set_exception(exc)
        else:
            reply.add_done_callback(self._on_reply)
        self._reply = reply

    def drop(self) -> None:
        """Nothing is to be queued later: queued now, or the chat ended before its first wait."""
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None

    async def cancelled_while_queued(self) -> bool:
        """Whether the client cancelled while the job was queued (queueing the start first,
        if the chat has not waited yet). Raises ConnectionError when Redis does not answer."""
        self.now()
        assert self._reply is not None
        try:
            async with asyncio.timeout(QUEUED_CANCEL_WAIT_S):
                return bool(await asyncio.shield(self._reply))
        except TimeoutError:
            raise ConnectionError(
                f"Redis did not answer the job's start within {QUEUED_CANCEL_WAIT_S:.0f}s"
            ) from None

    def _on_reply(self, reply: asyncio.Future[object]) -> None:
        # Cancelled while queued: stop at once (the engine request may be out; it is aborted).
        if not reply.cancelled() and reply.exception() is None and reply.result():
            self._on_cancelled()
