"""The gateway's side of drafts (issue 34): admit a `draft` frame and queue its prefill.

The decisions are shared/drafts.py's; this sends them. A draft costs its connection no wait:
the admission script goes out on the gateway's Redis pipe (shared/redis/pipe.py) and nothing
awaits its answer, which only feeds the counts below. The pipe keeps order, so a `chat` sent
right after a draft is admitted after it, and its :meth:`Drafts.forget` runs after the draft
was queued: the queued draft is then no longer its conversation's newest and the worker drops
it (a prefill already running goes on: its work is what the chat is about to reuse).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter

from shared.drafts import (
    DRAFT_RATE_WINDOW_MS,
    draft_fingerprint,
    draft_messages,
    draft_scope,
    gateway_drops,
    grew_enough,
)
from shared.keys import CHAT_QUEUE, PREFILL_TASK, Keys
from shared.protocol import DraftFrame
from shared.redis import scripts
from shared.redis.pipe import RedisPipe
from shared.settings import Settings
from shared.tasks import DraftJob, new_id, task_message

log = logging.getLogger(__name__)


class Drafts:
    """One per gateway process: admits drafts and counts what became of them."""

    def __init__(self, pipe: RedisPipe, keys: Keys, settings: Settings, origin: str) -> None:
        self._pipe = pipe
        self._keys = keys
        self._settings = settings
        self._origin = origin
        self._admit = pipe.script(scripts.DRAFT_ADMIT)
        # admission -> count ("queued", "busy", "rate", "full", "dropped" here, "failed").
        self.outcomes: Counter[str] = Counter()

    def submit(
        self,
        frame: DraftFrame,
        *,
        tenant_id: str,
        key_id: str,
        connection: str,
        chats_on_connection: int,
        sent: dict[str, tuple[int, str]],
    ) -> str | None:
        """Queue the draft's prefill unless the gateway drops it; returns its scope (the
        conversation it coalesces in), None when dropped here. `sent`: the connection's last
        draft sent per scope (fingerprint, text), updated here."""
        if gateway_drops(
            enabled=self._settings.drafts_enabled, chats_on_connection=chats_on_connection
        ):
            self.outcomes["dropped"] += 1
            return None
        scope = draft_scope(key_id, frame.conversation_id, connection)
        current = (draft_fingerprint(frame), frame.text)
        if not grew_enough(sent.get(scope), current, self._settings.draft_min_growth_chars):
            self.outcomes["too_little"] += 1
            return None
        job_id = new_id()
        payload = DraftJob(
            job_id=job_id,
            draft_id=frame.id,
            scope=scope,
            tenant_id=tenant_id,
            key_id=key_id,
            messages=draft_messages(frame),
            model=frame.model,
            conversation_id=frame.conversation_id,
            enqueued_at=time.time(),
        )
        message = task_message(
            PREFILL_TASK,
            {"draft": payload.model_dump()},
            queue=CHAT_QUEUE,
            task_id=job_id,
            origin=self._origin,
        )
        k, s = self._keys, self._settings
        reply: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        reply.add_done_callback(self._count)
        try:
            self._admit.send(
                [
                    k.queue_list(CHAT_QUEUE),
                    k.draft_list(),
                    k.draft_rate(key_id),
                    k.draft_latest(scope),
                    k.draft_running(scope),
                ],
                [
                    job_id,
                    message,
                    s.draft_rate_per_s,
                    DRAFT_RATE_WINDOW_MS,
                    # The newest-draft marker outlives any draft that could still be read.
                    max(1, int(s.draft_max_age_s * 4)),
                    k.cancel_channel,
                    s.draft_queue_max,
                ],
                reply,
            )
        except ConnectionError:
            reply.cancel()
            self.outcomes["failed"] += 1
            return None
        sent[scope] = current
        return scope

    def forget(self, scope: str) -> None:
        """A chat of this conversation was sent: its drafts still queued are stale."""
        try:
            self._pipe.send((b"DEL", self._keys.draft_latest(scope).encode()))
        except ConnectionError:
            pass  # the queued drafts then run, late: harmless, and they expire

    def _count(self, reply: asyncio.Future[object]) -> None:
        if reply.cancelled() or reply.exception() is not None:
            self.outcomes["failed"] += 1
            return
        result = reply.result()
        outcome = result.decode() if isinstance(result, bytes) else str(result)
        self.outcomes[outcome] += 1
