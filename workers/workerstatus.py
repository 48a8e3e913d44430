"""What a worker process's heartbeat says about it, and how old news is judged.

Every heartbeat (workers/resources.py) writes, besides its `worker_heartbeats` entries, one
`Keys.worker_status` record: this schema, JSON. `firsttoken workers` reads them
(firsttoken/workerscli.py). The record expires `worker_status_ttl_s` after the last beat, so
a worker killed without a goodbye shows as stale for that long, then drops out.

Pure: no Redis here, so both sides and the tests use it as plain values.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, ValidationError

# Bumped when a field changes meaning; a reader skips records of a version it does not know
# (a rolling upgrade shows the new workers once the reader is upgraded too).
STATUS_VERSION = 1


class WorkerStatus(BaseModel):
    """One worker process as of its last heartbeat."""

    model_config = ConfigDict(frozen=True)

    v: int = STATUS_VERSION
    name: str  # the Celery node name (`celery inspect` shows the same)
    queues: tuple[str, ...]
    host: str
    pid: int
    # Chats (chat workers) or tasks (bulk, summarize) running now, and the most at once.
    in_flight: int = 0
    capacity: int = 0
    # Since the process started: chats ended however they ended (chat workers; tasks finished
    # on the other pools), and chats that ended with `engine_error`.
    done: int = 0
    engine_errors: int = 0
    started_at: float  # unix s
    beat_at: float  # unix s, the worker's clock (as `worker_heartbeats`)

    def encode(self) -> str:
        return self.model_dump_json()

    def age_s(self, now: float) -> float:
        """Seconds since the last heartbeat (never negative: clocks of two hosts differ)."""
        return max(0.0, now - self.beat_at)

    def stale(self, now: float, lost_s: float) -> bool:
        """Whether the worker has missed beats for longer than `lost_s` (`worker_lost_s`, the
        age at which a chat worker's chats are taken over): taken for dead."""
        return self.age_s(now) > lost_s


def decode_status(raw: str | bytes) -> WorkerStatus | None:
    """A record as written by a heartbeat, or None for one this reader cannot use (another
    version, or not a record at all)."""
    try:
        status = WorkerStatus.model_validate_json(raw)
    except ValidationError:
        return None
    return status if status.v == STATUS_VERSION else None
