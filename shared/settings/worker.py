"""Settings: the workers: deadlines, heartbeats, pools, flushing, the usage outbox and retries.

Fields only; the one object that reads them from the environment is shared/settings/__init__.py.
"""

from __future__ import annotations

from pydantic import BaseModel, Field


class WorkerSettings(BaseModel):
    """The workers: deadlines, heartbeats, pools, flushing, the usage outbox and retries."""

    # --- deadlines ------------------------------------------------------------------------
    queue_deadline_s: float = Field(
        10.0,
        gt=0,
        description="A chat not picked up by a worker within this is answered "
        "`timeout` and dropped by any worker that finds it later.",
    )
    stream_idle_timeout_s: float = Field(
        10.0,
        gt=0,
        description="Longest silence from the worker once a chat has started before "
        "the client gets `engine_error`.",
    )
    worker_heartbeat_s: float = Field(
        1.0, gt=0, description="How often workers announce themselves."
    )
    worker_lost_after_s: float = Field(
        2.0,
        gt=0,
        description="A chat worker whose last heartbeat is older than this is taken for dead: "
        "another chat worker takes its chats over, or, with none left, the gateway ends them "
        "with `engine_error`. At least 1.5 heartbeats are used (one late beat on a busy "
        "machine is no death).",
    )

    worker_status_ttl_s: float = Field(
        600.0,
        gt=0,
        description="How long a worker's status record (host, pid, load: what `firsttoken "
        "workers` lists) outlives its last heartbeat: a worker killed without a goodbye shows "
        "as stale that long, then drops out of the list.",
    )

    # --- worker ---------------------------------------------------------------------------
    chat_concurrency: int = Field(
        256, ge=1, description="Concurrent chats per chat worker process."
    )
    bulk_concurrency: int = Field(8, ge=1, description="Concurrent tasks per bulk worker process.")
    background_nice: int = Field(
        10,
        ge=0,
        le=19,
        description="CPU priority (nice increment) of a worker without the `chat` queue: "
        "database writes and summaries yield the CPU to streaming chats. 0: no change.",
    )
    flush_interval_ms: float = Field(
        4.0,
        ge=0,
        description="Token coalescing: the first token is sent at once; later text is "
        "sent at once if this long has passed since the last send, else held until it has.",
    )
    flush_max_chars: int = Field(256, ge=1, description="Held text is sent early at this size.")
    publish_linger_ms: float = Field(
        2.0,
        ge=0,
        le=50,
        description="A chat worker holds token chunks (never a chat's first) this long before "
        "writing them to Redis, so many chats' chunks go out in one write and Redis wakes once "
        "for them: less CPU per token in the worker and in Redis, at up to this much delay on "
        "later tokens. 0: write on every turn of the event loop.",
    )
    replay_maxlen: int = Field(2000, ge=10, description="Chunks kept in a job's replay stream.")
    replay_ttl_s: int = Field(600, ge=10, description="How long a job's replay stream lives.")
    usage_batch_ms: float = Field(
        250.0,
        ge=0,
        description="A chat worker sends the usage rows of chats that end within this window "
        "as one bulk task (one message, one transaction) instead of one each: the bulk "
        "worker's cost is per task. Each row is in Redis before its chat's `done` is sent "
        "(shared/usage_outbox.py) until a bulk worker has written it: a worker killed within "
        "the window loses none. 0: one task per chat.",
    )
    usage_resend_after_s: float = Field(
        60.0,
        gt=0,
        description="A usage row still unwritten this long after its bulk task was queued (or "
        "last retried) is queued again by a bulk worker's sweep (shared/usage_outbox.py): the "
        "task was lost on the way (a bulk worker killed as it took it, a Redis restart). Above "
        "`bulk_visibility_timeout_s`, so that a task a dead worker held comes back first; the "
        "write is idempotent, so a resend too early costs a duplicate task, never a row.",
    )
    worker_redis_outage_s: float = Field(
        30.0,
        gt=0,
        description="How long a worker holds its chats' chunks and usage rows in memory while "
        "Redis is unreachable; they are sent in order when it returns. Past this the chats "
        "end with an error.",
    )
    store_text: bool = Field(
        False,
        description="Store prompt and answer text in `messages`. Off unless enabled: usage rows "
        "never need the text, and a deployment must opt in to keeping it.",
    )
    persist_max_retries: int = Field(
        1000, ge=0, description="Retries of a usage/message write while the database is down."
    )
    persist_retry_backoff_max_s: int = Field(
        20,
        ge=1,
        description="Longest wait between retries; below `bulk_visibility_timeout_s`.",
    )
    bulk_visibility_timeout_s: int = Field(
        30,
        ge=5,
        description="A bulk task taken by a worker that died comes back to the queue within "
        "about this long (+5 s). Above `persist_retry_backoff_max_s`: a task waiting out a "
        "retry countdown longer than this would be delivered twice.",
    )
