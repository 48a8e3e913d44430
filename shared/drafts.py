"""Prefill while the user types (issue 34): the pure decisions about `draft` frames.

A client sends `draft` frames (shared/protocol.py DraftFrame) while its user types. The gateway
(gateway/drafts.py) admits each with one Redis script (shared/redis/scripts/draft_admit.lua),
and the chat worker that reads it (workers/chat/prefill.py) builds the prompt the chat would
have (the same retrieval stage: builder, budget, sources) and sends it to the engine with
``max_tokens`` 1, so that the engine's prefix cache holds it when the chat comes.

Why drafts never delay a chat:

- they wait on the chat queue's *lowest-priority* list (``Keys.draft_list``): the chat pool's
  BRPOP reads that list only when every chat list is empty, so a waiting chat always goes
  first, and the draft runs on the worker that reads it, beside the chats, on the same engine
  server the chat will use;
- the gateway drops a draft that only adds a few characters to the last one it sent in the
  same conversation (``draft_min_growth_chars``): an engine caches whole blocks of 16-128
  tokens, so a word more prefills nothing it would keep; typing at 5 drafts a second, most
  drafts stop there, at the cost of one frame parse;
- the gateway drops a draft when a chat is queued (the workers are behind), when the draft
  list holds ``draft_queue_max`` already, when the key is over its draft budget
  (``draft_rate_per_s``, apart from its chat limits), and while the same connection has a
  chat running (its answer's decode would share the engine with the prefill);
- a worker drops a draft that is no longer its conversation's newest (coalescing: a key per
  conversation holds the newest draft's job id), one older than ``draft_max_age_s``, and any
  while ``draft_worker_share`` of its chat slots are busy; a newer draft's admission aborts
  the prefill in flight for an older one (its job id goes out on the cancel channel).

Dropped drafts get no frame: a draft is a hint, and a client goes on typing. Only a draft
that does not validate is answered (``invalid_draft``, naming its id).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from shared.protocol import DraftFrame, Message
from shared.tasks import ChatJob, DraftJob

# What the admission script said (gateway/drafts.py); "queued" is the only one that prefills.
Admission = Literal["queued", "busy", "rate", "full"]
# What a worker does with a draft it read.
Verdict = Literal["prefill", "superseded", "stale", "busy"]

DRAFT_RATE_WINDOW_MS = 1000


def draft_scope(key_id: str, conversation_id: str | None, connection: str) -> str:
    """The conversation a draft belongs to, for coalescing: a server-kept conversation by its
    id (under the key, so one key's drafts never supersede another's), else the connection
    (a client keeping its own history types one message at a time per socket)."""
    if conversation_id is not None:
        return f"{key_id}:c:{conversation_id}"
    return f"{key_id}:s:{connection}"


def draft_messages(frame: DraftFrame) -> list[Message]:
    """The messages the chat frame would send if the user pressed send now."""
    history: Sequence[Message] = frame.messages or ()
    return [*history, Message(role="user", content=frame.text)]


def draft_fingerprint(frame: DraftFrame) -> int:
    """What a draft is drafted on (its history), to tell a draft that extends the previous one
    from one of another conversation or after an edit of the history."""
    return hash((frame.conversation_id, tuple((m.role, m.content) for m in frame.messages or ())))


def grew_enough(previous: tuple[int, str] | None, current: tuple[int, str], min_chars: int) -> bool:
    """Whether a draft (fingerprint, text) is worth prefilling after the last one sent in its
    conversation: always the first, one on another history, and one whose text is not an
    extension of the last (an edit); an extension only once it adds `min_chars`."""
    if previous is None or previous[0] != current[0]:
        return True
    before, text = previous[1], current[1]
    if not text.startswith(before):
        return True
    return len(text) - len(before) >= min_chars


def gateway_drops(*, enabled: bool, chats_on_connection: int) -> bool:
    """The gateway's own check before any Redis work: drafts off, or this connection has a
    chat running (its answer streams now; the user's next message can wait for it)."""
    return not enabled or chats_on_connection > 0


def prefill_verdict(
    *,
    job_id: str,
    latest: str | None,
    now: float,
    enqueued_at: float,
    max_age_s: float,
    busy: int,
    slots: int,
    share: float,
) -> Verdict:
    """Whether a worker prefills a draft it read: only its conversation's newest draft, only
    while it is fresh, and only while the worker has room (`busy`: chats and prefills
    running in it, of `slots`)."""
    if latest != job_id:
        return "superseded"
    if now - enqueued_at > max_age_s:
        return "stale"
    if busy >= max(1, int(slots * share)):
        return "busy"
    return "prefill"


def draft_chat_job(draft: DraftJob, now: float, deadline_s: float) -> ChatJob:
    """The chat job the draft would be if sent now, for the retrieval stage to build its
    prompt: what the worker prefills is exactly what it will send for the chat."""
    return ChatJob(
        job_id=draft.job_id,
        chat_id=draft.draft_id,
        tenant_id=draft.tenant_id,
        key_id=draft.key_id,
        messages=draft.messages,
        model=draft.model,
        max_tokens=1,
        cache=False,
        conversation_id=draft.conversation_id,
        received_at=draft.enqueued_at,
        enqueued_at=draft.enqueued_at,
        deadline_at=now + deadline_s,
    )
