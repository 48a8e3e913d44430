"""The usage outbox: every billed row stays in Redis until a bulk worker has written it.

A usage row goes into the outbox (`Keys.usage_rows`: request_id -> the row's JSON) before its
chat's `done` is sent, with a due time (`Keys.usage_due`: request_id -> Redis time in ms). The
bulk task that carries it takes it out only after its transaction committed. Whatever loses
a row on the way (a chat worker killed before it queued the batch, kombu's Redis transport
taking a message off the list before it records it as unacked, a Redis restart without
persistence) leaves the row in the outbox past its due time, and a bulk worker's sweep queues
it again (workers/bulk/sweep.py). A row sent twice is written once: the write is idempotent
on request_id.

The scripts shared/redis/scripts/usage_*.lua (add, queue, claim, touch, written) are the
outbox's only writers; they run on Redis so that each step is one round trip and atomic. Time
is Redis's, so hosts with skewed clocks agree.
"""

from __future__ import annotations

# A row added but not queued within this long (after the batch window) was held by a process
# that died, or one cut off from Redis (its own resend and the sweep's then both land: one row).
UNQUEUED_GRACE_MS = 5_000
# A sweep sends at most this many rows per task (a batcher's own cap).
CLAIM_ROWS = 200
# The bulk queue's length (messages) above which a sweep waits: see usage_claim.lua.
MAX_BACKLOG = 1_000
