"""The chat's cache decisions around the lookup (workers/chat/run.py runs them): which chats are
looked up and when, the job as the cache keys it, and a conversation's turn served from the
cache kept as that conversation's turn.
"""

from __future__ import annotations

from shared.tasks import ChatJob
from workers import retrieval
from workers.cache.conversation import stored_turn
from workers.chat.takeover import Takeover
from workers.resources import WorkerContext


def cacheable_at_once(job: ChatJob, takeover: Takeover | None) -> bool:
    """Whether the lookup may start at once, alongside retrieval. A turn of a stored
    conversation may not: its key holds the history retrieval reads (:func:`keyed_on_history`)."""
    if takeover is not None:
        return False  # a takeover answers from the engine, and its answer is not stored
    return job.cache and not (job.conversation_id and not job.new_conversation)


def keyed_on_history(
    job: ChatJob, takeover: Takeover | None, prepared: retrieval.Prepared
) -> ChatJob | None:
    """A turn of a stored conversation as the cache keys it: with the history retrieval read
    (workers/cache/conversation.py). None when it is not looked up: not such a turn, cache off,
    a takeover, or a history that could not be read (the turn is then answered without it,
    and is neither looked up nor stored)."""
    window = prepared.window
    if (
        takeover is not None
        or not job.cache
        or job.conversation_id is None
        or job.new_conversation
        or not prepared.conversation_ok
        or window is None  # a window is chosen only for a history that was read
    ):
        return None
    messages = stored_turn(job.messages, window.history, window.summary)
    return job.model_copy(update={"messages": messages})


async def keep_cached_turn(
    ctx: WorkerContext,
    job: ChatJob,
    prepared: retrieval.Prepared | None,
    answer: str,
    model: str,
) -> str | None:
    """A conversation's turn answered from the cache is still its turn: written before `done`
    as an engine's answer is (the next turn reads it), and named in `done`. Returns the
    conversation, or None where there is none or it was not verified (nothing is written then,
    as for an engine's answer)."""
    if job.conversation_id is None:
        return None
    if prepared is not None:
        if not prepared.conversation_ok:
            return None
        await retrieval.after_answer(ctx, job, prepared, answer, model)
    elif job.new_conversation:
        # Served before retrieval ran: the gateway minted the id for this tenant.
        await retrieval.store_turn(ctx, job, job.conversation_id, answer, model)
    else:
        return None
    return job.conversation_id
