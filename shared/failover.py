"""A chat whose worker died: who notices, what happens to it. Pure: no Redis, no clock.

The design (issue 29). This module is the gateway's side (its decisions; the I/O is
gateway/jobs.py's watchdog); the workers' decisions are workers/chat/takeover.py, their I/O
workers/chat/failover.py:

- **Lease.** A chat worker records every chat it runs in its own hash (`Keys.worker_jobs`:
  job id -> the `ChatJob` payload), written once when the chat starts and removed when it
  ends. The lease is renewed by the heartbeat the worker sends anyway (`worker_heartbeats`),
  once per worker per beat, never per chat or per token: a worker whose beat is older than
  `worker_lost_s` has lost the leases of all its chats at once.
- **Detection.** Every surviving chat worker looks for lost workers twice per beat (one small
  sorted-set read); every gateway watches the heartbeat of each job's worker (the `started`
  chunk names it) in its own count of the chat workers.
- **Claim.** A survivor moves a lost worker's leases into its own hash with one Lua script, so
  exactly one worker takes each chat over, and only while the owner's beat is still stale. The
  dead worker's Celery message cannot run a third time: the chat queue's reader removed it on
  receipt (workers/chat/consumer.py). A worker whose lease was taken while it was in fact alive (a
  stall longer than `worker_lost_s`) finds its chat missing from its hash at its next look and
  stands down without a word: the survivor speaks for the chat from then on.
- **Continuation.** The job's replay stream holds every chunk sent: the text so far, the last
  seq, the tokens so far (each token chunk's header). No token yet: the chat is run again from
  the start, which the client cannot tell. Some text: the engine is asked to continue the
  assistant message that text starts (vLLM's `continue_final_message`), the chunks go on at the
  next seq, and `done` says `continued`. A cut cache replay has no token counts and is not
  continued.
- **No survivor.** The gateway ends the chat with `engine_error` as soon as its worker's beat is
  `worker_lost_s` old (within 3 s of the death at the defaults) and records its usage row;
  with survivors it first leaves them `TAKEOVER_GRACE_S` to claim it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

import orjson

from shared.protocol import (
    CHUNK_TOKEN,
    chunk_tokens,
    decode_chunk,
)

# How long past an owner's loss a gateway waits for a survivor to take a chat over before it
# ends the chat itself: survivors look twice per heartbeat (0.5 s at the default), and a claim
# is two Redis round trips; the rest is slack for a busy machine.
TAKEOVER_GRACE_S = 1.5

# How long a worker's start (`Keys.worker_starting`: process up, warming, no heartbeat yet)
# counts as a worker on its way: a chat worker's warm-up (tokenizers, engine clients, the
# embedding model, the cache index) takes seconds; one that died while starting stops counting
# after this.
STARTING_S = 30.0


# --- the gateway's side -------------------------------------------------------------------

Verdict = Literal["alive", "wait", "give_up"]


def owner_verdict(
    owner: str,
    beats: Mapping[str, float],
    *,
    checked_at: float,
    lost_s: float,
    quiet_s: float = float("inf"),
    min_quiet_s: float = 0.0,
) -> Verdict:
    """What a gateway makes of a started chat's worker, from its last count of the chat
    workers' heartbeats (`beats`, read at `checked_at`).

    ``alive``: its beat is fresh. Lost, with another worker alive: ``wait`` for it to take the
    chat over, up to TAKEOVER_GRACE_S past the loss, then ``give_up``; lost with no other
    worker alive: ``give_up`` at once. An owner missing from the count counts as alive (the
    idle deadline still applies): a worker just started may beat after the count was taken, a
    stopping one ends its chats itself, and one whose chats were claimed has none left.

    A chat still sending (quiet for `quiet_s` < `min_quiet_s`, a heartbeat) is alive whatever
    the beat says: a dead worker sends nothing, and a beat lost to a busy loop or a Redis blip
    is no reason to end a chat that streams.
    """
    beat = beats.get(owner)
    if beat is None or quiet_s < min_quiet_s:
        return "alive"
    age = checked_at - beat
    if age < lost_s:
        return "alive"
    others = any(checked_at - b < lost_s for name, b in beats.items() if name != owner)
    if others and age < lost_s + TAKEOVER_GRACE_S:
        return "wait"
    return "give_up"


def started_worker(payload: str) -> str | None:
    """The worker a `started` chunk names, if any."""
    return _started_field(payload, "worker")


def started_model(payload: str) -> str | None:
    """The answering model a `started` chunk names, if any."""
    return _started_field(payload, "model")


def _started_field(payload: str, name: str) -> str | None:
    try:
        value = orjson.loads(payload).get(name)
    except (orjson.JSONDecodeError, AttributeError):
        return None
    return value if isinstance(value, str) else None


def delivered_tokens(log: Sequence[str]) -> int:
    """The answer's tokens as of the last token chunk in `log` (0 without one, or without a
    count: a cache replay's chunks, which the gateway's usage row then counts as 0)."""
    for message in reversed(log):
        kind, _, _ = decode_chunk(message)
        if kind == CHUNK_TOKEN:
            return chunk_tokens(message) or 0
    return 0
